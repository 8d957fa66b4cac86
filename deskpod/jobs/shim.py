"""The small parent each job runs under, so its exit code outlives the daemon.

The daemon starts ``python -I shim.py EXIT_FILE PID_FILE -- ARGV...`` in a new session; the shim
writes its pid, runs ARGV as its child (same process group, so the daemon's SIGTERM/SIGKILL to the
group reach both), waits, and writes the child's exit code to EXIT_FILE atomically. A daemon that
was killed and restarted cannot ``wait()`` for processes it did not start, but it can read that file:
that is how a re-adopted job still ends with its true exit code.

This file is run by path with ``python -I -S``, not imported: it needs only ``os``, ``signal`` and
``sys`` and spawns with ``posix_spawnp``, so it adds about ten milliseconds to a job's start. Signals: the shim itself ignores SIGTERM/SIGINT (its child handles them and
exits; the shim then records the code); SIGKILL ends both, and the daemon records that.
"""

import os
import signal
import sys


def _write(path: str, text: str) -> None:
    tmp = f"{path}.tmp"
    with open(tmp, "w") as f:
        f.write(text)
    os.replace(tmp, path)


def main(args: list[str]) -> int:
    exit_file, pid_file, sep, *argv = args
    if sep != "--" or not argv:
        print("usage: shim.py EXIT_FILE PID_FILE -- ARGV...", file=sys.stderr)
        return 2
    # A Python-level handler (not SIG_IGN) so the child gets the default disposition after exec.
    signal.signal(signal.SIGTERM, lambda *_: None)
    signal.signal(signal.SIGINT, lambda *_: None)
    _write(pid_file, str(os.getpid()))
    try:
        pid = os.posix_spawnp(argv[0], argv, os.environ)
    except OSError as e:
        print(f"deskpod: cannot start {argv[0]!r}: {e.strerror}", file=sys.stderr, flush=True)
        code = 127
    else:
        _, status = os.waitpid(pid, 0)
        rc = os.waitstatus_to_exitcode(status)
        code = rc if rc >= 0 else 128 - rc
    _write(exit_file, str(code))
    return code


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
