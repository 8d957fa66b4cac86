"""The OS accounts jobs run as, becoming one of them, and the files the root daemon makes in their folders.

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

Root writing into a folder a user owns is how a privileged daemon gets tricked into overwriting
``/etc/shadow``: the user plants a symbolic link where the daemon will write. `prepare_owned_dir` and
`write_no_follow` never follow a link at the path they are given.
"""

from __future__ import annotations

import contextlib
import os
import pwd
import shutil
import stat
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TypedDict

from deskpod.errors import ConfigError, RunError

PARENT_MODE = 0o711
"""Mode of the parent folders `prepare_owned_dir` creates: others may pass through to their own
folder (a job's folder under the pod's home) but not list who else has one."""


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


def may_read(account: Account, path: Path) -> bool:
    """Whether ``account`` may read ``path`` (and list it, when it is a folder) by its mode bits: every folder
    above it searchable, the path itself readable — for the owner, the group or others, as the kernel decides
    for a process of ``account`` (root may read anything). ACLs are not looked at (they can only grant more)."""
    if account.uid == 0:
        return True
    target = Path(os.path.realpath(path))  # the folders the kernel walks, links followed
    for folder, need in [*((p, 0o1) for p in reversed(target.parents)), (target, 0o5 if target.is_dir() else 0o4)]:
        try:
            st = folder.stat()
        except OSError:
            return False
        if st.st_uid == account.uid:
            bits = st.st_mode >> 6
        elif st.st_gid in account.groups:
            bits = st.st_mode >> 3
        else:
            bits = st.st_mode
        if bits & need != need:
            return False
    return True


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


def _open_dir_no_follow(path: Path) -> int:
    """An fd of the folder at ``path``; `RunError` when a symbolic link or something else is there."""
    try:
        return os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError as e:
        if path.is_symlink():
            raise RunError(f"refusing to use {path}: it is a symbolic link, not a folder") from None
        raise RunError(f"cannot open folder {path}: {e.strerror}") from None


def prepare_owned_dir(path: Path, account: Account, mode: int = 0o700) -> Path:
    """Make ``path`` a folder owned by ``account`` (uid and primary gid) with ``mode``; returns ``path``.

    Missing parents are created owned by this process with mode 0711. An existing folder is taken
    over (chowned, chmodded) through a descriptor opened with ``O_NOFOLLOW``, so a symbolic link
    planted at ``path`` is refused (`RunError`) and never followed; so is a file there.
    """
    path = Path(os.path.abspath(path))
    missing: list[Path] = []
    for parent in path.parents:
        if parent.exists():
            break
        missing.append(parent)
    for parent in reversed(missing):
        with contextlib.suppress(FileExistsError):
            os.mkdir(parent, PARENT_MODE)
            os.chmod(parent, PARENT_MODE)  # mkdir's mode is masked by the umask
    with contextlib.suppress(FileExistsError):
        os.mkdir(path, 0o700)
    fd = _open_dir_no_follow(path)
    try:
        os.fchown(fd, account.uid, account.gid)
        os.fchmod(fd, mode)
    except OSError as e:
        raise RunError(f"cannot give folder {path} to OS account {account.name!r}: {e.strerror}") from None
    finally:
        os.close(fd)
    return path


def write_no_follow(path: Path, data: bytes, mode: int = 0o644) -> None:
    """Write ``data`` to ``path`` (a file in a folder someone else may control) without following links.

    The bytes go to a temporary name beside it, created with ``O_CREAT|O_EXCL|O_NOFOLLOW`` relative to
    the folder's descriptor (itself opened with ``O_NOFOLLOW``), then renamed over ``path``: a symbolic
    link planted at either name is replaced, never written through. The file is owned by this process.
    """
    path = Path(os.path.abspath(path))
    tmp = f".{path.name}.deskpod-tmp"
    folder = _open_dir_no_follow(path.parent)
    try:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp, dir_fd=folder)
        try:
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, mode, dir_fd=folder)
        except OSError as e:
            raise RunError(f"cannot write {path}: {e.strerror} (creating {tmp})") from None
        try:
            if not stat.S_ISREG(os.fstat(fd).st_mode):
                raise RunError(f"cannot write {path}: {tmp} is not a regular file")
            os.fchmod(fd, mode)
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view) :]
        finally:
            os.close(fd)
        os.replace(tmp, path.name, src_dir_fd=folder, dst_dir_fd=folder)
    finally:
        os.close(folder)
