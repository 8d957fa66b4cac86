"""Environments per OS account, built by that account inside its sandbox, and read by root without being tricked.

A pod started by root keeps each account's environments in ``<cache>/users/<NAME>/``, owned by NAME, built by
NAME. Root still looks into these trees (a lookup before each job, the admin's ``deskpod env list/prune/remove``,
the pod's pruning), and whatever is in them is the account's choice. The attacks here are planted the way the
account could plant them (links, FIFOs, swapped folders, all owned by the account) and replayed against every
root-side reader: none may follow, block, or create or delete anything outside the tree.

Folders live under /var/tmp, not /tmp: the sandbox has its own /tmp.
"""

from __future__ import annotations

import functools
import hashlib
import http.server
import io
import json
import os
import shutil
import stat
import subprocess
import sys
import tarfile
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from deskpod import cli
from deskpod.envs.accounts import Account
from deskpod.envs.cache import EnvCache, account_root
from deskpod.envs.definition import EnvDefinition
from deskpod.envs.python import resolve_python
from deskpod.envs.sandbox import Walls, bwrap_path, sandbox_argv
from deskpod.envs.userfiles import prepare_owned_dir
from deskpod.errors import ConfigError, RunError, UsageError
from deskpod.jobs.isolation import SANDBOX_TMPFS, closed_ancestors, interpreter_paths
from tests.unix_users import shared_folder

from .test_cache import LOCAL, packages, sources

DEADLINE = 120.0
"""Seconds a root-side call may take before the test calls it blocked (never asserted on otherwise)."""


def give(path: Path, account: Account | None) -> None:
    """Make everything under ``path`` the account's (None: root's), links themselves, never what they point at."""
    uid, gid = (account.uid, account.gid) if account is not None else (0, 0)
    os.chown(path, uid, gid, follow_symlinks=False)
    for folder, dirs, files in os.walk(path):
        for name in dirs + files:
            os.chown(os.path.join(folder, name), uid, gid, follow_symlinks=False)


def within_deadline(fn: Callable[[], Any], what: str) -> Any:
    """``fn()`` in a thread; the test fails (naming ``what``) when it has not returned within `DEADLINE`."""
    out: list[Any] = []

    def run() -> None:
        try:
            out.append((True, fn()))
        except BaseException as e:
            out.append((False, e))

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    thread.join(DEADLINE)
    if thread.is_alive():
        pytest.fail(f"{what} blocked (still running after {DEADLINE} s)")
    ok, value = out[0]
    if not ok:
        raise value
    return value


