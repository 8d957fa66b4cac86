"""Data staging: a dataset copied once to node-local scratch, checksummed, shared by the node's jobs, evicted LRU.

The DGX-1 had a 4×1.92 TB SSD RAID-0 cache for datasets; on a cluster node the same idea is a scratch folder.
`stage` copies a dataset (one file or a folder tree: an image folder, the Fashion-MNIST IDX files) into it once,
so the epochs read the local SSD instead of the shared file system::

    copy = stage(Path("/shared/imagenet"), Path("/raid/scratch"), limit_bytes=6 * 10**12, lease=job_id)
    ...  # train on copy.path
    release(copy)

Layout of a scratch folder (only `stage`, `release`, `evict` and `verify` write it)::

    scratch/
    ├── <key>/                        one staged copy, complete by construction: it is renamed into place
    │   ├── info.json                 source, bytes, files, when it was made (small: read by every eviction)
    │   ├── manifest.json             every folder, and every file's size, mtime and sha256
    │   ├── last_used                 its mtime is the copy's last use: the LRU clock
    │   ├── leases/<name>@<pid>.json  who uses it (pid + process start time); a dead pid is no lease
    │   └── data/                     the copy: the source folder's tree, or the one source file
    ├── .tmp-<key>-<pid>/             a copy in progress; owner.json holds pid, start time and the bytes it reserves
    ├── .evict-<key>-<ns>-<pid>/      a copy being deleted
    └── .locks/<key>.lock, .locks/scratch.lock

The key is ``<source name>-<16 hex>``: a sha256 of the source's resolved path and of every folder and every
file's (relative path, size, mtime_ns), so a changed, added or removed file gives a new key and a new copy; a
hit costs one walk of the source (stat only). Trust comes from the checksums: each file is hashed while it is
copied (read once, written once), its size and mtime are checked again after the copy (a file written during
staging is an error, not a silent mix), and `verify` re-hashes a copy against its manifest; ``stage(verify=True)``
re-copies the files found damaged. Copied files are read-only (0444) so a job does not change what others read.

Concurrency, with `fcntl.flock` (held by the open file, so a process that dies releases it):

- ``.locks/<key>.lock`` is held while a copy is checked, made, leased or repaired. Several jobs (or ranks) staging
  the same source at once: one copies, the others wait on the lock and then find the copy complete.
- ``.locks/scratch.lock`` is held while sizes are counted, copies evicted, room reserved and leftovers swept. It is
  always taken *after* a key lock; eviction only *tries* other keys' locks (a copy being staged or leased right now
  is skipped), so no two processes wait on each other.

Eviction deletes the least recently used copies (last ``stage`` or ``release``) that have no live lease, until the
new copy fits under ``limit_bytes`` (copies in progress count at their full size) and on the disk; it deletes nothing
when even evicting everything evictable would not be enough. Sizes are the files' bytes, not disk blocks.

A pod with ``--backend slurm`` lists what its default scratch folder has staged in its status (`StagedSources`:
the sources, read at most every few seconds), so that a fleet routes a job to the cluster that has its data.

Not done: fsync of each copied file (a node that crashes right after staging may keep a damaged copy:
``verify=True`` finds it); scratch shared between users (whoever evicts needs write access to every copy's folder).
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import math
import os
import re
import shutil
import stat
import threading
import time
from collections.abc import Iterator, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from deskpod.environment import Environment
from deskpod.environment.files import write_json
from deskpod.environment.sizes import format_bytes
from deskpod.errors import ConfigError, DataError, RunError
from deskpod.processes import alive, start_time

FORMAT = 1
ALGORITHM = "sha256"
CHUNK = 1 << 20
COPY_THREADS = 8
"""Files copied at once: a shared file system's per-file latency, not its bandwidth, bounds small-file copies."""
DATA_HELP = "fashion-mnist, synthetic[:CxHxW] (e.g. synthetic:3x224x224), or imagefolder:PATH"
_LEASE_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,99}")


