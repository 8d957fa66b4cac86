"""The OS accounts jobs run as, and becoming one of them.

The pod service runs as root (like slurmd) and starts each job as the OS account its deskpod user maps
to. An `Account` is that account as the password and group databases describe it. Two ways to become
it in a child process:

* `popen_credentials` gives ``subprocess.Popen``'s ``user``/``group``/``extra_groups`` arguments; the
  switch then happens in C between fork and exec, which is safe in a daemon with threads (a
  ``preexec_fn`` is not);
* `drop_privileges` does the same by hand in a child made with ``os.fork`` right before ``exec``, and
  checks that it took: the uid, gid and groups are the account's, and ``setuid(0)`` now fails;
* `as_account_argv` puts util-linux's ``setpriv`` in front of a command line, for a root parent that
  only spawns (the supervisor's shim uses ``posix_spawnp``) and so cannot switch in between.

What the root daemon reads and writes in the folders these accounts own goes through
`deskpod.envs.userfiles`, which follows no link a user planted.
"""

from __future__ import annotations

import os
import platform
import pwd
import shutil
import sys
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypedDict, TypeVar

from deskpod.errors import ConfigError, RunError

T = TypeVar("T")


@dataclass(frozen=True, slots=True)
class Account:
    """An OS account, as the password and group databases know it."""

    name: str
    uid: int
    gid: int
    """The primary group."""
    groups: tuple[int, ...]
    """Every group the account is in (``os.getgrouplist``: the primary group and the supplementary ones
    of ``/etc/group`` or the directory), sorted; what a process running as the account gets from ``setgroups``."""
    home: Path
    shell: str


class PopenCredentials(TypedDict):
    """``subprocess.Popen`` arguments that start the child as an account."""

    user: int
    group: int
    extra_groups: list[int]


def _account(entry: pwd.struct_passwd) -> Account:
    groups = set(os.getgrouplist(entry.pw_name, entry.pw_gid))  # NSS, as initgroups(3) sees them
    return Account(
        name=entry.pw_name,
        uid=entry.pw_uid,
        gid=entry.pw_gid,
        groups=tuple(sorted(groups)),
        home=Path(entry.pw_dir),
        shell=entry.pw_shell,
    )


def account_by_name(name: str) -> Account:
    """The account called ``name``; `ConfigError` saying how to fix it when this box has none."""
    try:
        entry = pwd.getpwnam(name)
    except (KeyError, ValueError):
        raise ConfigError(
            f"OS account {name!r} does not exist on this box; create it (useradd {name}) "
            "or map the deskpod user to an existing account"
        ) from None
    return _account(entry)


def account_by_uid(uid: int) -> Account:
    """The account with user id ``uid``; `ConfigError` when this box has none."""
    try:
        entry = pwd.getpwuid(uid)
    except (KeyError, OverflowError):
        raise ConfigError(
            f"OS account with uid {uid} does not exist on this box; create one (useradd --uid {uid} NAME) "
            "or map the deskpod user to an existing account"
        ) from None
    return _account(entry)


_SETGROUPS = {"x86_64": 116, "aarch64": 159}
"""``setgroups``'s system call number (Linux: arch/x86/entry/syscalls/syscall_64.tbl, include/uapi/asm-generic/
unistd.h), called raw: glibc's wrapper changes the groups of every thread of the process, not of one."""