def run_cli(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    code = cli.main(["env", *args])
    out, err = capsys.readouterr()
    return code, out, err


@dataclass(frozen=True)
class Pod:
    base: Path
    """The test's folder under /var/tmp."""
    cache: Path
    """The pod's environment cache (its top-level root)."""
    private: Path
    """Root's own files, outside every tree (mode 0700): where planted links point."""

    def tree(self, account: Account) -> Path:
        return prepare_owned_dir(account_root(self.cache, account.name), account)

    def top(self) -> EnvCache:
        return EnvCache(self.cache, sources=sources())

    def of(self, account: Account) -> EnvCache:
        return EnvCache.for_account(self.cache, account.name, sources=sources())


@pytest.fixture
def pod(monkeypatch: pytest.MonkeyPatch) -> Iterator[Pod]:
    monkeypatch.setattr(cli, "COMMAND_MODULES", ("deskpod.cli.env",))
    with shared_folder("deskpod-envs-", 0o711) as base:
        cache = base / "pod" / "envs"
        cache.mkdir(parents=True)
        for p in (base / "pod", cache):
            p.chmod(0o711)
        private = base / "private"
        private.mkdir(mode=0o700)
        yield Pod(base, cache, private)


SIX = packages("six==1.17.0")


@pytest.fixture(scope="module")
def template() -> Iterator[Path]:
    """A cache root with one ready environment (six), built once; tests copy it into an account's tree."""
    with shared_folder("deskpod-envs-template-", 0o700) as base:
        EnvCache(base / "envs", sources=sources()).ensure(SIX, log=io.BytesIO())
        yield base / "envs"


def copy_tree(template: Path, tree: Path, account: Account) -> None:
    shutil.copytree(template, tree, symlinks=True, dirs_exist_ok=True)
    give(tree, account)


def build_in(tree: Path, account: Account, defn: EnvDefinition) -> None:
    """An environment in ``account``'s tree, as if the account had built it (built by root, then given over)."""
    os.chown(tree, 0, 0)
    EnvCache(tree, sources=sources()).ensure(defn, log=io.BytesIO())
    give(tree, account)


# -- one tree per account, listed together ------------------------------------------------------------------


def test_account_root_takes_only_an_account_name(tmp_path: Path) -> None:
    assert account_root(tmp_path, "alice") == tmp_path / "users" / "alice"
    assert EnvCache.for_account(tmp_path, "alice").account == "alice"
    for bad in ("..", ".", "", "a/b", "-x", ".hidden", "x" * 33, "al ice"):
        with pytest.raises(ConfigError, match=r"^OS account .*: not an account name"):
            account_root(tmp_path, bad)


def test_each_account_has_its_own_environments_and_the_admin_sees_them_all(
    pod: Pod, template: Path, two_users: tuple[Account, Account], capsys: pytest.CaptureFixture[str]
) -> None:
    alice, bob = two_users
    own = pod.top().ensure(SIX, log=io.BytesIO())  # a job of the daemon's own account
    copy_tree(template, pod.tree(alice), alice)  # alice asked for the same environment: her own copy
    build_in(pod.tree(bob), bob, packages("tabulate==0.8.10"))
    found = pod.of(alice).lookup(SIX)
    assert found is not None and found.key == own.key and found.path != own.path
    assert found.path == account_root(pod.cache, alice.name) / own.key[:20] / "env"
    assert pod.of(bob).lookup(SIX) is None  # bob's jobs never run in alice's environment

    entries = pod.top().entries()
    assert sorted((e.account, e.state) for e in entries) == sorted([("", "ready"), (alice.name, "ready"),
                                                                    (bob.name, "ready")])  # fmt: skip
    assert {e.folder.parent for e in entries} == {pod.cache, pod.cache / "users" / alice.name,
                                                  pod.cache / "users" / bob.name}  # fmt: skip
    assert pod.of(alice).entries() == [e for e in entries if e.account == alice.name]
    # Sizes: no inode is shared between trees (each has its own uv cache), so the total is the sum.
    assert pod.top().total_bytes() == sum(e.size_bytes for e in entries)
    assert pod.top().uv_cache_bytes() > pod.of(alice).uv_cache_bytes() > 0
    with pytest.raises(UsageError, match=rf"is ambiguous: {own.key[:12]}, {own.key[:12]} \({alice.name}\); give more"):
        pod.top().find(own.key[:8])
    assert pod.top().find(own.key[:8], alice.name).account == alice.name
    assert pod.top().find(own.key[:8], "").folder == own.folder

    code, out, err = run_cli(capsys, "list", "--cache", str(pod.cache))
    assert (code, err) == (0, "")
    head, *rows, total = out.splitlines()
    assert head.split()[:3] == ["KEY", "ACCOUNT", "STATE"]
    assert sorted(r.split()[1] for r in rows) == sorted(["root", alice.name, bob.name])
    assert total.startswith("total: 3 environments, ")
    code, out, _ = run_cli(capsys, "show", own.key[:12], "--account", alice.name, "--cache", str(pod.cache))
    assert code == 0 and f"account:    {alice.name}" in out and out.endswith("freeze.txt:\n  six==1.17.0\n")

    # Root builds in no account's tree: a build runs the account's code, so it runs as the account.
    with pytest.raises(RunError, match=rf"is uid {alice.uid}'s: its environments are built by that account"):
        pod.of(alice).ensure(packages("idna"), log=io.BytesIO())

    # Pruning is least recently used across every tree: alice's, used longest ago, goes first.
    old = 1_000_000_000
    os.utime(found.folder / "last_used", (old, old), follow_symlinks=False)
    limit = pod.top().total_bytes(exclude={found.folder})
    removed = pod.top().prune(limit)
    assert [(e.account, e.key) for e in removed] == [(alice.name, own.key)]
    assert not found.folder.exists() and own.folder.exists() and pod.of(bob).entries()[0].state == "ready"
    code, out, _ = run_cli(capsys, "remove", own.key[:12], "--cache", str(pod.cache))
    assert code == 0 and out.startswith(f"removed {own.key[:12]}  root  ready ")
    assert [e.account for e in pod.top().entries()] == [bob.name]


# -- the build, as the account, in its sandbox ----------------------------------------------------------------


def _under(path: Path, tops: list[Path]) -> bool:
    real = Path(os.path.realpath(path))
    return any(real == t or t in real.parents for t in tops)


def sandboxed(pod: Pod, account: Account, argv: list[str], writable: tuple[Path, ...], *,
              env_dir: Path | None = None) -> subprocess.CompletedProcess[str]:  # fmt: skip
    """Run ``argv`` as ``account`` inside a job's sandbox, laid out as `deskpod.jobs.isolation` lays it out: the
    system read-only, the pod's home hidden, folders other accounts cannot enter (the daemon's Python under
    /root) hidden but for the interpreter and deskpod, ``writable`` read-write; started by root (``switch_user``).
    The environment is clean: PATH, HOME, LANG (and where packages come from, as an admin would set it)."""
    if bwrap_path() is None:
        pytest.fail("bubblewrap is not installed (make test installs the Debian package bubblewrap)")
    interp = resolve_python("3.11")
    readable = [*interpreter_paths(), Path(os.path.realpath(interp.path)).parent.parent]
    closed = closed_ancestors(readable)
    hidden = [pod.base / "pod", pod.private, *closed]
    covered = [*hidden, *SANDBOX_TMPFS]  # an interpreter under /tmp (a checkout there) is shown again, as for jobs
    walls = Walls(writable=writable, hidden=tuple(hidden),
                  extra_ro=tuple(p for p in dict.fromkeys(readable) if _under(p, covered)))  # fmt: skip
    env = {"PATH": "/usr/local/bin:/usr/bin:/bin", "HOME": str(account.home), "LANG": "C.UTF-8"}
    if sources() is LOCAL:
        env.update(PIP_CONFIG_FILE=os.devnull, PIP_INDEX_URL=LOCAL.index_url or "")
    full = sandbox_argv(walls, argv, account=account, env_dir=env_dir, cwd=writable[0], switch_user=True)
    return subprocess.run(full, env=env, capture_output=True, text=True, timeout=600)


def test_env_build_runs_as_the_account_inside_its_sandbox(pod: Pod, two_users: tuple[Account, Account]) -> None:
    """What the pod runs for a job whose environment is not ready: ``deskpod env build`` as the job's account, in
    the job's sandbox, writing only the account's cache and the job's folder; then root finds it ready."""
    alice, bob = two_users
    tree = pod.tree(bob)
    job = prepare_owned_dir(pod.base / "pod" / "jobs" / "7", bob)
    (job / "environment.json").write_text(json.dumps(SIX.to_json()))
    give(job, bob)
    interp = resolve_python("3.11")
    build = [sys.executable, "-m", "deskpod", "env", "build", "--cache", str(tree), "--definition",
             str(job / "environment.json"), "--log", str(job / "env-build.log"), "--python", str(interp.path)]  # fmt: skip
    done = sandboxed(pod, bob, build, (job, tree))
    assert done.returncode == 0, done.stdout + done.stderr
    built = pod.of(bob).lookup(SIX, interp)  # root's lookup finds what bob built: the same key
    assert built is not None and done.stdout.strip() == str(built.path)
    assert "deskpod: building environment" in (job / "env-build.log").read_text()
    owners = {os.lstat(os.path.join(d, n)).st_uid for d, ds, fs in os.walk(tree) for n in ds + fs}
    assert owners == {bob.uid} and (job / "env-build.log").stat().st_uid == bob.uid
    assert [e.state for e in pod.top().entries()] == ["ready"]

    # It works, for bob, in his sandbox (outside it he cannot reach the interpreter under /root).
    # /tmp and /dev/shm are the sandbox's own, and writable by the account (a build's temporary files, a DataLoader).
    code = "import os, six, tempfile; [tempfile.mkstemp(dir=d) for d in ('/tmp', '/dev/shm')]; print(six.__version__, os.getuid())"
    ran = sandboxed(pod, bob, [str(built.python), "-c", code], (job,), env_dir=built.path)
    assert ran.returncode == 0 and ran.stdout.split() == ["1.17.0", str(bob.uid)], ran.stderr
    # A build is its own account's: bob's build refuses alice's cache (the kernel would stop its writes too).
    theirs = pod.tree(alice)
    done = sandboxed(pod, bob, [*build[:6], str(theirs), *build[7:]], (job, theirs))
    assert done.returncode == 1 and f"is uid {alice.uid}'s: its environments are built by that account" in done.stderr
    assert os.listdir(theirs) == []


BACKEND = """
import errno, json, os, zipfile

def attempt(f):
    try:
        f()
        return "ok"
    except OSError as e:
        return errno.errorcode.get(e.errno, str(e.errno))

def write(p):
    with open(p, "w") as f:
        f.write("written by a build backend")

def get_requires_for_build_wheel(config_settings=None):
    return []

def build_wheel(wheel_directory, config_settings=None, metadata_directory=None):
    seen = {"uid": os.getuid(), "read /etc/shadow": attempt(lambda: open("/etc/shadow").read()),
            "read the pod's token": attempt(lambda: open(TOKEN).read()),
            "list /root": sorted(os.listdir("/root")), "write /etc": attempt(lambda: write("/etc/deskpod-backend")),
            "write /root": attempt(lambda: write("/root/deskpod-backend"))}
    with open(PROOF, "w") as f:
        json.dump(seen, f)
    name = "evilpkg-1.0-py3-none-any.whl"
    with zipfile.ZipFile(os.path.join(wheel_directory, name), "w") as z:
        z.writestr("evilpkg.py", "BUILT_BY = %d\\n" % os.getuid())
        z.writestr("evilpkg-1.0.dist-info/METADATA", "Metadata-Version: 2.1\\nName: evilpkg\\nVersion: 1.0\\n")
        z.writestr("evilpkg-1.0.dist-info/WHEEL", "Wheel-Version: 1.0\\nRoot-Is-Purelib: true\\nTag: py3-none-any\\n")
        z.writestr("evilpkg-1.0.dist-info/RECORD", "")
    return name
"""


def test_a_build_backend_runs_as_the_account_inside_its_sandbox(pod: Pod, two_users: tuple[Account, Account]) -> None:
    """An attack through a build: an sdist whose build backend runs code. Served from http://127.0.0.1 (a network URL,
    allowed), it is built by ``deskpod env build`` run as the job's account in its sandbox: the backend runs as
    that account, sees neither the pod's home nor /root, and writes nowhere but where the account may."""
    _, bob = two_users
    tree = pod.tree(bob)
    job = prepare_owned_dir(pod.base / "pod" / "jobs" / "8", bob)
    proof = job / "backend-proof.json"
    served = pod.base / "served"
    source = served / "evilpkg-1.0"
    source.mkdir(parents=True)
    (source / "pyproject.toml").write_text('[build-system]\nrequires = []\nbuild-backend = "backend"\n'
                                           'backend-path = ["."]\n[project]\nname = "evilpkg"\nversion = "1.0"\n')  # fmt: skip
    (source / "PKG-INFO").write_text("Metadata-Version: 2.1\nName: evilpkg\nVersion: 1.0\n")
    token = pod.base / "pod" / "token"
    token.write_text("dp_admin_token")
    token.chmod(0o644)
    (source / "backend.py").write_text(f"PROOF = {str(proof)!r}\nTOKEN = {str(token)!r}\n{BACKEND}")
    with tarfile.open(served / "evilpkg-1.0.tar.gz", "w:gz") as tar:
        tar.add(source, arcname="evilpkg-1.0")
    handler = functools.partial(http.server.SimpleHTTPRequestHandler, directory=str(served))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        url = f"http://127.0.0.1:{server.server_address[1]}/evilpkg-1.0.tar.gz"
        defn = packages(f"evilpkg @ {url}")
        (job / "environment.json").write_text(json.dumps(defn.to_json()))
        give(job, bob)
        interp = resolve_python("3.11")
        build = [sys.executable, "-m", "deskpod", "env", "build", "--cache", str(tree), "--definition",
                 str(job / "environment.json"), "--python", str(interp.path)]  # fmt: skip
        done = sandboxed(pod, bob, build, (job, tree))
    finally:
        server.shutdown()
        server.server_close()
    assert done.returncode == 0, done.stdout + done.stderr
    assert json.loads(proof.read_text()) == {
        "uid": bob.uid,
        "read /etc/shadow": "EACCES",
        "read the pod's token": "ENOENT",  # the pod's home is hidden (world-readable here on purpose)
        "list /root": [".pyenv"],  # only the daemon's interpreter is shown of root's home
        "write /etc": "EROFS",
        "write /root": "EROFS",
    }
    assert proof.stat().st_uid == bob.uid
    built = pod.of(bob).lookup(defn, interp)
    assert built is not None
    code = "import evilpkg; print(evilpkg.BUILT_BY)"
    ran = sandboxed(pod, bob, [str(built.python), "-c", code], (job,), env_dir=built.path)
    assert ran.stdout.split() == [str(bob.uid)], ran.stderr


# -- attacks on root's readers ---------------------------------------------------------------------------------


def snapshot(base: Path, skip: Path) -> dict[str, tuple[int, int, int, int, str]]:
    """What is under ``base`` but ``skip`` (and /etc/shadow): type, inode, size, mtime and a hash of each file."""
    out: dict[str, tuple[int, int, int, int, str]] = {}
    paths = [Path("/etc/shadow")]
    for folder, dirs, files in os.walk(base):
        dirs[:] = [d for d in dirs if Path(folder, d) != skip]
        paths += [Path(folder, n) for n in dirs + files]
    for p in paths:
        st = os.lstat(p)
        digest = hashlib.sha256(p.read_bytes()).hexdigest() if stat.S_ISREG(st.st_mode) else ""
        out[str(p)] = (stat.S_IFMT(st.st_mode), st.st_ino, st.st_size, st.st_mtime_ns, digest)
    return out


MARKER = "ROOT-ONLY-SECRET"


def _plant(kind: str, tree: Path, key: str, private: Path) -> None:
    """Replace what is at one place of the account's environment ``key`` with an attack (as the account would)."""
    folder = tree / key[:20]
    if kind == "meta -> /etc/shadow":
        (folder / "meta.json").unlink()
        (folder / "meta.json").symlink_to("/etc/shadow")
    elif kind == "meta -> a valid meta only root may read":
        meta = json.loads((folder / "meta.json").read_text())
        (private / "meta.json").write_text(json.dumps({**meta, "note": MARKER}))
        (folder / "meta.json").unlink()
        (folder / "meta.json").symlink_to(private / "meta.json")
    elif kind == "meta is a FIFO":
        (folder / "meta.json").unlink()
        os.mkfifo(folder / "meta.json")
    elif kind == "lock -> a root file":
        (private / "daemon.lock").write_text(MARKER)
        (tree / ".locks" / f"{key[:20]}.lock").unlink()
        (tree / ".locks" / f"{key[:20]}.lock").symlink_to(private / "daemon.lock")
    elif kind == "lock -> nowhere":
        (tree / ".locks" / f"{key[:20]}.lock").unlink()
        (tree / ".locks" / f"{key[:20]}.lock").symlink_to(private / "created-by-root")
    elif kind == "lock is a FIFO":
        (tree / ".locks" / f"{key[:20]}.lock").unlink()
        os.mkfifo(tree / ".locks" / f"{key[:20]}.lock")
    elif kind == ".locks -> a root folder":
        shutil.rmtree(tree / ".locks")
        (private / "locks").mkdir()
        (tree / ".locks").symlink_to(private / "locks")
    elif kind == "folder -> a root folder":
        os.rename(folder, private / "env-copy")  # a complete, valid environment: following the link finds it ready
        give(private / "env-copy", None)
        folder.symlink_to(private / "env-copy")
    elif kind == "env -> a root folder":
        os.rename(folder / "env", private / "env")
        give(private / "env", None)
        (folder / "env").symlink_to(private / "env")
    else:
        raise AssertionError(kind)


ATTACKS = ["meta -> /etc/shadow", "meta -> a valid meta only root may read", "meta is a FIFO", "lock -> a root file",
           "lock -> nowhere", "lock is a FIFO", ".locks -> a root folder", "folder -> a root folder",
           "env -> a root folder"]  # fmt: skip


@pytest.mark.parametrize("clean", ["prune", "remove"])
@pytest.mark.parametrize("attack", ATTACKS)
def test_root_never_follows_blocks_or_reaches_outside_an_accounts_tree(
    pod: Pod, template: Path, two_users: tuple[Account, Account], capsys: pytest.CaptureFixture[str], attack: str,
    clean: str,
) -> None:  # fmt: skip
    alice, _ = two_users
    tree = pod.tree(alice)
    copy_tree(template, tree, alice)
    assert pod.of(alice).lookup(SIX) is not None  # the control: untouched, it is ready
    key = pod.of(alice).entries()[0].key
    _plant(attack, tree, key, pod.private)
    give(tree, alice)
    before = snapshot(pod.base, tree)

    assert within_deadline(lambda: pod.of(alice).lookup(SIX), "lookup") is None
    [entry] = within_deadline(pod.top().entries, "entries")
    assert (entry.account, entry.key[:20], entry.state, entry.in_use) == (alice.name, key[:20], "broken", False)
    code, out, err = within_deadline(lambda: run_cli(capsys, "list", "--cache", str(pod.cache)), "env list")
    assert code == 0 and out.splitlines()[1].split()[1:3] == [alice.name, "broken"], out + err
    code, out, err = within_deadline(lambda: run_cli(capsys, "show", key[:12], "--cache", str(pod.cache)), "env show")
    assert code == 0 and MARKER not in out and "root:" not in out, out  # nothing of /etc/shadow or root's file
    if clean == "prune":
        removed = within_deadline(lambda: pod.top().prune(10**15), "prune")  # a broken one goes whatever the limit
        assert [(e.account, e.key[:20]) for e in removed] == [(alice.name, key[:20])]
    else:
        assert within_deadline(lambda: pod.top().remove(key[:12]), "remove").account == alice.name
    assert not os.path.lexists(tree / key[:20]) and pod.top().entries() == []
    assert snapshot(pod.base, tree) == before  # nothing outside the tree was created, changed or removed
    lock = tree / ".locks" / f"{key[:20]}.lock"  # a bad lock was replaced by a file of the account's
    assert stat.S_ISREG(os.lstat(lock).st_mode) and os.lstat(lock).st_uid == alice.uid


def test_touch_and_sizes_follow_no_link(pod: Pod, template: Path, two_users: tuple[Account, Account]) -> None:
    alice, _ = two_users
    tree = pod.tree(alice)
    copy_tree(template, tree, alice)
    cache = pod.of(alice)
    key = cache.entries()[0].key
    target = pod.private / "mtime-kept"
    target.write_text(MARKER * 100_000)
    os.utime(target, (1_000_000_000, 1_000_000_000))
    (tree / key[:20] / "last_used").unlink()
    (tree / key[:20] / "last_used").symlink_to(target)
    os.rename(tree / ".uv-cache", tree / "uv-cache-moved")
    (tree / ".uv-cache").symlink_to(pod.private)
    (tree / key[:20] / "big").symlink_to(target)
    give(tree, alice)
    cache.touch(key)
    assert target.stat().st_mtime == 1_000_000_000  # the link's own time was set, not its target's
    [entry] = cache.entries()
    assert entry.state == "ready" and entry.last_used == os.lstat(tree / key[:20] / "last_used").st_mtime
    assert entry.size_bytes < target.stat().st_size and cache.uv_cache_bytes() == 0
    # A missing last_used is made by root as a file of the account's, not of root's.
    (tree / key[:20] / "last_used").unlink()
    cache.touch(key)
    assert os.lstat(tree / key[:20] / "last_used").st_uid == alice.uid
    # A meta.json nested a thousand deep, or naming a key that is a path, is a broken entry, not a crash.
    (tree / key[:20] / "meta.json").write_text("[" * 100_000 + "]" * 100_000)
    (tree / key[:20] / "definition.json").write_text(json.dumps({"key": "../../../../etc/x"}))
    [entry] = pod.top().entries()
    assert (entry.key, entry.state) == (key[:20], "broken")