@dataclass(frozen=True, slots=True)
class Staged:
    """A staged copy, as `stage` returns it."""

    key: str
    root: Path
    """``scratch/<key>``: the copy's folder (info, manifest, leases, data)."""
    path: Path
    """What to read: ``root/data`` for a folder source, ``root/data/<name>`` for a file source."""
    source: Path
    size: int
    """Bytes of the files staged."""
    copied: bool
    """True when this call made the copy; False when it was already staged (a hit)."""
    repaired: tuple[str, ...] = ()
    """Relative paths that ``verify=True`` found damaged and copied again."""
    lease: Path | None = None
    """This call's lease file; `release` removes it."""


@dataclass(frozen=True, slots=True)
class Lease:
    name: str
    pid: int


@dataclass(frozen=True, slots=True)
class StagedCopy:
    """One copy in a scratch folder, as `staged_list` shows it."""

    key: str
    source: Path
    path: Path
    size: int
    files: int
    last_used: float
    """Seconds since the epoch of the last `stage` or `release`."""
    leases: tuple[Lease, ...]
    """Live leases only: a lease whose process is gone does not count."""


@dataclass(frozen=True, slots=True)
class _Tree:
    """The source's identity: its folders and files (relative path, size, mtime_ns)."""

    source: Path
    kind: str  # "file" or "folder"
    dirs: tuple[str, ...]
    files: tuple[tuple[str, int, int], ...]

    @property
    def size(self) -> int:
        return sum(f[1] for f in self.files)

    def key(self) -> str:
        h = hashlib.sha256(f"deskpod-staging/{FORMAT}\n{self.source}\n{self.kind}\n".encode())
        for d in self.dirs:
            h.update(f"d\0{d}\n".encode())
        for rel, size, mtime in self.files:
            h.update(f"f\0{rel}\0{size}\0{mtime}\n".encode())
        slug = re.sub(r"[^A-Za-z0-9._-]+", "_", self.source.name).lstrip(".")[:48] or "data"
        return f"{slug}-{h.hexdigest()[:16]}"

    def read_path(self, root: Path) -> Path:
        return root / "data" / self.files[0][0] if self.kind == "file" else root / "data"

    def source_of(self, rel: str) -> Path:
        return self.source if self.kind == "file" else self.source / rel


# --------------------------------------------------------------------------- the public functions
def stage(
    source: Path,
    scratch: Path,
    *,
    limit_bytes: int | None = None,
    lease: str | None = None,
    lease_pid: int | None = None,
    verify: bool = False,
) -> Staged:
    """Copy ``source`` (a file or a folder) into ``scratch/<key>/data`` unless it is staged already.

    ``limit_bytes`` caps the bytes of all copies in ``scratch``: least recently used unleased copies are evicted
    to make room, and a `DataError` says why when the dataset cannot fit. ``lease`` (a name such as the job id)
    keeps the copy from eviction while process ``lease_pid`` (default: this one) runs, or until `release`.
    ``verify`` re-hashes an existing copy and copies again the files that do not match their checksums.
    """
    if limit_bytes is not None and (isinstance(limit_bytes, bool) or limit_bytes <= 0):
        raise ConfigError(f"staging limit {limit_bytes!r} bytes is not valid: give a positive number of bytes")
    holder = _lease_holder(lease, lease_pid)
    tree = _walk(source)
    scratch = _scratch_folder(scratch, tree.source)
    key = tree.key()
    root = scratch / key
    with _locked(scratch, key):
        with _locked(scratch, None):
            _sweep(scratch)
        if (root / "info.json").is_file():
            repaired = _repair(root, tree) if verify else ()
            _live_leases(root, drop_dead=True)
            lease_file = _write_lease(root, holder)
            _touch(root)
            return Staged(key, root, tree.read_path(root), tree.source, tree.size, False, repaired, lease_file)
        if root.exists():  # a folder without info.json was not made by `stage`: never trust it
            _remove(scratch, root)
        need = tree.size
        with _locked(scratch, None):
            _make_room(scratch, need, limit_bytes, key, tree.source)
            tmp = scratch / f".tmp-{key}-{os.getpid()}"
            tmp.mkdir()
            write_json(tmp / "owner.json", {"pid": os.getpid(), "start": start_time(os.getpid()), "bytes": need})
        try:
            _copy(tree, tmp)
            lease_file = _write_lease(tmp, holder)
            _touch(tmp)
            try:
                os.rename(tmp, root)
            except OSError as e:  # only a process that ignores the key's lock can have put something there
                raise RunError(f"cannot move the staged copy into {root}: {e.strerror}") from None
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
        lease_file = root / "leases" / lease_file.name if lease_file else None
        return Staged(key, root, tree.read_path(root), tree.source, need, True, (), lease_file)


