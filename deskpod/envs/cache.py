"""Environments built once, kept by the hash of what defines them, found again without installing anything.

The cache is a folder (``$DESKPOD_ENV_CACHE``, default ``$DESKPOD_HOME/envs``)::

    <root>/<key[:20]>/env/            the virtual environment a job runs in (env/bin/python)
                      meta.json       the ready marker: written last, atomically, once everything else is done
                      definition.json what is being built (written first, so a half-built folder can be named)
                      build.log       the installer's output
                      freeze.txt      ``uv pip freeze`` of the result: the exact environment a job ran in
                      requirements.txt / project/{pyproject.toml,uv.lock}   the copy it was built from
                      last_used       its mtime is when a job last started in it
    <root>/.locks/<key>.lock          exclusive while building or removing; shared while a job runs in it
    <root>/.resolved/<key>.txt        the exact packages a build resolved to (kept after a prune: a rebuild
                                      installs them offline from uv's cache, the same versions, no resolving)
    <root>/.uv-cache/                 uv's cache: envs are hardlinked from it, so a package is on disk once

The key is the sha256 of the definition (packages sorted; files by their contents), the interpreter's exact
version, implementation and platform, and the installer (uv, or pip where uv is missing). A folder without a
valid ``meta.json``, or whose ``env/bin/python`` or ``pyvenv.cfg`` is gone, is never used: `ensure` deletes it
and builds again. Two processes asking for the same new environment serialise on its lock: the first builds,
the second waits and finds it ready. A job holds the lock *shared* while it runs (`in_use`, or `flock` on
`in_use_lock_path` from any process), and `prune`/`remove` take it exclusive without waiting, so an environment
in use is never deleted. The pattern for a job start is: take the shared lock, then `lookup`; a None means it
was pruned or broken meanwhile, so release and `ensure`.

Sizes count each inode once (uv hardlinks files between environments and its cache) and leave out uv's cache,
which is reported on its own: removing environments frees their size, removing uv's cache (``uv cache clean``)
frees the rest, and environments keep working after it because their hardlinks hold the files.

Environments are per account. A build runs a user's code (an sdist's build backend) and can write anything into
what it builds, and uv's cache is hardlinked into environments, so two accounts never share a tree: on a pod
started by root, the jobs of OS account NAME build, as NAME and inside their sandbox, in their own complete
cache root ``<root>/users/<NAME>/`` (`account_root`, `EnvCache.for_account`), which NAME owns (mode 0700; the pod
makes it with `deskpod.envs.userfiles.prepare_owned_dir`). Jobs of one account share its environments. Jobs that
run as the daemon's own account use ``<root>`` itself. A cache is built in only by the account that owns its
root (`EnvCache.ensure` refuses anyone else, root included).

The root daemon still reads these trees (`lookup` before a job starts) and its admin lists, prunes and removes
in them (`entries`, `find`, `prune`, `remove`, `total_bytes` and `uv_cache_bytes` of the top-level cache cover
every account's tree, `EnvEntry.account` naming whose). Whatever is in a user's tree is that user's choice, made
at any moment, so every file operation there follows no link and waits on no FIFO: files are read with
`deskpod.envs.userfiles` (owner: the tree's account), lock files opened ``O_NOFOLLOW|O_NONBLOCK`` and refused
unless regular and the account's (a bad one is reported broken, and replaced, never written through, by
`prune`/`remove`), ``last_used`` touched through the folder's descriptor, sizes walked descriptor by descriptor,
and trees removed with ``shutil.rmtree`` relative to the cache's descriptor (which resists symlink attacks on
Linux). An environment with anything wrong in those places is ``broken``.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import functools
import hashlib
import json
import os
import re
import shutil
import stat
import subprocess
import time
from collections import Counter
from collections.abc import Collection, Iterator, Mapping
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import IO, Any

from deskpod.environment import Environment
from deskpod.environment.files import write_text
from deskpod.environment.sizes import UNITS
from deskpod.envs.definition import EnvDefinition, canonical_definition, parse_environment
from deskpod.envs.index import PackageSources, package_sources
from deskpod.envs.python import Interpreter, resolve_python
from deskpod.envs.userfiles import RefusedFile, check_owned, open_beneath, read_beneath, scandir_beneath, stat_beneath
from deskpod.errors import ConfigError, ConflictError, DeskpodError, NotFoundError, RunError, UsageError

KEY_DIR_CHARS = 20
KEY_DIR_RE = re.compile(f"^[0-9a-f]{{{KEY_DIR_CHARS}}}$")
KEY_RE = re.compile(r"^[0-9a-f]{64}$")
USERS_DIR = "users"
"""``<root>/users/<NAME>/``: the cache root of OS account NAME's environments."""
ACCOUNT_RE = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.-]{0,31}$")
"""An OS account's name, as it may name a folder (useradd's names, and more; never ``.``, ``..`` or a ``/``)."""
MAX_JSON_BYTES = 8 << 20
"""meta.json and definition.json hold a definition (two files of at most 1 MB, escaped); more is not ours."""
MAX_WALK_DEPTH = 64
"""How deep sizes are walked (a descriptor per level is held open); deeper folders are not counted."""
_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_LOCK_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC
META_SCHEMA = "deskpod.env/1"
STATES = ("ready", "building", "broken")
"""ready: meta.json valid and the env intact; building: its lock is held exclusive; broken: neither (a failed or
interrupted build, or a damaged env) — `ensure` rebuilds it, `prune` removes it."""
ANSI_RE = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")
CAUSE_MARKERS = ("caused by:", "cause:", "╰─▶", "├─▶", "│")
MAX_CAUSE_CHARS = 600
Step = tuple[str, list[str], dict[str, str], Path]
"""One installer command: (name for messages, argv, environment, working directory)."""


