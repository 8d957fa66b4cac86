"""The tables the stacks are fitted to, and the fits: one table per stack, each of its own era.

**tf1-2017** — the DGX-1 (P100) training throughputs of ``docs/reference/calibration.md#tensorflow-2017``:
TensorFlow benchmarks, May 2017, FP32, CUDA 8 / cuDNN 5.1, batch 64 (ResNet-50) and 512 (AlexNet)
per GPU (tensorflow/docs site/en/r1/guide/performance/benchmarks.md @62da04c0); and the one CPU
baseline (§4.4, "CPU baselines"): ResNet-50, 90 epochs of ImageNet in 711 h on a dual Xeon
E5-2699 v4 server (scan.co.uk), about 45 images/s. `fit`, in four closed steps (each factor from
the figures it shows in):

1. ``e_c`` and ``k_m`` from the two 1-GPU synthetic figures: two linear equations in ``1/e_c``
   and ``k_m`` (`predict.compute_time` is linear in both), solved exactly.
2. ``e_n`` and ``overlap`` from the six 2/4/8-GPU synthetic figures: a grid search minimizing the
   squared log error (the figures' scaling loss is what communication costs).
3. ``r`` (input images/s per core) from the real-data figures below 8 GPUs and ResNet-50 at 8: a
   one-dimensional search, same error.
4. ``e_cpu`` from the CPU baseline: the step it implies, less the modelled all-reduce between the
   two sockets and the input pipeline, is FLOPs at ``e_cpu`` x peak; solved exactly.

**pytorch-2021** — §4.1b: NVIDIA DeepLearningExamples' PyTorch ResNet-50 v1.5 on the DGX-1 32GB
(8x V100-SXM2-32GB, the catalog's ``dgx1-v100``), pytorch-21.03 NGC container, FP32 and mixed
precision (AMP), 1 and 8 GPUs (NVIDIA/DeepLearningExamples
PyTorch/Classification/ConvNets/resnet50v1.5/README.md @291f0d02; the figures came in at 7bdfc81d).
The README's benchmark commands run ``launch.py``, which takes the settings from ``configs.yml`` of the
same folder (read at 7bdfc81d): batch per GPU 112 (FP32) and 256 (AMP), AMP in channels_last and FP32
in NCHW, ImageNet decoded by torchvision in PyTorch DataLoader workers (``data_backend: pytorch``, 8 per
GPU on DGX1V) that prefetch ahead of the step. The DGX-1 16GB rows of the same table run on GPUs
the catalog does not tell apart (same peaks and bandwidth): shown beside the fit, not fitted.
`fit_pytorch_2021`, in three closed steps:

1. ``e_c`` and ``k_m`` from the two 1-GPU figures (FP32 on CUDA cores at 15.7 TFLOPS, AMP on
   Tensor Cores at 125, 4 and 2 bytes per activation): two linear equations, solved exactly. One
   compute efficiency for both units is what makes two figures enough. Neither pays layout changes
   (`deskpod.plan.factors.TRANSPOSE_MOVES`: FP32 runs on CUDA cores, AMP in channels_last).
2. ``sync_s`` from the FP32 8-GPU figure, exactly: its step less the modelled one (compute, and an
   all-reduce the backward pass hides). The input pipeline does not show there (896 images per step
   against the AMP row's 2,048).
3. ``r`` from the two 8-GPU figures: a one-dimensional search, squared log error (the workers run
   ahead of the step, so only a pipeline slower than the GPUs shows: AMP on 8 GPUs).

``overlap`` and ``e_n`` are not fitted (`deskpod.plan.stacks` says why and what they are).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Any

from deskpod.errors import UsageError
from deskpod.plan.predict import Factors, predict_plan
from deskpod.plan.stacks import PYTORCH_2021, STACKS, TF1_2017
from deskpod.plan.workload import IMAGENET_TRAIN_IMAGES, MODELS, Precision, Workload

SOURCE = "tensorflow/docs site/en/r1/guide/performance/benchmarks.md @62da04c0 (docs/reference/calibration.md#tensorflow-2017)"
DLE_SOURCE = (
    "NVIDIA/DeepLearningExamples PyTorch/Classification/ConvNets/resnet50v1.5/README.md @291f0d02, "
    "'Training performance: NVIDIA DGX-1 32GB (8x V100 32GB)', pytorch-21.03 (docs/reference/calibration.md#pytorch-2021)"
)


@dataclass(frozen=True, slots=True)
class Point:
    """One published throughput."""

    model: str
    gpus: int
    data: str
    images_per_s: float
    batch: int
    precision: Precision = "fp32"
    fitted: bool = True
    """False: a figure of the same table shown beside the fit (same catalog hardware), not fitted to."""
    label: str = ""


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
CPU_SOURCE = "scan.co.uk: ResNet-50, 90 epochs, 711 h (docs/reference/calibration.md#cpu-baseline)"
CPU_HOURS = 711.0
CPU_POINT = Point("resnet50", 2, "real", IMAGENET_TRAIN_IMAGES * 90 / (CPU_HOURS * 3600), 64)
"""The CPU baseline: 2 devices = the two sockets; batch 64 per socket (the figure does not say; in the
FLOP-only CPU model it moves only the small inter-socket all-reduce)."""


DLE_MACHINE = "dgx1-v100"
_DLE = {  # (system, GPUs): (FP32 batch 112, AMP batch 256), images/s
    ("DGX-1 32GB", 1): (356, 1156),
    ("DGX-1 32GB", 8): (2766, 8056),
    ("DGX-1 16GB", 1): (367, 1200),
    ("DGX-1 16GB", 8): (2855, 8322),
}
_DLE_RUNS: tuple[tuple[Precision, int], ...] = (("fp32", 112), ("fp16", 256))
"""Precision and batch per GPU of each column (configs.yml, DGX1V: FP32 112, AMP 256)."""
DLE_POINTS: tuple[Point, ...] = tuple(
    Point(
        "resnet50",
        gpus,
        "real",
        float(v),
        batch,
        precision,
        fitted=system == "DGX-1 32GB",
        label=f"{system} {'AMP' if precision == 'fp16' else 'FP32'}",
    )
    for (system, gpus), row in _DLE.items()
    for (precision, batch), v in zip(_DLE_RUNS, row, strict=True)
)


def predicted(point: Point, factors: Factors, machine: str = MACHINE) -> float:
    w = Workload(MODELS[point.model], batch=point.batch, precision=point.precision, data=point.data)  # type: ignore[arg-type]
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


def solve_compute(points: list[Point], machine: str, channels_last: tuple[Precision, ...] = ()) -> tuple[float, float]:
    """``e_c`` and ``k_m`` from two 1-device synthetic figures, exactly: each figure's time per sample is
    ``a / e_c + k_m x c + l`` (`deskpod.plan.factors.sample_terms`), two linear equations in ``1/e_c`` and ``k_m``."""
    from deskpod.plan.factors import sample_terms
    from deskpod.plan.predict import machine_facts

    rows = []
    for p in points:
        w = Workload(MODELS[p.model], batch=1, precision=p.precision, data="synthetic")
        t = sample_terms(w, machine_facts(machine, p.precision), channels_last)
        rows.append((t.flops_s, t.pass_s, 1 / p.images_per_s - t.layout_s))
    (a1, c1, t1), (a2, c2, t2) = rows
    det = a1 * c2 - a2 * c1
    u = (t1 * c2 - t2 * c1) / det
    k = (a1 * t2 - a2 * t1) / det
    return round(1 / u, 6), round(k, 4)


def fit() -> Factors:
    """Fit the five factors to `POINTS` (see the module docstring); deterministic."""
    # 1. Per-sample time t = u * a + k * c with u = 1/e_c, from ResNet-50's and AlexNet's 1-GPU synthetic figures.
    ones = [
        next(p for p in POINTS if p.model == m and p.gpus == 1 and p.data == "synthetic")
        for m in ("resnet50", "alexnet")
    ]
    e_c, k_m = solve_compute(ones, MACHINE, TF1_2017.factors.channels_last)
    base = replace(TF1_2017.factors, compute_efficiency=e_c, memory_passes=k_m)
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


def fit_input_rate(base: Factors) -> Factors:
    """``base`` with stack pytorch-2021's ``r``: images/s per core on a grid, squared log error over the fitted
    8-GPU figures (step 3 of `fit_pytorch_2021`)."""
    multi = [p for p in DLE_POINTS if p.fitted and p.gpus > 1]

    def loss(rate: int) -> float:
        cand = replace(base, input_images_per_core=float(rate))
        return sum(math.log(predicted(p, cand, DLE_MACHINE) / p.images_per_s) ** 2 for p in multi)

    return replace(base, input_images_per_core=float(min(range(50, 5001), key=loss)))


def fit_pytorch_2021() -> Factors:
    """Fit stack pytorch-2021's factors to the fitted `DLE_POINTS` (see the module docstring); deterministic."""
    fitted = [p for p in DLE_POINTS if p.fitted]
    ones = [p for p in fitted if p.gpus == 1]
    # 1. per-sample time t = u * a + k * c, as in `fit`, across the two units instead of two models
    unfitted = PYTORCH_2021.factors
    e_c, k_m = solve_compute(ones, DLE_MACHINE, unfitted.channels_last)
    base = replace(unfitted, compute_efficiency=e_c, memory_passes=k_m)
    # 2. Synchronization per step, from the FP32 8-GPU figure (an input pipeline that cannot bind).
    multi = [p for p in fitted if p.gpus > 1]
    fp32 = next(p for p in multi if p.precision == "fp32")
    w = Workload(MODELS[fp32.model], batch=fp32.batch, precision=fp32.precision, data=fp32.data)  # type: ignore[arg-type]
    free = replace(base, sync_s=0.0, input_images_per_core=1e12)
    modelled = predict_plan(w, DLE_MACHINE, 1, devices_per_node=fp32.gpus, factors=free).step_s
    base = replace(base, sync_s=round(fp32.batch * fp32.gpus / fp32.images_per_s - modelled, 6))
    # 3. Input pipeline: images/s per core on a grid, over the 8-GPU figures.
    out = fit_input_rate(base)
    for p in [*ones, fp32]:  # steps 1 and 2 assumed the pipeline does not show in these rows; it must not
        if abs(predicted(p, out, DLE_MACHINE) / p.images_per_s - 1) > 1e-3:
            raise AssertionError(f"pytorch-2021 fit: the input pipeline shows in {p.label} at {p.gpus} GPU(s)")
    return out


