"""The figures the planner is fitted to, and the fit.

The DGX-1 (P100) training throughputs of ``shared/reference/calibration.md`` §4.2: TensorFlow
benchmarks, May 2017, FP32, CUDA 8 / cuDNN 5.1, batch 64 (ResNet-50) and 512 (AlexNet) per GPU
(tensorflow/docs site/en/r1/guide/performance/benchmarks.md @62da04c0); and its one CPU baseline
(§4.4, "CPU baselines"): ResNet-50, 90 epochs of ImageNet in 711 h on a dual Xeon E5-2699 v4
server (scan.co.uk), about 45 images/s. Everything else the report compares with is a prediction,
not a fit.

The fit, in four closed steps (each factor from the figures it shows in):

1. ``e_c`` and ``k_m`` from the two 1-GPU synthetic figures: two linear equations in ``1/e_c``
   and ``k_m`` (`predict.compute_time` is linear in both), solved exactly.
2. ``e_n`` and ``overlap`` from the six 2/4/8-GPU synthetic figures: a grid search minimizing the
   squared log error (the figures' scaling loss is what communication costs).
3. ``r`` (input images/s per core) from the real-data figures below 8 GPUs and ResNet-50 at 8: a
   one-dimensional search, same error.
4. ``e_cpu`` from the CPU baseline: the step it implies, less the modelled all-reduce between the
   two sockets and the input pipeline, is FLOPs at ``e_cpu`` x peak; solved exactly.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Any

from deskpod.plan.predict import Factors, predict_plan
from deskpod.plan.workload import IMAGENET_TRAIN_IMAGES, MODELS, Workload

SOURCE = "tensorflow/docs site/en/r1/guide/performance/benchmarks.md @62da04c0 (calibration.md 4.2)"


@dataclass(frozen=True, slots=True)
class Point:
    """One published throughput."""

    model: str
    gpus: int
    data: str
    images_per_s: float
    batch: int


BATCH = {"resnet50": 64, "alexnet": 512}
_TABLE = {  # GPUs: (ResNet-50 synthetic, ResNet-50 real, AlexNet synthetic, AlexNet real)
    1: (219, 218, 2987, 2890),
    2: (422, 425, 5658, 4448),
    4: (852, 853, 10509, 7105),
    8: (1734, 1630, 17822, None),  # AlexNet real at 8: N/A ("maxing out the input pipeline")
}
POINTS: tuple[Point, ...] = tuple(
    Point(model, gpus, data, float(v), BATCH[model])
    for gpus, row in _TABLE.items()
    for (model, data), v in zip(
        (("resnet50", "synthetic"), ("resnet50", "real"), ("alexnet", "synthetic"), ("alexnet", "real")),
        row,
        strict=True,
    )
    if v is not None
)
MACHINE = "dgx1-p100"
CPU_MACHINE = "xeon-e5-2699v4-2s"
CPU_SOURCE = "scan.co.uk deep-learning-hardware: ResNet-50, 90 epochs, 711 h (calibration.md 4.4)"
CPU_HOURS = 711.0
CPU_POINT = Point("resnet50", 2, "real", IMAGENET_TRAIN_IMAGES * 90 / (CPU_HOURS * 3600), 64)
"""The CPU baseline: 2 devices = the two sockets; batch 64 per socket (the figure does not say; in the
FLOP-only CPU model it moves only the small inter-socket all-reduce)."""


def predicted(point: Point, factors: Factors, machine: str = MACHINE) -> float:
    w = Workload(MODELS[point.model], batch=point.batch, precision="fp32", data=point.data)  # type: ignore[arg-type]
    return predict_plan(w, machine, 1, devices_per_node=point.gpus, factors=factors).images_per_s


def fit_cpu(factors: Factors) -> float:
    """``e_cpu`` that reproduces `CPU_POINT` exactly (step 4)."""
    p = CPU_POINT
    w = Workload(MODELS[p.model], batch=p.batch, precision="fp32", data=p.data)  # type: ignore[arg-type]
    unit = predict_plan(w, CPU_MACHINE, 1, factors=replace(factors, cpu_compute_efficiency=1.0))
    step = p.batch * p.gpus / p.images_per_s
    compute = step - unit.exposed_comm_s - unit.input_s
    if compute <= 0:  # pragma: no cover - a catalog error, not an input
        raise AssertionError(f"CPU baseline step {step} s leaves no compute time")
    return round(unit.compute_s / compute, 6)


def _loss(points: list[Point], factors: Factors) -> float:
    return sum(math.log(predicted(p, factors) / p.images_per_s) ** 2 for p in points)


def fit() -> Factors:
    """Fit the five factors to `POINTS` (see the module docstring); deterministic."""
    from deskpod.plan.predict import compute_time, machine_facts

    f = machine_facts(MACHINE, "fp32")
    # 1. Per-sample time t = u * a + k * c with u = 1/e_c; a, c from a unit-factor evaluation.
    rows = []
    for model in ("resnet50", "alexnet"):
        one = next(p for p in POINTS if p.model == model and p.gpus == 1 and p.data == "synthetic")
        w = Workload(MODELS[model], batch=1, precision="fp32", data="synthetic")
        a = compute_time(w, f, Factors(compute_efficiency=1.0, memory_passes=0.0))
        c = compute_time(w, f, Factors(compute_efficiency=1e30, memory_passes=1.0))
        rows.append((a, c, 1 / one.images_per_s))
    (a1, c1, t1), (a2, c2, t2) = rows
    det = a1 * c2 - a2 * c1
    u = (t1 * c2 - t2 * c1) / det
    k = (a1 * t2 - a2 * t1) / det
    base = Factors(compute_efficiency=round(1 / u, 6), memory_passes=round(k, 4))
    # 2. Communication: grid over efficiency and overlap.
    multi = [p for p in POINTS if p.data == "synthetic" and p.gpus > 1]
    best: tuple[float, Factors] | None = None
    for i in range(1, 101):
        for j in range(0, 21):
            cand = replace(base, comm_efficiency=i / 100, overlap=j / 20)
            loss = _loss(multi, cand)
            if best is None or loss < best[0] - 1e-12:
                best = (loss, cand)
    assert best is not None
    comm = best[1]
    # 3. Input pipeline: images/s per core on a grid.
    real = [p for p in POINTS if p.data == "real" and p.gpus > 1]
    rate = min(range(100, 5001), key=lambda r: _loss(real, replace(comm, input_images_per_core=float(r))))
    gpu = replace(comm, input_images_per_core=float(rate))
    # 4. CPUs: their own FLOP efficiency.
    return replace(gpu, cpu_compute_efficiency=fit_cpu(gpu))


def calibration_table(factors: Factors | None = None) -> list[dict[str, Any]]:
    """Every calibration figure beside the model's prediction."""
    factors = factors or Factors()
    out = []
    for machine, p in [(MACHINE, p) for p in POINTS] + [(CPU_MACHINE, CPU_POINT)]:
        pred = predicted(p, factors, machine)
        out.append({"machine": machine, "model": p.model, "devices": p.gpus, "data": p.data,
                    "published": round(p.images_per_s, 1), "predicted": round(pred, 1),
                    "ratio": round(pred / p.images_per_s, 3)})  # fmt: skip
    return out
