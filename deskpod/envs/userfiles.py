"""Files in folders an account controls, read and written by a process with more rights without being tricked.

The pod service runs as root and works in folders its users own: a job's folder (``jobs/<id>/``, the job's
account's, mode 0700), the run folders inside it, an account's environment cache. Whatever is at a path there is
the user's choice, made at any moment, so a path is not a file. Three tricks, and what stops each:

* **A link** (``output.log -> /etc/shadow``, or ``runs -> /root``): root following it reads or writes what the
  user could not. Every component of a path is opened relative to the folder before it with ``O_NOFOLLOW``, so a
  symbolic link anywhere on the way is refused, never followed (`open_beneath`); a file not owned by the folder's
  account is refused unless it is the daemon's own with a single link (a hard link to the admin's token has two).
* **A FIFO** (or a socket, a device node) where a regular file was: opening it for reading would block the
  daemon's thread forever. The last component is opened with ``O_NONBLOCK`` and refused unless it is a regular
  file (or, asked for, a folder).
* **A swap between a check and a use**: nothing here checks a path and then opens it again; the descriptor that
  was checked is the one read.

A refusal is a `RefusedFile`, an `OSError` (``EACCES``): callers that treat an unreadable file as missing keep
doing so, and one that shows the reason can (``output.log is a symbolic link``).

Writing goes the other way round (`write_no_follow`, `prepare_owned_dir`): the bytes go to a new file created
with ``O_EXCL|O_NOFOLLOW`` beside the target and are renamed over it, so a planted link is replaced, not written
through.
"""

from __future__ import annotations

import contextlib
import errno
import os
import stat
from pathlib import Path, PurePosixPath
from typing import TYPE_CHECKING

from deskpod.errors import RunError

if TYPE_CHECKING:
    from deskpod.envs.accounts import Account

PARENT_MODE = 0o711
"""Mode of the parent folders `prepare_owned_dir` creates: others may pass through to their own
folder (a job's folder under the pod's home) but not list who else has one."""

_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_FILE_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC


class RefusedFile(PermissionError):
    """A path in a folder someone else controls that is not what it must be: a link, a FIFO, another's file."""

    def __init__(self, path: str, why: str) -> None:
        super().__init__(errno.EACCES, f"{path} {why}", path)
        self.why = why

    def __str__(self) -> str:
        return str(self.args[1])


def _parts(rel: str | PurePosixPath) -> list[str]:
    parts = [p for p in PurePosixPath(rel).parts if p not in ("", ".")]
    if PurePosixPath(rel).is_absolute() or ".." in parts:
        raise RefusedFile(str(rel), "is not a path inside its folder (absolute, or with '..')")
    return parts


def _kind(mode: int) -> str:
    for test, name in ((stat.S_ISFIFO, "a FIFO"), (stat.S_ISSOCK, "a socket"), (stat.S_ISCHR, "a device"),
                       (stat.S_ISBLK, "a device"), (stat.S_ISLNK, "a symbolic link"),
                       (stat.S_ISDIR, "a folder")):  # fmt: skip
        if test(mode):
            return name
    return "not a regular file"


def _open_dir(name: str, dir_fd: int | None, shown: str) -> int:
    try:
        return os.open(name, _DIR_FLAGS, dir_fd=dir_fd)
    except OSError as e:
        if e.errno in (errno.ELOOP, errno.ENOTDIR):
            try:
                link = stat.S_ISLNK(os.lstat(name, dir_fd=dir_fd).st_mode)
            except OSError:
                link = False
            raise RefusedFile(shown, "is a symbolic link" if link else "is not a folder") from None
        raise