class EnvBuildError(RunError):
    """An environment that could not be built; the message is one line with the installer's own cause."""


def default_root(environ: Mapping[str, str] | None = None) -> Path:
    """``$DESKPOD_ENV_CACHE``, else ``$DESKPOD_HOME/envs``."""
    env = Environment.read(environ)
    return env.env_cache or env.home / "envs"


def account_root(root: Path | str, account: str) -> Path:
    """The cache root of OS account ``account``'s environments under the pod's cache ``root``:
    ``<root>/users/<account>``. `ConfigError` for a name that is not an account's (``..``, ``a/b``)."""
    if not ACCOUNT_RE.match(account):
        raise ConfigError(f"OS account {account!r}: not an account name (letters, digits, _ . -; at most 32,"
                          " not starting with . or -)")  # fmt: skip
    return Path(root).absolute() / USERS_DIR / account


def find_uv() -> str | None:
    """The uv executable: the one installed with deskpod (the ``uv`` package), else ``uv`` on PATH."""
    try:
        from uv import find_uv_bin

        return str(find_uv_bin())
    except (ImportError, FileNotFoundError):
        return shutil.which("uv")


@dataclass(frozen=True, slots=True)
class BuiltEnv:
    """A ready environment."""

    key: str
    path: Path
    """The virtual environment (``<root>/<key[:20]>/env``): what a job's PATH and VIRTUAL_ENV point at."""
    python: Path
    """``env/bin/python``."""
    bin_dir: Path
    built: bool
    """True when this call built it; False when it was found ready."""
    seconds: float
    """Time this call spent building or waiting for another build (0 when found ready at once)."""
    freeze: Path
    """``freeze.txt``: the exact packages; the run folder keeps a copy."""

    @property
    def folder(self) -> Path:
        return self.path.parent

    @property
    def inputs(self) -> list[Path]:
        """What it was built from (requirements.txt; project/pyproject.toml and uv.lock): with `freeze`, what a
        run folder keeps of the exact environment a job ran in."""
        names = ("requirements.txt", "project/pyproject.toml", "project/uv.lock")
        return [self.folder / n for n in names if _is_file_beneath(self.folder, n)]

    def to_json(self) -> dict[str, Any]:
        paths = {k: str(v) if isinstance(v, Path) else v for k, v in asdict(self).items()}
        return {**paths, "seconds": round(self.seconds, 3)}


@dataclass(frozen=True, slots=True)
class EnvEntry:
    """One folder of the cache, as `EnvCache.entries` sees it."""

    key: str
    folder: Path
    kind: str
    summary: str
    """What defines it, in one short line (`EnvDefinition.summary`)."""
    python: str
    size_bytes: int
    created: float | None
    last_used: float | None
    state: str
    """One of `STATES`."""
    in_use: bool
    """A job holds its lock shared (or it is being built or removed)."""
    account: str = ""
    """Whose it is: the OS account of its tree (``users/<account>``); "" for the cache's own root (the jobs that
    run as the daemon's account)."""

    def to_json(self) -> dict[str, Any]:
        return {**asdict(self), "folder": str(self.folder)}