def release(staged: Staged) -> None:
    """Drop the lease `stage` took (if any) and count this as the copy's last use."""
    if staged.lease is not None:
        staged.lease.unlink(missing_ok=True)
    with contextlib.suppress(FileNotFoundError):
        _touch(staged.root)


def verify(staged: Staged | Path) -> list[str]:
    """Re-hash a staged copy (a `Staged` or its ``scratch/<key>`` folder) against its manifest.

    Returns the relative paths that are wrong: a file damaged, missing or of another size, a folder missing, or
    something that the source did not have. An empty list means the copy is exactly what was staged.
    """
    root = staged.root if isinstance(staged, Staged) else staged
    manifest = _read_json(root / "manifest.json")
    data = root / "data"
    want_dirs = set(manifest["dirs"])
    want_files = {rel: (size, digest) for rel, size, _, digest in manifest["files"]}
    bad: list[str] = []
    have_dirs, have_files = set(), set()
    for dirpath, dirnames, filenames in os.walk(data):
        base = Path(dirpath).relative_to(data)
        for d in dirnames:
            have_dirs.add((base / d).as_posix())
        for f in filenames:
            have_files.add((base / f).as_posix())
    bad += sorted(want_dirs - have_dirs) + sorted((have_dirs - want_dirs) | (have_files - set(want_files)))
    for rel, (size, digest) in sorted(want_files.items()):
        p = data / rel
        if rel not in have_files or p.stat().st_size != size or _hash_file(p) != digest:
            bad.append(rel)
    return sorted(set(bad))


def staged_list(scratch: Path) -> list[StagedCopy]:
    """Every complete copy in ``scratch``, least recently used first (the order eviction takes them in)."""
    out = [c for c in (_read_copy(p) for p in _copy_folders(scratch)) if c is not None]
    return sorted(out, key=lambda c: (c.last_used, c.key))


class StagedSources:
    """The sources staged in one scratch folder, as a pod's status shows them (`deskpod.cluster.backend`): read
    with `staged_list` at most once every ``ttl`` seconds, since a status is asked often (a fleet's survey) and
    the answer changes only when a job stages or a copy is evicted. A scratch folder that does not exist, or that
    this user cannot read, has nothing staged."""

    def __init__(self, scratch: Path, *, ttl: float = 5.0) -> None:
        self.scratch, self.ttl = Path(scratch), ttl
        self._read_at = -math.inf
        self._sources: list[str] = []
        self._lock = threading.Lock()

    def sources(self) -> list[str]:
        """The staged copies' sources (resolved paths, each once, sorted)."""
        with self._lock:
            now = time.monotonic()
            if now - self._read_at >= self.ttl:
                try:
                    copies = staged_list(self.scratch)
                except OSError:  # unreadable (another user's, a dead mount): nothing this pod can count on
                    copies = []
                self._sources, self._read_at = sorted({str(c.source) for c in copies}), now
            return list(self._sources)


def evict(scratch: Path, limit_bytes: int) -> list[str]:
    """Delete least recently used unleased copies until all copies take at most ``limit_bytes``.

    ``limit_bytes=0`` deletes every copy without a live lease. Returns the keys deleted; copies that are leased,
    or being staged right now, stay (`staged_list` shows what is left).
    """
    if isinstance(limit_bytes, bool) or limit_bytes < 0:
        raise ConfigError(f"eviction limit {limit_bytes!r} bytes is not valid: give 0 or more bytes")
    if not scratch.is_dir():
        raise ConfigError(f"scratch folder {str(scratch)!r} does not exist")
    scratch = _scratch_folder(scratch, None)
    with _locked(scratch, None):
        _sweep(scratch)
        copies = staged_list(scratch)
        used = sum(c.size for c in copies)
        evicted: list[str] = []
        for c in copies:
            if used <= limit_bytes:
                break
            with _try_locked(scratch, c.key) as got:
                if got and not _live_leases(scratch / c.key):
                    _remove(scratch, scratch / c.key)
                    used -= c.size
                    evicted.append(c.key)
        return evicted


