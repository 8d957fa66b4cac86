"""How often a finished two-rank Gloo DDP script dies at interpreter exit, with and without deskpod's ending.

    .venv/bin/python benchmarks/gloo_teardown.py --trials 40

Each trial starts a plain two-process DDP script (no launcher: ``RANK``, ``WORLD_SIZE``, ``MASTER_ADDR``,
``MASTER_PORT`` set by hand; ``init_process_group("gloo")``, 60 steps of a linear model,
``destroy_process_group()``) and records each rank's exit status. The ``python`` ending lets the interpreter
finish as usual; the ``deskpod`` ending calls `deskpod.processes.exit_without_finalizing` (what the workers
of ``deskpod run`` and ``deskpod train`` do). The two alternate trial by trial. A trial fails when any rank
exits non-zero; PyTorch's teardown race shows as SIGABRT (-6) with "terminate called without an active
exception" on that rank's stderr (see `exit_without_finalizing`).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

from deskpod.environment.network import free_port

SCRIPT = """
import sys, torch, torch.distributed as dist
dist.init_process_group("gloo")
rank, world = dist.get_rank(), dist.get_world_size()
torch.manual_seed(0)
model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(4, 1))
opt = torch.optim.SGD(model.parameters(), lr=0.1)
w = torch.tensor([[1.0, -2.0, 3.0, 0.5]])
for step in range(60):
    x = torch.randn(32, 4, generator=torch.Generator().manual_seed(step * world + rank))
    loss = ((model(x) - x @ w.T) ** 2).mean()
    opt.zero_grad(); loss.backward(); opt.step()
dist.destroy_process_group()
if sys.argv[1] == "deskpod":
    from deskpod.processes import exit_without_finalizing
    exit_without_finalizing(0)
"""


def trial(script: Path, ending: str) -> list[int]:
    env = {**os.environ, "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(free_port()), "WORLD_SIZE": "2",
           "OMP_NUM_THREADS": "1"}  # fmt: skip
    procs = []
    for r in (0, 1):
        rank_env = {**env, "RANK": str(r), "LOCAL_RANK": str(r)}
        out = subprocess.DEVNULL
        procs.append(subprocess.Popen([sys.executable, str(script), ending], env=rank_env, stdout=out, stderr=out))
    return [p.wait(timeout=300) for p in procs]


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--trials", type=int, default=40, help="trials per ending (default 40)")
    p.add_argument("--out", type=Path, default=None, help="also write the results as JSON here")
    args = p.parse_args()
    results: dict[str, list[list[int]]] = {"python": [], "deskpod": []}  # each trial's exit statuses
    with tempfile.TemporaryDirectory() as tmp:
        script = Path(tmp) / "ddp.py"
        script.write_text(SCRIPT)
        for i in range(args.trials * 2):
            ending = ("python", "deskpod")[i % 2]
            results[ending].append(trial(script, ending))
    for ending, runs in results.items():
        failed = [codes for codes in runs if any(codes)]
        print(f"{ending:8s} ending: {len(failed)} of {len(runs)} trials had a rank exit non-zero {failed}")
    if args.out:
        args.out.write_text(json.dumps(results) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