class EnvCache:
    """The cache of environments under ``root`` (default `default_root`)."""

    def __init__(self, root: Path | None = None, *, sources: PackageSources | None = None,
                 installer: str | None = None, account: str = "") -> None:  # fmt: skip
        """``sources``: where packages come from (default: pip's configuration, `package_sources`);
        ``installer``: ``"uv"`` or ``"pip"`` (default: uv when it is installed); ``account``: the OS account whose
        tree ``root`` is, for listings (`for_account` sets it)."""
        self.root = (Path(root) if root is not None else default_root()).absolute()
        self.account = account
        self._sources = sources
        self._uv = find_uv()
        self.installer = installer or ("uv" if self._uv else "pip")
        if self.installer not in ("uv", "pip") or (self.installer == "uv" and not self._uv):
            raise ConfigError(f"installer {self.installer!r}: use uv (when installed) or pip")

    @classmethod
    def for_account(cls, root: Path | str, account: str, *, sources: PackageSources | None = None,
                    installer: str | None = None) -> EnvCache:  # fmt: skip
        """The cache of OS account ``account``'s environments under the pod's cache ``root`` (`account_root`)."""
        return cls(account_root(root, account), sources=sources, installer=installer, account=account)

    # -- where things are ---------------------------------------------------------------------------------
    @property
    def owner(self) -> int | None:
        """The uid that owns the root folder: the account whose tree this is (its files are trusted to be its
        own, nobody else's); None while there is no root folder."""
        try:
            return os.lstat(self.root).st_uid
        except OSError:
            return None

    def trees(self) -> list[EnvCache]:
        """This cache, then (for a cache that is no account's own) each account's under ``users/``, by name."""
        out = [self]
        if self.account:
            return out
        try:
            found = scandir_beneath(self.root, USERS_DIR, owner=self.owner)
        except OSError:
            return out
        for entry in found:
            if ACCOUNT_RE.match(entry.name) and entry.is_dir(follow_symlinks=False):
                out.append(EnvCache.for_account(self.root, entry.name, sources=self._sources, installer=self.installer))
        return out

    @property
    def uv_cache(self) -> Path:
        return self.root / ".uv-cache"

    def folder(self, key: str) -> Path:
        return self.root / key[:KEY_DIR_CHARS]

    def in_use_lock_path(self, key: str) -> Path:
        """The lock a job holds shared while it runs in the environment (`flock(fd, LOCK_SH)`)."""
        return self.root / ".locks" / f"{key[:KEY_DIR_CHARS]}.lock"

    @property
    def sources(self) -> PackageSources:
        if self._sources is None:
            self._sources = package_sources()
        return self._sources

    # -- keys and lookups -----------------------------------------------------------------------------------
    def key(self, defn: EnvDefinition, interp: Interpreter) -> str:
        """The sha256 (hex) of what defines the environment, the interpreter and the installer."""
        doc = {
            "definition": canonical_definition(defn),  # the interpreter below is what the request resolved to
            "python": {"version": interp.version, "implementation": interp.implementation, "platform": interp.platform},
            "installer": self.installer,
        }
        return hashlib.sha256(json.dumps(doc, sort_keys=True, separators=(",", ":")).encode()).hexdigest()

    def lookup(self, defn: EnvDefinition, interp: Interpreter | None = None) -> BuiltEnv | None:
        """The ready environment for ``defn``, or None. Runs nothing (the interpreter list is found once per
        process); reads one small file and looks at three paths, none followed (safe in an account's tree)."""
        if defn.kind == "image":
            return None
        interp = interp or resolve_python(defn.python)
        key = self.key(defn, interp)
        return self._ready(key)

    def _ready(self, key: str) -> BuiltEnv | None:
        name = key[:KEY_DIR_CHARS]
        meta = self._read_json(f"{name}/meta.json")
        if meta is None or meta.get("key") != key or not self._intact(name) or not self._lock_sound(name):
            return None
        env = self.folder(key) / "env"
        return BuiltEnv(key, env, env / "bin" / "python", env / "bin", False, 0.0, self.folder(key) / "freeze.txt")

    def _ours(self) -> bool:
        """Whether this process owns the tree (it may follow what is in it: nobody else put it there)."""
        return self.owner in (None, os.geteuid())

    def _read_json(self, rel: str) -> dict[str, Any] | None:
        try:
            data = json.loads(read_beneath(self.root, rel, owner=self.owner, limit=MAX_JSON_BYTES))
        except (OSError, ValueError, RecursionError):  # RecursionError: JSON nested a thousand deep
            return None
        return data if isinstance(data, dict) else None

    def read(self, key: str, name: str, *, limit: int = MAX_JSON_BYTES) -> bytes | None:
        """The bytes (at most ``limit``) of file ``name`` of environment ``key``'s folder (``freeze.txt``,
        ``meta.json``), read as `deskpod.envs.userfiles` does; None when it is missing or not a file of the tree's."""
        try:
            return read_beneath(self.root, f"{key[:KEY_DIR_CHARS]}/{name}", owner=self.owner, limit=limit)
        except OSError:
            return None

    def _intact(self, name: str) -> bool:
        """``env/bin/python`` (a link to the interpreter, or a copy) and ``env/pyvenv.cfg`` are there. In the tree of
        another account the link's target is not looked at: root following it would tell that account whether a
        path it cannot see exists."""
        try:
            python = stat_beneath(self.root, f"{name}/env/bin/python")
            cfg = stat_beneath(self.root, f"{name}/env/pyvenv.cfg")
        except OSError:
            return False
        if not stat.S_ISREG(cfg.st_mode) or not (stat.S_ISREG(python.st_mode) or stat.S_ISLNK(python.st_mode)):
            return False
        return (
            not stat.S_ISLNK(python.st_mode) or not self._ours() or os.path.exists(self.root / name / "env/bin/python")
        )

    def _lock_sound(self, name: str) -> bool:
        """The lock file is missing (made when first taken) or a regular file of the tree's account."""
        try:
            st = stat_beneath(self.root, f".locks/{name}.lock")
            if not stat.S_ISREG(st.st_mode):
                return False
            check_owned(st, name, self.owner)
        except FileNotFoundError:
            return True
        except OSError:
            return False
        return True

    def touch(self, key: str) -> None:
        """Record that a job starts in the environment now (the ``last_used`` file's mtime): through the folder's
        descriptor, a link at ``last_used`` is touched itself, never followed, and a missing file is made."""
        with contextlib.suppress(OSError):
            fd = open_beneath(self.root, key[:KEY_DIR_CHARS], owner=self.owner, directory=True)
            try:
                try:
                    os.utime("last_used", dir_fd=fd, follow_symlinks=False)
                except FileNotFoundError:
                    made = os.open("last_used", os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC,
                                   0o644, dir_fd=fd)  # fmt: skip
                    try:
                        self._give(made, fd)
                    finally:
                        os.close(made)
            finally:
                os.close(fd)

    @contextlib.contextmanager
    def in_use(self, key: str) -> Iterator[None]:
        """Hold the environment's lock shared for the ``with`` block: `prune` and `remove` leave it alone."""
        fd = self.open_lock(key)
        try:
            fcntl.flock(fd, fcntl.LOCK_SH)
            yield
        finally:
            os.close(fd)

    def open_lock(self, key: str, *, replace_bad: bool = False) -> int:
        """A descriptor of the environment's lock file (for ``flock``), made (with ``.locks``) when missing: safe
        for root in an account's tree, where a link, FIFO or another's file at that name is refused (`RefusedFile`),
        or with ``replace_bad`` unlinked and replaced; see `_lock`. The caller closes it."""
        fd = self._lock(key, create=True, replace_bad=replace_bad)
        assert fd is not None
        return fd

    def _lock(self, key: str, *, create: bool, replace_bad: bool = False) -> int | None:
        """A descriptor of the environment's lock file, opened without following a link or waiting on a FIFO, and
        refused (`RefusedFile`) unless it is a regular file of the tree's account. ``create``: make ``.locks`` and
        the file when missing (else None); ``replace_bad``: a link, FIFO or another's file there is unlinked (the
        name, never what it points at) and a new file made in its place."""
        name = f"{key[:KEY_DIR_CHARS]}.lock"
        shown = str(self.in_use_lock_path(key))
        locks = self._locks_dir(create=create, replace_bad=replace_bad)
        if locks is None:
            return None
        try:
            for attempt in (1, 2):
                try:
                    fd = os.open(name, _LOCK_FLAGS, dir_fd=locks)
                except FileNotFoundError:
                    if not create:
                        return None
                    try:
                        fd = os.open(name, _LOCK_FLAGS | os.O_CREAT | os.O_EXCL, 0o644, dir_fd=locks)
                    except FileExistsError:
                        continue  # made meanwhile: open that one
                    try:
                        self._give(fd, locks)
                    except OSError:
                        os.close(fd)
                        raise
                except OSError as e:
                    if e.errno not in (errno.ELOOP, errno.ENXIO):
                        raise
                    if not (replace_bad and attempt == 1):
                        raise RefusedFile(shown, "is a symbolic link" if e.errno == errno.ELOOP else
                                          "is not a regular file") from None  # fmt: skip
                    os.unlink(name, dir_fd=locks)
                    continue
                try:
                    st = os.fstat(fd)
                    if not stat.S_ISREG(st.st_mode):
                        raise RefusedFile(shown, "is not a regular file")
                    check_owned(st, shown, self.owner)
                except RefusedFile:
                    os.close(fd)
                    if not (replace_bad and attempt == 1):
                        raise
                    os.unlink(name, dir_fd=locks)
                    continue
                return fd
            raise RefusedFile(shown, "was replaced again while it was being replaced")
        finally:
            os.close(locks)

    def _locks_dir(self, *, create: bool, replace_bad: bool) -> int | None:
        """A descriptor of ``<root>/.locks`` (no link followed), made when missing with ``create``; with
        ``replace_bad``, a link or file planted at its name is unlinked first."""
        try:
            return open_beneath(self.root, ".locks", owner=self.owner, directory=True)
        except FileNotFoundError:
            if not create:
                return None
        except RefusedFile:
            if not replace_bad:
                raise
        root = open_beneath(self.root, ".", owner=self.owner, directory=True)
        try:
            if replace_bad and not _is_dir_at(root, ".locks"):
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(".locks", dir_fd=root)
            with contextlib.suppress(FileExistsError):
                os.mkdir(".locks", 0o755, dir_fd=root)
                made = os.open(".locks", _DIR_FLAGS, dir_fd=root)
                try:
                    self._give(made, root)
                finally:
                    os.close(made)
        finally:
            os.close(root)
        return open_beneath(self.root, ".locks", owner=self.owner, directory=True)

    def _give(self, fd: int, folder_fd: int) -> None:
        """Give a file this process made in the tree to the account that owns the folder it is in (root making a
        lock or ``last_used`` in an account's tree), so that the tree stays wholly the account's."""
        st = os.fstat(folder_fd)
        if os.geteuid() == 0 and st.st_uid != 0:
            os.fchown(fd, st.st_uid, st.st_gid)

    # -- building -------------------------------------------------------------------------------------------
    def ensure(self, defn: EnvDefinition, *, log: IO[bytes], interp: Interpreter | None = None) -> BuiltEnv:
        """The ready environment for ``defn``, built now if it is not in the cache (output streamed to ``log``
        and to ``build.log``). Raises `EnvBuildError` (one line, the installer's cause) when the build fails,
        leaving no ready environment; `ConfigError` for what cannot be built here (an image; a lock without uv)."""
        if defn.kind == "image":
            raise ConfigError(f"job spec: environment.image {defn.image!r} runs in a container; it is not built"
                              " into the environment cache")  # fmt: skip
        if defn.kind == "lock" and self.installer != "uv":
            raise ConfigError("job spec: environment.lock needs uv on this box (pip cannot install from a uv.lock);"
                              " install it (pip install uv) or use requirements")  # fmt: skip
        owner = self.owner
        if owner is not None and owner != os.geteuid():
            raise RunError(f"the environment cache {self.root} is uid {owner}'s: its environments are built by that"
                           f" account only, not by uid {os.geteuid()} (a cache two accounts share would let one change"
                           " what the other runs); use a cache of your own (--cache, DESKPOD_ENV_CACHE)")  # fmt: skip
        if owner is None:
            self.root.mkdir(parents=True, exist_ok=True)
        start = time.monotonic()
        interp = interp or resolve_python(defn.python)
        key = self.key(defn, interp)
        found = self._ready(key)
        if found is not None:
            _say(log, f"deskpod: environment {key[:KEY_DIR_CHARS]} is ready ({defn.summary()}); nothing to install")
            self.touch(key)
            return found
        fd = self.open_lock(key, replace_bad=True)
        try:
            if not _try_flock(fd, fcntl.LOCK_EX):
                _say(log, f"deskpod: environment {key[:KEY_DIR_CHARS]} is being built by another job; waiting for it")
                fcntl.flock(fd, fcntl.LOCK_EX)
            found = self._ready(key)
            if found is not None:
                _say(log, f"deskpod: environment {key[:KEY_DIR_CHARS]} is ready ({defn.summary()}); nothing to install")
                self.touch(key)
                return replace(found, seconds=time.monotonic() - start)
            folder = self.folder(key)
            if os.path.lexists(folder):
                _say(log, f"deskpod: removing a half-built or broken environment {folder}")
                self._delete(folder.name)
            self._build(defn, interp, key, log, fd, start)
            self.touch(key)
            built = self._ready(key)
            if built is None:  # the build said it finished but left something unusable
                raise EnvBuildError(f"environment {key[:12]} was built but is not intact (env/bin/python missing)")
            return replace(built, built=True, seconds=time.monotonic() - start)
        finally:
            os.close(fd)  # releases the lock

    def _build(self, defn: EnvDefinition, interp: Interpreter, key: str, log: IO[bytes], lock_fd: int,
               start: float) -> None:  # fmt: skip
        folder = self.folder(key)
        env_dir = folder / "env"
        folder.mkdir(parents=True)
        _write_json(folder / "definition.json", {"key": key, "definition": defn.to_json(), "python": interp.to_json(),
                                                 "installer": self.installer, "started": time.time()})  # fmt: skip
        with open(folder / "build.log", "wb") as build_log:
            out = _Tee(log, build_log)
            installer = self._installer_name()
            out.line(f"deskpod: building environment {key[:KEY_DIR_CHARS]} ({defn.summary()}) on Python"
                     f" {interp.version} ({interp.path}) with {installer}")  # fmt: skip
            try:
                steps = self._steps(defn, interp, folder)
                if self._replay(steps[0], key, env_dir, out, lock_fd):
                    freeze = self.resolved_path(key).read_text()  # `uv pip sync` installed exactly this
                else:
                    for name, argv, env, cwd in steps:
                        _run_step(name, argv, env, cwd, out, lock_fd)
                    freeze = self._freeze(env_dir, folder)
                (folder / "freeze.txt").write_text(freeze)
                if self.installer == "uv" and defn.kind != "lock":
                    self.resolved_path(key).parent.mkdir(exist_ok=True)
                    self.resolved_path(key).write_text(freeze)
            except EnvBuildError as e:
                out.line(f"deskpod: {e}")
                shutil.rmtree(env_dir, ignore_errors=True)  # build.log and definition.json stay, for `env show`
                raise
            except (OSError, subprocess.SubprocessError) as e:
                out.line(f"deskpod: environment build failed: {e}")
                shutil.rmtree(env_dir, ignore_errors=True)
                raise EnvBuildError(f"environment build failed: {e}") from e
            seconds = time.monotonic() - start
            size = sum(_inodes(self.root, folder.name).values())
            out.line(f"deskpod: environment {key[:KEY_DIR_CHARS]} built in {seconds:.1f} s ({format_size(size)})")
        _write_json(folder / "meta.json", {
            "schema": META_SCHEMA, "key": key, "definition": defn.to_json(), "python": interp.to_json(),
            "installer": installer, "created": time.time(), "built_s": round(seconds, 3), "size_bytes": size,
        })  # fmt: skip

    def resolved_path(self, key: str) -> Path:
        """The exact package set a build of ``key`` resolved to, kept after the environment is pruned, so that
        a rebuild installs the same versions from uv's cache without resolving (or reaching an index) again."""
        return self.root / ".resolved" / f"{key[:KEY_DIR_CHARS]}.txt"

    def _replay(self, venv: Step, key: str, env_dir: Path, out: _Tee, lock_fd: int) -> bool:
        """Rebuild ``key`` from its recorded resolution, offline (`uv pip sync --offline`); False when there is
        none or uv's cache no longer has every file (the caller then builds from the definition)."""
        resolved = self.resolved_path(key)
        if self.installer != "uv" or self._uv is None or not resolved.is_file():
            return False
        name, argv, env, cwd = venv
        _run_step(name, argv, env, cwd, out, lock_fd)
        sync = [self._uv, "pip", "sync", "--offline", "--python", str(env_dir / "bin" / "python"), str(resolved)]
        try:
            _run_step("uv pip sync --offline", sync, env, cwd, out, lock_fd)
        except EnvBuildError as e:
            out.line(f"deskpod: the recorded resolution cannot be installed offline ({e}); resolving again")
            shutil.rmtree(env_dir, ignore_errors=True)
            return False
        out.line(f"deskpod: installed the recorded resolution of {key[:KEY_DIR_CHARS]} from uv's cache, offline")
        return True

    def _installer_name(self) -> str:
        """``uv 0.13.9`` or ``pip``, for the log and meta.json."""
        if self.installer == "pip":
            return "pip (python -m venv)"
        assert self._uv is not None
        return _uv_version(self._uv)

    def _environ(self) -> dict[str, str]:
        """The installer's environment: ours, pip's sources for uv (an admin's own UV_* variables win), and the
        cache's own uv cache."""
        env = dict(os.environ)
        for k, v in self.sources.uv_environment().items():
            env.setdefault(k, v)
        env.setdefault("UV_LINK_MODE", "hardlink")
        env.update({"UV_CACHE_DIR": str(self.uv_cache), "UV_PYTHON_DOWNLOADS": "never", "NO_COLOR": "1",
                    "UV_NO_PROGRESS": "1", "PIP_NO_INPUT": "1", "PIP_PROGRESS_BAR": "off"})  # fmt: skip
        for k in ("VIRTUAL_ENV", "CONDA_PREFIX", "PYTHONPATH", "PYTHONHOME", "UV_PROJECT_ENVIRONMENT"):
            env.pop(k, None)
        return env

    def _steps(self, defn: EnvDefinition, interp: Interpreter, folder: Path) -> list[Step]:
        """What to run, in order: (name, argv, environment, cwd). The inputs are written into ``folder`` here."""
        env = self._environ()
        env_dir = folder / "env"
        py = str(env_dir / "bin" / "python")
        if self.installer == "pip":
            venv: Step = ("python -m venv", [str(interp.path), "-m", "venv", str(env_dir)], env, folder)
        else:
            assert self._uv is not None
            uv = self._uv
            venv = ("uv venv", [uv, "venv", "--no-project", "--python", str(interp.path), str(env_dir)], env, folder)
        if defn.pyproject is not None:
            (folder / "project").mkdir()
            (folder / "project" / "pyproject.toml").write_text(defn.pyproject.text)
        if defn.kind == "lock":
            assert defn.lock is not None
            (folder / "project" / "uv.lock").write_text(defn.lock.text)
            project = str(folder / "project")
            sync = [uv, "sync", "--frozen", "--no-install-project", "--project", project, "--python", py]
            return [venv, ("uv sync", sync, {**env, "UV_PROJECT_ENVIRONMENT": str(env_dir)}, folder)]
        requirements = folder / "requirements.txt"
        requirements.write_text(defn.requirements_text())
        if self.installer == "pip":
            return [venv, ("pip install", [py, "-m", "pip", "install", "-r", str(requirements)], env, folder)]
        install = [uv, "pip", "install", "--python", py, *self.sources.uv_arguments(), "-r", str(requirements)]
        return [venv, ("uv pip install", install, env, folder)]

    def _freeze(self, env_dir: Path, folder: Path) -> str:
        py = str(env_dir / "bin" / "python")
        if self.installer == "uv":
            assert self._uv is not None
            name, argv = "uv pip freeze", [self._uv, "pip", "freeze", "--python", py]
        else:
            name, argv = "pip freeze", [py, "-m", "pip", "freeze"]
        p = subprocess.run(argv, cwd=folder, env=self._environ(), capture_output=True, text=True, timeout=120)
        if p.returncode != 0:
            raise EnvBuildError(f"environment build failed ({name}): {installer_cause(p.stderr + p.stdout)}")
        return p.stdout

    # -- listing and cleaning -------------------------------------------------------------------------------
    def entries(self) -> list[EnvEntry]:
        """Every environment folder of the cache, and of every account's (`trees`), oldest use first."""
        out = [tree._entry(name, _inodes(tree.root, name)) for tree in self.trees() for name in tree._names()]
        return sorted(out, key=lambda e: (e.last_used or e.created or 0.0, e.key, e.account))

    def _names(self) -> list[str]:
        """The names of the environment folders (``<key[:20]>``) in the root; whatever is at such a name, a link or
        a file included (that is a broken environment, for `prune` to remove)."""
        try:
            found = scandir_beneath(self.root, ".", owner=self.owner)
        except OSError:
            return []
        return [e.name for e in found if KEY_DIR_RE.match(e.name)]

    def _entry(self, name: str, inodes: dict[tuple[int, int], int]) -> EnvEntry:
        meta = self._read_json(f"{name}/meta.json")
        started = meta or self._read_json(f"{name}/definition.json") or {}
        key = started.get("key")
        if not isinstance(key, str) or not KEY_RE.match(key) or not key.startswith(name):
            key = name  # what a file in the folder says is no path to anything
        sound = self._lock_sound(name)
        ready = meta is not None and key == meta.get("key") and self._intact(name) and sound
        held = self._held(name) if sound else None
        state = "ready" if ready else "building" if held == "exclusive" else "broken"
        summary, kind = "?", "?"
        with contextlib.suppress(DeskpodError, TypeError, ValueError, RecursionError):
            defn = parse_environment(started.get("definition"))
            summary, kind = defn.summary(), defn.kind
        python = started.get("python")
        try:
            last_used: float | None = stat_beneath(self.root, f"{name}/last_used").st_mtime
        except OSError:
            last_used = None
        created = meta.get("created") if meta else None
        return EnvEntry(key=key, folder=self.root / name, kind=kind, summary=summary,
                        python=str(python.get("version", "?")) if isinstance(python, dict) else "?",
                        size_bytes=sum(inodes.values()),
                        created=float(created) if isinstance(created, (int, float)) else None,
                        last_used=last_used, state=state, in_use=held is not None, account=self.account)  # fmt: skip

    def _held(self, key: str) -> str | None:
        """Whether another holds the lock: ``"exclusive"`` (building, removing), ``"shared"`` (a job), or None."""
        try:
            fd = self._lock(key, create=False)
        except OSError:
            return None
        if fd is None:
            return None
        try:
            if not _try_flock(fd, fcntl.LOCK_SH):
                return "exclusive"
            fcntl.flock(fd, fcntl.LOCK_UN)
            return None if _try_flock(fd, fcntl.LOCK_EX) else "shared"
        finally:
            os.close(fd)

    def find(self, prefix: str, account: str | None = None) -> EnvEntry:
        """The entry whose key starts with ``prefix``, in any account's tree (or in ``account``'s: "" for the
        cache's own); `NotFoundError` or `UsageError` (ambiguous) otherwise."""
        prefix = prefix.strip().lower()
        if not re.fullmatch(r"[0-9a-f]{1,64}", prefix):
            raise UsageError(f"environment {prefix!r}: expected a key or its first characters (hex), as"
                             " `deskpod env list` shows them")  # fmt: skip
        trees = [t for t in self.trees() if account is None or t.account == account]
        found = [
            e
            for tree in trees
            for e in (
                tree._entry(n, _inodes(tree.root, n)) for n in tree._names() if n.startswith(prefix[:KEY_DIR_CHARS])
            )
            if e.key.startswith(prefix)
        ]
        whose = "" if account is None else f" of account {account!r}" if account else " of the pod's own account"
        if not found:
            raise NotFoundError(f"no environment {prefix!r}{whose} in {self.root}; `deskpod env list` shows them")
        if len(found) > 1:
            shown = ", ".join(e.key[:12] + (f" ({e.account})" if e.account else "") for e in found)
            raise UsageError(f"environment {prefix!r} is ambiguous: {shown}; give more characters, or the account"
                             " (--account NAME)")  # fmt: skip
        return found[0]

    def tree(self, account: str) -> EnvCache:
        """The cache of ``account``'s environments ("" : this one), as `trees` finds it."""
        for tree in self.trees():
            if tree.account == account:
                return tree
        raise NotFoundError(f"no environments of OS account {account!r} in {self.root}")

    def remove(self, key: str, account: str | None = None) -> EnvEntry:
        """Delete one environment (by key or prefix, as `find`); `ConflictError` while a job uses it or it is being
        built. A bad lock file (a link, a FIFO) is replaced, not followed."""
        entry = self.find(key, account)
        tree = self.tree(entry.account)
        fd = tree.open_lock(entry.key, replace_bad=True)
        try:
            if not _try_flock(fd, fcntl.LOCK_EX):
                raise ConflictError(f"environment {entry.key[:12]} is in use by a running job (or being built);"
                                    " remove it when that is done")  # fmt: skip
            tree._delete(entry.folder.name)
        finally:
            os.close(fd)
        return entry

    def _delete(self, name: str, *, ignore_errors: bool = False) -> None:
        """Remove the folder ``name`` of the root (or the link or file there) without following any link in it:
        ``shutil.rmtree`` relative to the root's descriptor, which on Linux opens each folder with ``O_NOFOLLOW``
        and checks it is the one it listed."""
        if not shutil.rmtree.avoids_symlink_attacks and not self._ours():
            raise RunError(f"cannot remove {self.root / name} safely on this platform (shutil.rmtree may follow a"
                           " link that another account swaps in); remove it as its owner")  # fmt: skip
        root = open_beneath(self.root, ".", owner=self.owner, directory=True)
        try:
            if _is_dir_at(root, name):
                shutil.rmtree(name, ignore_errors=ignore_errors, dir_fd=root)
            else:
                try:
                    os.unlink(name, dir_fd=root)
                except FileNotFoundError:
                    pass
                except OSError:
                    if not ignore_errors:
                        raise
        finally:
            os.close(root)

    def prune(self, max_bytes: int, *, dry_run: bool = False) -> list[EnvEntry]:
        """Remove broken folders nobody holds, then ready environments least recently used first, across every
        account's tree, until all of them together (uv's caches left out) are at most ``max_bytes``; never one
        whose lock is held. Returns what was removed (or, with ``dry_run``, what would be)."""
        found = [(tree, name, _inodes(tree.root, name)) for tree in self.trees() for name in tree._names()]
        entries = [(tree, tree._entry(name, inodes), inodes) for tree, name, inodes in found]
        links = Counter(ino for _, _, table in found for ino in table)  # how many of the folders hold each inode
        sizes = {ino: size for _, _, table in found for ino, size in table.items()}
        total = sum(sizes.values())
        broken = [x for x in entries if x[1].state == "broken"]
        ready = sorted(
            (x for x in entries if x[1].state == "ready"), key=lambda x: x[1].last_used or x[1].created or 0.0
        )
        removed: list[EnvEntry] = []
        for tree, entry, inodes in broken + ready:
            if entry.state == "ready" and total <= max_bytes:
                break
            bad_lock = not tree._lock_sound(entry.folder.name)  # a link or FIFO there: replaced, and the folder goes
            fd: int | None = None
            if not (dry_run and bad_lock):  # (a dry run changes nothing, a bad lock file included)
                try:
                    fd = tree.open_lock(entry.key, replace_bad=not dry_run)
                except OSError:
                    continue  # the account keeps swapping its lock file
            try:
                if fd is not None and not _try_flock(fd, fcntl.LOCK_EX):
                    continue  # in use, or being built
                if entry.state == "broken" and not bad_lock and tree._ready(entry.key) is not None:
                    continue  # rebuilt since we looked
                if not dry_run:
                    tree._delete(entry.folder.name, ignore_errors=True)
            finally:
                if fd is not None:
                    os.close(fd)
            for ino in inodes:
                links[ino] -= 1
                if links[ino] == 0:
                    total -= sizes[ino]
            removed.append(entry)
        return removed

    def total_bytes(self, *, exclude: Collection[str | Path] = frozenset()) -> int:
        """The size of every environment folder of every account's tree, each inode once, uv's caches left out;
        but those in ``exclude``: keys (in any tree) or folders (`EnvEntry.folder`)."""
        keys = {k[:KEY_DIR_CHARS] for k in exclude if isinstance(k, str)}
        folders = {Path(f) for f in exclude if isinstance(f, Path)}
        seen: dict[tuple[int, int], int] = {}
        for tree in self.trees():
            for name in tree._names():
                if name not in keys and tree.root / name not in folders:
                    seen.update(_inodes(tree.root, name))
        return sum(seen.values())

    def uv_cache_bytes(self) -> int:
        """The size of uv's caches, every account's (files they share with the environments included)."""
        seen: dict[tuple[int, int], int] = {}
        for tree in self.trees():
            seen.update(_inodes(tree.root, ".uv-cache"))
        return sum(seen.values())