# --------------------------------------------------------------------------- deskpod's data names
def resolve_data_path(data: str, environ: Mapping[str, str] | None = None) -> Path | None:
    """The file or folder that staging ``data`` (a ``--data`` value of ``deskpod train``) would copy.

    ``imagefolder:PATH`` → PATH (its ``train``/``val`` subfolders, if any, come with it); ``fashion-mnist`` → the
    folder ``DESKPOD_FASHION_MNIST`` names; ``synthetic[:CxHxW]`` → None (nothing to read, nothing to stage).
    The same spelling rules as `deskpod.train.data.describe`.
    """
    kind = _data_kind(data)
    if kind == "fashion-mnist":
        return Environment.read(environ).fashion_mnist_dir
    if kind == "imagefolder":
        return Path(data.partition(":")[2]).expanduser()
    return None


def rewrite_data(data: str, staged_path: Path) -> tuple[str, dict[str, str]]:
    """The ``--data`` value and the environment variables that make a job read the staged copy.

    ``imagefolder:PATH`` → ``(imagefolder:<staged_path>, {})``; ``fashion-mnist`` →
    ``(fashion-mnist, {"DESKPOD_FASHION_MNIST": <staged_path>})``; synthetic data is returned unchanged.
    ``staged_path`` is `Staged.path`.
    """
    kind = _data_kind(data)
    if kind == "fashion-mnist":
        return data, {"DESKPOD_FASHION_MNIST": str(staged_path)}
    if kind == "imagefolder":
        return f"imagefolder:{staged_path}", {}
    return data, {}


def _data_kind(data: str) -> str:
    """``fashion-mnist``, ``synthetic`` or ``imagefolder``, spelled as `deskpod.train.data.describe` accepts them."""
    kind, _, arg = data.partition(":")
    if (kind == "fashion-mnist" and not arg) or kind == "synthetic" or (kind == "imagefolder" and arg):
        return kind
    if kind == "imagefolder":
        raise DataError(f"imagefolder path {arg!r} is empty; give imagefolder:PATH with class folders")
    raise DataError(f"unknown dataset {data!r}; valid: {DATA_HELP}")


# --------------------------------------------------------------------------- checking the input
def _lease_holder(lease: str | None, lease_pid: int | None) -> tuple[str, int, int] | None:
    if lease is None:
        if lease_pid is not None:
            raise ConfigError(f"lease_pid {lease_pid} given without a lease name")
        return None
    if not _LEASE_NAME.fullmatch(lease):
        raise ConfigError(
            f"lease name {lease!r} is not valid: use letters, digits, '.', '_' and '-' (e.g. a job id such as 4242)"
        )
    pid = os.getpid() if lease_pid is None else lease_pid
    started = start_time(pid)
    if started is None:
        raise ConfigError(f"lease pid {pid} is not a running process: a lease lasts while its process runs")
    return lease, pid, started


