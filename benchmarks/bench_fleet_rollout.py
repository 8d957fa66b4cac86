"""A stack rolled out to 3 members beside building the same environment on each box by hand with uv.

    .venv/bin/python benchmarks/bench_fleet_rollout.py               # 1 round; table + JSON
    .venv/bin/python benchmarks/bench_fleet_rollout.py --rounds 3

Runs as root (members run their jobs sandboxed, as in production). Each round, in the same run:

- **Rollout.** Three real root pods (``deskpod up`` through `tests.jobs.pods.Pods` with ``sandbox=True``), each with
  its own home and its own environment cache (as three boxes have), a stack ``torch==2.13.0`` for Python 3.11
  published to a `StackStore` (resolved first), and `roll_out` over the three (`PodLink`: the member's admin token):
  on each member in turn the smoke job builds the environment (cold: a fresh cache) and runs import, matmul and a
  gloo all-reduce over 2 CPU slots through ``torch.distributed.run``. Time: the rollout's wall time, and each
  member's (submit to end). Correct only if every member passed.
- **By hand.** The same requirements on each of three boxes, one after the other, as an admin would: ``uv venv
  --python 3.11`` and ``uv pip install -r requirements.txt`` with a fresh uv cache per box and the box's package
  sources (pip's configuration, `deskpod.envs.index`), then ``python -c "import torch"`` in it. Time: the three
  together. Correct only if each imports torch 2.13.0.

The ratio rollout / by hand is what the fleet's one command costs over doing it by hand (which checks neither the
matmul nor the all-reduce, and leaves nothing recorded). The packages come from this box's wheel folder and local
indexes (offline). The machine has 2 cores shared with other work: medians over ``--rounds``.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from deskpod.envs.cache import find_uv
from deskpod.envs.index import package_sources
from deskpod.fleet.rollout import PodLink, roll_out
from deskpod.fleet.stacks import StackStore, stack_definition
from tests.jobs.pods import Pods

REQUIREMENTS = "torch==2.13.0\n"
PYTHON = "3.11"
MEMBERS = 3


def rollout_round(root: Path) -> dict[str, object]:
    (root / "pods").mkdir()
    pods = Pods(root / "pods")
    try:
        members = [pods("--machine", "dgx1-v100", sandbox=True) for _ in range(MEMBERS)]
        store = StackStore(root / "stacks.db")
        defn = stack_definition({"requirements": {"file": "requirements.txt", "text": REQUIREMENTS}}, PYTHON)
        store.publish("pytorch", defn, by="bench", cache_dir=root / "uv-fleet")
        links = [PodLink(f"box-{i}", m.client()) for i, m in enumerate(members)]
        t0 = time.perf_counter()
        done = roll_out(store, "pytorch", links, timeout_s=900)
        wall = time.perf_counter() - t0
        store.close()
        if done.state != "passed":
            raise SystemExit(f"rollout failed: {done.message}\n{done.results[-1].log_tail if done.results else ''}")
        return {"seconds": wall, "members": [round(r.seconds, 2) for r in done.results],
                "reasons": [r.reason for r in done.results]}  # fmt: skip
    finally:
        pods.stop_all()


def by_hand_round(root: Path) -> dict[str, object]:
    uv = find_uv()
    assert uv is not None
    (root / "requirements.txt").write_text(REQUIREMENTS)
    env = {**os.environ, **package_sources().uv_environment(), "UV_PYTHON_DOWNLOADS": "never"}
    times = []
    t0 = time.perf_counter()
    for i in range(MEMBERS):
        box = root / f"box-{i}"
        box.mkdir()
        start = time.perf_counter()
        e = {**env, "UV_CACHE_DIR": str(box / "uv-cache")}
        subprocess.run([uv, "venv", "-q", "--python", PYTHON, str(box / "env")], env=e, check=True)
        subprocess.run([uv, "pip", "install", "-q", "--python", str(box / "env/bin/python"), "-r",
                        str(root / "requirements.txt")], env=e, check=True)  # fmt: skip
        got = subprocess.run([str(box / "env/bin/python"), "-c", "import torch; print(torch.__version__)"],
                             capture_output=True, text=True, check=True).stdout.strip()  # fmt: skip
        if not got.startswith("2.13.0"):
            raise SystemExit(f"by hand: box-{i} has torch {got!r}, not 2.13.0")
        times.append(time.perf_counter() - start)
    return {"seconds": time.perf_counter() - t0, "members": [round(t, 2) for t in times]}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=1)
    args = parser.parse_args()
    if os.geteuid() != 0:
        raise SystemExit("run as root: members build environments as their jobs' accounts, sandboxed")
    rounds = []
    for n in range(args.rounds):
        with tempfile.TemporaryDirectory(prefix="bench-rollout-") as tmp:
            root = Path(tmp)
            # the order swaps every round, so that neither always runs on a cold page cache
            first, second = (rollout_round, by_hand_round) if n % 2 == 0 else (by_hand_round, rollout_round)
            (root / "a").mkdir()
            (root / "b").mkdir()
            got = {first.__name__: first(root / "a"), second.__name__: second(root / "b")}
            shutil.rmtree(root, ignore_errors=True)
        rollout, hand = got["rollout_round"], got["by_hand_round"]
        rounds.append({"rollout": rollout, "by_hand": hand,
                       "ratio": float(rollout["seconds"]) / float(hand["seconds"])})  # type: ignore[arg-type]  # fmt: skip
    med = {k: statistics.median(float(r[k]["seconds"]) for r in rounds) for k in ("rollout", "by_hand")}  # type: ignore[index]
    ratio = statistics.median(float(r["ratio"]) for r in rounds)  # type: ignore[arg-type]
    print(f"{'what':<36} {'seconds (median)':>18}")
    print(f"{'rollout to 3 members (build+smoke)':<36} {med['rollout']:>18.1f}")
    print(f"{'by hand on 3 boxes (uv venv+install)':<36} {med['by_hand']:>18.1f}")
    print(f"{'rollout / by hand':<36} {ratio:>18.2f}")
    print(json.dumps({"rounds": rounds, "median": med, "ratio": ratio}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
