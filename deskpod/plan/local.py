"""This box as a planner machine: ``deskpod plan calibrate`` measures it and fits the factors to it.

The catalog knows reference machines; this box is usually not one of them. Calibration measures
what the model needs (``deskpod doctor``'s per-device matmul FP32 rate and memory copy bandwidth
stand in for the peak and the memory bandwidth), then what it predicts (``bench train`` images/s on
every device, ``bench comm`` all-reduce bus bandwidth at the model's gradient size), and fits:

* ``comm_efficiency`` = measured busbw / the ring bandwidth the topology model gives this box;
* the compute efficiency from the measured step: step - modelled all-reduce = modelled compute.
  On CPU devices that is ``cpu_compute_efficiency`` (the CPU compute is FLOPs only); on GPUs it is
  ``compute_efficiency``, with ``memory_passes`` kept at its DGX-1 fit (one measurement cannot
  separate the two terms).

The result is stored in ``DESKPOD_HOME/plan/local.json`` and shown; ``deskpod plan predict
--machine local`` then uses this box's facts and factors, so its plan for the measured run matches
the measurement by construction, and other runs (models, batches, precisions) are predictions.
Those plans are under their own software stack, ``local`` (this box's software as measured, not a
catalog stack; `deskpod.plan.stacks`): the factors one calibration cannot measure (memory passes, the
input pipeline) are stack tf1-2017's, and overlap stays 0 because the fit above charges the whole
modelled all-reduce to the step.
Model costs are for 224x224 inputs; a calibration at another size scales FLOPs and activations by
the pixel count (exact for convolutions; the final layers of ResNets do not depend on it).
"""

from __future__ import annotations

import json
import statistics
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

from deskpod.comm.cost import predict
from deskpod.comm.rings import build_rings
from deskpod.environment.files import write_text
from deskpod.errors import RunError, UsageError
from deskpod.hardware.topology import Topology
from deskpod.plan.factors import Factors, MachineFacts, compute_time
from deskpod.plan.workload import BYTES_PER_ELEMENT, ModelCost, Workload, find_model

LOCAL = "local"


@dataclass(frozen=True, slots=True)
class Measurements:
    """What calibration measured on this box."""

    kind: str
    devices: int
    cores: int
    peak_tflops: float
    """Per device: doctor's matmul FP32 rate."""
    memory_bandwidth_gbs: float
    """Per device: doctor's memory copy bandwidth."""
    model: str
    batch: int
    shape: tuple[int, int, int]
    images_per_s: float
    """bench train on every device."""
    comm_busbw_gbs: float
    """bench comm all-reduce at the gradient size."""

    def __post_init__(self) -> None:
        for name in ("peak_tflops", "memory_bandwidth_gbs", "images_per_s"):
            if not getattr(self, name) > 0:
                raise RunError(f"calibration: measured {name} is {getattr(self, name)}; expected a positive figure")
        if self.devices > 1 and not self.comm_busbw_gbs > 0:
            raise RunError(f"calibration: measured all-reduce bandwidth is {self.comm_busbw_gbs} GB/s")


@dataclass(frozen=True, slots=True)
class Calibration:
    measurements: Measurements
    factors: Factors
    ring_bandwidth: float
    when: str

    def to_json(self) -> str:
        return json.dumps({"schema": "deskpod.plan.local/1", "when": self.when, "ring_bandwidth": self.ring_bandwidth,
                           "measurements": asdict(self.measurements), "factors": asdict(self.factors)}, indent=2)  # fmt: skip

    @classmethod
    def from_json(cls, text: str) -> Calibration:
        d = json.loads(text)
        m = d["measurements"]
        m["shape"] = tuple(m["shape"])
        f = dict(d["factors"])
        f["channels_last"] = tuple(f.get("channels_last", ()))  # a JSON list; absent in calibrations before it
        return cls(Measurements(**m), Factors(**f), float(d["ring_bandwidth"]), str(d["when"]))


def measure(model: str = "resnet18", shape: str = "3x112x112", batch: int = 8, steps: int = 3, *,
            log: Callable[[str], None] = lambda text: None) -> Measurements:  # fmt: skip
    """Measure this box for `fit_local`: doctor (matmul and memory copy per device), bench train ``model`` on
    synthetic ``shape`` data with ``batch`` per device for ``steps`` on every device, and bench comm (an all-reduce
    of the model's gradients, on more than one device). ``log`` hears what is measured next."""
    from deskpod.comm.bench import CommBenchConfig, run_comm_bench
    from deskpod.environment import Environment
    from deskpod.hardware.doctor import run_doctor
    from deskpod.train.bench import BenchRequest, run_bench
    from deskpod.train.data import parse_shape

    c, h, w = parse_shape(shape)
    cost = scaled_model(model, (c, h, w))
    log("calibrate: deskpod doctor (matmul and memory copy per device) ...")
    report = run_doctor()

    def median_of(name: str) -> float:
        values = [ck.measured for ck in report.checks if ck.name == name and ck.measured is not None]
        if not values:
            raise RunError(f"calibrate: doctor measured no {name}")
        return float(statistics.median(values))

    peak, copy = median_of("matmul fp32"), median_of("memory copy")
    log(f"calibrate: bench train {model} {shape} batch {batch} on every device ...")
    train = run_bench(BenchRequest(model=model, data=f"synthetic:{shape}", batch_size=batch, steps=steps, warmup=1,
                                   reference=False))  # fmt: skip
    row = train["rows"][-1]
    busbw = 0.0
    if row["devices"] > 1:
        grad = int(cost.params_m * 1e6 * 4)
        log(f"calibrate: bench comm all_reduce of {grad} bytes ...")
        comm = run_comm_bench(CommBenchConfig(collectives=("all_reduce",), min_bytes=grad, max_bytes=grad, iters=5,
                                              warmup=2, devices=row["devices"]))  # fmt: skip
        if comm["wrong"]:
            raise RunError("calibrate: bench comm returned wrong results")
        busbw = comm["rows"][-1]["busbw"]
    return Measurements(kind=report.kind, devices=row["devices"], cores=Environment.read().cpu_count, peak_tflops=peak,
                        memory_bandwidth_gbs=copy, model=model, batch=batch, shape=(c, h, w),
                        images_per_s=row["images_per_s"], comm_busbw_gbs=busbw)  # fmt: skip