def _walk(source: Path) -> _Tree:
    """Stat every folder and file of the source; only regular files and folders may be in it."""
    try:
        src = Path(source).expanduser().resolve(strict=True)
        st = src.stat()
    except (FileNotFoundError, NotADirectoryError):
        raise DataError(f"dataset {str(source)!r} to stage does not exist") from None
    except OSError as e:
        raise DataError(f"dataset {str(source)!r} cannot be read: {e.strerror}") from None
    if stat.S_ISREG(st.st_mode):
        return _Tree(src, "file", (), ((src.name, st.st_size, st.st_mtime_ns),))
    if not stat.S_ISDIR(st.st_mode):
        raise DataError(f"dataset {str(source)!r} to stage is neither a file nor a folder")
    dirs: list[str] = []
    files: list[tuple[str, int, int]] = []
    seen: set[tuple[int, int]] = {(st.st_dev, st.st_ino)}

    def fail(e: OSError) -> None:
        raise DataError(f"dataset {str(source)!r}: cannot read {e.filename}: {e.strerror}")

    for dirpath, dirnames, filenames in os.walk(src, onerror=fail, followlinks=True):
        base = Path(dirpath)
        dirnames.sort()
        for d in dirnames:
            dst = (base / d).stat()
            if (dst.st_dev, dst.st_ino) in seen:
                raise DataError(f"dataset {str(source)!r}: {base / d} is a second way into a folder (a link loop?)")
            seen.add((dst.st_dev, dst.st_ino))
            dirs.append((base / d).relative_to(src).as_posix())
        for f in sorted(filenames):
            p = base / f
            try:
                fst = p.stat()
            except OSError as e:
                raise DataError(f"dataset {str(source)!r}: cannot read {p}: {e.strerror}") from None
            if not stat.S_ISREG(fst.st_mode):
                raise DataError(f"dataset {str(source)!r}: {p} is not a regular file; stage only files and folders")
            files.append((p.relative_to(src).as_posix(), fst.st_size, fst.st_mtime_ns))
    return _Tree(src, "folder", tuple(dirs), tuple(files))


def _scratch_folder(scratch: Path, source: Path | None) -> Path:
    """The scratch folder, created if missing, checked to be writable (by creating its lock folder)."""
    scratch = Path(scratch).expanduser().absolute()
    if scratch.exists() and not scratch.is_dir():
        raise ConfigError(f"scratch folder {str(scratch)!r} is not a folder")
    real = scratch.resolve()
    if source is not None and (real.is_relative_to(source) or source.is_relative_to(real)):
        raise ConfigError(f"scratch folder {str(scratch)!r} and dataset {str(source)!r} overlap: keep them apart")
    try:
        (scratch / ".locks").mkdir(parents=True, exist_ok=True)
        with open(scratch / ".locks" / "scratch.lock", "ab"):
            pass
    except OSError as e:
        raise ConfigError(
            f"scratch folder {str(scratch)!r} is not writable ({e.strerror}): give a node-local folder this user "
            "can write, e.g. /raid/scratch"
        ) from None
    if not os.access(scratch, os.W_OK | os.X_OK):
        raise ConfigError(
            f"scratch folder {str(scratch)!r} is not writable: give a node-local folder this user can write"
        )
    return real


# --------------------------------------------------------------------------- locks, leases, clock
@contextlib.contextmanager
def _locked(scratch: Path, key: str | None) -> Iterator[None]:
    """Hold a key's lock (or, with None, the scratch folder's) until the block ends; waits for it."""
    with open(scratch / ".locks" / f"{key or 'scratch'}.lock", "ab") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        yield  # closing the file releases the lock


@contextlib.contextmanager
def _try_locked(scratch: Path, key: str) -> Iterator[bool]:
    """Take a key's lock if no one holds it; yields whether it was taken. Never waits."""
    with open(scratch / ".locks" / f"{key}.lock", "ab") as f:
        try:
            fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            yield False
            return
        yield True


def _write_lease(root: Path, holder: tuple[str, int, int] | None) -> Path | None:
    if holder is None:
        return None
    name, pid, started = holder
    (root / "leases").mkdir(exist_ok=True)
    path = root / "leases" / f"{name}@{pid}.json"
    write_json(path, {"name": name, "pid": pid, "start": started, "created_ns": time.time_ns()})
    return path


def _live_leases(root: Path, *, drop_dead: bool = False) -> tuple[Lease, ...]:
    """The leases whose process still runs; ``drop_dead`` (under the key's lock) deletes the others' files."""
    live: list[Lease] = []
    for p in sorted((root / "leases").glob("*.json")):
        try:
            d = _read_json(p)
            if alive(int(d["pid"]), int(d["start"])):
                live.append(Lease(str(d["name"]), int(d["pid"])))
                continue
        except (OSError, ValueError, KeyError, TypeError):
            pass  # unreadable: no one can be shown to hold it (leases are written whole, then renamed)
        if drop_dead:
            p.unlink(missing_ok=True)
    return tuple(live)


