"""What a job's software environment is: the ``[environment]`` table of a job spec, validated where it enters.

One of five kinds, plus the Python to build it on::

    [environment]
    python = "3.11"                      # or "3.11.7"; default: the daemon's own X.Y (resolved by deskpod.envs.python)
    packages = ["torch==2.13.0", "six"]  # PEP 508 requirements ... or exactly one of:
    requirements = "requirements.txt"    # a requirements file: requirement lines (with --hash=...) and comments
    lock = "uv.lock"                     # a uv lock, with pyproject = "pyproject.toml" (default: the one beside it)
    pyproject = "pyproject.toml"         # alone: install its [project].dependencies
    image = "docker.io/library/python:3.11"   # a container image (podman or enroot; deskpod.envs.images)

A file-valued key names a path relative to the spec file's folder (``base_dir``); `parse_environment` reads it
and keeps ``{"file": NAME, "text": CONTENTS}``, so what defines the environment travels with the job and is
hashed by its contents. Over HTTP there is no spec file and the daemon never reads a path a user names: the
client sends ``{"file": NAME, "text": CONTENTS}`` itself (``deskpod submit`` does). Contents are checked here
(requirement syntax, TOML that parses, a ``[project]`` table), so a bad file is refused at submission.

Where packages may come from. A requirement by name and version comes from the box's package indexes (pip's
configuration, `deskpod.envs.index`). A direct reference (``name @ URL``) or a ``uv.lock`` source may point over
the network (``https://``, ``http://``, ``git+https://``, ``git+ssh://``, ...; ``http://127.0.0.1/...`` too):
the build fetches it as the job's own account, inside that account's sandbox and into that account's own cache
(`deskpod.envs.cache`), so it reaches only what the user reaches anyway. What is fetched is not part of the
definition, so it is not in the environment's hash: a URL whose contents move is not fetched again while the
environment is cached; give it a new definition (a new URL, a commit, a ``#sha256=`` fragment) to change it.
A local path is refused, in every form: ``name @ /abs``, ``name @ ./rel``, ``name @ ../x``, ``file:``,
``git+file:`` (and ``hg+``, ``svn+``, ``bzr+``), and in a ``uv.lock`` a package whose source is a ``path``, a
``directory``, an ``editable`` or a ``virtual`` project (a workspace member), other than the lock's own project
(``source = { editable = "." }`` or ``{ virtual = "." }``, which is never installed), or a locked wheel or sdist
at a local path or ``file:`` URL (but when its index is itself a folder: the box's own local index, whose
files the lock pins by hash). What a path names would not be part of what defines the environment, and
depends on the box and the folder the build runs in.
"""

from __future__ import annotations

import hashlib
import json
import re
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from packaging.requirements import InvalidRequirement, Requirement
from packaging.utils import canonicalize_name

from deskpod.errors import ConfigError

FIELDS = ("python", "packages", "requirements", "lock", "pyproject", "image")
KINDS = ("packages", "requirements", "lock", "pyproject", "image")
"""What defines the environment; a table has exactly one (``lock`` may come with ``pyproject``)."""
FILE_FIELDS = ("requirements", "lock", "pyproject")
MAX_FILE_BYTES = 1_000_000
MAX_FILE_NAME = 4096
"""Characters of a file-valued field's name (a path on the submitting side: PATH_MAX)."""
MAX_PACKAGES = 1000
MAX_REQUIREMENT_CHARS = 1000
MAX_IMAGE_CHARS = 512
PYTHON_RE = re.compile(r"^3\.\d{1,2}(\.\d{1,3})?$")
IMAGE_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._/:@+-]*$")
HASH_RE = re.compile(r"^--hash=[A-Za-z0-9]+:[0-9a-fA-F]+$")
PREFIX = "job spec: environment."
URL_SCHEMES = frozenset({"http", "https", "git+http", "git+https", "git+ssh", "git+git", "hg+http", "hg+https",
                         "hg+ssh", "svn+http", "svn+https", "svn+ssh", "svn+svn", "bzr+http", "bzr+https", "bzr+ssh",
                         "bzr+sftp"})  # fmt: skip
