"""A stand-in for ``deskpod.hardware.placement`` while issue 3 writes the real one (tests only).

Same API: ``local_topology()``, ``place(topo, free, k, policy)``, ``Placement``, ``Unplaceable``.
It places the lowest-numbered free devices and says so. `install()` puts it into ``sys.modules``
only when the real module is missing, so the tests run against the real placement once it lands.
"""

from __future__ import annotations

import importlib
import sys
import types
from collections.abc import Sequence
from dataclasses import dataclass

from deskpod.errors import UsageError


@dataclass(frozen=True, slots=True)
class Placement:
    devices: tuple[int, ...]
    ring_bandwidth: float
    reason: str


@dataclass(frozen=True, slots=True)
class Unplaceable:
    reason: str
    ever: bool


@dataclass(frozen=True, slots=True)
class Topo:
    device_count: int


def local_topology() -> Topo:
    from deskpod.hardware.devices import discover

    return Topo(len(discover().devices))


def place(topo: Topo, free: Sequence[int], k: int, *, policy: str = "best") -> Placement | Unplaceable:
    if k < 1:
        raise UsageError(f"asks for {k} devices; ask for at least 1")
    if policy not in ("best", "pack") and not policy.startswith("partition:"):
        raise UsageError(f"unknown placement policy {policy!r}; use best, pack or partition:<name>")
    if k > topo.device_count:
        return Unplaceable(f"needs {k} devices; this box has {topo.device_count}", ever=False)
    ordered = sorted(free)
    if len(ordered) < k:
        return Unplaceable(f"needs {k} devices; {len(ordered)} free", ever=True)
    return Placement(tuple(ordered[:k]), 1.0, f"the {k} lowest free devices")


def install() -> None:
    """Use the real placement when it imports; patch only a `local_topology` that cannot run yet."""
    try:
        real = importlib.import_module("deskpod.hardware.placement")
    except ImportError:
        module = types.ModuleType("deskpod.hardware.placement")
        for name in ("Placement", "Unplaceable", "Topo", "local_topology", "place"):
            setattr(module, name, globals()[name])
        sys.modules["deskpod.hardware.placement"] = module
        return
    try:
        real.local_topology()
    except ImportError:
        from deskpod.hardware.devices import discover
        from deskpod.hardware.topology import cpu_topology

        real.local_topology = lambda: cpu_topology(len(discover().devices))