def _touch(root: Path) -> None:
    now = time.time_ns()
    (root / "last_used").touch()
    os.utime(root / "last_used", ns=(now, now))


def _last_used(root: Path) -> int:
    try:
        return (root / "last_used").stat().st_mtime_ns
    except FileNotFoundError:
        return 0


# --------------------------------------------------------------------------- room: sweep and evict
def _copy_folders(scratch: Path) -> list[Path]:
    if not scratch.is_dir():
        return []
    return [p for p in scratch.iterdir() if not p.name.startswith(".") and (p / "info.json").is_file()]


def _read_copy(root: Path) -> StagedCopy | None:
    try:
        info = _read_json(root / "info.json")
    except (OSError, ValueError):
        return None
    data = root / "data"
    path = data / Path(info["source"]).name if info["kind"] == "file" else data
    return StagedCopy(root.name, Path(info["source"]), path, int(info["bytes"]), int(info["files"]),
                      _last_used(root) / 1e9, _live_leases(root))  # fmt: skip


def _sweep(scratch: Path) -> None:
    """Delete what dead processes left: copies in progress and copies being deleted. Under the scratch lock."""
    for p in scratch.iterdir():
        if p.name.startswith(".tmp-") or p.name.startswith(".evict-"):
            pid_text = p.name.rsplit("-", 1)[-1]
            started: int | None = None
            with contextlib.suppress(OSError, ValueError, KeyError, TypeError):
                started = int(_read_json(p / "owner.json")["start"])
            if not pid_text.isdigit() or not alive(int(pid_text), started):
                shutil.rmtree(p, ignore_errors=True)


def _reserved(scratch: Path) -> int:
    """Bytes that copies in progress (by live processes) will take."""
    total = 0
    for p in scratch.glob(".tmp-*"):
        with contextlib.suppress(OSError, ValueError, KeyError, TypeError):
            owner = _read_json(p / "owner.json")
            if alive(int(owner["pid"]), owner["start"]):
                total += int(owner["bytes"])
    return total


def _make_room(scratch: Path, need: int, limit: int | None, keep: str, source: Path) -> None:
    """Evict LRU unleased copies until ``need`` more bytes fit; raise, evicting nothing, when they cannot."""
    what = f"dataset {str(source)!r} ({format_bytes(need)})"
    if limit is not None and need > limit:
        raise DataError(f"{what} is larger than the staging limit of {format_bytes(limit)} in {scratch}")
    copies = [c for c in staged_list(scratch) if c.key != keep]
    used = sum(c.size for c in copies) + _reserved(scratch)
    free = shutil.disk_usage(scratch).free

    def fits(used: int, free: int) -> bool:
        return (limit is None or used + need <= limit) and need <= free

    if fits(used, free):
        return
    with contextlib.ExitStack() as stack:
        evictable = []
        for c in copies:  # oldest first; each lock is kept until the copies are gone or the attempt given up
            if stack.enter_context(_try_locked(scratch, c.key)) and not _live_leases(scratch / c.key):
                evictable.append(c)
        freed = sum(c.size for c in evictable)
        if not fits(used - freed, free + freed):
            held = used - freed
            limit_text = f"the staging limit of {format_bytes(limit)}" if limit is not None else "no staging limit"
            raise DataError(
                f"{what} does not fit in {scratch}: {format_bytes(held)} are held by copies in use or being staged, "
                f"{format_bytes(free)} free on the disk, {limit_text}; release or wait for those jobs, or stage elsewhere"
            )
        for c in evictable:
            _remove(scratch, scratch / c.key)
            used -= c.size
            if fits(used, shutil.disk_usage(scratch).free):
                return


def _remove(scratch: Path, root: Path) -> None:
    """Delete a copy: renamed aside first, so no one finds it half deleted."""
    gone = scratch / f".evict-{root.name}-{time.time_ns()}-{os.getpid()}"
    os.rename(root, gone)
    shutil.rmtree(gone, ignore_errors=True)


# --------------------------------------------------------------------------- copy, hash, repair
def _hash_file(path: Path) -> str:
    with open(path, "rb") as f:
        return hashlib.file_digest(f, ALGORITHM).hexdigest()