"""The schemes of a direct reference (``name @ URL``) the build may fetch: over the network, never ``file:``."""
LOCK_GIT_SCHEMES = frozenset({"http", "https", "ssh", "git"})
"""The schemes of a ``uv.lock`` git source (uv writes ``git = "https://...?rev=...#SHA"``, without ``git+``)."""
LOCK_URL_SCHEMES = frozenset({"http", "https"})
LOCK_LOCAL_SOURCES = ("path", "directory", "editable", "virtual")
"""``uv.lock`` sources that are a path on the box where the lock was made."""
LOCK_SOURCES = ("registry", "git", "url", *LOCK_LOCAL_SOURCES)
SCHEME_RE = re.compile(r"^([A-Za-z][A-Za-z0-9+.-]*):")
TO_INSTEAD = ("put the package on a package index or find-links folder and require it by version, or give its"
              " https:// or git+https:// URL")  # fmt: skip


@dataclass(frozen=True, slots=True)
class EnvFile:
    """A file that defines an environment: its name as the user wrote it, and its contents."""

    file: str
    text: str

    def to_json(self) -> dict[str, str]:
        return {"file": self.file, "text": self.text}


@dataclass(frozen=True, slots=True, kw_only=True)
class EnvDefinition:
    """One ``[environment]`` table, validated. Exactly one of the `KINDS` fields is set (``lock`` with ``pyproject``)."""

    python: str | None = None
    """The Python asked for, ``"3.11"`` or ``"3.11.7"``; None: the daemon's own X.Y."""
    packages: tuple[str, ...] = ()
    """PEP 508 requirements, normalised (``six == 1.16`` -> ``six==1.16``), in the order given."""
    requirements: EnvFile | None = None
    """A requirements file."""
    lock: EnvFile | None = None
    """A ``uv.lock``; ``pyproject`` is then its project file."""
    pyproject: EnvFile | None = None
    """A ``pyproject.toml``: the lock's project, or alone, the project whose ``[project].dependencies`` are installed."""
    image: str | None = None
    """A container image reference."""

    @property
    def kind(self) -> str:
        """``packages``, ``requirements``, ``lock``, ``pyproject`` or ``image``."""
        return next(
            (k for k in ("image", "lock", "requirements", "pyproject") if getattr(self, k) is not None), "packages"
        )

    def to_json(self) -> dict[str, Any]:
        """The canonical stored form; `parse_environment` takes it back unchanged (with or without ``base_dir``)."""
        out: dict[str, Any] = {} if self.python is None else {"python": self.python}
        if self.kind in ("image", "packages"):
            out[self.kind] = self.image if self.kind == "image" else list(self.packages)
        for name in FILE_FIELDS:  # a lock's pyproject comes with it
            file: EnvFile | None = getattr(self, name)
            if file is not None:
                out[name] = file.to_json()
        return out

    def summary(self) -> str:
        """One short line for listings: ``packages six==1.16.0, idna`` or ``requirements.txt (3 requirements)``."""
        if self.image is not None:
            return f"image {self.image}"
        if self.lock is not None:
            return f"lock {self.lock.file} ({len(_lock_packages(self.lock.text))} packages)"
        if self.requirements is not None:
            n = len(requirement_lines(self.requirements))
            return f"requirements {self.requirements.file} ({n} requirement{'s' * (n != 1)})"
        if self.pyproject is not None:
            n = len(project_dependencies(self.pyproject))
            return f"pyproject {self.pyproject.file} ({n} dependenc{'ies' if n != 1 else 'y'})"
        shown = ", ".join(self.packages)
        return "packages " + (shown if len(shown) <= 60 else shown[:57] + "...")

    def requirements_text(self) -> str:
        """What to hand ``uv pip install -r`` (every kind but lock and image): one requirement per line."""
        if self.requirements is not None:
            return self.requirements.text
        if self.pyproject is not None and self.lock is None:
            return "".join(r + "\n" for r in project_dependencies(self.pyproject))
        if self.kind == "packages":
            return "".join(r + "\n" for r in self.packages)
        raise ValueError(f"a {self.kind} environment has no requirements list")


def canonical_definition(defn: EnvDefinition) -> dict[str, Any]:
    """What defines the environment's contents, in one canonical form: `EnvDefinition.to_json` without the Python
    asked for (a cache keys on the interpreter it resolved to), the packages sorted (their order installs the same)."""
    definition = defn.to_json()
    definition.pop("python", None)
    if "packages" in definition:
        definition["packages"] = sorted(definition["packages"])
    return definition


