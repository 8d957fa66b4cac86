"""Where packages come from: pip's configuration on this box, handed to uv, which does not read it.

An admin configures package sources for pip (``/etc/pip.conf``, ``PIP_*`` variables...); an environment built by
uv must install from the same places, or ``torch==2.13.0`` found by pip in a local wheel folder is "not found" by
uv. `package_sources` reads pip's files the way pip does (``pip/_internal/configuration.py``), later ones
overriding earlier ones::

    global   $XDG_CONFIG_DIRS/pip/pip.conf (default /etc/xdg/pip/pip.conf), then /etc/pip.conf
    user     ~/.pip/pip.conf, then $XDG_CONFIG_HOME/pip/pip.conf (default ~/.config/pip/pip.conf)
             (skipped when PIP_CONFIG_FILE names a file that exists)
    site     <sys.prefix>/pip.conf
    env      $PIP_CONFIG_FILE (os.devnull: no file is read at all)
    then the PIP_INDEX_URL, PIP_EXTRA_INDEX_URL, PIP_FIND_LINKS, PIP_NO_INDEX, PIP_TRUSTED_HOST variables

In each file ``[install]`` overrides ``[global]``. Of it deskpod takes index-url, extra-index-url, find-links,
no-index and trusted-host, and turns them into uv's variables (`PackageSources.uv_environment`): UV_INDEX_URL,
UV_EXTRA_INDEX_URL (space-separated), UV_FIND_LINKS (comma-separated; see uv's ``EnvVars``), UV_INSECURE_HOST,
and UV_INDEX_STRATEGY=unsafe-best-match, which is pip's rule (the best version across every index; uv's own
default stops at the first index that has the package). pip's ``constraint`` file is not passed on: it caps what
pip installs into the daemon's own environment, not what a job's environment may pin. A ``file://`` index or a
find-links folder that does not exist is dropped (uv refuses a missing find-links folder outright).
"""

from __future__ import annotations

import configparser
import os
import sys
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from pathlib import Path
from urllib.parse import unquote, urlparse

KEYS = ("index-url", "extra-index-url", "find-links", "no-index", "trusted-host")
TRUE = frozenset({"1", "true", "yes", "on"})


@dataclass(frozen=True, slots=True)
class PackageSources:
    """pip's package sources on this box."""

    index_url: str | None = None
    """pip's index-url; None: PyPI."""
    extra_index_urls: tuple[str, ...] = ()
    find_links: tuple[str, ...] = ()
    """Folders or URLs of flat lists of wheels."""
    no_index: bool = False
    """pip's no-index: only find-links."""
    trusted_hosts: tuple[str, ...] = ()
    files: tuple[str, ...] = ()
    """The configuration files that were read, in order (for ``deskpod env`` to show)."""

    def uv_environment(self) -> dict[str, str]:
        """The variables that make uv install from these sources."""
        env = {"UV_INDEX_STRATEGY": "unsafe-best-match"}
        if self.index_url:
            env["UV_INDEX_URL"] = self.index_url
        if self.extra_index_urls:
            env["UV_EXTRA_INDEX_URL"] = " ".join(self.extra_index_urls)
        if self.find_links:
            env["UV_FIND_LINKS"] = ",".join(self.find_links)
        if self.trusted_hosts:
            env["UV_INSECURE_HOST"] = " ".join(self.trusted_hosts)
        return env

    def uv_arguments(self) -> list[str]:
        """Options of ``uv pip install`` that have no variable: ``--no-index``."""
        return ["--no-index"] if self.no_index else []

    def to_json(self) -> dict[str, object]:
        return {k: list(v) if isinstance(v, tuple) else v for k, v in asdict(self).items()}


def pip_config_files(environ: Mapping[str, str] | None = None, prefix: str | None = None) -> list[Path]:
    """pip's configuration files in the order pip reads them (later overrides earlier), existing or not."""
    env = os.environ if environ is None else environ
    home = Path(env.get("HOME") or Path.home())
    config_file = env.get("PIP_CONFIG_FILE")
    if config_file == os.devnull:
        return []
    dirs = [d for d in (env.get("XDG_CONFIG_DIRS") or "/etc/xdg").split(os.pathsep) if d]
    files = [Path(d) / "pip" / "pip.conf" for d in dirs] + [Path("/etc/pip.conf")]
    if not (config_file and os.path.exists(config_file)):
        files += [home / ".pip" / "pip.conf", Path(env.get("XDG_CONFIG_HOME") or home / ".config") / "pip" / "pip.conf"]
    files.append(Path(prefix if prefix is not None else sys.prefix) / "pip.conf")
    if config_file:
        files.append(Path(config_file))
    return files


def read_pip_settings(
    environ: Mapping[str, str] | None = None, prefix: str | None = None
) -> tuple[dict[str, str], list[str]]:
    """pip's values for `KEYS` (raw strings, as pip would see them) and the files they came from."""
    env = os.environ if environ is None else environ
    values: dict[str, str] = {}
    read: list[str] = []
    for path in pip_config_files(env, prefix):
        parser = configparser.RawConfigParser()
        try:
            if not parser.read(path, encoding="utf-8"):
                continue
        except (configparser.Error, UnicodeDecodeError):
            continue  # pip would refuse to run; deskpod keeps what it has rather than fail every build
        read.append(str(path))
        for section in ("global", "install"):
            if parser.has_section(section):
                for key, value in parser.items(section):
                    name = key.replace("_", "-")
                    if name in KEYS:
                        values[name] = value
    for name in KEYS:
        var = "PIP_" + name.upper().replace("-", "_")
        if var in env:
            values[name] = env[var]
    return values, read


def package_sources(environ: Mapping[str, str] | None = None, prefix: str | None = None) -> PackageSources:
    """pip's package sources on this box (``environ``/``prefix`` default to this process's)."""
    values, read = read_pip_settings(environ, prefix)
    index = values.get("index-url", "").split()
    return PackageSources(
        index_url=next((u for u in index if _exists(u)), None),
        extra_index_urls=tuple(u for u in values.get("extra-index-url", "").split() if _exists(u)),
        find_links=tuple(u for u in values.get("find-links", "").split() if _exists(u)),
        no_index=values.get("no-index", "").strip().lower() in TRUE,
        trusted_hosts=tuple(values.get("trusted-host", "").split()),
        files=tuple(read),
    )


def _exists(location: str) -> bool:
    """A URL of another scheme is kept; a local folder or ``file://`` URL only if it is there."""
    parsed = urlparse(location)
    if parsed.scheme == "file":
        return Path(unquote(parsed.path)).exists()
    if not parsed.scheme:  # a plain path
        return Path(location).expanduser().exists()
    return True
