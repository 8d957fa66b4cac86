"""The sandbox, with real users and real bubblewrap: what user B's job can see, touch and signal.

Each sandboxed run forks, the child becomes the account (`drop_privileges`) and execs `sandbox_argv`,
as the pod's supervisor does. The job is a small Python probe that tries things and prints what
happened (errno names) as JSON. The folders live under /var/tmp, not /tmp: the sandbox has its own
/tmp, which would hide them whatever the walls said.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import stat
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from deskpod.envs.accounts import Account, drop_privileges, popen_credentials
from deskpod.envs.sandbox import Walls, bwrap_path, check_sandbox, gpu_device_nodes, sandbox_argv
from deskpod.envs.userfiles import prepare_owned_dir
from deskpod.errors import ConfigError, DeviceError, RunError
from tests.unix_users import processes_of

PROBE = r"""
import errno, json, os, signal, sys
spec = json.loads(sys.argv[1])

def attempt(f):
    try:
        f()
        return "ok"
    except OSError as e:
        return errno.errorcode.get(e.errno, str(e.errno))

def read(p):
    with open(p, "rb") as f:
        f.read()

def write(p):
    with open(p, "w") as f:
        f.write("written by the job")

print(json.dumps({
    "uid": os.getuid(), "gid": os.getgid(), "pid": os.getpid(), "cwd": os.getcwd(),
    "pids": sorted(int(p) for p in os.listdir("/proc") if p.isdigit()),
    "dev": sorted(os.listdir("/dev")),
    "read": {p: attempt(lambda p=p: read(p)) for p in spec.get("read", [])},
    "write": {p: attempt(lambda p=p: write(p)) for p in spec.get("write", [])},
    "kill": {str(pid): attempt(lambda pid=pid: os.kill(pid, signal.SIGKILL)) for pid in spec.get("kill", [])},
}))
"""

DEADLINE = 60.0
"""Seconds a sandboxed run or an awaited effect may take before the test gives up (never asserted on)."""


def _python_for_others() -> str:
    """An interpreter a test user may execute (pyenv's lies under root's 0700 home)."""
    for candidate in (sys.executable, "/usr/bin/python3"):
        real = Path(os.path.realpath(candidate))
        if real.exists() and all(p.stat().st_mode & stat.S_IXOTH for p in (real, *real.parents)):
            return str(real)
    pytest.fail("no Python interpreter here that other accounts may run (tried sys.executable, /usr/bin/python3)")


@dataclass(frozen=True)
class Box:
    """A pod's home with two users' job folders, a token file and simulated GPU device nodes."""

    pod: Path  # the pod's home: hidden
    db: Path
    a_job: Path
    a_secret: Path
    a_open_job: Path  # alice's job folder outside any hidden folder: only its mode protects it
    b_job: Path
    b_work: Path
    token: Path  # a token file elsewhere: hidden
    envs: Path
    dev_root: Path

    def walls(self, bob_gpus: list[int], *, hide: bool = True) -> Walls:
        return Walls(
            writable=(self.b_job, self.b_work),
            hidden=(self.pod, self.token) if hide else (),
            devices=gpu_device_nodes(bob_gpus, self.dev_root),
            dev_root=self.dev_root,
        )


@pytest.fixture
def box(two_users: tuple[Account, Account]) -> Iterator[Box]:
    if bwrap_path() is None:
        pytest.fail("bubblewrap is not installed (make test installs the Debian package bubblewrap)")
    alice, bob = two_users
    base = Path(tempfile.mkdtemp(prefix="deskpod-sandbox-", dir="/var/tmp"))
    try:
        base.chmod(0o711)
        pod = base / "pod"
        b = Box(
            pod=pod,
            db=pod / "deskpod.db",
            a_job=pod / "jobs" / "1",
            a_secret=pod / "jobs" / "1" / "secret.txt",
            a_open_job=base / "alice-job",
            b_job=pod / "jobs" / "2",
            b_work=base / "bob-work",
            token=base / "token",
            envs=pod / "envs" / "abc123",
            dev_root=base / "dev",
        )
        for p in (b.a_job, b.a_open_job):
            prepare_owned_dir(p, alice)
            (p / "secret.txt").write_text("alice's weights")
            os.chown(p / "secret.txt", alice.uid, alice.gid)
        prepare_owned_dir(b.b_job, bob)
        prepare_owned_dir(b.b_work, bob)
        b.envs.mkdir(parents=True)
        (b.envs / "pyvenv.cfg").write_text("home = /usr/bin\n")
        # World-readable on purpose: only the sandbox stands between bob and these.
        b.db.write_text("SQLite format 3")
        b.token.write_text("dp_secret_token")
        for p in (pod, pod / "jobs", pod / "envs", b.envs):
            p.chmod(0o755)
        for p in (b.db, b.token, b.envs / "pyvenv.cfg"):
            p.chmod(0o644)
        b.dev_root.mkdir()
        for node in ("nvidia0", "nvidia1", "nvidia2", "nvidia3", "nvidiactl"):
            (b.dev_root / node).write_text("")
            (b.dev_root / node).chmod(0o666)
        b.dev_root.chmod(0o755)
        yield b
    finally:
        shutil.rmtree(base, ignore_errors=True)


def _fork_exec_as(account: Account, argv: list[str], *, output: int | None = None, new_session: bool = False) -> int:
    """Fork a child that becomes ``account`` and execs ``argv``; its pid. The child never returns into pytest."""
    pid = os.fork()
    if pid == 0:
        try:
            if new_session:
                os.setsid()
            if output is not None:
                os.dup2(output, 1)
                os.dup2(output, 2)
            drop_privileges(account)
            os.execv(argv[0], argv)
        finally:
            os._exit(127)
    return pid


def _wait(pid: int) -> int:
    """Exit code of child ``pid``, killing it if it outlives `DEADLINE`."""
    end = time.monotonic() + DEADLINE
    while time.monotonic() < end:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            return os.waitstatus_to_exitcode(status)
        time.sleep(0.05)
    os.kill(pid, signal.SIGKILL)
    os.waitpid(pid, 0)
    pytest.fail(f"process {pid} did not finish within {DEADLINE} s")


def _until(condition: Callable[[], object], what: str) -> None:
    end = time.monotonic() + DEADLINE
    while time.monotonic() < end:
        if condition():
            return
        time.sleep(0.05)
    pytest.fail(f"gave up waiting for {what}")


def probe(
    walls: Walls,
    account: Account,
    *,
    cwd: Path,
    env_dir: Path | None = None,
    read: Sequence[str] = (),
    write: Sequence[str] = (),
    kill: Sequence[int] = (),
    switch_user: bool = False,
) -> dict[str, Any]:
    """Run `PROBE` in the sandbox as ``account``: it tries to read, write and SIGKILL those; what it saw.

    The sandbox is started by a fork that became ``account``, or, with ``switch_user``, straight from
    this (root) process, the argv switching by itself."""
    spec = {"read": list(read), "write": list(write), "kill": list(kill)}
    job = [_python_for_others(), "-I", "-c", PROBE, json.dumps(spec)]
    argv = sandbox_argv(walls, job, account=account, env_dir=env_dir, cwd=cwd, switch_user=switch_user)
    if switch_user:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=DEADLINE)
        code, text = done.returncode, done.stdout + done.stderr
    else:
        with tempfile.TemporaryFile() as out:
            code = _wait(_fork_exec_as(account, argv, output=out.fileno()))
            out.seek(0)
            text = out.read().decode(errors="replace")
    assert code == 0, f"sandboxed probe failed ({code}):\n{text}"
    result: dict[str, Any] = json.loads(text.strip().splitlines()[-1])
    return result


def test_the_job_runs_as_its_user_and_writes_only_its_folders(box: Box, two_users: tuple[Account, Account]) -> None:
    _, bob = two_users
    made = box.b_job / "made-by-job"
    seen = probe(box.walls([]), bob, cwd=box.b_work,
                 write=[str(made), str(box.b_work / "out"), "/etc/deskpod-test", str(box.pod / "planted")])  # fmt: skip
    assert (seen["uid"], seen["gid"]) == (bob.uid, bob.gid)
    assert seen["cwd"] == str(box.b_work)
    assert seen["write"] == {
        str(made): "ok",  # its job folder, though it lies inside the hidden pod home
        str(box.b_work / "out"): "ok",
        "/etc/deskpod-test": "EROFS",  # the system is read-only
        str(box.pod / "planted"): "EROFS",  # and so is the empty stand-in for the pod's home
    }
    st = made.stat()  # seen from outside: the file really is bob's, not root's mapped to bob
    assert (st.st_uid, st.st_gid) == (bob.uid, bob.gid)
    assert not (box.pod / "planted").exists()


def test_switch_user_lets_a_root_parent_start_the_sandbox(box: Box, two_users: tuple[Account, Account]) -> None:
    _, bob = two_users
    made = box.b_job / "made-by-switched-job"
    seen = probe(box.walls([]), bob, cwd=box.b_work, write=[str(made)], read=[str(box.db)], switch_user=True)
    assert (seen["uid"], seen["write"], seen["read"]) == (bob.uid, {str(made): "ok"}, {str(box.db): "ENOENT"})
    assert made.stat().st_uid == bob.uid  # bob outside too, not root mapped to bob


def test_another_users_files_the_database_and_the_token_cannot_be_opened(
    box: Box, two_users: tuple[Account, Account]
) -> None:
    _, bob = two_users
    targets = [str(box.a_secret), str(box.a_open_job / "secret.txt"), str(box.db), str(box.token)]
    seen = probe(box.walls([]), bob, cwd=box.b_work, read=targets)
    assert seen["read"] == {
        str(box.a_secret): "ENOENT",  # the pod's home is an empty tmpfs in the sandbox
        str(box.a_open_job / "secret.txt"): "EACCES",  # alice's 0700 folder outside it
        str(box.db): "ENOENT",
        str(box.token): "EACCES",  # /dev/null bound without device access
    }
    # The control: without the hidden walls the same job reads the database and the token.
    open_walls = probe(box.walls([], hide=False), bob, cwd=box.b_work, read=[str(box.db), str(box.token)])
    assert open_walls["read"] == {str(box.db): "ok", str(box.token): "ok"}


def test_the_environment_is_shown_read_only_inside_the_hidden_home(
    box: Box, two_users: tuple[Account, Account]
) -> None:
    _, bob = two_users
    cfg = str(box.envs / "pyvenv.cfg")
    seen = probe(box.walls([]), bob, cwd=box.b_work, env_dir=box.envs, read=[cfg, str(box.db)], write=[cfg])
    assert seen["read"] == {cfg: "ok", str(box.db): "ENOENT"}
    assert seen["write"] == {cfg: "EROFS"}


def test_the_job_cannot_signal_another_users_process(box: Box, two_users: tuple[Account, Account]) -> None:
    alice, bob = two_users
    alices = subprocess.Popen(["sleep", "600"], **popen_credentials(alice))
    try:
        seen = probe(box.walls([]), bob, cwd=box.b_work, kill=[alices.pid])
        assert seen["kill"][str(alices.pid)] in ("ESRCH", "EPERM")
        assert alices.poll() is None  # alice's job is still running
    finally:
        alices.kill()
        alices.wait()


def test_the_job_sees_only_its_own_device_nodes(box: Box, two_users: tuple[Account, Account]) -> None:
    _, bob = two_users
    walls = box.walls([2])
    assert walls.devices == ("nvidia2", "nvidiactl")
    seen = probe(walls, bob, cwd=box.b_work, read=["/dev/nvidia2", "/dev/nvidia0"])
    assert {"nvidia2", "nvidiactl", "null", "zero", "shm"} <= set(seen["dev"])
    assert not {"nvidia0", "nvidia1", "nvidia3"} & set(seen["dev"])
    assert seen["read"] == {"/dev/nvidia2": "ok", "/dev/nvidia0": "ENOENT"}


def test_the_job_has_its_own_pid_namespace(box: Box, two_users: tuple[Account, Account]) -> None:
    _, bob = two_users
    host = [int(p) for p in os.listdir("/proc") if p.isdigit()]
    seen = probe(box.walls([]), bob, cwd=box.b_work)
    assert seen["pid"] <= 3  # bwrap's reaper is 1, the job 2
    assert set(seen["pids"]) <= {1, 2, 3} and seen["pid"] in seen["pids"]
    assert len(host) > len(seen["pids"])


def _jobs_of(account: Account, marker: str) -> list[int]:
    out = []
    for pid in processes_of(account.uid):
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                if marker.encode() in f.read():
                    out.append(pid)
        except OSError:
            continue
    return out


def _sleeper(marker: str, ready: Path, *, trap: Path | None = None) -> list[str]:
    """A job that writes ``ready`` and sleeps; with ``trap``, on SIGTERM it writes ``trap`` and exits 0."""
    code = [
        "import signal, sys, time",
        f"ready, trap = {str(ready)!r}, {str(trap) if trap else ''!r}",
        "def stop(*_):",
        "    open(trap, 'w').write('checkpointed')",
        "    sys.exit(0)",
        "if trap: signal.signal(signal.SIGTERM, stop)",
        "open(ready, 'w').write('up')",
        "time.sleep(600)",
    ]
    return [_python_for_others(), "-I", "-c", "\n".join(code), marker]


def _supervise(account: Account, argv: list[str], code_file: Path) -> int:
    """Fork a stand-in for the pod's shim: a session leader that, like it, catches SIGTERM, starts the
    sandbox as ``account`` in its own process group and writes the sandbox's exit code to ``code_file``."""
    pid = os.fork()
    if pid == 0:
        try:
            os.setsid()
            signal.signal(signal.SIGTERM, lambda *_: None)
            child = _fork_exec_as(account, argv)
            _, status = os.waitpid(child, 0)
            code_file.write_text(str(os.waitstatus_to_exitcode(status)))
        finally:
            os._exit(0)
    return pid


