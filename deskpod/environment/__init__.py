"""What a deskpod process finds around it, on the ground floor: the environment variables it reads (here, read in
this one place and turned into typed values), the file system (`files`: atomic writes), the loopback network
(`network`: free ports) and sizes as flags and limits write them (`sizes`)."""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from deskpod.errors import ConfigError


@dataclass(frozen=True, slots=True)
class Environment:
    """What deskpod takes from the process environment."""

    home: Path
    """``DESKPOD_HOME``: where the pod service keeps its state (default ``~/.deskpod``)."""
    cuda_visible_devices: tuple[str, ...] | None
    """``CUDA_VISIBLE_DEVICES`` split on commas; None when unset (every GPU is visible)."""
    cpu_count: int
    """Cores this process may run on (its CPU affinity), not the machine's total."""
    fashion_mnist_dir: Path
    """``DESKPOD_FASHION_MNIST``: folder of the Fashion-MNIST IDX files (default: where Debian's package puts them)."""
    cpu_slots: tuple[int, ...] | None = None
    """``DESKPOD_CPU_SLOTS``: the CPU worker slots the pod service gave this job (comma list); None when unset.
    In a job pinned to its slots' cores (`deskpod.envs.cgroups`) they are numbered from 0 among its own."""
    pod_url: str | None = None
    """``DESKPOD_URL``: where the pod service listens (default: what ``<home>/daemon.json`` says)."""
    token_file: Path | None = None
    """``DESKPOD_TOKEN_FILE``: the CLI's pod-service token (default ``<home>/token``; mode 0600)."""
    pod_socket: Path | None = None
    """``DESKPOD_SOCKET``: the pod service's Unix socket, where the kernel tells it who you are (no token)."""
    env_cache: Path | None = None
    """``DESKPOD_ENV_CACHE``: where jobs' environments are built and kept (default ``<home>/envs``)."""
    dev_dir: Path = Path("/dev")
    """``DESKPOD_DEV_DIR``: where the GPUs' device nodes (``nvidia<N>``, ``nvidiactl``) are (tests: stand-ins)."""

    @classmethod
    def read(cls, environ: Mapping[str, str] | None = None) -> Environment:
        env = os.environ if environ is None else environ
        cvd = env.get("CUDA_VISIBLE_DEVICES")
        visible = None if cvd is None else tuple(p.strip() for p in cvd.split(",") if p.strip())
        try:
            cores = len(os.sched_getaffinity(0))
        except AttributeError:  # not Linux
            cores = os.cpu_count() or 1
        return cls(
            home=Path(env.get("DESKPOD_HOME", str(Path.home() / ".deskpod"))).expanduser(),
            cuda_visible_devices=visible,
            cpu_count=max(1, cores),
            cpu_slots=_cpu_slots(env.get("DESKPOD_CPU_SLOTS")),
            pod_url=env.get("DESKPOD_URL") or None,
            token_file=Path(env["DESKPOD_TOKEN_FILE"]).expanduser() if env.get("DESKPOD_TOKEN_FILE") else None,
            pod_socket=Path(env["DESKPOD_SOCKET"]).expanduser() if env.get("DESKPOD_SOCKET") else None,
            env_cache=Path(env["DESKPOD_ENV_CACHE"]).expanduser() if env.get("DESKPOD_ENV_CACHE") else None,
            dev_dir=Path(env.get("DESKPOD_DEV_DIR") or "/dev"),
            fashion_mnist_dir=Path(env.get("DESKPOD_FASHION_MNIST", "/usr/share/datasets/fashion-mnist")),
        )


def _cpu_slots(text: str | None) -> tuple[int, ...] | None:
    """Parse ``DESKPOD_CPU_SLOTS`` (``0,2,3``); the pod service writes it, a bad value is named, not ignored."""
    if text is None:
        return None
    parts = [p.strip() for p in text.split(",") if p.strip()]
    if not all(p.isascii() and p.isdigit() for p in parts):
        raise ConfigError(f"DESKPOD_CPU_SLOTS={text!r}: expected slot indices like 0,2,3")
    return tuple(int(p) for p in parts)