def as_account(account: Account, fn: Callable[[], T]) -> T:
    """``fn()`` with the file-system rights of ``account``: every path it opens, lists or stats is checked by
    the kernel as for a process of that account (folders it cannot enter, ACLs, groups), nothing as root.

    For a root daemon that must open a path a user named (a job's work directory, a dataset) exactly as that
    user could, and no further. ``fn`` runs in a new thread of this process whose file-system uid and gid
    (``setfsuid``/``setfsgid``, which Linux keeps per thread) and supplementary groups are the account's; its
    other threads keep root's rights throughout, and the thread ends with ``fn``. A descriptor ``fn`` opens
    stays valid after it (``--bind-fd`` hands it to a sandbox: the folder checked is the folder shown). ``fn``
    must not import anything (the account may not read this interpreter's files). Raises what ``fn`` raises;
    `RunError` when this process cannot take the account's rights (it is not root, or not on Linux).
    """
    if account.uid == os.geteuid() and account.gid == os.getegid():
        return fn()
    if os.geteuid() != 0:
        raise RunError(f"cannot check paths as OS account {account.name!r}: only a pod service run by root can")
    number = _SETGROUPS.get(platform.machine())
    if sys.platform != "linux" or number is None:
        raise RunError(f"cannot check paths as another OS account on {sys.platform} {platform.machine()}")
    import ctypes

    libc = ctypes.CDLL(None, use_errno=True)
    out: list[Any] = []

    def run() -> None:
        try:
            groups = (ctypes.c_uint * max(1, len(account.groups)))(*account.groups)
            if libc.syscall(number, len(account.groups), groups) != 0:
                raise RunError(f"setgroups for OS account {account.name!r} failed (errno {ctypes.get_errno()})")
            libc.setfsgid(account.gid)
            libc.setfsuid(account.uid)
            if libc.setfsuid(-1 & 0xFFFFFFFF) != account.uid or libc.setfsgid(-1 & 0xFFFFFFFF) != account.gid:
                raise RunError(f"could not take the file-system rights of OS account {account.name!r}")
            out.append((True, fn()))
        except BaseException as e:  # handed to the caller's thread
            out.append((False, e))

    thread = threading.Thread(target=run, name=f"deskpod-as-{account.name}", daemon=True)
    thread.start()
    thread.join()
    ok, value = out[0]
    if not ok:
        raise value
    return value  # type: ignore[no-any-return]


def current_account() -> Account:
    """The account this process runs as (its real uid)."""
    return account_by_uid(os.getuid())


def popen_credentials(account: Account) -> PopenCredentials:
    """``Popen(argv, **popen_credentials(account))`` starts the child as ``account`` (groups, gid, then uid)."""
    return {"user": account.uid, "group": account.gid, "extra_groups": list(account.groups)}


def as_account_argv(account: Account, argv: Sequence[str], *, no_new_privs: bool = False) -> list[str]:
    """``argv`` prefixed with ``setpriv`` so that it runs as ``account`` (real, effective and saved
    uid/gid, and its groups); run by root. ``no_new_privs``: setuid programs (sudo) cannot regain rights
    either. `RunError` when util-linux's setpriv is not installed."""
    setpriv = shutil.which("setpriv")
    if setpriv is None:
        raise RunError("setpriv is not installed, so jobs cannot be started as their OS account; install util-linux")
    groups = ["--groups", ",".join(str(g) for g in account.groups)] if account.groups else ["--clear-groups"]
    extra = ["--no-new-privs"] if no_new_privs else []
    return [setpriv, "--reuid", str(account.uid), "--regid", str(account.gid), *groups, *extra, "--", *argv]


def drop_privileges(account: Account) -> None:
    """Become ``account`` for good: supplementary groups, then real/effective/saved gid, then uid.

    Meant for a child made with ``os.fork`` right before it execs (catch the error there and
    ``os._exit``). `RunError` when the switch is not permitted (only root may become another
    account) or did not take.
    """
    try:
        os.setgroups(list(account.groups))
        os.setresgid(account.gid, account.gid, account.gid)
        os.setresuid(account.uid, account.uid, account.uid)
    except OSError as e:
        raise RunError(
            f"cannot become OS account {account.name!r} (uid {account.uid}): {e.strerror}; "
            "only a pod service running as root starts jobs as other accounts"
        ) from None
    got = (os.getresuid(), os.getresgid(), sorted(set(os.getgroups())))
    want = ((account.uid,) * 3, (account.gid,) * 3, sorted(set(account.groups)))
    if got != want:
        raise RunError(
            f"switching to OS account {account.name!r} did not take: uids/gids/groups are {got}, expected {want}"
        )
    if account.uid != 0:
        try:
            os.setuid(0)
        except PermissionError:
            return
        raise RunError(f"after switching to OS account {account.name!r} this process could still become root")