def content_hash(defn: EnvDefinition) -> str:
    """The sha256 (hex) of `canonical_definition` and the Python asked for: two definitions with the same hash build
    the same environment on a box (where `deskpod.envs.cache.EnvCache.key` adds the interpreter it resolved to)."""
    doc = {"definition": canonical_definition(defn), "python": defn.python}
    return hashlib.sha256(json.dumps(doc, sort_keys=True, separators=(",", ":")).encode()).hexdigest()


def _bad(key: str, value: object, valid: str) -> ConfigError:
    shown = repr(value)
    if len(shown) > 80:
        shown = shown[:77] + "..."
    return ConfigError(f"{PREFIX}{key} = {shown} is not valid; {valid}")


def parse_environment(table: object, *, base_dir: Path | None = None) -> EnvDefinition:
    """Validate a job spec's ``[environment]`` table (decoded TOML or JSON) into an `EnvDefinition`.

    With ``base_dir`` (a TOML spec: its folder) a file-valued key may be a path, read here; without it (the
    HTTP API) it must be ``{"file": NAME, "text": CONTENTS}``. Raises `ConfigError` naming the bad value.
    """
    if not isinstance(table, Mapping):
        raise ConfigError(
            f"job spec: environment must be a table/object with one of {', '.join(KINDS)} (and python), "
            f'got {type(table).__name__}; e.g. [environment] packages = ["six==1.17.0"]'
        )
    unknown = sorted(str(k) for k in table if k not in FIELDS)
    if unknown:
        raise ConfigError(f"{PREFIX}{unknown[0]} is not a field; valid fields: {', '.join(FIELDS)}")
    for key, value in table.items():
        if value is None:  # the schema takes no null: python left out is the daemon's own
            raise ConfigError(f"{PREFIX}{key} = null is not valid; leave {key} out")
    given = [k for k in KINDS if k in table]
    if given == ["pyproject", "lock"] or given == ["lock", "pyproject"]:
        given = ["lock"]
    if len(given) != 1:
        raise ConfigError(
            "job spec: environment: give exactly one of packages (a list of requirements), requirements (a"
            " requirements.txt), lock (a uv.lock, with its pyproject), pyproject (a pyproject.toml) and image"
            f" (a container image); got {' and '.join(k for k in KINDS if k in table) or 'none'}"
        )
    kind = given[0]
    python = _python(table.get("python"))
    if kind == "image":
        if python is not None:
            raise _bad("python", python, "an image brings its own Python; leave python out with image")
        return EnvDefinition(image=_image(table["image"]))
    if kind == "packages":
        return EnvDefinition(python=python, packages=_packages(table["packages"]))
    if kind == "requirements":
        req = _file("requirements", table["requirements"], base_dir)
        requirement_lines(req)  # checks every line
        return EnvDefinition(python=python, requirements=req)
    if kind == "pyproject":
        pyproject = _file("pyproject", table["pyproject"], base_dir)
        project_dependencies(pyproject)
        return EnvDefinition(python=python, pyproject=pyproject)
    lock = _file("lock", table["lock"], base_dir)
    _lock_packages(lock.text, lock.file)
    if "pyproject" in table:
        pyproject = _file("pyproject", table["pyproject"], base_dir)
    elif base_dir is not None and isinstance(table["lock"], str):
        beside = str(Path(table["lock"]).parent / "pyproject.toml")
        pyproject = _file("pyproject", beside, base_dir, why=f"a uv.lock needs its pyproject.toml ({beside!r})")
    else:
        raise ConfigError(
            f"{PREFIX}lock {lock.file!r} needs environment.pyproject too: a uv.lock is meaningless without its"
            ' pyproject.toml; send pyproject = {"file": "pyproject.toml", "text": CONTENTS} beside it'
        )
    project = _project_table(pyproject)
    _lock_sources(lock, project.get("name"))
    return EnvDefinition(python=python, lock=lock, pyproject=pyproject)


def _python(v: object) -> str | None:
    if v is None:
        return None
    if isinstance(v, float):
        raise _bad("python", v, 'quote the version: python = "3.11" (as a number, 3.10 would read as 3.1)')
    if not isinstance(v, str) or not PYTHON_RE.match(v):
        raise _bad("python", v, 'expected a Python 3 version, "3.11" (the newest 3.11.x here) or "3.11.7" (exactly)')
    return v