def check_owned(st: os.stat_result, shown: str, owner: int | None) -> None:
    """Refuse a file that is not ``owner``'s (the account whose folder it is in) nor this process's own with a
    single link. None: any owner (a folder this process trusts)."""
    if owner is None or st.st_uid == owner:
        return
    if st.st_uid == os.geteuid() and st.st_nlink == 1:
        return
    if st.st_uid == os.geteuid():
        raise RefusedFile(shown, f"has {st.st_nlink} hard links (a file of the pod's own has one)")
    raise RefusedFile(shown, f"belongs to uid {st.st_uid}, not to the folder's account (uid {owner})")


Folder = Path | str | int
"""A folder by its path (itself not a link; the folders above it are trusted) or by an open descriptor."""


def _start(folder: Folder) -> int:
    return os.dup(folder) if isinstance(folder, int) else _open_dir(str(folder), None, str(folder))


def _shown(folder: Folder, parts: list[str]) -> str:
    return "/".join(parts) if isinstance(folder, int) else str(Path(folder, *parts))


def open_beneath(folder: Folder, rel: str | PurePosixPath, *, owner: int | None = None,
                 directory: bool = False) -> int:  # fmt: skip
    """A read-only descriptor of ``folder/rel``: no symbolic link followed on the way (``folder`` itself
    included), never blocking on what is there, and a regular file (a folder with ``directory``) owned by
    ``owner`` or by this process (single-linked). `RefusedFile` when it is anything else; `FileNotFoundError` and
    friends as ``open`` raises them. The caller closes the descriptor."""
    parts = _parts(rel)
    shown = _shown(folder, parts)
    fd = _start(folder)
    try:
        for part in parts[:-1]:
            nxt = _open_dir(part, fd, shown)
            os.close(fd)
            fd = nxt
        if parts:
            return _open_last(parts[-1], fd, shown, owner=owner, directory=directory)
        if not directory:
            raise RefusedFile(shown, "is a folder, not a file")
        out, fd = fd, -1
        return _checked(out, shown, owner=owner, directory=True)
    finally:
        if fd >= 0:
            os.close(fd)


def _open_last(name: str, dir_fd: int, shown: str, *, owner: int | None, directory: bool) -> int:
    """``name`` in the folder ``dir_fd``, opened read-only without following a link or blocking, then `_checked`."""
    try:
        out = os.open(name, _FILE_FLAGS | (os.O_DIRECTORY if directory else 0), dir_fd=dir_fd)
    except OSError as e:
        if e.errno == errno.ELOOP:
            raise RefusedFile(shown, "is a symbolic link") from None
        if e.errno == errno.ENOTDIR and directory:
            raise RefusedFile(shown, "is not a folder") from None
        if e.errno == errno.ENXIO:  # a socket, or a device without its driver
            raise RefusedFile(shown, "is not a regular file") from None
        raise
    return _checked(out, shown, owner=owner, directory=directory)


def _checked(fd: int, shown: str, *, owner: int | None, directory: bool) -> int:
    """``fd`` when it is a regular file (a folder with ``directory``) that `check_owned` lets through; else it is
    closed and `RefusedFile` raised."""
    try:
        st = os.fstat(fd)
        wanted = stat.S_ISDIR(st.st_mode) if directory else stat.S_ISREG(st.st_mode)
        if not wanted:
            raise RefusedFile(shown, f"is {_kind(st.st_mode)}, not a {'folder' if directory else 'regular file'}")
        check_owned(st, shown, owner)
    except BaseException:
        os.close(fd)
        raise
    return fd


def read_beneath(folder: Folder, rel: str | PurePosixPath, *, owner: int | None = None,
                 limit: int | None = None, offset: int = 0) -> bytes:  # fmt: skip
    """The bytes of ``folder/rel`` (from ``offset``, at most ``limit``), opened as `open_beneath` does."""
    return _read_all(open_beneath(folder, rel, owner=owner), offset, limit)


def _read_all(fd: int, offset: int, limit: int | None) -> bytes:
    """Read the descriptor ``fd`` from ``offset`` (at most ``limit`` bytes), then close it."""
    try:
        out = bytearray()
        while limit is None or len(out) < limit:
            chunk = os.pread(fd, 1 << 20 if limit is None else min(1 << 20, limit - len(out)), offset + len(out))
            if not chunk:
                break
            out += chunk
        return bytes(out)
    finally:
        os.close(fd)


