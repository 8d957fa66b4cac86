"""The small parent each job runs under, so its exit code outlives the daemon, and the job's last step.

**The parent.** The daemon starts ``python -I -S shim.py EXIT_FILE PID_FILE [OPTIONS] -- ARGV...`` in a new
session, with the job's *plan* on its stdin (JSON in an anonymous memory file, never on a command line, where
every local user could read it). The shim writes its pid, joins the job's cgroups, runs the job as its
child (same process group, so the daemon's SIGTERM/SIGKILL to the group reach both), waits, and writes the
child's exit code to EXIT_FILE atomically. A daemon that was killed and restarted cannot ``wait()`` for
processes it did not start, but it can read that file: that is how a re-adopted job still ends with its
true exit code. Options, in the order they act:

- ``--cgroup PATH`` (repeatable): write the shim's pid into this ``cgroup.procs`` before anything starts, so
  the job and everything it forks stay inside the job's limits (`deskpod.envs.cgroups`).
- ``--fsize BYTES``: no process of the job may write a file bigger than this (``RLIMIT_FSIZE``).
- ``--as UID:GID:G1,G2``: become that account in the child before the job step (set groups, gid, uid).
- ``--sandboxed``: ARGV is a sandbox whose innermost command is this file's job step (below); the shim starts
  it as it is and hands it the plan on its stdin.

**The job step** (`become`) runs as the job's own account — after ``--as`` in the shim's child, or inside
the sandbox after ``setpriv`` made it the account (``python -I -S shim.py --exec -- ARGV``) — and is the only
code that ever sees the job's environment variables: nothing running as root does, so no variable a user
chose (``LD_PRELOAD``, ``PYTHONPATH``) can act before the privilege drop. In order, from the plan: build the
job's environment (``build``, as the account, its output in the job's log; the phase file says
``building``, then ``build-failed`` or ``running``), hold its in-use lock shared (``hold``: `deskpod env prune`
leaves an environment alone while a job runs in it), copy what the environment was built from into the job's
folder (``record``), enter the working directory it was given (``cwd``, as the account: the kernel checks it;
without one the job starts in its own folder, where the shim was started), put
``/dev/null`` on stdin, set every signal back to its default, and exec ARGV with the plan's ``env``.

The plan: ``{"env": {NAME: VALUE}, "cwd": PATH, "phase": FILE, "build": ARGV or null, "build_env": {...},
"hold": FILE or null, "record": [[SOURCE, DEST], ...]}``.

Files are written without following symbolic links (the job folder belongs to the job's user, who could plant
one). This file is run by path with ``python -I -S``, not imported: it needs only the standard library's
``os``, ``signal``, ``sys``, ``json``, ``fcntl`` and ``resource``, so it adds about ten milliseconds to a
job's start; the job step must not import anything once it is the account (it may not be able to read this
interpreter's files). Signals: the shim itself ignores SIGTERM/SIGINT (its child handles them and exits; the
shim then records the code); SIGKILL ends both, and the daemon records that.
"""

from __future__ import annotations

import fcntl
import json
import os
import signal
import sys

TYPE_CHECKING = False  # typing is not imported at run time (mypy reads the name as typing's)
if TYPE_CHECKING:
    from typing import Any

Plan = dict[str, "Any"]

NO_FILE = "deskpod: cannot start {!r}: {}"


def _write(path: str, text: str | bytes) -> None:
    tmp = f"{path}.tmp"
    try:  # noqa: SIM105 - no contextlib: the shim imports as little as it can
        os.unlink(tmp)
    except FileNotFoundError:
        pass
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o644)
    with os.fdopen(fd, "wb") as f:
        f.write(text.encode() if isinstance(text, str) else text)
    os.replace(tmp, path)


def _say(text: str) -> None:
    os.write(2, (text + "\n").encode(errors="replace"))


def _code(status: int) -> int:
    rc = os.waitstatus_to_exitcode(status)
    return rc if rc >= 0 else 128 - rc


def _read_plan() -> Plan:
    """The plan on stdin, read from offset 0 (whoever read it before, the file is the same)."""
    data = b""
    while True:
        chunk = os.pread(0, 1 << 20, len(data))
        if not chunk:
            break
        data += chunk
    plan: Plan = json.loads(data or b"{}")
    return plan


def _exec_path(argv: list[str], env: dict[str, str]) -> None:
    """``execvpe`` without its lazy imports (this interpreter's own files may be closed to the account)."""
    if "/" in argv[0]:
        os.execve(argv[0], argv, env)
    error: OSError = FileNotFoundError(2, "No such file or directory")
    for folder in env.get("PATH", os.defpath).split(":"):
        try:
            os.execve(os.path.join(folder or ".", argv[0]), argv, env)
        except (FileNotFoundError, NotADirectoryError):
            continue
        except OSError as e:  # e.g. EACCES: remember it, try the next folder (as execvp does)
            error = e
    raise error


def _spawn_wait(argv: list[str], env: dict[str, str]) -> int:
    """Run ``argv`` with ``env`` and stdin from /dev/null; its exit code, 127 if it cannot start."""
    pid = os.fork()
    if pid == 0:
        try:
            null = os.open("/dev/null", os.O_RDONLY)
            os.dup2(null, 0)
            _exec_path([str(a) for a in argv], env)
        except OSError as e:
            _say(NO_FILE.format(argv[0], e.strerror))
        os._exit(127)
    return _code(os.waitpid(pid, 0)[1])


def _phase(plan: Plan, text: str) -> None:
    """Say what the job step is doing (the daemon moves the job from ``building`` to ``running`` by it); the
    folder may be out of the account's reach when a pod runs without a sandbox: then the daemon goes by the
    exit code alone."""
    if plan.get("phase"):
        try:  # noqa: SIM105
            _write(plan["phase"], text)
        except OSError:
            pass