def read_measurements(path: Path) -> Measurements:
    """Measurements written as JSON (``deskpod plan calibrate --from-json``: another box's, or an earlier run's)."""
    try:
        data = json.loads(path.read_text())
        data["shape"] = tuple(data["shape"])
        return Measurements(**data)
    except (OSError, ValueError, TypeError, KeyError) as e:
        raise UsageError(f"--from-json {path}: not a measurements file ({e})") from None


def scaled_model(model: str, shape: tuple[int, int, int]) -> ModelCost:
    """The model's cost at ``shape`` (C, H, W): FLOPs, activations and convolution elements scale with H x W / 224^2."""
    base = find_model(model)
    ratio = shape[1] * shape[2] / (224 * 224)
    return replace(base, forward_gflops=base.forward_gflops * ratio, activations_m=base.activations_m * ratio,
                   conv_io_m=base.conv_io_m * ratio, source=f"{base.source}, scaled to {shape[1]}x{shape[2]}")  # fmt: skip


def facts(m: Measurements, topology: Topology) -> MachineFacts:
    return MachineFacts(
        name=LOCAL, title=f"this box: {m.devices} {m.kind} device(s), measured", kind=m.kind, devices=m.devices,
        peak_tflops=m.peak_tflops, peak_key="measured matmul fp32", memory_bandwidth_gbs=m.memory_bandwidth_gbs,
        power_w=0.0, price_usd=None, cpu_cores=m.cores, topology=topology,
    )  # fmt: skip


def fit_local(m: Measurements, topology: Topology) -> Calibration:
    """Fit comm and compute efficiency to ``m`` (see the module docstring)."""
    if topology.device_count < m.devices:
        raise UsageError(f"calibration measured {m.devices} devices; the topology has {topology.device_count}")
    base = Factors()  # stack tf1-2017's: what one calibration cannot measure stays as fitted there
    devices = list(range(m.devices))
    ring = build_rings(topology, devices).bandwidth if m.devices > 1 else 0.0
    comm_eff = min(1.0, m.comm_busbw_gbs / ring) if ring else base.comm_efficiency
    f = facts(m, topology)
    model = scaled_model(m.model, m.shape)
    w = Workload(model, batch=m.batch, precision="fp32", data="synthetic")
    step = m.devices * m.batch / m.images_per_s
    comm = 0.0
    if m.devices > 1:
        grad = int(model.params_m * 1e6 * BYTES_PER_ELEMENT["fp32"])
        comm = predict(topology, "all_reduce", grad, devices=devices, efficiency=comm_eff).time_s
    compute = step - comm
    unit = Factors(compute_efficiency=1.0, memory_passes=0.0, cpu_compute_efficiency=1.0)
    flops_only = compute_time(w, f, unit)
    no_flops = Factors(compute_efficiency=1e30, memory_passes=base.memory_passes, cpu_compute_efficiency=1e30)
    memory = compute_time(w, f, no_flops)  # 0 on CPUs: their compute is FLOPs only
    if compute <= memory:
        raise RunError(
            f"calibration: the measured step ({step * 1e3:.1f} ms) leaves {compute * 1e3:.1f} ms after the all-reduce, "
            f"less than the memory term alone ({memory * 1e3:.1f} ms); the measurements are inconsistent, run it again"
        )
    efficiency = round(flops_only / (compute - memory), 6)
    factors = replace(base, comm_efficiency=round(comm_eff, 6))
    if m.kind == "cpu":
        factors = replace(factors, cpu_compute_efficiency=efficiency)
    else:
        factors = replace(factors, compute_efficiency=efficiency)
    return Calibration(m, factors, ring, time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()))


def calibration_path(home: Path) -> Path:
    return home / "plan" / "local.json"


def save(cal: Calibration, home: Path) -> Path:
    path = calibration_path(home)
    path.parent.mkdir(parents=True, exist_ok=True)
    write_text(path, cal.to_json())
    return path


def load(home: Path | None = None) -> Calibration:
    """The stored calibration; `UsageError` saying how to make one when there is none."""
    if home is None:
        from deskpod.environment import Environment

        home = Environment.read().home
    path = calibration_path(home)
    if not path.exists():
        raise UsageError(f"machine 'local' is not calibrated ({path} missing); run: deskpod plan calibrate")
    try:
        return Calibration.from_json(path.read_text())
    except (ValueError, KeyError, TypeError) as e:
        raise UsageError(f"{path} is not a deskpod calibration ({e}); run: deskpod plan calibrate") from None


def summary(cal: Calibration) -> dict[str, Any]:
    return {"when": cal.when, "ring_bandwidth": cal.ring_bandwidth, "measurements": asdict(cal.measurements),
            "factors": asdict(cal.factors)}  # fmt: skip