def stat_beneath(folder: Folder, rel: str | PurePosixPath) -> os.stat_result:
    """``lstat`` of ``folder/rel`` with no link followed on the way to it (the last component is not followed
    either: a link answers as a link)."""
    parts = _parts(rel)
    if not parts:
        return os.fstat(folder) if isinstance(folder, int) else os.lstat(folder)
    fd = _start(folder)
    try:
        for part in parts[:-1]:
            nxt = _open_dir(part, fd, _shown(folder, parts))
            os.close(fd)
            fd = nxt
        return os.stat(parts[-1], dir_fd=fd, follow_symlinks=False)
    finally:
        os.close(fd)


def scandir_beneath(folder: Folder, rel: str | PurePosixPath = ".", *,
                    owner: int | None = None) -> list[os.DirEntry[str]]:  # fmt: skip
    """The entries of the folder ``folder/rel`` (opened as `open_beneath` does), sorted by name. Each entry's
    ``is_file``/``is_dir`` must be asked with ``follow_symlinks=False``."""
    fd = open_beneath(folder, rel, owner=owner, directory=True)
    try:
        return _entries(fd)
    finally:
        os.close(fd)


MAX_LINKS = 40
"""Links of this process's own followed in one path at most (the kernel's own limit)."""


def _walk(path: Path | str) -> tuple[int, str, int | None, str]:
    """The folder descriptor, last name, owner and shown path of ``path`` as `open_path` reaches it."""
    me = os.geteuid()
    shown = os.path.abspath(path)
    todo = [p for p in PurePosixPath(shown).parts[1:]]
    if not todo:
        raise RefusedFile(shown, "is the root folder")
    fd = os.open("/", _DIR_FLAGS)
    owner: int | None = None
    links = 0
    try:
        while True:
            name = todo.pop(0)
            if name in ("", "."):
                continue
            if name == "..":
                if owner is not None:
                    raise RefusedFile(shown, "leads out of a folder of another account ('..')")
                up = os.open("..", _DIR_FLAGS, dir_fd=fd)
                os.close(fd)
                fd = up
                continue
            st = os.stat(name, dir_fd=fd, follow_symlinks=False)
            if stat.S_ISLNK(st.st_mode):
                if owner is not None or st.st_uid != me:  # only a link of this process's own, in its own folders
                    why = "is a symbolic link" if not todo else f"has a symbolic link on its way ({name})"
                    raise RefusedFile(shown, why)
                links += 1
                if links > MAX_LINKS:
                    raise OSError(errno.ELOOP, "too many symbolic links", shown)
                target = os.readlink(name, dir_fd=fd)
                if target.startswith("/"):
                    os.close(fd)
                    fd = os.open("/", _DIR_FLAGS)
                todo[:0] = [p for p in PurePosixPath(target).parts if p != "/"]
                continue
            if not todo:
                out, fd = fd, -1
                return out, name, owner, shown
            nxt = _open_dir(name, fd, shown)  # swapped for a link since the stat: refused
            os.close(fd)
            fd = nxt
            if owner is None and os.fstat(fd).st_uid != me:
                owner = os.fstat(fd).st_uid  # from here on, another account's folder
    finally:
        if fd >= 0:
            os.close(fd)


def open_path(path: Path | str, *, directory: bool = False) -> int:
    """A read-only descriptor of ``path`` (absolute), opened as a root daemon may when part of the way belongs to
    another account: a symbolic link is followed only where it is this process's own and lies in its own folders
    (the system's, the pod's home); from the first folder on the way that belongs to another account (a job's
    folder) no link is followed, and what is opened must be that account's or this process's own single-linked
    file (`check_owned`); it is never waited on (a FIFO is refused at once), and it is a regular file (a folder
    with ``directory``). `RefusedFile` otherwise; `FileNotFoundError` and friends as ``open`` raises them."""
    fd, name, owner, shown = _walk(path)
    try:
        return _open_last(name, fd, shown, owner=owner, directory=directory)
    finally:
        os.close(fd)


