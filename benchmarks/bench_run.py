"""``deskpod run`` against ``torchrun`` on the same script: time to the first step and throughput.

    .venv/bin/python benchmarks/bench_run.py --rounds 5            # print, and update docs/benchmarks.md
    .venv/bin/python benchmarks/bench_run.py --rounds 3 --no-docs  # print only

One DDP script (torchvision ResNet-18 on random 3x64x64 images, Gloo, written the way PyTorch's
examples are for torchrun: the env vars, ``init_process_group()`` without arguments) is started on
2 workers by ``python -m torch.distributed.run --standalone --nproc_per_node 2`` and by
``deskpod run --devices 2``, alternating which goes first each round. Rank 0 reports the wall clock
at the end of its first optimizer step and its images/s over the steps after ``--warmup``. Time to
first step is from just before the launcher process is spawned. Both give each worker 1 intra-op
thread (torchrun sets ``OMP_NUM_THREADS=1`` for several workers; deskpod splits the cores). Targets:
deskpod/torchrun <= 1.05x time to first step, >= 0.99x throughput, each judged on the median over rounds
of the round's own ratio (the two runs of a round are back to back; this box drifts by more than the
margins within minutes).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from docs_section import cpu_model, replace_subsection

ROOT = Path(__file__).resolve().parents[1]
SECTION = "## Your own script (`deskpod run`)"
SUBSECTION = "### Launch overhead and throughput against torchrun (bench_run.py)"
SCRIPT = """
import json, os, sys, time
import torch, torch.distributed as dist, torchvision

steps, warmup, batch = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])
dist.init_process_group("gloo")
torch.manual_seed(0)
model = torch.nn.parallel.DistributedDataParallel(torchvision.models.resnet18(num_classes=10))
opt = torch.optim.SGD(model.parameters(), lr=0.01)
x, y = torch.randn(batch, 3, 64, 64), torch.randint(0, 10, (batch,))
first = t0 = None
for step in range(steps):
    if step == warmup:
        t0 = time.perf_counter()
    loss = torch.nn.functional.cross_entropy(model(x), y)
    opt.zero_grad(); loss.backward(); opt.step()
    if first is None:
        first = time.time()
rate = batch * dist.get_world_size() * (steps - warmup) / (time.perf_counter() - t0)
if dist.get_rank() == 0:
    print(json.dumps({"first_step_at": first, "images_per_s": rate}), flush=True)
dist.destroy_process_group()
"""


def one(launcher: str, script: Path, args: list[str], workdir: Path) -> dict[str, float]:
    env = {k: v for k, v in os.environ.items() if k not in ("OMP_NUM_THREADS", "CUDA_VISIBLE_DEVICES")}
    env["CUDA_VISIBLE_DEVICES"] = ""
    if launcher == "torchrun":
        cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2", str(script)]
    else:
        cmd = [sys.executable, "-m", "deskpod", "run", "--devices", "2", "--out", str(workdir / "runs"), str(script)]
    start = time.time()
    proc = subprocess.run([*cmd, *args], capture_output=True, text=True, env=env, cwd=workdir, timeout=900)
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("{")]
    if proc.returncode != 0 or not lines:
        raise SystemExit(f"{launcher} failed (exit {proc.returncode}): {proc.stderr[-2000:]}")
    got = json.loads(lines[-1])
    return {"first_step_s": got["first_step_at"] - start, "images_per_s": got["images_per_s"]}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--no-docs", action="store_true")
    a = ap.parse_args()
    samples: dict[str, list[dict[str, float]]] = {"torchrun": [], "deskpod run": []}
    with tempfile.TemporaryDirectory(prefix="bench-run-") as tmp:
        script = Path(tmp) / "resnet_ddp.py"
        script.write_text(SCRIPT)
        args = [str(a.steps), str(a.warmup), str(a.batch)]
        for r in range(a.rounds):
            order = ["torchrun", "deskpod run"] if r % 2 == 0 else ["deskpod run", "torchrun"]
            for launcher in order:
                samples[launcher].append(one(launcher, script, args, Path(tmp)))
                s = samples[launcher][-1]
                print(f"round {r + 1}/{a.rounds} {launcher}: first step after {s['first_step_s']:.2f} s, "
                      f"{s['images_per_s']:.1f} img/s", file=sys.stderr)  # fmt: skip
    med = {k: {m: statistics.median(s[m] for s in v) for m in ("first_step_s", "images_per_s")}
           for k, v in samples.items()}  # fmt: skip
    # The box drifts by more than the margins within minutes: each round's pair (run back to back) is one
    # ratio, and the target is judged on the median of those paired ratios.
    pairs = list(zip(samples["deskpod run"], samples["torchrun"], strict=True))
    first_ratio = statistics.median(d["first_step_s"] / t["first_step_s"] for d, t in pairs)
    rate_ratio = statistics.median(d["images_per_s"] / t["images_per_s"] for d, t in pairs)
    cmd = f".venv/bin/python benchmarks/bench_run.py --rounds {a.rounds}"
    rows = [
        "| launcher | time to first step, median s | runs (s) | images/s, median | runs |",
        "|---|---|---|---|---|",
    ]
    for k, v in samples.items():
        firsts = ", ".join(f"{s['first_step_s']:.2f}" for s in v)
        rates = ", ".join(f"{s['images_per_s']:.1f}" for s in v)
        rows.append(f"| {k} | {med[k]['first_step_s']:.2f} | {firsts} | {med[k]['images_per_s']:.1f} | {rates} |")
    paired = ", ".join(f"{d['images_per_s'] / t['images_per_s']:.3f}" for d, t in pairs)
    verdict = (
        f"Paired throughput ratios, round by round: {paired}.\n\n"
        f"deskpod run / torchrun, median of the paired ratios: time to first step {first_ratio:.3f}x (target <= 1.05x: "
        f"{'met' if first_ratio <= 1.05 else 'NOT met'}), throughput {rate_ratio:.3f}x (target >= 0.99x: "
        f"{'met' if rate_ratio >= 0.99 else 'NOT met'})."
    )
    body = "\n".join([
        SUBSECTION, "",
        f"Command: `{cmd}` ({time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, {cpu_model()}, "
        f"{os.cpu_count()} cores, CPU workers). The same ResNet-18 DDP script (batch {a.batch} per worker, "
        f"{a.steps} steps, images/s after {a.warmup}) on 2 workers, the launchers alternating first.", "",
        *rows, "", verdict,
    ])  # fmt: skip
    print(body)
    if not a.no_docs:
        replace_subsection(SECTION, SUBSECTION, body)
    return 0


if __name__ == "__main__":
    sys.exit(main())