def _image(v: object) -> str:
    if not isinstance(v, str) or not 0 < len(v) <= MAX_IMAGE_CHARS or not IMAGE_RE.match(v):
        raise _bad("image", v, 'expected a container image reference, e.g. image = "docker.io/library/python:3.11"')
    return v


def _requirement(text: str, where: str) -> str:
    """One PEP 508 requirement, normalised; a direct reference to a local file is refused (its contents would
    not be part of what defines, and is hashed for, the environment)."""
    try:
        req = Requirement(text)
    except InvalidRequirement as e:
        raise ConfigError(
            f"{PREFIX}{where}: {text!r} is not a valid requirement ({str(e).splitlines()[0]}); "
            'expected PEP 508, e.g. "six==1.17.0" or "torch>=2.3"'
        ) from e
    if req.url is not None:
        why = url_problem(req.url, URL_SCHEMES)
        if why is not None:
            raise ConfigError(f"{PREFIX}{where}: {text!r} {why}; {TO_INSTEAD}")
    return str(req)


def _is_local(url: str) -> bool:
    """A path (no scheme, or a drive letter ``C:``) or a ``file:`` URL (``git+file:`` and the like included)."""
    m = SCHEME_RE.match(url)
    scheme = m.group(1).lower() if m else ""
    return len(scheme) <= 1 or scheme.rsplit("+", 1)[-1] == "file"


def url_problem(url: str, schemes: frozenset[str]) -> str | None:
    """Why a build may not fetch ``url``, as the end of a sentence (``points at a local file or folder ...``), or
    None when it is a network URL of one of ``schemes``."""
    m = SCHEME_RE.match(url)
    scheme = m.group(1).lower() if m else ""
    if _is_local(url):
        return "points at a local file or folder, whose contents would not be part of what defines the environment"
    if scheme not in schemes or not url[len(scheme) + 1 :].startswith("//"):
        shown = ", ".join(f"{s}://" for s in sorted(schemes)) if len(schemes) <= 4 else "https://, git+https://, ..."
        return f"is not a network URL an environment build fetches ({shown})"
    return None


def _packages(v: object) -> tuple[str, ...]:
    if (
        not isinstance(v, list)
        or not 1 <= len(v) <= MAX_PACKAGES
        or not all(isinstance(s, str) and 0 < len(s) <= MAX_REQUIREMENT_CHARS for s in v)
    ):
        raise _bad("packages", v, f'expected a list of 1 to {MAX_PACKAGES} requirement strings, e.g. ["six==1.17.0"]')
    return tuple(_requirement(s, "packages") for s in v)


def _file(key: str, v: object, base_dir: Path | None, *, why: str = "") -> EnvFile:
    """A file-valued key: a path read under ``base_dir``, or ``{"file": NAME, "text": CONTENTS}``."""
    if isinstance(v, Mapping):
        if set(v) != {"file", "text"} or not isinstance(v["file"], str) or not isinstance(v["text"], str):
            raise _bad(key, v, 'expected {"file": NAME, "text": CONTENTS} (both strings) or, in a TOML spec, a path')
        name, text = v["file"], v["text"]
        if not 0 < len(name) <= MAX_FILE_NAME or "\0" in name:
            raise _bad(f"{key}.file", name, "expected the file's name, e.g. requirements.txt")
        if len(text.encode()) > MAX_FILE_BYTES:
            raise ConfigError(f"{PREFIX}{key} {name!r} is over {MAX_FILE_BYTES // 1_000_000} MB; environments are"
                              " defined by requirement lists and locks, not data")  # fmt: skip
        return EnvFile(name, text)
    if not isinstance(v, str) or not 0 < len(v) <= MAX_FILE_NAME or "\0" in v:
        raise _bad(key, v, f'expected the path of the file, e.g. {key} = "{_example(key)}"')
    if base_dir is None:
        raise ConfigError(
            f"{PREFIX}{key} = {v!r}: the pod service reads no path a request names; send the file itself,"
            f' {key} = {{"file": "{Path(v).name}", "text": CONTENTS}} (deskpod submit does this for you)'
        )
    path = base_dir / v
    try:
        size = path.stat().st_size
        if size > MAX_FILE_BYTES:
            raise ConfigError(f"{PREFIX}{key} {v!r} is over {MAX_FILE_BYTES // 1_000_000} MB ({size} bytes);"
                              " environments are defined by requirement lists and locks, not data")  # fmt: skip
        data = path.read_bytes()
    except OSError as e:
        raise ConfigError(
            f"{PREFIX}{key} {v!r}: cannot read {str(path)!r} ({e.strerror}){'; ' + why if why else ''}"
        ) from e
    try:
        return EnvFile(v, data.decode())
    except UnicodeDecodeError as e:
        raise ConfigError(f"{PREFIX}{key} {v!r} is not UTF-8 text ({e.reason} at byte {e.start})") from e