def read_path(path: Path | str, *, offset: int = 0, limit: int | None = None) -> bytes:
    """The bytes of ``path`` from ``offset`` (at most ``limit``), opened as `open_path` does."""
    return _read_all(open_path(path), offset, limit)


def stat_path(path: Path | str, *, directory: bool = False) -> os.stat_result | None:
    """``fstat`` of the regular file (or the folder, with ``directory``) ``path`` opened as `open_path` does; None
    when it is missing or refused."""
    try:
        fd = open_path(path, directory=directory)
    except OSError:
        return None
    try:
        return os.fstat(fd)
    finally:
        os.close(fd)


def scandir_path(path: Path | str) -> list[os.DirEntry[str]]:
    """The entries of the folder ``path`` (opened as `open_path` does), sorted by name; ask each entry's
    ``is_file``/``is_dir`` with ``follow_symlinks=False``. Empty when it is missing or refused."""
    try:
        fd = open_path(path, directory=True)
    except OSError:
        return []
    try:
        return _entries(fd)
    finally:
        os.close(fd)


def _entries(fd: int) -> list[os.DirEntry[str]]:
    """The entries of the open folder ``fd``, sorted by name, each with its ``lstat`` asked while ``fd`` is open: a
    `DirEntry` of a descriptor asks relative to it, and after the caller closes it the number may be another
    file's. (An entry whose ``lstat`` fails is left out.)"""
    out = []
    with os.scandir(fd) as it:
        for entry in it:
            try:
                entry.stat(follow_symlinks=False)  # cached on the entry: is_file/is_dir(follow_symlinks=False) use it
            except OSError:
                continue
            out.append(entry)
    return sorted(out, key=lambda e: e.name)


def folder_bytes(folder: Folder) -> int:
    """The disk space everything under ``folder`` takes (allocated blocks, a hard-linked file once), walked
    without following a link; what cannot be opened counts as nothing."""
    seen: set[tuple[int, int]] = set()
    total = 0
    try:
        stack = [_start(folder)]
    except OSError:
        return 0
    while stack:
        fd = stack.pop()
        try:
            with os.scandir(fd) as it:
                for entry in it:
                    try:
                        st = entry.stat(follow_symlinks=False)
                        if stat.S_ISDIR(st.st_mode):
                            stack.append(os.open(entry.name, _DIR_FLAGS, dir_fd=fd))
                    except OSError:
                        continue
                    if (st.st_dev, st.st_ino) not in seen:
                        seen.add((st.st_dev, st.st_ino))
                        total += st.st_blocks * 512
        except OSError:
            pass
        finally:
            os.close(fd)
    return total


def _open_dir_no_follow(path: Path) -> int:
    """An fd of the folder at ``path``; `RunError` when a symbolic link or something else is there."""
    try:
        return os.open(path, _DIR_FLAGS)
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


def write_no_follow(path: Path, data: bytes, mode: int = 0o644, owner: tuple[int, int] | None = None) -> None:
    """Write ``data`` to ``path`` (a file in a folder someone else may control) without following links.

    The bytes go to a temporary name beside it, created with ``O_CREAT|O_EXCL|O_NOFOLLOW`` relative to
    the folder's descriptor (itself opened with ``O_NOFOLLOW``), then renamed over ``path``: a symbolic
    link planted at either name is replaced, never written through. The file is owned by this process, or by
    ``owner`` (uid, gid) when given.
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
            if owner is not None:
                os.fchown(fd, *owner)
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view) :]
        finally:
            os.close(fd)
        os.replace(tmp, path.name, src_dir_fd=folder, dst_dir_fd=folder)
    finally:
        os.close(folder)