class _Tee:
    """Writes to the caller's log and to build.log."""

    def __init__(self, *outs: IO[bytes]) -> None:
        self.outs = outs

    def write(self, data: bytes) -> None:
        for out in self.outs:
            with contextlib.suppress(OSError, ValueError):
                out.write(data)
                out.flush()

    def line(self, text: str) -> None:
        self.write(text.encode() + b"\n")


def _say(log: IO[bytes], text: str) -> None:
    _Tee(log).line(text)


def _run_step(name: str, argv: list[str], env: dict[str, str], cwd: Path, out: _Tee, lock_fd: int) -> None:
    """Run one installer command, streaming its output; `EnvBuildError` with its cause when it fails.

    The child inherits the build lock, so should this process die, the lock stays held until the installer
    has exited too and nobody deletes or rebuilds the folder under it."""
    out.line("$ " + " ".join(argv))
    tail = bytearray()
    try:
        proc = subprocess.Popen(argv, cwd=cwd, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                stderr=subprocess.STDOUT, pass_fds=(lock_fd,))  # fmt: skip
    except OSError as e:
        raise EnvBuildError(f"{name} could not start: {e}") from e
    assert proc.stdout is not None
    with proc:
        while chunk := os.read(proc.stdout.fileno(), 65536):
            out.write(chunk)
            tail += chunk
            del tail[:-65536]
    if proc.returncode != 0:
        raise EnvBuildError(f"environment build failed ({name}): {installer_cause(tail.decode(errors='replace'))}")