def test_sigterm_to_the_parents_group_reaches_the_job(box: Box, two_users: tuple[Account, Account]) -> None:
    _, bob = two_users
    ready, trap, code = box.b_job / "ready", box.b_job / "checkpoint", box.b_work.parent / "code"
    argv = sandbox_argv(box.walls([]), _sleeper("dp-killpg-trap", ready, trap=trap), account=bob, cwd=box.b_work)
    shim = _supervise(bob, argv, code)
    _until(ready.exists, "the sandboxed job to start")
    os.killpg(shim, signal.SIGTERM)  # how the pod stops (or preempts) a job
    assert _wait(shim) == 0
    assert trap.read_text() == "checkpointed"  # the job's handler ran: it got SIGTERM, not bwrap's SIGKILL
    assert code.read_text() == "0"  # and the sandbox ended with the job's own exit code


def test_a_job_without_a_handler_dies_of_sigterm(box: Box, two_users: tuple[Account, Account]) -> None:
    _, bob = two_users
    ready, code = box.b_job / "ready", box.b_work.parent / "code"
    argv = sandbox_argv(box.walls([]), _sleeper("dp-killpg-plain", ready), account=bob, cwd=box.b_work)
    shim = _supervise(bob, argv, code)
    _until(ready.exists, "the sandboxed job to start")
    os.killpg(shim, signal.SIGTERM)
    assert _wait(shim) == 0
    assert code.read_text() == str(128 + signal.SIGTERM)  # the signal was not left ignored


