"""What a job's process is given: its OS account, its software environment, and its walls.

The pod's loop asks `Isolation.prepare` for every start. It answers the argv the shim runs, the
process environment, the shim's options and who owns the job's folder:

- **Account** (`deskpod.jobs.identity`): on a pod started by root the job runs as its user's account;
  its folder (``jobs/<id>/``) is made that account's, mode 0700, so no other user can read it.
- **Environment** (``[environment]``, `deskpod.envs`): the job's own interpreter and packages, found in
  the cache by the hash of their definition. A cached one costs one lookup (no subprocess); a new one
  is built as the first step of the job's own process (``deskpod env build``, run by the shim with the
  pod's rights, its output in ``env-build.log``) while the job is ``building``. Either way the job's
  ``PATH`` starts with the environment's ``bin``, and its folder keeps what was installed
  (``environment/freeze.txt``, and the lock or requirements it came from).
- **Sandbox** (bubblewrap, `deskpod.envs.sandbox`): the job sees the system and its environment
  read-only, its own folder and work directory writable, none of the pod's state (database, tokens,
  other jobs' folders), only the device nodes of the GPUs it was given, its own PID namespace; it dies
  with its shim. Where bubblewrap cannot run, a root pod refuses to start unless its admin allowed
  unsandboxed jobs (``deskpod up --allow-unsandboxed``).
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import stat
import sys
import threading
import traceback
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import Any

from deskpod.envs import images
from deskpod.envs.accounts import Account, as_account, current_account, popen_credentials
from deskpod.envs.cache import EnvCache, account_root
from deskpod.envs.definition import EnvDefinition
from deskpod.envs.python import resolve_python
from deskpod.envs.sandbox import Walls, gpu_device_nodes, sandbox_argv
from deskpod.envs.userfiles import open_beneath, prepare_owned_dir, scandir_beneath, write_no_follow
from deskpod.errors import ConflictError
from deskpod.jobs.identity import Accounts
from deskpod.jobs.kinds import command
from deskpod.jobs.kinds import video as video_kind
from deskpod.jobs.spec import JobSpec
from deskpod.jobs.store import User
from deskpod.jobs.supervisor import SHIM
from deskpod.train.runs import checkpoint_step

SANDBOX_TMPFS = (Path("/tmp"), Path("/dev/shm"))
"""Folders every sandbox gets empty and private: an interpreter or a deskpod installed under them is shown again."""

SECRET_ENV = ("DESKPOD_TOKEN_FILE",)
"""Variables of the daemon's environment a job never inherits."""

BOX_VARIABLES = (
    "PATH", "LANG", "LANGUAGE", "TZ", "TERM",  # where programs are, the locale and time zone
    "SSL_CERT_FILE", "SSL_CERT_DIR", "REQUESTS_CA_BUNDLE", "CURL_CA_BUNDLE",  # which certificate authorities to trust
    "http_proxy", "https_proxy", "no_proxy", "HTTP_PROXY", "HTTPS_PROXY", "NO_PROXY",  # the way out of this network
    "DESKPOD_FASHION_MNIST",  # where this box keeps Fashion-MNIST
)  # fmt: skip
"""What a job takes from the daemon's environment (with every ``LC_*``): how this box is set up, the same for every
user. Nothing else of the admin's environment reaches a user's job (it may hold the admin's own credentials); a job
sets what else it needs in its spec's ``[env]``."""


def box_environment(environ: Mapping[str, str]) -> dict[str, str]:
    """The part of the daemon's environment every job starts from (`BOX_VARIABLES`)."""
    return {k: v for k, v in environ.items() if k in BOX_VARIABLES or k.startswith("LC_")}


@dataclass(frozen=True, slots=True)
class Prepared:
    """How to start one attempt of a job."""

    argv: list[str]
    plan: dict[str, Any]
    """The job step's plan (`deskpod.jobs.shim`): its environment variables, working directory, build, lock."""
    options: list[str]
    """The shim's options (`deskpod.jobs.shim`)."""
    owner: tuple[int, int] | None
    """(uid, gid) that owns the job's folder and log; None: the daemon's own account."""
    building: bool
    """The job's environment is not in the cache yet: its process builds it first."""
    notes: list[str] = field(default_factory=list)
    """For the job's history: which environment, which account, which walls."""
    fds: tuple[int, ...] = ()
    """Descriptors the shim inherits (folders opened as the job's account, bound into its sandbox); the caller
    closes them once the shim has started."""

    def close(self) -> None:
        for fd in self.fds:
            with contextlib.suppress(OSError):
                os.close(fd)