def installer_cause(output: str) -> str:
    """The cause of an installer's failure in one line, from its output.

    uv writes ``error: X`` followed by indented ``cause:`` / ``Caused by:`` / ``╰─▶`` lines (with indented
    continuations) and ``hint:`` lines; pip writes ``ERROR: ...`` lines. The result is ``X: cause: cause`` for
    uv, the ``ERROR`` lines joined by ``; `` for pip, and the last line of output when neither is found."""
    lines = [ANSI_RE.sub("", line).rstrip() for line in output.splitlines()]
    blocks: list[list[str]] = []
    current: list[str] | None = None
    for line in lines:
        text = line.strip()
        low = text.lower()
        if low.startswith("error:") or text.startswith("× "):
            current = [text.split(":", 1)[1].strip() if low.startswith("error:") else text[2:].strip()]
            blocks.append(current)
        elif current is not None and text and not low.startswith(("hint:", "help:", "warning:")):
            marker = next((m for m in CAUSE_MARKERS if low.startswith(m)), None)
            if marker is not None:
                part = text[len(marker) :].strip()
                if part:
                    current.append(part)
            elif line[:1].isspace():
                current[-1] = f"{current[-1]} {text}".strip()
            else:
                current = None
        else:
            current = None
    if blocks:
        parts = [": ".join(p.rstrip(":") for p in block if p) for block in blocks]
        cause = "; ".join(dict.fromkeys(p for p in parts if p))
    else:
        cause = next((line.strip() for line in reversed(lines) if line.strip()), "no output")
    cause = " ".join(cause.split())
    return cause if len(cause) <= MAX_CAUSE_CHARS else cause[: MAX_CAUSE_CHARS - 3] + "..."