def _example(key: str) -> str:
    return {"requirements": "requirements.txt", "lock": "uv.lock", "pyproject": "pyproject.toml"}.get(key, key)


def requirement_lines(req: EnvFile) -> list[str]:
    """The requirements of a requirements file, checked: requirement lines (optionally with ``--hash=...``, as
    pip-compile and ``uv pip compile --generate-hashes`` write them, continued with ``\\``) and comments. Option
    lines (``-r``, ``-e``, ``--index-url`` ...) are refused: what a file includes or where it installs from is
    not part of its text, so two identical files could build different environments."""
    out: list[str] = []
    logical: list[tuple[int, str]] = []
    pending = ""
    start = 0
    for n, raw in enumerate(req.text.splitlines(), 1):
        line = raw if not pending else pending + " " + raw.strip()
        start = start if pending else n
        if line.rstrip().endswith("\\"):
            pending = line.rstrip()[:-1].rstrip()
            continue
        pending = ""
        logical.append((start, line))
    if pending:
        logical.append((start, pending))
    for n, line in logical:
        text = re.sub(r"(^|\s)#.*$", "", line).strip()
        if not text:
            continue
        where = f"requirements {req.file!r} line {n}"
        if text.startswith("-"):
            raise ConfigError(
                f"{PREFIX}{where}: {text[:80]!r} is an option line; only requirement lines (with --hash=...) and"
                " comments are allowed (package indexes come from the box's pip configuration)"
            )
        requirement, _, options = text.partition(" --")
        for opt in ("--" + options).split() if options else []:
            if not HASH_RE.match(opt):
                raise ConfigError(
                    f"{PREFIX}{where}: {opt[:80]!r} is not allowed after a requirement; only --hash=ALGO:HEX is"
                )
        out.append(_requirement(requirement.strip(), where))
    return out


def _toml(key: str, f: EnvFile) -> dict[str, Any]:
    try:
        return tomllib.loads(f.text)
    except tomllib.TOMLDecodeError as e:
        raise ConfigError(f"{PREFIX}{key} {f.file!r} does not parse: {e}") from e


def _project_table(pyproject: EnvFile) -> Mapping[str, Any]:
    data = _toml("pyproject", pyproject)
    project = data.get("project")
    if not isinstance(project, Mapping):
        raise ConfigError(
            f"{PREFIX}pyproject {pyproject.file!r} has no [project] table; expected a PEP 621 pyproject.toml"
            ' with [project] name = "..." and dependencies = [...]'
        )
    return project


def project_dependencies(pyproject: EnvFile) -> list[str]:
    """``[project].dependencies`` of a pyproject.toml, checked (a missing list is an empty one)."""
    project = _project_table(pyproject)
    if "dependencies" in (project.get("dynamic") or []):
        raise ConfigError(
            f"{PREFIX}pyproject {pyproject.file!r} declares its dependencies dynamic; list them in"
            " [project].dependencies, or send a uv.lock with it (lock = ...)"
        )
    deps = project.get("dependencies", [])
    if not isinstance(deps, list) or not all(isinstance(d, str) for d in deps) or len(deps) > MAX_PACKAGES:
        raise ConfigError(f"{PREFIX}pyproject {pyproject.file!r}: [project].dependencies must be a list of"
                          " requirement strings")  # fmt: skip
    return [_requirement(d, f"pyproject {pyproject.file!r} dependencies") for d in deps]


def _lock_packages(text: str, name: str = "uv.lock") -> list[Mapping[str, Any]]:
    """The ``[[package]]`` entries of a uv.lock, checked to be one (``version`` and packages with names)."""
    data = _toml("lock", EnvFile(name, text))
    packages = data.get("package")
    if (
        not isinstance(data.get("version"), int)
        or not isinstance(packages, list)
        or not all(isinstance(p, Mapping) and isinstance(p.get("name"), str) for p in packages)
    ):
        raise ConfigError(
            f"{PREFIX}lock {name!r} does not parse: not a uv.lock (expected version = N and [[package]] entries"
            " with names; make one with `uv lock`)"
        )
    return packages


