"""The environment variables deskpod reads, read in this one place and turned into typed values."""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True, slots=True)
class Environment:
    """What deskpod takes from the process environment."""

    home: Path
    """``DESKPOD_HOME``: where the pod service keeps its state (default ``~/.deskpod``)."""
    cuda_visible_devices: tuple[str, ...] | None
    """``CUDA_VISIBLE_DEVICES`` split on commas; None when unset (every GPU is visible)."""
    cpu_count: int
    """Cores this process may run on (its CPU affinity), not the machine's total."""

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
        )