FITS = {TF1_2017.name: fit, PYTORCH_2021.name: fit_pytorch_2021}


def fit_stack(name: str) -> Factors:
    """Refit the catalog stack ``name`` to its own table."""
    if name not in FITS:
        raise UsageError(f"unknown stack {name!r}; valid: {', '.join(STACKS)}")
    return FITS[name]()


def _compared(stack: str, machine: str, p: Point, factors: Factors, fitted: bool, **first: str) -> dict[str, Any]:
    """One published figure beside the prediction (``first``: columns that lead, after the stack and machine)."""
    pred = predicted(p, factors, machine)
    return {"stack": stack, "machine": machine, **first, "model": p.model, "devices": p.gpus, "precision": p.precision,
            "data": p.data, "batch": p.batch, "fitted": fitted, "published": round(p.images_per_s, 1),
            "predicted": round(pred, 1), "ratio": round(pred / p.images_per_s, 3)}  # fmt: skip


def calibration_table(factors: Factors | None = None) -> list[dict[str, Any]]:
    """Every tf1-2017 calibration figure beside the model's prediction."""
    points = [(MACHINE, p) for p in POINTS] + [(CPU_MACHINE, CPU_POINT)]
    return [_compared(TF1_2017.name, m, p, factors or TF1_2017.factors, True) for m, p in points]


def pytorch_2021_table(factors: Factors | None = None) -> list[dict[str, Any]]:
    """Every §4.1b figure beside stack pytorch-2021's prediction (``fitted`` False: shown, not fitted to)."""
    f = factors or PYTORCH_2021.factors
    return [_compared(PYTORCH_2021.name, DLE_MACHINE, p, f, p.fitted, system=p.label) for p in DLE_POINTS]


def stack_table(name: str, factors: Factors | None = None) -> list[dict[str, Any]]:
    """The table stack ``name`` is fitted to, beside its predictions."""
    tables = {TF1_2017.name: calibration_table, PYTORCH_2021.name: pytorch_2021_table}
    if name not in tables:
        raise UsageError(f"unknown stack {name!r}; valid: {', '.join(STACKS)}")
    return tables[name](factors)
