"""What each of pytorch-2021's later terms does to the held-out DGX A100 rows, and the other reading of the sync cost.

    .venv/bin/python benchmarks/plan_terms.py

Stack pytorch-2021 gained two terms after its predictions for the DGX A100 (`deskpod.plan.generations`,
published, not in the reference) had been compared: the layout changes of NCHW convolutions on Tensor
Cores (`deskpod.plan.factors.TRANSPOSE_MOVES`, counted) and a synchronization cost per step (``sync_s``,
solved from the V100 table's FP32 8-GPU row). This prints every held-out row under four models:

* before both terms (every precision treated as channels_last, no sync cost);
* the layout term only;
* both (the stack as it is);
* the V100's 8-GPU FP32 loss read as all-reduce efficiency with no overlap instead of a fixed cost
  (``e_n`` solved so that the FP32 8-GPU row is reproduced), which shrinks with the link bandwidth.

Each variant refits what depends on it (the input rate ``r``) to the V100 table, as the stack's fit does.
"""

from __future__ import annotations

from dataclasses import replace

from deskpod.plan.calibration import DLE_MACHINE, DLE_POINTS, fit_input_rate, predicted
from deskpod.plan.factors import Factors
from deskpod.plan.generations import HELD_OUT
from deskpod.plan.predict import predict_plan
from deskpod.plan.stacks import PYTORCH_2021
from deskpod.plan.workload import MODELS, PRECISIONS, Workload


def comm_reading(f: Factors) -> Factors:
    """``e_n`` with no overlap and no sync cost, solved (bisection) to reproduce the FP32 8-GPU row."""
    fp32 = next(p for p in DLE_POINTS if p.fitted and p.gpus > 1 and p.precision == "fp32")
    lo, hi = 1e-3, 1.0
    for _ in range(60):
        mid = (lo + hi) / 2
        rate = predicted(fp32, replace(f, sync_s=0.0, overlap=0.0, comm_efficiency=mid), DLE_MACHINE)
        lo, hi = (mid, hi) if rate < fp32.images_per_s else (lo, mid)
    return fit_input_rate(replace(f, sync_s=0.0, overlap=0.0, comm_efficiency=(lo + hi) / 2))


def main() -> int:
    now = PYTORCH_2021.factors
    variants = {
        "before both": fit_input_rate(replace(now, sync_s=0.0, channels_last=PRECISIONS)),
        "+ layout only": fit_input_rate(replace(now, sync_s=0.0)),
        "+ both (the stack)": now,
        "sync read as all-reduce efficiency": comm_reading(now),
    }
    for name, f in variants.items():
        print(f"{name}: e_n {f.comm_efficiency:.4f}, overlap {f.overlap}, sync {f.sync_s * 1e3:.2f} ms, "
              f"r {f.input_images_per_core:.0f}/core")  # fmt: skip
    print()
    print("| row | published | " + " | ".join(variants) + " |")
    print("|---|---|" + "---|" * len(variants))
    for h in HELD_OUT:
        w = Workload(MODELS[h.model], batch=h.batch, precision=h.precision, data=h.data)  # type: ignore[arg-type]
        cells = []
        for f in variants.values():
            rate = predict_plan(w, h.machine, 1, devices_per_node=h.gpus, factors=f).images_per_s
            cells.append(f"{rate:,.0f} ({(rate / h.images_per_s - 1) * 100:+.1f}%)")
        print(
            f"| {h.label}, {h.gpus} GPU{'s' if h.gpus > 1 else ''} | {h.images_per_s:,.0f} | "
            + " | ".join(cells)
            + " |"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
