"""The Python interpreters of this box, and the one an environment asks for.

deskpod finds interpreters itself rather than asking ``uv python find``: on boxes with pyenv, the shims on PATH
fail when a version is not the selected one, and uv gives up on them. Looked at, in order::

    every folder of PATH                        python3.X (pyenv's shims folders skipped: dispatchers, not Pythons)
    $PYENV_ROOT/versions/*/bin                  (default ~/.pyenv)
    /usr/local/bin, /usr/bin
    uv's managed Pythons                        $UV_PYTHON_INSTALL_DIR, else $XDG_DATA_HOME/uv/python,
                                                else ~/.local/share/uv/python (what `uv python dir` prints)
    this process's own interpreter

Each candidate runs once (``-I -c``, in parallel) to report its exact version, platform and implementation;
one that fails is skipped. The answer is kept for the life of the process (`available_pythons`), so resolving
an environment's Python on a job's start path runs nothing after the first time.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from dataclasses import asdict, dataclass
from pathlib import Path

from packaging.version import InvalidVersion, Version

from deskpod.errors import ConfigError

NAME_RE = re.compile(r"^python3\.\d{1,2}$")
PROBE = (
    "import json, platform, sys, sysconfig; "
    "print(json.dumps([platform.python_version(), sysconfig.get_platform(), sys.implementation.name]))"
)
PROBE_TIMEOUT_S = 20.0

_found: list[Interpreter] | None = None


@dataclass(frozen=True, slots=True)
class Interpreter:
    """One Python on this box."""

    path: Path
    """The executable (``.../bin/python3.11``), as found (not resolved through symlinks)."""
    version: str
    """Exact version, ``3.11.7``."""
    platform: str
    """``sysconfig.get_platform()``, e.g. ``linux-x86_64``."""
    implementation: str
    """``sys.implementation.name``, e.g. ``cpython``."""

    @property
    def minor(self) -> str:
        """``3.11``."""
        return ".".join(self.version.split(".")[:2])

    def to_json(self) -> dict[str, str]:
        return {**asdict(self), "path": str(self.path)}


def candidate_paths(environ: dict[str, str] | None = None) -> list[Path]:
    """Executables named ``python3.X`` where this box keeps Pythons, in the order above, each real file once."""
    env = os.environ if environ is None else environ
    home = Path(env.get("HOME") or Path.home())
    folders = [Path(p) for p in env.get("PATH", "").split(os.pathsep) if p and Path(p).name != "shims"]
    pyenv = Path(env.get("PYENV_ROOT") or home / ".pyenv") / "versions"
    folders += sorted(pyenv.glob("*/bin"))
    folders += [Path("/usr/local/bin"), Path("/usr/bin")]
    uv_dir = env.get("UV_PYTHON_INSTALL_DIR") or str(
        Path(env.get("XDG_DATA_HOME") or home / ".local/share") / "uv/python"
    )
    folders += sorted(Path(uv_dir).expanduser().glob("*/bin"))
    out: list[Path] = []
    seen: set[str] = set()
    for folder in folders:
        try:
            names = sorted(os.listdir(folder))
        except OSError:
            continue
        for name in names:
            if NAME_RE.match(name):
                out += _once(folder / name, seen)
    own = getattr(sys, "_base_executable", None) or sys.executable
    if own:
        out += _once(Path(own), seen)
    return out


def _once(path: Path, seen: set[str]) -> list[Path]:
    try:
        real = os.path.realpath(path)
        if real in seen or not os.access(real, os.X_OK) or not os.path.isfile(real):
            return []
    except OSError:
        return []
    seen.add(real)
    return [path]


def probe(paths: list[Path]) -> list[Interpreter]:
    """Run each interpreter once, in parallel, and keep those that answer (in the order given)."""
    procs: list[tuple[Path, subprocess.Popen[str] | None]] = []
    for path in paths:
        try:
            p = subprocess.Popen([str(path), "-I", "-c", PROBE], stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                 stderr=subprocess.DEVNULL, text=True)  # fmt: skip
        except OSError:
            p = None
        procs.append((path, p))
    out: list[Interpreter] = []
    for path, p in procs:
        if p is None:
            continue
        try:
            stdout, _ = p.communicate(timeout=PROBE_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            p.kill()
            p.communicate()
            continue
        if p.returncode != 0:
            continue
        try:
            version, platform, implementation = json.loads(stdout.strip().splitlines()[-1])
            Version(version)
        except (ValueError, IndexError, InvalidVersion):
            continue
        out.append(Interpreter(path, str(version), str(platform), str(implementation)))
    return out


def available_pythons(*, refresh: bool = False) -> list[Interpreter]:
    """Every working Python 3 of this box, oldest version first (found once per process unless ``refresh``)."""
    global _found
    if _found is None or refresh:
        found = probe(candidate_paths())
        _found = sorted(found, key=lambda i: Version(i.version))  # stable: scan order among equal versions
    return list(_found)


def resolve_python(request: str | None) -> Interpreter:
    """The interpreter an environment asks for: ``None`` -> this process's own X.Y; ``"3.11"`` -> the newest
    3.11.x here; ``"3.11.7"`` -> exactly that. Raises `ConfigError` listing what this box has."""
    want = request if request is not None else f"{sys.version_info.major}.{sys.version_info.minor}"
    found = available_pythons()
    exact = want.count(".") >= 2
    matches = [i for i in found if (i.version == want if exact else i.minor == want)]
    if matches:
        best = max(Version(i.version) for i in matches)
        return next(i for i in matches if Version(i.version) == best)
    shown = [i.version if exact else i.minor for i in found]
    listed = ", ".join(dict.fromkeys(shown)) or "none found"
    raise ConfigError(f"job spec: environment.python {want!r} is not available on this box; available: {listed}")
