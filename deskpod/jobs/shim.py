"""The small parent each job runs under, so its exit code outlives the daemon.

The daemon starts ``python -I -S shim.py EXIT_FILE PID_FILE [OPTIONS] -- ARGV...`` in a new session;
the shim writes its pid, runs ARGV as its child (same process group, so the daemon's SIGTERM/SIGKILL
to the group reach both), waits, and writes the child's exit code to EXIT_FILE atomically. A daemon
that was killed and restarted cannot ``wait()`` for processes it did not start, but it can read that
file: that is how a re-adopted job still ends with its true exit code.

Options, in the order they act:

- ``--phase FILE``: write the job's phase there (``building``, ``running``, ``build-failed``); the
  daemon's loop reads it to move the job from ``building`` to ``running``.
- ``--build JSON``: first run this argv (a JSON list: ``deskpod env build ...``) with the shim's own
  rights — environments are shared and trusted, so the pod's account builds them, never a job's user;
  if it fails, the job ends with its exit code and ARGV never runs.
- ``--hold LOCK``: hold a shared ``flock`` on LOCK while the job runs (its environment's in-use
  lock: ``deskpod env prune`` never removes an environment a job holds).
- ``--as UID:GID:G1,G2``: run ARGV as that account (set groups, gid, uid in the child, then exec). A
  sandboxed job does not use it: its sandbox drops the rights itself (`deskpod.envs.sandbox`).

The shim writes its files without following symbolic links (the job folder belongs to the job's user,
who could plant one). This file is run by path with ``python -I -S``, not imported: it needs only the
standard library's ``os``, ``signal``, ``sys``, ``json`` and ``fcntl``, so it adds about ten
milliseconds to a job's start. Signals: the shim itself ignores SIGTERM/SIGINT (its child handles
them and exits; the shim then records the code); SIGKILL ends both, and the daemon records that.
"""

import os
import signal
import sys


def _write(path: str, text: str) -> None:
    tmp = f"{path}.tmp"
    try:  # noqa: SIM105 - no contextlib: the shim imports as little as it can
        os.unlink(tmp)
    except FileNotFoundError:
        pass
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o644)
    with os.fdopen(fd, "w") as f:
        f.write(text)
    os.replace(tmp, path)


def _code(status: int) -> int:
    rc = os.waitstatus_to_exitcode(status)
    return rc if rc >= 0 else 128 - rc


def _exec_path(argv: list[str]) -> None:
    """``execvp`` without its lazy imports: once the child is the job's account it may not be able to read
    this interpreter's standard library (here, under a /root closed to it)."""
    if "/" in argv[0]:
        os.execv(argv[0], argv)
    error: OSError = FileNotFoundError(2, "No such file or directory")
    for folder in os.environ.get("PATH", os.defpath).split(":"):
        try:
            os.execv(os.path.join(folder or ".", argv[0]), argv)
        except (FileNotFoundError, NotADirectoryError):
            continue
        except OSError as e:  # e.g. EACCES: remember it, try the next folder (as execvp does)
            error = e
    raise error


def _run(argv: list[str], account: tuple[int, int, list[int]] | None) -> int:
    """Run ``argv`` as a child (as ``account`` when given) and wait; its exit code, 127 if it cannot start."""
    if account is None:
        try:
            pid = os.posix_spawnp(argv[0], argv, os.environ)
        except OSError as e:
            print(f"deskpod: cannot start {argv[0]!r}: {e.strerror}", file=sys.stderr, flush=True)
            return 127
    else:
        pid = os.fork()
        if pid == 0:  # the child: drop to the account, then become the job
            try:
                uid, gid, groups = account
                os.setgroups(groups)
                os.setgid(gid)
                os.setuid(uid)
                if os.getuid() != uid or os.geteuid() != uid:
                    raise OSError(1, "the uid did not change")
                _exec_path(argv)
            except OSError as e:
                print(f"deskpod: cannot start {argv[0]!r}: {e.strerror}", file=sys.stderr, flush=True)
            except BaseException as e:  # nothing may escape the child but its exit code
                print(f"deskpod: cannot start {argv[0]!r}: {e}", file=sys.stderr, flush=True)
            os._exit(127)
    _, status = os.waitpid(pid, 0)
    return _code(status)


def main(args: list[str]) -> int:
    if len(args) < 4 or "--" not in args[2:]:
        print("usage: shim.py EXIT_FILE PID_FILE [--phase F] [--build JSON] [--hold F] [--as U:G:GS] -- ARGV...",
              file=sys.stderr)  # fmt: skip
        return 2
    exit_file, pid_file = args[0], args[1]
    sep = args.index("--", 2)
    opts, argv = args[2:sep], args[sep + 1 :]
    given = dict(zip(opts[::2], opts[1::2], strict=False))
    if not argv or len(opts) % 2 or set(given) - {"--phase", "--build", "--hold", "--as"}:
        print(f"shim.py: bad options {opts!r}", file=sys.stderr)
        return 2
    # A Python-level handler (not SIG_IGN) so the child gets the default disposition after exec.
    signal.signal(signal.SIGTERM, lambda *_: None)
    signal.signal(signal.SIGINT, lambda *_: None)
    _write(pid_file, str(os.getpid()))
    phase = given.get("--phase")
    code = 0
    if "--build" in given:
        import json

        if phase:
            _write(phase, "building")
        code = _run([str(a) for a in json.loads(given["--build"])], None)
        if code != 0 and phase:
            _write(phase, "build-failed")
    if code == 0:
        if "--hold" in given:
            import fcntl

            held = os.open(given["--hold"], os.O_RDONLY | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644)
            fcntl.flock(held, fcntl.LOCK_SH)  # released when the shim exits
        if phase:
            _write(phase, "running")
        account = None
        if "--as" in given:
            uid, gid, groups = given["--as"].split(":")
            account = (int(uid), int(gid), [int(g) for g in groups.split(",") if g])
        code = _run(argv, account)
    _write(exit_file, str(code))
    return code


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
