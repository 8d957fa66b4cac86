"""``deskpod bench train``: training throughput on 1, 2, 4, … devices, beside a plain DDP reference.

For each device count it runs deskpod's own trainer (the launcher and DDP loop ``deskpod train``
uses) on synthetic data for ``warmup + steps`` optimizer steps, timing only the last ``steps``;
then, in the same run, ``benchmarks/ddp_reference.py`` under torchrun with the same model, input
shape, batch, precision and devices. The table gives images/s, per device, scaling efficiency
and deskpod/reference. ``--repeats`` alternates the two and keeps the median.

Scaling compares equal hardware. On GPUs a row of N devices is set against N times one device's
rate. On CPUs every row uses all the cores, N workers sharing them as threads, so a row is set
against one worker with the same cores (its rate, not N times it), and the row of ``deskpod train``'s
own layout for ``--devices all`` (`deskpod.hardware.devices.cpu_layout`) is marked: the table
measures that layout against every other, the old one-worker-per-core default included.
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import tempfile
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import deskpod
from deskpod.errors import ConfigError, RunError
from deskpod.hardware.affinity import numa_nodes
from deskpod.hardware.devices import cpu_layout, discover
from deskpod.train.data import parse_shape
from deskpod.train.launcher import launch, prepare

REFERENCE = Path(deskpod.__file__).resolve().parents[1] / "benchmarks" / "ddp_reference.py"
REFERENCE_MODELS = ("alexnet", "resnet18", "resnet50")


@dataclass(frozen=True, slots=True)
class BenchRequest:
    model: str = "resnet18"
    data: str = "synthetic:3x64x64"
    batch_size: int = 32
    steps: int = 30
    warmup: int = 5
    devices: str = "all"
    precision: str = "auto"
    repeats: int = 1
    reference: bool = True


def device_counts(n: int) -> list[int]:
    """1, 2, 4, … up to n, and n itself."""
    counts, k = [], 1
    while k < n:
        counts.append(k)
        k *= 2
    return [*counts, n]


def _deskpod_rate(req: BenchRequest, n: int, out: Path, tag: str) -> dict[str, Any]:
    samples = req.batch_size * n * (req.steps + req.warmup)
    overrides = {
        "model": req.model, "data": req.data, "devices": str(n), "steps": req.steps + req.warmup,
        "batch_size": req.batch_size, "precision": req.precision, "synthetic_samples": samples, "out": str(out),
        "name": tag, "log_every_steps": req.steps + req.warmup, "checkpoint_every_minutes": 0.0, "max_restarts": 0,
        "warmup_epochs": 0.0,
    }  # fmt: skip
    plan = prepare(None, overrides, resume=False)
    summary = launch(plan, "quiet", timing_skip_steps=req.warmup)
    return {"images_per_s": summary["throughput_images_per_s"], "precision": summary["precision"]}


def _reference_rate(req: BenchRequest, n: int, kind: str, threads: int, precision: str) -> dict[str, Any]:
    c, h, w = parse_shape(req.data.partition(":")[2] or "3x224x224")
    cmd = [
        sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={n}", str(REFERENCE),
        "--model", req.model, "--shape", f"{c}x{h}x{w}", "--batch-size", str(req.batch_size),
        "--steps", str(req.steps), "--warmup", str(req.warmup), "--precision", precision,
    ]  # fmt: skip
    env = dict(os.environ)
    if kind == "cpu":
        env.update(OMP_NUM_THREADS=str(threads), CUDA_VISIBLE_DEVICES="")
    else:
        env["CUDA_VISIBLE_DEVICES"] = ",".join(str(i) for i in range(n))
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=1800)
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("{")]
    if proc.returncode != 0 or not lines:
        raise RunError(f"the DDP reference failed (exit {proc.returncode}): {proc.stderr.strip()[-2000:]}")
    return dict(json.loads(lines[-1]))


def run_bench(req: BenchRequest, log: Callable[[str], None] | None = None) -> dict[str, Any]:
    if not req.data.startswith("synthetic"):
        raise ConfigError(
            f"bench train measures the network, not the input pipeline: use --data synthetic:CxHxW, not {req.data!r}"
        )
    if req.steps < 1 or req.warmup < 0 or req.repeats < 1:
        raise ConfigError(
            f"--steps {req.steps}, --warmup {req.warmup}, --repeats {req.repeats}: need steps ≥ 1, warmup ≥ 0, repeats ≥ 1"
        )
    inv = discover()
    largest = len(inv.select(req.devices))
    default_workers = len(cpu_layout(inv, numa_nodes(os.sched_getaffinity(0))).devices) if inv.kind == "cpu" else 0
    use_ref = req.reference and REFERENCE.exists() and req.model in REFERENCE_MODELS
    note = None
    if req.reference and not use_ref:
        note = (f"reference skipped: {REFERENCE} not found" if not REFERENCE.exists()
                else f"reference skipped: it builds only {', '.join(REFERENCE_MODELS)}")  # fmt: skip
    rows: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="deskpod-bench-") as tmp:
        for n in device_counts(largest):
            ours: list[float] = []
            refs: list[float] = []
            precision = "fp32"
            threads = max(1, inv.cores // n) if inv.kind == "cpu" else 0
            for r in range(req.repeats):
                d = _deskpod_rate(req, n, Path(tmp), f"n{n}-r{r}")
                ours.append(d["images_per_s"])
                precision = d["precision"]
                if use_ref:
                    refs.append(_reference_rate(req, n, inv.kind, threads, precision)["images_per_s"])
                if log:
                    ref_txt = f", reference {refs[-1]:,.1f}" if refs else ""
                    log(
                        f"  {n} device{'s' if n > 1 else ''}, repeat {r + 1}/{req.repeats}: deskpod {ours[-1]:,.1f} img/s{ref_txt}"
                    )
            rows.append({
                "devices": n,
                "images_per_s": statistics.median(ours),
                "per_device": statistics.median(ours) / n,
                "reference_images_per_s": statistics.median(refs) if refs else None,
                "samples": ours,
                "reference_samples": refs,
                "precision": precision,
                "threads_per_worker": threads,
                "default_layout": n == default_workers,
            })  # fmt: skip
    # CPUs: every row has all the cores, so the same cores as one worker are the yardstick.
    key = "images_per_s" if inv.kind == "cpu" else "per_device"
    base = rows[0][key]
    for row in rows:
        row["scaling_efficiency"] = row[key] / base if base else None
        ref = row["reference_images_per_s"]
        row["vs_reference"] = row["images_per_s"] / ref if ref else None
    return {"request": asdict(req), "device_kind": inv.kind, "device_name": inv.devices[0].name, "cores": inv.cores,
            "rows": rows, "note": note}  # fmt: skip


def format_table(result: dict[str, Any]) -> str:
    req = result["request"]
    head = (f"deskpod bench train: {req['model']} on {req['data']}, batch {req['batch_size']} per device, "
            f"{req['steps']} timed steps after {req['warmup']} warm-up, {result['device_kind']} ({result['device_name']})")  # fmt: skip
    cpu = result["device_kind"] == "cpu"
    lines = [
        head,
        "",
        f"{'devices':>7}  {'layout':>13}  {'img/s':>10}  {'per device':>10}  {'scaling':>7}  {'reference':>10}  "
        f"{'deskpod/ref':>11}",
    ]
    for r in result["rows"]:
        ref = f"{r['reference_images_per_s']:10,.1f}" if r["reference_images_per_s"] else f"{'—':>10}"
        ratio = f"{r['vs_reference']:11.3f}" if r["vs_reference"] else f"{'—':>11}"
        t = r["threads_per_worker"]
        layout = (f"{r['devices']}×{t} thread{'s' if t != 1 else ''}" + ("*" if r.get("default_layout") else "")
                  if cpu else f"{r['devices']} GPU{'s' if r['devices'] != 1 else ''}")  # fmt: skip
        lines.append(f"{r['devices']:>7}  {layout:>13}  {r['images_per_s']:10,.1f}  {r['per_device']:10,.1f}  "
                     f"{100 * r['scaling_efficiency']:6.1f}%  {ref}  {ratio}")  # fmt: skip
    if cpu:
        lines.append(
            f"CPU rows share all {result['cores']} cores (workers × threads); scaling is img/s against 1 worker with "
            "the same cores. * deskpod train's layout for --devices all (one worker per NUMA node)."
        )
    if result.get("note"):
        lines.append(result["note"])
    return "\n".join(lines)
