"""Detector training throughput: `deskpod lung train` against a plain MONAI + DDP loop, same run.

    .venv/bin/python benchmarks/bench_lung_train.py --rounds 3

Both train the same RetinaNet (MONAI's classes) on the same crops of the same phantom LUNA16 folder
(`deskpod lung phantom`, written once into a temporary folder) with the same devices, batch and steps,
alternating round by round: deskpod through its launcher and trainer (`deskpod.train.launcher`, the path
of `deskpod lung train`), the reference through torchrun and `benchmarks/reference_lung_detector.py`.
Throughput leaves out the first --warmup steps of each. The ratio is the median of deskpod's rounds over
the median of the reference's; target ≥ 0.98. Phantom data: a speed figure, never a detection result.
Writes its subsection of docs/benchmarks.md (``## Lung CT``) unless --no-docs.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import statistics
import subprocess
import sys
import tempfile
from datetime import date
from pathlib import Path

from bench_lung_eval import INTRO, SECTION
from docs_section import cpu_model, replace_subsection

REFERENCE = Path(__file__).with_name("reference_lung_detector.py")
TITLE = "### Detector training against a plain MONAI loop (bench_lung_train.py)"


def deskpod_rate(a: argparse.Namespace, data: Path, runs: Path, tag: str) -> float:
    from deskpod.train.launcher import launch, prepare

    options = f"spacing={a.spacing},patch={a.patch},repeats=20,cache={runs / 'cache'}"
    overrides = {
        "task": "deskpod.lung.detect:luna16", "task_options": options, "model": a.model, "data": f"luna16:{data}",
        "devices": str(a.devices), "steps": a.steps + a.warmup, "batch_size": a.batch_size, "lr": 0.01,
        "precision": "fp32", "out": str(runs), "name": tag, "log_every_steps": 10, "checkpoint_every_minutes": 0.0,
        "max_restarts": 0, "warmup_epochs": 0.0,
    }  # fmt: skip
    plan = prepare(None, overrides, resume=False)
    summary = launch(plan, "quiet", timing_skip_steps=a.warmup)
    return float(summary["throughput_images_per_s"])


def reference_rate(a: argparse.Namespace, data: Path, runs: Path) -> float:
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={a.devices}",
           str(REFERENCE), "--data", str(data), "--spacing", a.spacing, "--patch", a.patch, "--model", a.model,
           "--cache", str(runs / "cache"), "--batch-size", str(a.batch_size), "--steps", str(a.steps + a.warmup),
           "--warmup", str(a.warmup)]  # fmt: skip
    threads = max(1, (os.cpu_count() or 1) // a.devices)
    env = {**os.environ, "OMP_NUM_THREADS": str(threads), "CUDA_VISIBLE_DEVICES": ""}
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=3600)
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("{")]
    if proc.returncode != 0 or not lines:
        raise SystemExit(f"the reference failed (exit {proc.returncode}): {proc.stderr.strip()[-2000:]}")
    return float(json.loads(lines[-1])["crops_per_s"])


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--steps", type=int, default=20, help="timed steps per run (default 20)")
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--devices", type=int, default=2)
    p.add_argument("--batch-size", type=int, default=2, help="crops per device (default 2)")
    p.add_argument("--model", default="retinanet3d-small")
    p.add_argument("--spacing", default="1.4x1.4x2.5")
    p.add_argument("--patch", default="64x64x32")
    p.add_argument("--scans", type=int, default=6)
    p.add_argument("--target", type=float, default=0.98)
    p.add_argument("--no-docs", action="store_true")
    a = p.parse_args()

    from deskpod.lung.phantom import write_phantom

    ours: list[float] = []
    ref: list[float] = []
    with tempfile.TemporaryDirectory() as tmp:
        data = write_phantom(Path(tmp) / "luna16", a.scans, seed=0, subsets=2, shape=(80, 192, 192))
        runs = Path(tmp) / "runs"
        for r in range(a.rounds):
            first, second = (deskpod_rate, reference_rate) if r % 2 == 0 else (reference_rate, deskpod_rate)
            for fn in (first, second):
                if fn is deskpod_rate:
                    ours.append(deskpod_rate(a, data, runs, f"round{r}"))
                else:
                    ref.append(reference_rate(a, data, runs))
            print(f"round {r + 1}: deskpod {ours[-1]:.2f} crops/s, reference {ref[-1]:.2f} crops/s "
                  f"({ours[-1] / ref[-1]:.3f}x)", file=sys.stderr)  # fmt: skip
    ratio = statistics.median(ours) / statistics.median(ref)
    met = ratio >= a.target
    cmd = ".venv/bin/python benchmarks/bench_lung_train.py " + shlex.join(sys.argv[1:])
    rows = "\n".join(
        f"| {i + 1} | {o:.2f} | {f:.2f} | {o / f:.3f}x |" for i, (o, f) in enumerate(zip(ours, ref, strict=True))
    )
    block = f"""{TITLE}

Command: `{cmd.strip()}`. Measured {date.today()} on {cpu_model()} ({os.cpu_count()} cores, CPU workers, fp32).
`{a.model}` (MONAI's RetinaNet construction), {a.devices} workers × {a.batch_size} crops of {a.patch} voxels at
{a.spacing} mm, {a.steps} timed steps after {a.warmup} warm-up steps, on {a.scans} phantom scans
(`deskpod lung phantom`; synthetic data, a speed figure only). deskpod: the launcher and trainer of
`deskpod lung train`; reference: `benchmarks/reference_lung_detector.py` under torchrun (the same network and
crops, DDP, SGD, nothing else). The runs alternate.

| round | deskpod crops/s | plain MONAI loop crops/s | ratio |
|---|---|---|---|
{rows}

Medians: deskpod {statistics.median(ours):.2f}, reference {statistics.median(ref):.2f} crops/s: **{ratio:.3f}x**
(target ≥ {a.target}: {"met" if met else "MISSED"}).
"""
    print(block)
    if not a.no_docs:
        replace_subsection(SECTION, TITLE, block, intro=INTRO)
    return 0 if met else 1


if __name__ == "__main__":
    raise SystemExit(main())