@dataclass
class Isolation:
    """The pod's policy for job processes (see the module docstring)."""

    envs: EnvCache
    accounts: Accounts | None = None
    """None: every job runs as the daemon's account (a pod in a unit test)."""
    sandbox: bool = False
    """Run each job in a bubblewrap sandbox."""
    hidden: tuple[Path, ...] = ()
    """What no job may see: the pod's home (database, tokens, job folders), a token file elsewhere."""
    dev_dir: Path = Path("/dev")
    """Where the GPUs' device nodes are."""
    readable: tuple[Path, ...] = field(default_factory=lambda: interpreter_paths())
    """What every job must be able to read: the daemon's Python (train and serve jobs run it)."""
    jobs_root: Path | None = None
    """The pod's job folders (``<home>/jobs``): a run there is served to the user whose job made it."""

    def check(self, spec: JobSpec, user: User | None = None) -> None:
        """Refuse at submission what can be known to fail: an interpreter or container runtime this box lacks, a
        work directory or served run the user could not open themselves (`ConflictError`)."""
        defn = spec.environment
        if defn is not None:
            if defn.kind == "image":
                images.check_image(defn)
            else:
                resolve_python(defn.python)
        who = self.account(user) or self._daemon()
        if spec.workdir is not None:
            os.close(open_as(who, Path(spec.workdir), _WORKDIR))
        binds = self.spec_binds(who, spec)
        try:
            if spec.serve is not None and not _has_checkpoint(binds[0][0]):  # a serve job's one bind: its run
                raise ConflictError(f"job spec: serve.run {str(Path(spec.serve['run']))!r} has no checkpoint yet; "
                                    "train it first (or wait for one)")  # fmt: skip
        finally:
            for fd, _, _ in binds:
                os.close(fd)
        if spec.video is not None:
            video_kind.check_models(spec.video)  # folders the account could open: is each a detector that fits?

    def account(self, user: User | None) -> Account | None:
        """The account the job runs as, when it is not the daemon's own."""
        if self.accounts is None or user is None:
            return None
        account = self.accounts.account_for(user)
        return None if account.uid == self.accounts.daemon.uid else account

    def open_folder(self, account: Account, path: Path, message: str) -> int:
        """A descriptor of the folder ``path`` (a run to serve, a video job's database folder), opened as
        ``account`` may: a folder in one of the pod's own job folders is reached through the pod, not the
        filesystem (the pod's home may be closed to its users), so it is the account's when its job folder is (or
        the account is the daemon's); it is opened from there with no link followed. Any other folder is opened
        with the account's own rights (`open_as`). `ConflictError` with ``message`` (formatted with ``path``), the
        same for a missing folder and one that is not the account's."""
        refused = ConflictError(message.format(path=str(path)))
        rel = _inside(Path(os.path.normpath(path)), self.jobs_root) if self.jobs_root is not None else None
        if rel is None:
            return open_as(account, path, message)
        assert self.jobs_root is not None
        try:
            folder = open_beneath(self.jobs_root, rel.parts[0], directory=True)
        except OSError:
            raise refused from None
        try:
            owner = os.fstat(folder).st_uid
            if owner != account.uid and account.uid != self._daemon().uid:
                raise refused
            return open_beneath(folder, PurePosixPath(*rel.parts[1:]), owner=owner, directory=True)
        except OSError:
            raise refused from None
        finally:
            os.close(folder)

    def _daemon(self) -> Account:
        return self.accounts.daemon if self.accounts is not None else current_account()

    def env_cache(self, account: Account | None) -> EnvCache:
        """Where ``account``'s environments are built and kept: its own cache (`deskpod.envs.cache`), since a
        build runs the account's code; the daemon's own jobs use the top of the cache."""
        if account is None:
            return self.envs
        prepare_owned_dir(account_root(self.envs.root, account.name), account)
        return EnvCache.for_account(self.envs.root, account.name, sources=self.envs.sources,
                                    installer=self.envs.installer)  # fmt: skip

    def prepare(
        self,
        spec: JobSpec,
        user: User | None,
        folder: Path,
        argv: Sequence[str],
        env: Mapping[str, str],
        *,
        devices: Sequence[int],
        gpus: bool,
        phase_file: Path,
    ) -> Prepared:
        account = self.account(user)
        owner = (account.uid, account.gid) if account is not None else None
        home = folder
        if account is not None:
            prepare_owned_dir(folder, account)
            if _owns(account, account.home):
                home = account.home
            env = {**env, "HOME": str(home), "USER": account.name, "LOGNAME": account.name}
        else:
            folder.mkdir(parents=True, exist_ok=True)
        env = {k: v for k, v in env.items() if k not in SECRET_ENV}
        options: list[str] = []
        notes: list[str] = []
        plan: dict[str, Any] = {"phase": str(phase_file)}
        fds: list[int] = []
        try:
            return self._prepare(spec, account, folder, home, list(argv), env, devices, gpus, plan, options, notes, fds)
        except BaseException:
            Prepared(list(argv), plan, options, owner, False, notes, tuple(fds)).close()
            raise

    def _prepare(self, spec: JobSpec, account: Account | None, folder: Path, home: Path, argv: list[str],
                 env: dict[str, str], devices: Sequence[int], gpus: bool, plan: dict[str, Any], options: list[str],
                 notes: list[str], fds: list[int]) -> Prepared:  # fmt: skip
        owner = (account.uid, account.gid) if account is not None else None
        who = account or self._daemon()
        binds: list[tuple[int, Path, bool]] = []  # (fd, where, writable): folders opened as the job's account
        if spec.workdir is not None:  # opened as the account: the kernel decides, as it would for the user
            fd = open_as(who, Path(spec.workdir), _WORKDIR)
            fds.append(fd)
            real = Path(os.readlink(f"/proc/self/fd/{fd}"))
            binds.append((fd, real, True))
            plan["cwd"] = str(real)
        outside = self.spec_binds(who, spec)
        fds.extend(fd for fd, _, _ in outside)
        binds.extend(outside)
        building = False
        defn = spec.environment
        venv = defn if defn is not None and defn.kind != "image" else None  # an environment the cache builds
        interp = resolve_python(venv.python) if venv is not None else None  # once per start: key and walls
        node_names = gpu_device_nodes(devices, self.dev_dir) if self.sandbox else ()
        if gpus and node_names:  # in the sandbox only the job's GPUs exist: CUDA numbers them from 0
            env["CUDA_VISIBLE_DEVICES"] = ",".join(str(i) for i in range(len(devices)))
        cache: EnvCache | None = None
        if defn is not None and venv is None:
            runtime = images.check_image(defn)  # raises when the runtime went away since submission
            notes.append(f"image {defn.image} with {runtime}")
            workdir = Path(plan.get("cwd", folder))
            argv = images.image_argv(
                runtime, str(defn.image), argv, writable=[folder, workdir], workdir=workdir,
                devices=[f"/dev/{n}" for n in node_names], env={},
            )  # fmt: skip
        elif venv is not None and interp is not None:
            cache = self.env_cache(account)
            key = cache.key(venv, interp)
            env_dir = cache.folder(key) / "env"
            env = {**env, "PATH": f"{env_dir / 'bin'}:{env.get('PATH', os.defpath)}", "VIRTUAL_ENV": str(env_dir)}
            env.pop("PYTHONHOME", None)
            if cache.lookup(venv, interp) is None:
                building = True
                record = folder / "environment.json"
                write_no_follow(record, json.dumps(venv.to_json()).encode())
                plan["build"] = command.build_argv(cache.root, record, folder / "env-build.log", interp.path)
                plan["build_env"] = self.build_env(env, home)
                notes.append(f"building environment {key[:12]} ({describe(venv)}) as "
                             f"{who.name}; log: env-build.log")  # fmt: skip
            else:
                cache.touch(key)
                notes.append(f"environment {key[:12]} ({describe(venv)}), cached")
            plan["hold"] = str(cache.in_use_lock_path(key))
            built = cache.folder(key)
            plan["record"] = [[str(built / name), str(folder / "environment" / Path(name).name)]
                              for name in RECORDED]  # fmt: skip
        plan["env"] = dict(env)
        if self.sandbox:
            readable = [*self.readable, *([_prefix(interp.path)] if interp is not None else [])]
            closed = closed_ancestors(readable)
            covered = [*closed, *self.hidden, *SANDBOX_TMPFS]  # what the sandbox lays an empty tmpfs over
            writable = [folder, *([home] if home != folder else [])]
            if building and cache is not None:
                writable.append(cache.root)  # the build writes the account's own cache, as the account
            walls = Walls(
                writable=tuple(dict.fromkeys(writable)),
                hidden=tuple(dict.fromkeys([*self.hidden, *closed])),
                devices=node_names,
                dev_root=self.dev_dir,
                extra_ro=tuple(p for p in dict.fromkeys(readable) if _under_any(Path(os.path.realpath(p)), covered)),
                binds=tuple(binds),
            )
            root = self.accounts is not None and self.accounts.root
            argv = sandbox_argv(
                walls,
                [sys.executable, "-I", "-S", str(SHIM), "--exec", "--", *argv],
                account=account,
                env_dir=cache.root if cache is not None and not building else None,
                cwd=folder,
                switch_user=root and account is not None,
            )  # the job step enters a work directory itself, as the account
            options.append("--sandboxed")
            notes.append("sandboxed (bubblewrap)")
        elif account is not None:
            options += ["--as", f"{account.uid}:{account.gid}:{','.join(map(str, account.groups))}"]
        if account is not None:
            notes.append(f"as {account.name} (uid {account.uid})")
        return Prepared(argv, plan, options, owner, building, notes, tuple(fds))

    def spec_binds(self, account: Account, spec: JobSpec) -> list[tuple[int, Path, bool]]:
        """What the job of ``spec`` reads and writes outside its folder, opened as ``account`` may, as sandbox binds
        ``(fd, where, writable)``: the run a serve job serves (`open_folder`); a video job's local sources (files or
        folders of videos), face rules' photos and detectors' model folders (`open_as`), read-only, and its
        database's folder writable when the spec names one (`open_folder`); the runs a TensorBoard job reads
        (`open_folder`: a run in one of the pod's job folders through the pod). `ConflictError` naming the first
        that the account cannot open."""
        out: list[tuple[int, Path, bool]] = []

        def bind(fd: int, writable: bool = False) -> None:
            out.append((fd, Path(os.readlink(f"/proc/self/fd/{fd}")), writable))

        try:
            if spec.serve is not None:
                bind(self.open_folder(account, Path(spec.serve["run"]), _SERVE_RUN))
            if (video := spec.video) is not None:
                for path in video_kind.local_sources(video):
                    bind(open_as(account, path, _VIDEO_SOURCE, directory=False))
                for path in video_kind.local_photos(video):
                    bind(open_as(account, path, _VIDEO_PHOTO, directory=False))
                for ref in video_kind.model_detectors(video):
                    bind(open_as(account, ref.folder, _VIDEO_MODEL))
                if "db" in video:
                    shown = repr(video["db"]).replace("{", "{{").replace("}", "}}")  # the message is formatted
                    db = self.open_folder(account, Path(video["db"]).parent, _VIDEO_DB.replace("{db!r}", shown))
                    bind(db, True)
            for run in spec.tensorboard["runs"] if spec.tensorboard is not None else ():
                bind(self.open_folder(account, Path(run), _TENSORBOARD_RUN))
        except BaseException:
            for fd, _, _ in out:
                os.close(fd)
            raise
        return out

    def tool_argv(self, account: Account | None, argv: Sequence[str], binds: Sequence[tuple[int, Path, bool]]) -> tuple[
            list[str], dict[str, Any]]:  # fmt: skip
        """How the pod runs a short command of its own for a user's job (the dashboard's face search in a video job's
        database): as the job's ``account`` and, on a pod with walls, inside the same walls as its jobs, with
        ``binds`` ``(fd, where, writable)`` (folders opened as the account) shown. The command line and the
        ``subprocess`` arguments that start it (the descriptors to pass, and the account when there are no walls
        to switch to it)."""
        fds = tuple(b[0] for b in binds)
        if not self.sandbox:
            creds: dict[str, Any] = dict(popen_credentials(account)) if account is not None else {}
            return list(argv), {"pass_fds": fds, **creds}
        readable = list(self.readable)
        closed = closed_ancestors(readable)
        covered = [*closed, *self.hidden, *SANDBOX_TMPFS]
        walls = Walls(
            hidden=tuple(dict.fromkeys([*self.hidden, *closed])),
            extra_ro=tuple(p for p in dict.fromkeys(readable) if _under_any(Path(os.path.realpath(p)), covered)),
            binds=tuple(binds),
        )
        root = self.accounts is not None and self.accounts.root and account is not None
        line = sandbox_argv(walls, argv, account=account, cwd=Path("/"), switch_user=bool(root))
        return line, {"pass_fds": fds}

    def prune_soon(self, max_bytes: int) -> None:
        """Prune the environment cache to ``max_bytes`` in the background (never an environment in use)."""

        def prune() -> None:
            try:
                self.envs.prune(max_bytes)
            except Exception:  # a failed prune must not end the pod; the next build tries again
                traceback.print_exc(file=sys.stderr)

        threading.Thread(target=prune, name="deskpod-env-prune", daemon=True).start()

    def build_env(self, env: Mapping[str, str], home: Path) -> dict[str, str]:
        """What the build step runs with: the job's box variables (not what the user put in ``[env]``), and the
        package sources the daemon reads from pip's configuration, so that a build installs from where the
        daemon would."""
        out = {k: v for k, v in env.items() if k in ("PATH", "HOME", "USER", "LOGNAME") or k in BOX_VARIABLES}
        out.update(self.envs.sources.uv_environment())
        out["HOME"] = str(home)
        return out


