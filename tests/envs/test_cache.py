"""The environment cache with real uv, real venvs and real installs of small packages.

Every test has its own cache root (and so its own uv cache, ``<root>/.uv-cache``). Packages come from this
machine's local indexes when it has them (``/opt/pypi``, ``/opt/wheels``), so nothing is fetched from the network;
on a machine without them, from pip's configuration (PyPI).
"""

from __future__ import annotations

import fcntl
import io
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from deskpod.envs.cache import EnvBuildError, EnvCache, find_uv, installer_cause
from deskpod.envs.definition import EnvDefinition, parse_environment
from deskpod.envs.index import PackageSources, package_sources, pip_config_files
from deskpod.envs.python import resolve_python
from deskpod.errors import ConflictError, NotFoundError, UsageError

LOCAL_INDEX = Path("/opt/pypi/simple")
LOCAL = PackageSources(
    index_url=LOCAL_INDEX.as_uri(),
    extra_index_urls=tuple(p.as_uri() for p in [Path("/opt/pypi-more/simple")] if p.exists()),
    find_links=tuple(str(p) for p in [Path("/opt/wheels")] if p.exists()),
)
SIX_HASH = "sha256:4721f391ed90541fddacab5acf947aa0d3dc7d27b2e1e8eda2be8970586c3274"
"""six-1.17.0-py2.py3-none-any.whl, the same file on PyPI and in the local index."""


def sources() -> PackageSources:
    return LOCAL if (LOCAL_INDEX / "six").exists() else package_sources()


def packages(*reqs: str) -> EnvDefinition:
    return parse_environment({"packages": list(reqs), "python": "3.11"})


def run_in(python: Path, code: str) -> str:
    return subprocess.run([str(python), "-c", code], capture_output=True, text=True, check=True).stdout.strip()


@pytest.fixture
def cache(tmp_path: Path) -> EnvCache:
    return EnvCache(tmp_path / "envs", sources=sources())


# -- package sources ----------------------------------------------------------------------------------------


def test_pip_configuration_becomes_uv_variables(tmp_path: Path) -> None:
    wheels, index = tmp_path / "wheels", tmp_path / "simple"
    wheels.mkdir()
    index.mkdir()
    (tmp_path / "etc" / "pip").mkdir(parents=True)
    (tmp_path / "etc" / "pip" / "pip.conf").write_text(
        f"[global]\nfind-links = {wheels}\nextra-index-url = {index.as_uri()} file:///nonexistent/simple\n"
        "  https://extra.example/simple\nconstraint = /etc/constraints.txt\n"
    )
    (tmp_path / ".config" / "pip").mkdir(parents=True)  # read after the global files (and /etc/pip.conf)
    (tmp_path / ".config" / "pip" / "pip.conf").write_text(
        "[global]\nindex-url = https://mirror.example/simple\n[install]\ntrusted-host = mirror.example\n"
    )
    env = {"HOME": str(tmp_path), "XDG_CONFIG_DIRS": str(tmp_path / "etc"), "PIP_FIND_LINKS": f"{wheels} /nonexistent"}
    s = package_sources(env, prefix=str(tmp_path / "venv"))
    assert s.index_url == "https://mirror.example/simple"
    assert s.extra_index_urls == (index.as_uri(), "https://extra.example/simple")  # the missing file:// one dropped
    assert s.find_links == (str(wheels),)  # PIP_FIND_LINKS overrides the file; the missing folder is dropped
    assert s.trusted_hosts == ("mirror.example",)
    ours = [f for f in s.files if f.startswith(str(tmp_path))]
    assert ours == [str(tmp_path / "etc/pip/pip.conf"), str(tmp_path / ".config/pip/pip.conf")]
    assert s.uv_environment() == {
        "UV_INDEX_STRATEGY": "unsafe-best-match",
        "UV_INDEX_URL": "https://mirror.example/simple",
        "UV_EXTRA_INDEX_URL": f"{index.as_uri()} https://extra.example/simple",  # space-separated
        "UV_FIND_LINKS": str(wheels),  # comma-separated
        "UV_INSECURE_HOST": "mirror.example",
    }
    assert package_sources({**env, "PIP_CONFIG_FILE": os.devnull, "PIP_FIND_LINKS": ""}) == PackageSources()
    assert pip_config_files({**env, "PIP_CONFIG_FILE": os.devnull}) == []
    assert package_sources({**env, "PIP_NO_INDEX": "true"}).uv_arguments() == ["--no-index"]