def _copy_file(src: Path, dst: Path, size: int, mtime_ns: int) -> str:
    """Copy one file, hashing what is read; it must still have the size and mtime it had when the key was made."""
    h = hashlib.new(ALGORITHM)
    written = 0
    try:
        fin = open(src, "rb")  # noqa: SIM115 - a failure to open the source is told apart from the scratch's
    except OSError as e:
        raise DataError(f"cannot read {src} to stage it: {e.strerror}") from None
    with fin:
        try:
            fout = open(dst, "xb")  # noqa: SIM115
        except OSError as e:
            raise RunError(f"cannot write {dst} while staging: {e.strerror}") from None
        with fout:
            while True:
                try:
                    chunk = fin.read(CHUNK)
                except OSError as e:
                    raise DataError(f"cannot read {src} to stage it: {e.strerror}") from None
                if not chunk:
                    break
                h.update(chunk)
                try:
                    fout.write(chunk)
                except OSError as e:
                    raise RunError(f"cannot write {dst} while staging: {e.strerror}") from None
                written += len(chunk)
        after = os.fstat(fin.fileno())
    if after.st_size != size or after.st_mtime_ns != mtime_ns or written != size:
        raise RunError(f"{src} changed while it was being staged; stage again once nothing writes the dataset")
    os.chmod(dst, 0o444)
    os.utime(dst, ns=(mtime_ns, mtime_ns))
    return h.hexdigest()


def _copy(tree: _Tree, tmp: Path) -> None:
    """Copy the tree into ``tmp/data`` and write its manifest and info."""
    data = tmp / "data"
    data.mkdir()
    for d in tree.dirs:
        (data / d).mkdir()
    with ThreadPoolExecutor(max_workers=max(1, min(COPY_THREADS, len(tree.files)))) as pool:
        digests = list(pool.map(lambda f: _copy_file(tree.source_of(f[0]), data / f[0], f[1], f[2]), tree.files))
    files = [[rel, size, mtime, digest] for (rel, size, mtime), digest in zip(tree.files, digests, strict=True)]
    write_json(
        tmp / "manifest.json", {"format": FORMAT, "algorithm": ALGORITHM, "dirs": list(tree.dirs), "files": files}
    )
    write_json(tmp / "info.json", {
        "format": FORMAT, "key": tree.key(), "source": str(tree.source), "kind": tree.kind, "bytes": tree.size,
        "files": len(tree.files), "dirs": len(tree.dirs), "created_ns": time.time_ns(), "algorithm": ALGORITHM,
    })  # fmt: skip


def _repair(root: Path, tree: _Tree) -> tuple[str, ...]:
    """Copy again, from the source, each file `verify` finds wrong; remove what the source does not have."""
    bad = verify(root)
    if not bad:
        return ()
    manifest = _read_json(root / "manifest.json")
    files = {rel: (size, mtime, digest) for rel, size, mtime, digest in manifest["files"]}
    data = root / "data"
    for rel in bad:
        p = data / rel
        if rel in manifest["dirs"]:
            p.mkdir(parents=True, exist_ok=True)
        elif rel not in files and p.is_dir() and not p.is_symlink():
            shutil.rmtree(p)
        elif rel not in files:
            p.unlink(missing_ok=True)
    for rel in bad:
        if rel in files:
            size, mtime, digest = files[rel]
            p = data / rel
            p.parent.mkdir(parents=True, exist_ok=True)
            part = p.with_name(f".{p.name}.repair-{os.getpid()}")
            part.unlink(missing_ok=True)
            try:
                got = _copy_file(tree.source_of(rel), part, size, mtime)
                if got != digest:
                    raise DataError(
                        f"{tree.source_of(rel)} no longer has the contents it was staged with (same size and mtime, "
                        f"another {ALGORITHM}); touch the file so that staging makes a new copy"
                    )
                os.replace(part, p)
            finally:
                part.unlink(missing_ok=True)
    return tuple(bad)


# --------------------------------------------------------------------------- small helpers
def _read_json(path: Path) -> Any:
    return json.loads(path.read_text())