def become(plan: Plan, argv: list[str]) -> int:
    """The job step (see the module docstring): returns only when the job cannot start (its exit code)."""
    if plan.get("build"):
        _phase(plan, "building")
        code = _spawn_wait(plan["build"], plan.get("build_env") or {})
        if code != 0:
            _phase(plan, "build-failed")
            return code
    if plan.get("hold"):
        try:  # the environment's in-use lock, held shared for as long as the job's process lives
            held = os.open(plan["hold"], os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
            fcntl.flock(held, fcntl.LOCK_SH)
        except OSError:
            pass
    for source, dest in plan.get("record") or []:
        try:
            with open(source, "rb") as f:
                data = f.read()
        except FileNotFoundError:
            continue  # a kind of environment that has no such file
        except OSError as e:
            _say(f"deskpod: could not keep {source} in the job's folder: {e.strerror}")
            continue
        try:
            os.makedirs(os.path.dirname(dest), exist_ok=True)
            _write(dest, data)
        except OSError as e:
            _say(f"deskpod: could not keep {source} in the job's folder: {e.strerror}")
    _phase(plan, "running")
    cwd = plan.get("cwd")
    if cwd:
        try:
            os.chdir(cwd)
        except OSError as e:
            _say(f"deskpod: cannot enter the working directory {cwd!r}: {e.strerror}")
            return 127
    null = os.open("/dev/null", os.O_RDONLY)
    os.dup2(null, 0)
    os.close(null)
    for sig in signal.valid_signals():
        if sig not in (signal.SIGKILL, signal.SIGSTOP):
            try:  # noqa: SIM105
                signal.signal(sig, signal.SIG_DFL)
            except (OSError, ValueError):
                pass
    try:
        _exec_path([str(a) for a in argv], dict(plan.get("env") or {}))
    except OSError as e:
        _say(NO_FILE.format(argv[0], e.strerror))
    return 127


def _run(argv: list[str], account: tuple[int, int, list[int]] | None, sandboxed: bool) -> int:
    """Start the job and wait; its exit code, 127 if it cannot start."""
    if sandboxed:  # the sandbox's innermost command is `shim.py --exec`; it reads the plan on the same stdin
        try:
            pid = os.posix_spawnp(argv[0], argv, os.environ)
        except OSError as e:
            _say(NO_FILE.format(argv[0], e.strerror))
            return 127
        return _code(os.waitpid(pid, 0)[1])
    pid = os.fork()
    if pid == 0:  # the child: drop to the account, then become the job
        code = 127
        try:
            if account is not None:
                uid, gid, groups = account
                os.setgroups(groups)
                os.setresgid(gid, gid, gid)
                os.setresuid(uid, uid, uid)
                if os.getresuid() != (uid, uid, uid):
                    raise OSError(1, "the uid did not change")
            code = become(_read_plan(), argv)
        except OSError as e:
            _say(NO_FILE.format(argv[0], e.strerror))
        except BaseException as e:  # nothing may escape the child but its exit code
            _say(NO_FILE.format(argv[0], e))
        os._exit(code)
    return _code(os.waitpid(pid, 0)[1])


OPTIONS = {"--cgroup": True, "--fsize": False, "--as": False, "--sandboxed": None}
"""The parent's options: True repeatable with a value, False once with a value, None a flag."""


def _options(opts: list[str]) -> dict[str, Any]:
    given: dict[str, Any] = {}
    i = 0
    while i < len(opts):
        name = opts[i]
        if name not in OPTIONS:
            raise ValueError(name)
        if OPTIONS[name] is None:
            given[name] = True
            i += 1
            continue
        if i + 1 >= len(opts):
            raise ValueError(name)
        if OPTIONS[name]:
            given.setdefault(name, []).append(opts[i + 1])
        elif name in given:
            raise ValueError(name)
        else:
            given[name] = opts[i + 1]
        i += 2
    return given


def main(args: list[str]) -> int:
    if args[:2] == ["--exec", "--"] and len(args) > 2:
        return become(_read_plan(), args[2:])
    if len(args) < 4 or "--" not in args[2:]:
        _say("usage: shim.py EXIT_FILE PID_FILE [--cgroup P]... [--fsize N] [--as U:G:GS] [--sandboxed] -- ARGV...")
        return 2
    exit_file, pid_file = args[0], args[1]
    sep = args.index("--", 2)
    argv = args[sep + 1 :]
    try:
        given = _options(args[2:sep])
    except ValueError as e:
        _say(f"shim.py: bad option {e}")
        return 2
    if not argv:
        _say("shim.py: nothing to run")
        return 2
    # A Python-level handler (not SIG_IGN) so the child gets the default disposition after exec.
    signal.signal(signal.SIGTERM, lambda *_: None)
    signal.signal(signal.SIGINT, lambda *_: None)
    _write(pid_file, str(os.getpid()))
    try:
        for procs in given.get("--cgroup", []):
            with open(procs, "w") as f:  # the daemon made it; no job process exists yet to have swapped it
                f.write(str(os.getpid()))
    except OSError as e:  # never run a job outside its limits
        _say(f"deskpod: cannot enter the job's cgroup {procs}: {e.strerror}")
        _write(exit_file, "126")
        return 126
    if "--fsize" in given:
        import resource

        limit = int(given["--fsize"])
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))
    account = None
    if "--as" in given:
        uid, gid, groups = given["--as"].split(":")
        account = (int(uid), int(gid), [int(g) for g in groups.split(",") if g])
    code = _run(argv, account, bool(given.get("--sandboxed")))
    _write(exit_file, str(code))
    return code


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