def test_sources_are_what_pip_itself_reports() -> None:
    """On this machine: pip's own ``pip config list`` and deskpod's reading of the same files agree."""
    out = subprocess.run([sys.executable, "-m", "pip", "config", "list"], capture_output=True, text=True, check=True)
    pip: dict[str, str] = {}
    for line in out.stdout.splitlines():  # global.find-links='/opt/wheels', :env:.find-links='/opt/wheels'
        key, _, value = line.partition("=")
        pip[key.split(".", 1)[1]] = value.strip("'")
    s = package_sources()
    assert s.find_links == tuple(p for p in pip.get("find-links", "").split() if Path(p).exists())
    assert s.extra_index_urls == tuple(u for u in pip.get("extra-index-url", "").split() if Path(u[7:]).exists())
    assert s.index_url == (pip.get("index-url") or None)


@pytest.mark.skipif(not list(Path("/opt/wheels").glob("torch-2.13.0*")), reason="torch 2.13.0 lies in /opt/wheels here")
def test_uv_finds_torch_2_13_where_pip_does(tmp_path: Path) -> None:
    env = {**os.environ, **package_sources().uv_environment(), "UV_CACHE_DIR": str(tmp_path / "c"), "UV_OFFLINE": "1"}
    uv_bin = find_uv()
    assert uv_bin is not None
    py = str(resolve_python("3.11").path)
    subprocess.run([uv_bin, "venv", "--python", py, str(tmp_path / "v")], env=env, check=True, capture_output=True)
    out = subprocess.run([uv_bin, "pip", "install", "--dry-run", "--no-deps", "--python", str(tmp_path / "v"),
                          "torch==2.13.0"], env=env, capture_output=True, text=True)  # fmt: skip
    assert out.returncode == 0, out.stderr
    assert "+ torch==2.13.0+cpu" in out.stderr


# -- building and finding -------------------------------------------------------------------------------------


def test_first_ensure_builds_and_the_second_installs_nothing(cache: EnvCache) -> None:
    d = packages("six==1.17.0")
    assert cache.lookup(d) is None
    log = io.BytesIO()
    first = cache.ensure(d, log=log)
    assert first.built and first.path == cache.folder(first.key) / "env" and first.python == first.path / "bin/python"
    assert run_in(first.python, "import six, sys; print(six.__version__, sys.prefix)") == f"1.17.0 {first.path}"
    text = log.getvalue().decode()
    assert text.count("deskpod: building environment") == 1 and "+ six==1.17.0" in text
    build_log = first.folder / "build.log"
    assert build_log.read_text() == text
    assert first.freeze.read_text() == "six==1.17.0\n"
    meta = json.loads((first.folder / "meta.json").read_text())
    assert meta["key"] == first.key and meta["python"]["version"] == resolve_python("3.11").version
    assert meta["installer"].startswith("uv ") and meta["definition"] == d.to_json() and meta["size_bytes"] > 0
    before = (build_log.stat().st_mtime_ns, build_log.read_bytes())

    log2 = io.BytesIO()
    second = cache.ensure(d, log=log2)
    assert not second.built and second.path == first.path
    assert "nothing to install" in log2.getvalue().decode() and "building" not in log2.getvalue().decode()
    assert (build_log.stat().st_mtime_ns, build_log.read_bytes()) == before  # no installer ran
    found = cache.lookup(d)
    assert found is not None and found.path == first.path and not found.built
    # What defines it, not how it is written: order of packages, or the Python named or left to default.
    assert cache.key(packages("idna", "six==1.17.0"), resolve_python("3.11")) == cache.key(
        packages("six==1.17.0", "idna"), resolve_python("3.11")
    )
    assert cache.key(d, resolve_python("3.11")) != cache.key(d, resolve_python("3.12"))