RECORDED = ("freeze.txt", "requirements.txt", "project/pyproject.toml", "project/uv.lock")
"""What a job's folder keeps of the environment it ran in (``environment/``): the exact packages, and the
requirements or lock it came from."""

_WORKDIR = "job spec: workdir {path!r} is not a folder you can open on this box"
_SERVE_RUN = "job spec: serve.run {path!r} is not a run folder you can open on this box"
_VIDEO_SOURCE = "job spec: video.sources {path!r} is not a video file or folder you can open on this box"
_VIDEO_PHOTO = "job spec: video.rules photo {path!r} is not a file you can open on this box"
_VIDEO_MODEL = "job spec: video.detect model folder {path!r} is not a folder you can open on this box"
_TENSORBOARD_RUN = (
    "job spec: tensorboard.runs {path!r} is not a run folder or a folder of TensorBoard events you can open on this box"
)
_VIDEO_DB = "job spec: video.db {db!r}: its folder {path!r} is not one you can open on this box"


def _inside(path: Path, top: Path) -> Path | None:
    """``path`` relative to ``top`` when it lies in a folder under it, else None."""
    try:
        rel = path.relative_to(top)
    except ValueError:
        return None
    return rel if rel.parts and ".." not in rel.parts else None


def _has_checkpoint(run: int) -> bool:
    """Whether the run opened at descriptor ``run`` has a checkpoint (no link followed on the way)."""
    try:
        names = [e.name for e in scandir_beneath(run, "checkpoints") if e.is_file(follow_symlinks=False)]
    except OSError:
        return False
    return any(checkpoint_step(Path(n)) is not None for n in names)


