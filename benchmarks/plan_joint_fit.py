"""Could one factor set fit two GPU generations? Fit the planner to the P100 table and the K80 row together.

    .venv/bin/python benchmarks/plan_joint_fit.py

The planner is fitted to the DGX-1 P100 TensorFlow table (`deskpod.plan.calibration`). The same
page has a second GPU generation under the same software: 8x K80 on GCE (ResNet-50 387, AlexNet
4,640 images/s, synthetic). This fits the four GPU factors that the synthetic figures show
(compute efficiency, memory passes, all-reduce efficiency, overlap) by grid search on the squared
log error, once to the P100 figures alone and once to P100 + K80, and prints every figure beside
its prediction. The answer decides whether the K80 joins the fit: it does not when the joint fit
still misses the K80 by far and costs the P100 rows their accuracy.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np

from deskpod.comm.cost import predict
from deskpod.plan.calibration import MACHINE, POINTS
from deskpod.plan.predict import Factors, compute_time, machine_facts, predict_plan
from deskpod.plan.workload import MODELS, Workload

K80 = "gce-k80-8"
K80_POINTS = (("resnet50", 8, 387.0, 64), ("alexnet", 8, 4640.0, 512))  # docs/reference/calibration.md#tensorflow-2017


@dataclass(frozen=True)
class Row:
    machine: str
    model: str
    gpus: int
    batch: int
    published: float
    flops_s: float  # per sample at compute efficiency 1
    memory_s: float  # per sample at 1 memory pass
    alpha: float  # all-reduce: alpha + beta / efficiency
    beta: float


def rows() -> list[Row]:
    out = []
    points = [(MACHINE, p.model, p.gpus, p.images_per_s, p.batch) for p in POINTS if p.data == "synthetic"]
    points += [(K80, m, g, v, b) for m, g, v, b in K80_POINTS]
    for machine, model, gpus, published, batch in points:
        f = machine_facts(machine, "fp32")
        w = Workload(MODELS[model], batch=1, precision="fp32", data="synthetic")
        a = compute_time(w, f, Factors(compute_efficiency=1.0, memory_passes=0.0))
        c = compute_time(w, f, Factors(compute_efficiency=1e30, memory_passes=1.0))
        alpha = beta = 0.0
        if gpus > 1:
            size = int(MODELS[model].params_m * 1e6 * 4)
            t1 = predict(f.topology, "all_reduce", size, devices=range(gpus), efficiency=1.0).time_s
            t2 = predict(f.topology, "all_reduce", size, devices=range(gpus), efficiency=0.5).time_s
            beta = t2 - t1
            alpha = t1 - beta
        out.append(Row(machine, model, gpus, batch, published, a, c, alpha, beta))
    return out


def fit(selected: list[Row]) -> tuple[float, Factors]:
    inv_ec = 1 / np.arange(0.3, 3.0, 0.005)[:, None]
    passes = np.arange(0.0, 40.0, 0.1)[None, :]
    best: tuple[float, Factors] | None = None
    for en in np.arange(0.05, 1.0001, 0.01):
        for ov in np.arange(0.0, 1.0001, 0.05):
            loss = np.zeros((inv_ec.size, passes.size))
            for r in selected:
                compute = r.batch * (inv_ec * r.flops_s + passes * r.memory_s)
                comm = r.alpha + r.beta / en if r.gpus > 1 else 0.0
                exposed = np.maximum(0.0, comm - ov * compute * 2 / 3)
                loss += np.log(r.batch * r.gpus / (compute + exposed) / r.published) ** 2
            i, j = np.unravel_index(np.argmin(loss), loss.shape)
            if best is None or loss[i, j] < best[0]:
                factors = replace(Factors(), compute_efficiency=round(float(1 / inv_ec[i, 0]), 3),
                                  memory_passes=round(float(passes[0, j]), 2),
                                  comm_efficiency=min(1.0, round(float(en), 2)), overlap=round(float(ov), 2))  # fmt: skip
                best = (float(loss[i, j]), factors)
    assert best is not None
    return best


def main() -> None:
    every = rows()
    for label, selected in (("P100 only", [r for r in every if r.machine == MACHINE]), ("P100 + K80", every)):
        loss, f = fit(selected)
        print(f"{label}: loss {loss:.4f}; compute_efficiency {f.compute_efficiency}, memory_passes "
              f"{f.memory_passes}, comm_efficiency {f.comm_efficiency}, overlap {f.overlap}")  # fmt: skip
        for r in every:
            w = Workload(MODELS[r.model], batch=r.batch, precision="fp32", data="synthetic")
            got = predict_plan(w, r.machine, 1, devices_per_node=r.gpus, factors=f).images_per_s
            print(f"  {r.machine:<10} {r.model:<9} {r.gpus} GPUs  published {r.published:>8.0f}  "
                  f"predicted {got:>8.0f}  ratio {got / r.published:.3f}")  # fmt: skip


if __name__ == "__main__":
    main()