def test_two_processes_build_one_new_environment_once(tmp_path: Path) -> None:
    definition = tmp_path / "env.json"
    definition.write_text(json.dumps(packages("six==1.17.0").to_json()))
    root = tmp_path / "envs"
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])}
    s = sources()
    if s is LOCAL:  # the same sources, handed over the way an admin would: pip's variables
        env.update(PIP_CONFIG_FILE=os.devnull, PIP_INDEX_URL=LOCAL.index_url or "", PIP_FIND_LINKS="")
    argv = [sys.executable, "-m", "deskpod", "env", "build", "--definition", str(definition), "--cache", str(root)]
    out = subprocess.PIPE
    procs = [subprocess.Popen([*argv, "--log", str(tmp_path / f"log{i}")], env=env, stdout=out, stderr=out, text=True)
             for i in range(2)]  # fmt: skip
    results = [p.communicate(timeout=120) for p in procs]
    assert [p.returncode for p in procs] == [0, 0], results
    assert results[0][0] == results[1][0] and results[0][0].strip().endswith("/env")
    logs = [(tmp_path / f"log{i}").read_text() for i in range(2)]
    assert sum(log.count("deskpod: building environment") for log in logs) == 1, logs
    assert sum(log.count("+ six==1.17.0") for log in logs) == 1
    other = next(log for log in logs if "building environment" not in log)
    assert "nothing to install" in other
    assert [e.state for e in EnvCache(root).entries()] == ["ready"]


def test_half_built_and_corrupt_environments_are_rebuilt(cache: EnvCache) -> None:
    d = packages("six==1.17.0")
    built = cache.ensure(d, log=io.BytesIO())
    # Half-built: interrupted before meta.json (the ready marker) was written.
    (built.folder / "meta.json").unlink()
    assert cache.lookup(d) is None
    assert [e.state for e in cache.entries()] == ["broken"]
    log = io.BytesIO()
    again = cache.ensure(d, log=log)
    assert again.built and "removing a half-built or broken environment" in log.getvalue().decode()
    assert run_in(again.python, "import six; print(six.__version__)") == "1.17.0"
    # Corrupt: meta.json says ready but the interpreter is gone.
    (again.path / "bin" / "python").unlink()
    assert cache.lookup(d) is None
    assert cache.ensure(d, log=io.BytesIO()).built
    # Garbage in meta.json.
    (again.folder / "meta.json").write_text("{not json")
    assert cache.lookup(d) is None and cache.ensure(d, log=io.BytesIO()).built
    assert [e.state for e in cache.entries()] == ["ready"]


def test_an_unknown_package_fails_with_the_installers_cause(cache: EnvCache) -> None:
    d = packages("nosuchpkg-deskpod==1.0")
    log = io.BytesIO()
    with pytest.raises(EnvBuildError) as e:
        cache.ensure(d, log=log)
    message = str(e.value)
    assert "\n" not in message and e.value.exit_code == 1
    assert message.startswith("environment build failed (uv pip install): No solution found when resolving")
    assert "nosuchpkg-deskpod was not found" in message
    assert "nosuchpkg-deskpod" in log.getvalue().decode()
    assert cache.lookup(d) is None
    [entry] = cache.entries()
    assert entry.state == "broken" and entry.summary == "packages nosuchpkg-deskpod==1.0"
    assert not (entry.folder / "env").exists() and "No solution found" in (entry.folder / "build.log").read_text()
    with pytest.raises(EnvBuildError, match="nosuchpkg-deskpod was not found"):
        cache.ensure(d, log=io.BytesIO())  # tried again from scratch, fails the same way


def test_conflicting_versions_live_side_by_side(cache: EnvCache) -> None:
    old = cache.ensure(packages("tabulate==0.8.10"), log=io.BytesIO())
    new = cache.ensure(packages("tabulate==0.10.0"), log=io.BytesIO())
    assert old.key != new.key
    code = "import tabulate; print(tabulate.__version__)"
    procs = [subprocess.Popen([str(b.python), "-c", code], stdout=subprocess.PIPE, text=True) for b in (old, new)]
    assert [p.communicate()[0].strip() for p in procs] == ["0.8.10", "0.10.0"]


