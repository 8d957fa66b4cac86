"""Real Unix users (and groups) for the tests that check who a job runs as, removed again whatever happens.

``with make_users("alice", "bob") as (alice, bob):`` creates ``dpt<random>alice`` and ``dpt<random>bob``
with ``useradd`` (no home folder, shell /bin/sh, a group of the same name each) and removes them with
``userdel``/``groupdel`` on the way out, after SIGKILLing by pid any process still running as them.
Tests that need this are skipped, saying why, when the suite does not run as root or the box has no
``useradd``.
"""

from __future__ import annotations

import contextlib
import grp
import os
import re
import secrets
import shutil
import signal
import subprocess
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from deskpod.envs.accounts import Account, account_by_name
from deskpod.errors import ConfigError

PREFIX = "dpt"
_NAME = re.compile(r"^[a-z][a-z0-9]{0,15}$")


def _tool(name: str) -> str | None:
    return shutil.which(name) or shutil.which(name, path="/usr/sbin:/sbin:/usr/bin:/bin")


def _need_root_and(tool: str) -> None:
    if os.geteuid() != 0:
        pytest.skip("creating Unix users needs root (the suite runs as root in CI)")
    if _tool(tool) is None:
        pytest.skip(f"{tool} is not installed, so no test users can be created")


def _run(tool: str, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    """Run a user-database tool, retrying while another process holds /etc/passwd's lock."""
    argv = [_tool(tool) or tool, *args]
    for _ in range(50):
        done = subprocess.run(argv, capture_output=True, text=True, stdin=subprocess.DEVNULL)
        if done.returncode == 0 or "lock" not in done.stderr.lower():
            break
        time.sleep(0.2)
    if check and done.returncode != 0:
        raise RuntimeError(f"{' '.join(argv)} failed ({done.returncode}): {done.stderr.strip()}")
    return done


def processes_of(uid: int) -> list[int]:
    """Pids of the live processes whose real uid is ``uid`` (from /proc)."""
    pids = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/status") as f:
                status = f.read()
        except OSError:
            continue
        m = re.search(r"^Uid:\s+(\d+)", status, re.MULTILINE)
        z = re.search(r"^State:\s+Z", status, re.MULTILINE)
        if m and int(m.group(1)) == uid and not z:
            pids.append(int(entry))
    return pids


def _remove_user(name: str) -> None:
    with contextlib.suppress(ConfigError):
        uid = account_by_name(name).uid
        for pid in processes_of(uid):  # only our test users' processes: started by the tests
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGKILL)
    _run("userdel", "--force", name, check=False)
    _run("groupdel", name, check=False)  # userdel usually removes it already


@contextlib.contextmanager
def shared_folder(prefix: str, mode: int = 0o755) -> Iterator[Path]:
    """A new folder with ``mode``, so that other accounts can reach it (pytest's own is root's alone), outside /tmp
    (a sandbox has its own); removed afterwards."""
    base = Path(tempfile.mkdtemp(prefix=prefix, dir="/var/tmp"))
    try:
        base.chmod(mode)
        yield base
    finally:
        shutil.rmtree(base, ignore_errors=True)


@contextlib.contextmanager
def make_users(*names: str) -> Iterator[list[Account]]:
    """Create one Unix user per name (``dpt`` + a random suffix + the name); yields their accounts."""
    _need_root_and("useradd")
    for n in names:
        if not _NAME.match(n):
            raise ValueError(f"test user name {n!r}: expected lowercase letters and digits, at most 16")
    suffix = secrets.token_hex(3)
    created: list[str] = []
    try:
        for n in names:
            full = f"{PREFIX}{suffix}{n}"
            _run(
                "useradd", "--no-create-home", "--home-dir", "/nonexistent", "--shell", "/bin/sh", "--user-group", full
            )
            created.append(full)
        yield [account_by_name(n) for n in created]
    finally:
        for full in reversed(created):
            _remove_user(full)


@contextlib.contextmanager
def make_group(*members: Account) -> Iterator[int]:
    """Create a Unix group (``dpt`` + random + ``grp``) with ``members`` as supplementary members; yields its gid."""
    _need_root_and("groupadd")
    name = f"{PREFIX}{secrets.token_hex(3)}grp"
    _run("groupadd", name)
    try:
        for m in members:
            _run("gpasswd", "--add", m.name, name)
        yield grp.getgrnam(name).gr_gid
    finally:
        _run("groupdel", name, check=False)