def test_the_job_dies_with_its_parent(box: Box, two_users: tuple[Account, Account]) -> None:
    _, bob = two_users
    ready, marker = box.b_job / "ready", "dp-die-with-parent"
    argv = sandbox_argv(box.walls([]), _sleeper(marker, ready), account=bob, cwd=box.b_work)
    parent = _supervise(bob, argv, box.b_work.parent / "code")
    try:
        _until(ready.exists, "the sandboxed job to start")
        assert _jobs_of(bob, marker), "the sandboxed job is not running"
        os.kill(parent, signal.SIGKILL)
        os.waitpid(parent, 0)
        _until(lambda: not _jobs_of(bob, marker), "the sandboxed job to die with its parent")
    finally:
        for pid in _jobs_of(bob, marker):
            os.kill(pid, signal.SIGKILL)


def test_check_sandbox_works_here_and_says_why_not(
    two_users: tuple[Account, Account], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _, bob = two_users
    check_sandbox.cache_clear()
    try:
        assert check_sandbox() is None
        assert check_sandbox(bob) is None
        monkeypatch.setenv("PATH", str(tmp_path))
        check_sandbox.cache_clear()
        assert check_sandbox() == (
            "bubblewrap (bwrap) is not installed; install it (apt-get install bubblewrap) to sandbox jobs"
        )
    finally:
        check_sandbox.cache_clear()


def test_sandbox_argv_orders_mounts_by_depth(tmp_path: Path) -> None:
    home = tmp_path / "pod"
    job = home / "jobs" / "3"
    job.mkdir(parents=True)
    secret = job / "token"
    secret.write_text("x")
    argv = sandbox_argv(Walls(writable=(job,), hidden=(home, secret)), ["true"], account=None, bwrap="/usr/bin/bwrap")
    i_home, i_job, i_secret = argv.index(str(home)), argv.index(str(job)), argv.index(str(secret))
    assert argv[i_home - 1] == "--tmpfs" and argv[i_job - 1] == "--bind"
    assert i_home < i_job < i_secret  # deeper mounts land on top: the job folder shows, its token does not
    assert argv[i_secret - 2 : i_secret] == ["--ro-bind", "/dev/null"]
    assert argv[argv.index("--remount-ro") + 1] == str(home)
    assert "--new-session" not in argv and "--die-with-parent" in argv and "--unshare-user" not in argv
    assert argv[-2:] == ["--", "true"]
    bob = Account("bob", 1234, 1235, (1235,), Path("/nonexistent"), "/bin/sh")
    as_bob = sandbox_argv(Walls(), ["true"], account=bob, cwd=job, bwrap="/usr/bin/bwrap")
    flags = " ".join(as_bob)
    assert "--unshare-user --uid 1234 --gid 1235" in flags and f"--chdir {job}" in flags


def test_sandbox_argv_refuses_bad_walls(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"'jobs/1' is not absolute"):
        Walls(writable=(Path("jobs/1"),))
    with pytest.raises(ConfigError, match=r"device node '\.\./sda' is not a name under /dev"):
        Walls(devices=("../sda",))
    with pytest.raises(ConfigError, match=r"both hidden and shown"):
        sandbox_argv(Walls(writable=(tmp_path,), hidden=(tmp_path,)), ["true"], account=None, bwrap="bwrap")
    with pytest.raises(RunError, match=r"missing does not exist"):
        sandbox_argv(Walls(writable=(tmp_path / "missing",)), ["true"], account=None, bwrap="bwrap")
    with pytest.raises(ConfigError, match=r"command is empty"):
        sandbox_argv(Walls(), [], account=None, bwrap="bwrap")


def test_gpu_device_nodes(tmp_path: Path) -> None:
    for node in ("nvidia0", "nvidiactl", "nvidia-uvm"):
        (tmp_path / node).write_text("")
    assert gpu_device_nodes([3, 0, 3], tmp_path) == ("nvidia3", "nvidia0", "nvidiactl", "nvidia-uvm")
    assert gpu_device_nodes([], tmp_path) == ("nvidiactl", "nvidia-uvm")
    with pytest.raises(DeviceError, match=r"GPU index -1 is not valid"):
        gpu_device_nodes([-1], tmp_path)