def test_requirements_lock_and_pyproject_environments(cache: EnvCache, tmp_path: Path) -> None:
    reqs = parse_environment({"requirements": {"file": "requirements.txt",
                                               "text": f"# pinned\nsix==1.17.0 \\\n    --hash={SIX_HASH}\n"}})  # fmt: skip
    built = cache.ensure(reqs, log=io.BytesIO())
    assert (built.folder / "requirements.txt").read_text() == reqs.requirements_text()
    assert built.inputs == [built.folder / "requirements.txt"]
    assert built.freeze.read_text() == "six==1.17.0\n"

    project = tmp_path / "project"
    project.mkdir()
    (project / "pyproject.toml").write_text(
        '[project]\nname = "demo"\nversion = "0.1"\nrequires-python = ">=3.10"\ndependencies = ["tabulate==0.8.10"]\n'
    )
    assert cache.installer == "uv"
    lock_env = {**os.environ, **cache.sources.uv_environment(), "UV_CACHE_DIR": str(cache.uv_cache)}
    subprocess.run([str(find_uv()), "lock", "--python", str(resolve_python("3.11").path)], cwd=project, env=lock_env,
                   check=True, capture_output=True)  # fmt: skip
    locked = parse_environment({"lock": "project/uv.lock", "python": "3.11"}, base_dir=tmp_path)
    log = io.BytesIO()
    built = cache.ensure(locked, log=log)
    assert "uv sync --frozen --no-install-project" in log.getvalue().decode()
    assert run_in(built.python, "import tabulate; print(tabulate.__version__)") == "0.8.10"
    assert (built.folder / "project" / "uv.lock").read_text() == (project / "uv.lock").read_text()
    assert built.inputs == [built.folder / "project/pyproject.toml", built.folder / "project/uv.lock"]
    assert "demo" not in built.freeze.read_text()  # the project itself is not installed, its dependencies are

    alone = parse_environment({"pyproject": "project/pyproject.toml"}, base_dir=tmp_path)
    built = cache.ensure(alone, log=io.BytesIO())
    assert built.freeze.read_text() == "tabulate==0.8.10\n"