def open_as(account: Account, path: Path, message: str, *, directory: bool = True) -> int:
    """A descriptor of the folder ``path`` (with ``directory=False``: the file or folder), opened with ``account``'s
    rights (`as_account`); `ConflictError` with ``message`` when it cannot be, the same whether it is missing or closed to the account, so that the answer
    reveals nothing of what the account cannot see."""
    flags = os.O_RDONLY | os.O_CLOEXEC | (os.O_DIRECTORY if directory else os.O_NONBLOCK | os.O_NOCTTY)
    try:
        fd = as_account(account, lambda: os.open(path, flags))
    except OSError:
        raise ConflictError(message.format(path=str(path))) from None
    mode = os.fstat(fd).st_mode
    if not (stat.S_ISDIR(mode) or stat.S_ISREG(mode)):  # a FIFO or a device: nothing a job reads video from
        os.close(fd)
        raise ConflictError(message.format(path=str(path)))
    return fd


def describe(defn: EnvDefinition) -> str:
    """A few words for the job's history: ``python 3.11, requirements.txt``."""
    return f"python {defn.python or 'default'}, {defn.summary()}"


def _owns(account: Account, path: Path) -> bool:
    try:
        return path.is_dir() and path.stat().st_uid == account.uid and str(path) != "/"
    except OSError:
        return False