def _lock_sources(lock: EnvFile, project_name: object) -> None:
    """Refuse a uv.lock package that comes from a local path or a local repository (see the module docstring).
    The lock's own project (``{ editable = "." }`` or ``{ virtual = "." }``, named as its pyproject.toml names
    it) is the one local source allowed: ``uv sync --no-install-project`` does not install it."""
    own = canonicalize_name(project_name) if isinstance(project_name, str) else None
    for package in _lock_packages(lock.text, lock.file):
        name, source = package["name"], package.get("source")
        where = f"{PREFIX}lock {lock.file!r}: package {name!r}"
        if not isinstance(source, Mapping) or len(source) != 1:
            raise ConfigError(f"{where} has source = {source!r}; expected one of {', '.join(LOCK_SOURCES)} as uv"
                              " writes it (make the lock with `uv lock`)")  # fmt: skip
        [(kind, value)] = source.items()
        if kind not in LOCK_SOURCES or not isinstance(value, str):
            raise ConfigError(f"{where} has source {kind} = {value!r}; expected one of {', '.join(LOCK_SOURCES)} as"
                              " uv writes it (make the lock with `uv lock`)")  # fmt: skip
        if kind in LOCK_LOCAL_SOURCES:
            if value == "." and kind in ("editable", "virtual") and canonicalize_name(name) == own:
                continue
            raise ConfigError(
                f"{where} comes from a local {kind} ({value!r}); what is there would not be part of what defines"
                " the environment. Publish it to a package index or find-links folder and lock it from there by"
                " version, or depend on it by its https:// or git+https:// URL"
            )
        if kind != "registry":
            why = url_problem(value, LOCK_GIT_SCHEMES if kind == "git" else LOCK_URL_SCHEMES)
            if why is not None:
                raise ConfigError(f"{where} comes from {kind} {value!r}, which {why}; {TO_INSTEAD}")
        # An index may be a folder (the box's own, as pip's configuration names it): its files are then paths.
        local_index = kind == "registry" and _is_local(value)
        wheels = package.get("wheels")
        for dist in [package.get("sdist"), *(wheels if isinstance(wheels, list) else [])]:
            if not isinstance(dist, Mapping):
                continue
            url, path = dist.get("url"), dist.get("path")
            why = url_problem(str(url), LOCK_URL_SCHEMES) if url is not None else None
            if why is None and path is not None and not local_index:
                why = (
                    "points at a local file or folder, whose contents would not be part of what defines the environment"
                )
            if why is not None:
                raise ConfigError(f"{where} has a file at {url or path!r}, which {why}; {TO_INSTEAD}")


ENVIRONMENT_SCHEMA: dict[str, Any] = {
    "type": "object",
    "additionalProperties": False,
    "description": "The job's software environment: one of packages, requirements, lock (with pyproject),"
    " pyproject and image; files travel as {file, text}.",
    "properties": {
        "python": {"type": "string", "pattern": PYTHON_RE.pattern, "example": "3.11"},
        "packages": {
            "type": "array",
            "items": {"type": "string", "maxLength": MAX_REQUIREMENT_CHARS},
            "minItems": 1,
            "maxItems": MAX_PACKAGES,
            "example": ["six==1.17.0"],
        },
        **{
            key: {
                "type": "object",
                "additionalProperties": False,
                "required": ["file", "text"],
                "properties": {
                    "file": {
                        "type": "string",
                        "minLength": 1,
                        "maxLength": MAX_FILE_NAME,
                        "pattern": "^[^\\u0000]*$",
                        "example": _example(key),
                    },
                    "text": {"type": "string", "description": f"the file's contents (at most {MAX_FILE_BYTES} bytes)"},
                },
            }
            for key in FILE_FIELDS
        },
        "image": {"type": "string", "maxLength": MAX_IMAGE_CHARS, "example": "docker.io/library/python:3.11"},
    },
    "example": {"python": "3.11", "packages": ["six==1.17.0"]},
}
"""The ``environment`` field of ``POST /v1/jobs`` for the OpenAPI document; `parse_environment` enforces it."""
