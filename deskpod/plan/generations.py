"""Other GPU generations under a fitted stack: published results NOT in the reference, and the model's error.

Each stack is fitted to one table of one GPU generation (`deskpod.plan.calibration`). What it says
about other generations under the same software is the test of the first-principles part: the
machine's peak per precision and unit, memory bandwidth, links and cores, with the stack's factors
unchanged. The figures here were not used to fit anything and are not in
``docs/reference/calibration.md``; each row names its source exactly. Only figures read from a
stored source are listed (none from memory).

* pytorch-2021 on the DGX A100 80GB: the same README and commit as the §4.1b table the stack is
  fitted to, its "Training performance: NVIDIA DGX A100 (8x A100 80GB)" table (pytorch-21.03 NGC
  container; the figures came in at 7bdfc81d): TF32 and mixed precision (AMP), 1 and 8 GPUs. As
  ``configs.yml`` of the same folder has it for DGXA100 at 7bdfc81d: batch 256 per GPU for both, AMP in
  channels_last and TF32 in NCHW, 16 PyTorch DataLoader workers per GPU.
  The machine is the catalog's ``dgx-a100-80gb`` (the ``dgx-a100`` layout with the 80 GB GPUs' faster
  memory).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from deskpod.plan.predict import predict_plan
from deskpod.plan.workload import MODELS, Precision, Workload

DLE_A100_SOURCE = (
    "NVIDIA/DeepLearningExamples PyTorch/Classification/ConvNets/resnet50v1.5/README.md @291f0d02, "
    "'Training performance: NVIDIA DGX A100 (8x A100 80GB)', pytorch-21.03 NGC container (2021); "
    "not in the reference"
)


@dataclass(frozen=True, slots=True)
class Published:
    """One published throughput of a GPU generation the stack was not fitted to."""

    stack: str
    machine: str
    model: str
    precision: Precision
    label: str
    """The precision as the source names it (TF32, AMP …)."""
    batch: int
    gpus: int
    data: str
    images_per_s: float
    source: str


_A100_RUNS: tuple[tuple[Precision, str], ...] = (("tf32", "TF32"), ("fp16", "AMP"))
HELD_OUT: tuple[Published, ...] = tuple(
    Published(
        "pytorch-2021", "dgx-a100-80gb", "resnet50", precision, label, 256, gpus, "real", float(v), DLE_A100_SOURCE
    )
    for gpus, row in ((1, (938, 2470)), (8, (7248, 16621)))
    for (precision, label), v in zip(_A100_RUNS, row, strict=True)
)


def held_out_table() -> list[dict[str, Any]]:
    """Every held-out figure beside its stack's prediction, with the error; and, for comparison only, what
    the other catalog stack (another era's software) says."""
    from deskpod.plan.stacks import STACKS

    out = []
    for p in HELD_OUT:
        w = Workload(MODELS[p.model], batch=p.batch, precision=p.precision, data=p.data)  # type: ignore[arg-type]
        plan = predict_plan(w, p.machine, 1, devices_per_node=p.gpus, stack=p.stack)
        other = next(s for s in STACKS if s != p.stack)
        other_rate = predict_plan(w, p.machine, 1, devices_per_node=p.gpus, stack=other).images_per_s
        out.append({"stack": plan.stack, "machine": p.machine, "model": p.model, "precision": p.label,
                    "batch": p.batch, "devices": p.gpus, "data": p.data, "published": p.images_per_s,
                    "predicted": plan.images_per_s, "ratio": plan.images_per_s / p.images_per_s,
                    "error_pct": (plan.images_per_s / p.images_per_s - 1) * 100, "source": p.source,
                    "other_stack": other, "other_predicted": other_rate})  # fmt: skip
    return out