def _prefix(python: Path) -> Path:
    """Where an interpreter is installed (an environment's venv links to it): the folder above its ``bin``."""
    return Path(os.path.realpath(python)).parent.parent


def _under_any(path: Path, tops: Sequence[Path]) -> bool:
    return any(path == t or t in path.parents for t in tops)


def closed_ancestors(paths: Sequence[Path]) -> list[Path]:
    """For each path, the highest folder above it that other accounts cannot pass through (no ``o+x``).

    The sandbox lays an empty tmpfs over such a folder and shows only the path inside it, so a job's
    account can run an interpreter installed under, say, ``/root`` without seeing the rest of ``/root``.
    """
    out: list[Path] = []
    for p in paths:
        for d in reversed(Path(os.path.realpath(p)).parents):
            try:
                if not d.stat().st_mode & 0o001:
                    if d not in out and str(d) != "/":
                        out.append(d)
                    break
            except OSError:
                break
    return out


def interpreter_paths() -> tuple[Path, ...]:
    """The daemon's Python (its prefix, its base prefix, where its executable really lies) and deskpod itself."""
    import deskpod

    paths = {Path(sys.prefix), Path(sys.base_prefix), Path(os.path.realpath(sys.executable)).parent.parent,
             Path(os.path.realpath(deskpod.__file__)).parent.parent}  # fmt: skip
    uv = shutil.which("uv")
    if uv:
        paths.add(Path(os.path.realpath(uv)).parent)
    return tuple(sorted(paths))