def _try_flock(fd: int, operation: int) -> bool:
    """``flock(fd, operation)`` without waiting: False when another holds the lock in a way that conflicts."""
    try:
        fcntl.flock(fd, operation | fcntl.LOCK_NB)
    except BlockingIOError:
        return False
    return True


def _is_dir_at(dir_fd: int, name: str) -> bool:
    try:
        return stat.S_ISDIR(os.stat(name, dir_fd=dir_fd, follow_symlinks=False).st_mode)
    except OSError:
        return False


def _is_file_beneath(folder: Path, rel: str) -> bool:
    """A regular file at ``folder/rel``, no link followed on the way (a link there is not one)."""
    try:
        return stat.S_ISREG(stat_beneath(folder, rel).st_mode)
    except OSError:
        return False


def _write_json(path: Path, data: Mapping[str, Any]) -> None:
    write_text(path, json.dumps(data, indent=2, sort_keys=True) + "\n")


@functools.cache
def _uv_version(uv: str) -> str:
    """``uv 0.13.9``: asked once per process and binary."""
    try:
        out = subprocess.run([uv, "--version"], capture_output=True, text=True, timeout=30).stdout
    except (OSError, subprocess.SubprocessError):
        return "uv"
    return out.split("(")[0].strip() or "uv"


def _inodes(root: Path, rel: str = ".") -> dict[tuple[int, int], int]:
    """``(device, inode) -> size`` of every file and symlink under the folder ``root/rel``, walked descriptor by
    descriptor (each folder opened ``O_NOFOLLOW`` relative to the one that listed it, so a folder swapped for a
    link is skipped, not followed), at most `MAX_WALK_DEPTH` deep."""
    out: dict[tuple[int, int], int] = {}
    try:
        top = open_beneath(root, rel, directory=True)
    except (OSError, ValueError):
        return out
    frames: list[tuple[int, Iterator[os.DirEntry[str]]]] = []

    def enter(fd: int) -> None:
        try:
            with os.scandir(fd) as it:
                listed = list(it)
        except OSError:
            listed = []
        frames.append((fd, iter(listed)))

    enter(top)
    try:
        while frames:
            fd, listed = frames[-1]
            entry = next(listed, None)
            if entry is None:
                frames.pop()
                os.close(fd)
                continue
            try:
                if entry.is_dir(follow_symlinks=False):
                    if len(frames) < MAX_WALK_DEPTH:
                        enter(os.open(entry.name, _DIR_FLAGS, dir_fd=fd))
                    continue
                st = entry.stat(follow_symlinks=False)
            except OSError:
                continue
            out[(st.st_dev, st.st_ino)] = st.st_size
    finally:
        for fd, _ in frames:
            os.close(fd)
    return out


def format_size(n: int) -> str:
    """``1.2G``, ``532M``, ``12K``, ``800B``, as ``du -h`` writes them."""
    for unit in ("T", "G", "M", "K"):
        if n >= UNITS[unit]:
            v = n / UNITS[unit]
            return f"{v:.1f}{unit}" if v < 10 else f"{v:.0f}{unit}"
    return f"{n}B"
