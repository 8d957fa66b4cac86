"""Whether an environment's definition resolves against this box's package sources, without building it.

An environment is built where a job runs; a definition that names a version no index has, or a lock that no longer
matches its pyproject, fails there, late. `resolve` asks uv the same question up front, installing nothing::

    packages, requirements, pyproject   uv pip compile --python-version X.Y   -> the exact packages it resolves to
    lock (with its pyproject)           uv lock --check                       -> the lock is current: its packages

against the sources a build would use (pip's configuration, `deskpod.envs.index`), with uv's cache in a folder the
caller names. Local indexes and find-links folders work offline; a definition that does not resolve is one line
(`installer_cause`), as a failed build says it.
"""

from __future__ import annotations

import os
import subprocess
import tempfile
import tomllib
from dataclasses import dataclass
from pathlib import Path

from deskpod.envs.cache import find_uv, installer_cause
from deskpod.envs.definition import EnvDefinition
from deskpod.envs.index import PackageSources, package_sources
from deskpod.errors import ConfigError, RunError

RESOLVE_TIMEOUT_S = 300.0
"""A resolution against remote indexes may fetch metadata; local ones answer in well under a second."""


@dataclass(frozen=True, slots=True)
class Resolution:
    """What a definition resolved to here."""

    packages: tuple[str, ...]
    """``name==version`` of every package it installs (the lock's own project left out), sorted."""
    python: str
    """The Python version it was resolved for (``3.11``)."""


def resolve(defn: EnvDefinition, *, python: str, cache_dir: Path, sources: PackageSources | None = None) -> Resolution:
    """Resolve ``defn`` for Python ``python`` (``3.11``) against ``sources`` (default: pip's configuration here),
    uv's cache in ``cache_dir``. `ConfigError` (one line, uv's cause) when it does not resolve; `RunError` when uv
    is missing or cannot run."""
    if defn.kind == "image":
        raise ConfigError(f"environment image {defn.image!r} is a container image: it is not resolved here; give a"
                          " uv lock or a requirements file")  # fmt: skip
    uv = find_uv()
    if uv is None:
        raise RunError("resolving an environment needs uv (pip install uv)")
    sources = sources or package_sources()
    env = dict(os.environ)
    for k, v in sources.uv_environment().items():
        env.setdefault(k, v)
    env.update({"UV_CACHE_DIR": str(cache_dir), "UV_PYTHON_DOWNLOADS": "never", "NO_COLOR": "1", "UV_NO_PROGRESS": "1"})
    for k in ("VIRTUAL_ENV", "CONDA_PREFIX", "PYTHONPATH", "PYTHONHOME", "UV_PROJECT_ENVIRONMENT"):
        env.pop(k, None)
    cache_dir.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="deskpod-resolve-") as tmp:
        folder = Path(tmp)
        if defn.kind == "lock":
            assert defn.lock is not None and defn.pyproject is not None
            (folder / "pyproject.toml").write_text(defn.pyproject.text)
            (folder / "uv.lock").write_text(defn.lock.text)
            argv = [uv, "lock", "--check", "--project", str(folder)]
            what = f"the lock {defn.lock.file!r} is not current for its pyproject"
        else:
            (folder / "requirements.in").write_text(defn.requirements_text())
            argv = [uv, "pip", "compile", "--python-version", python, "--no-header", "--no-annotate",
                    *sources.uv_arguments(), str(folder / "requirements.in")]  # fmt: skip
            what = "it does not resolve"
        try:
            done = subprocess.run(argv, cwd=folder, env=env, stdin=subprocess.DEVNULL, capture_output=True, text=True,
                                  timeout=RESOLVE_TIMEOUT_S)  # fmt: skip
        except (OSError, subprocess.SubprocessError) as e:
            raise RunError(f"could not run uv to resolve the environment: {e}") from e
        if done.returncode != 0:
            raise ConfigError(f"{defn.summary()}: {what}: {installer_cause(done.stderr + done.stdout)}")
        if defn.kind == "lock":
            return Resolution(_locked(defn), python)
        pins = sorted(line.strip() for line in done.stdout.splitlines() if line.strip() and line[0] not in "# -")
        return Resolution(tuple(pins), python)


def _locked(defn: EnvDefinition) -> tuple[str, ...]:
    """The ``name==version`` of a checked lock's packages, its own (virtual or editable) project left out."""
    assert defn.lock is not None and defn.pyproject is not None
    project = tomllib.loads(defn.pyproject.text).get("project", {}).get("name")
    out = []
    for package in tomllib.loads(defn.lock.text).get("package", []):
        source = package.get("source", {})
        if package.get("name") == project and ("virtual" in source or "editable" in source):
            continue
        out.append(f"{package['name']}=={package.get('version', '?')}")
    return tuple(sorted(out))