def test_the_pip_fallback_builds_the_same_environment(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    if sources() is LOCAL:
        monkeypatch.setenv("PIP_INDEX_URL", LOCAL.index_url or "")
    cache = EnvCache(tmp_path / "envs", installer="pip")
    built = cache.ensure(packages("six==1.17.0"), log=io.BytesIO())
    assert built.built and run_in(built.python, "import six; print(six.__version__)") == "1.17.0"
    assert "six==1.17.0" in built.freeze.read_text().splitlines()
    assert json.loads((built.folder / "meta.json").read_text())["installer"].startswith("pip")


# -- listing, removing, pruning ----------------------------------------------------------------------------


def test_prune_removes_least_recently_used_first_and_never_one_in_use(cache: EnvCache) -> None:
    a = cache.ensure(packages("six==1.17.0"), log=io.BytesIO())
    b = cache.ensure(packages("tabulate==0.8.10"), log=io.BytesIO())
    c = cache.ensure(packages("idna", "six==1.17.0"), log=io.BytesIO())
    now = time.time()
    for i, env in enumerate((a, b, c)):  # a used longest ago, c most recently
        os.utime(env.folder / "last_used", (now - 3000 + 1000 * i, now - 3000 + 1000 * i))
    half = cache.folder("f" * 64)  # an interrupted build nobody holds: removed whatever the limit
    half.mkdir()
    (half / "build.log").write_text("interrupted\n")
    entries = {e.key: e for e in cache.entries()}
    assert [entries[x.key].state for x in (a, b, c)] == ["ready"] * 3 and entries["f" * 20].state == "broken"
    # six's files are in a and c once each, hardlinked from uv's cache: counted once.
    assert cache.total_bytes() < sum(e.size_bytes for e in entries.values())
    # The limit a's removal would meet; but a (least recently used) is in use, so b goes, and then it is met.
    limit = cache.total_bytes(exclude={b.key, "f" * 64})

    with cache.in_use(a.key):
        assert next(e for e in cache.entries() if e.key == a.key).in_use
        with pytest.raises(ConflictError, match=r"in use by a running job"):
            cache.remove(a.key)
        dry = cache.prune(limit, dry_run=True)
        assert [e.key for e in dry] == ["f" * 20, b.key] and half.exists() and b.folder.exists()
        removed = cache.prune(limit)
        assert [e.key for e in removed] == ["f" * 20, b.key]
    assert not half.exists() and not b.folder.exists() and a.folder.exists() and c.folder.exists()
    assert cache.total_bytes() <= limit
    assert cache.lookup(packages("six==1.17.0")) is not None
    assert cache.prune(cache.total_bytes()) == []  # within the limit: nothing goes

    # A job holding the lock from another process is respected just the same.
    holder = subprocess.Popen([sys.executable, "-c", "import fcntl, sys; f = open(sys.argv[1]); "
                               "fcntl.flock(f, fcntl.LOCK_SH); print('held', flush=True); sys.stdin.read()",
                               str(cache.in_use_lock_path(c.key))], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                              text=True)  # fmt: skip
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "held"
        assert [e.key for e in cache.prune(0)] == [a.key]
    finally:
        holder.communicate("")
    assert [e.key for e in cache.prune(0)] == [c.key] and cache.entries() == []


def test_find_and_remove(cache: EnvCache) -> None:
    built = cache.ensure(packages("six==1.17.0"), log=io.BytesIO())
    assert cache.find(built.key[:6]).key == built.key == cache.find(built.key).key
    with pytest.raises(NotFoundError, match=r"no environment '000000' in .*; `deskpod env list` shows them"):
        cache.find("000000")
    with pytest.raises(UsageError, match=r"expected a key or its first characters"):
        cache.find("../etc")
    assert cache.remove(built.key[:8]).key == built.key
    assert cache.entries() == [] and cache.lookup(packages("six==1.17.0")) is None
    # The lock is taken shared and released by a job: after it, prune and remove may go ahead.
    fd = os.open(cache.in_use_lock_path(built.key), os.O_RDONLY)
    fcntl.flock(fd, fcntl.LOCK_SH)
    os.close(fd)


def test_installer_causes_in_one_line() -> None:
    uv = (
        "Using Python 3.11.7 environment at: env\n"
        "error: No solution found when resolving dependencies\n"
        "  cause: Because only the following versions of tabulate are available:\n"
        "      tabulate==0.8.10\n"
        "      tabulate==0.10.0\n"
        "  and you require tabulate==0.9.0, we can conclude that your requirements are unsatisfiable.\n"
        "\n"
        "hint: Pre-releases are available for tabulate\n"
    )
    assert installer_cause(uv) == (
        "No solution found when resolving dependencies: Because only the following versions of tabulate are"
        " available: tabulate==0.8.10 tabulate==0.10.0 and you require tabulate==0.9.0, we can conclude that your"
        " requirements are unsatisfiable."
    )
    fancy = "  \x1b[31m×\x1b[0m Failed to download `x==1`\n  ├─▶ Request failed\n  ╰─▶ connection refused\n"
    assert installer_cause(fancy) == "Failed to download `x==1`: Request failed: connection refused"
    pip = (
        "Looking in indexes: file:///opt/pypi/simple\n"
        "ERROR: Could not find a version that satisfies the requirement nosuchpkg==1.0 (from versions: none)\n"
        "ERROR: No matching distribution found for nosuchpkg==1.0\n"
    )
    assert installer_cause(pip) == (
        "Could not find a version that satisfies the requirement nosuchpkg==1.0 (from versions: none);"
        " No matching distribution found for nosuchpkg==1.0"
    )
    assert installer_cause("Traceback...\nOSError: disk full\n") == "OSError: disk full"


def test_a_pruned_environment_is_rebuilt_offline_to_the_same_versions(cache: EnvCache) -> None:
    defn = packages("tabulate")  # unpinned: a fresh resolve could pick another version; the replay may not
    first = cache.ensure(defn, log=io.BytesIO())
    freeze = first.freeze.read_text()
    cache.remove(first.key)
    log = io.BytesIO()
    again = cache.ensure(defn, log=log)
    assert again.built and again.freeze.read_text() == freeze
    assert b"uv pip sync --offline" in log.getvalue() and b"installed the recorded resolution" in log.getvalue()
    assert b"uv pip install" not in log.getvalue()  # nothing was resolved again
    # When the recorded set cannot be installed offline (here: a version no index or cache has), the build
    # resolves from the definition instead.
    cache.remove(again.key)
    cache.resolved_path(again.key).write_text("tabulate==0.0.1\n")
    log = io.BytesIO()
    third = cache.ensure(defn, log=log)
    assert b"cannot be installed offline" in log.getvalue() and b"uv pip install" in log.getvalue()
    assert "tabulate==" in third.freeze.read_text()
