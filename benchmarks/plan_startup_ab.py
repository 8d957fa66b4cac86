"""Does a change slow ``deskpod plan predict``? The whole process, this tree against another, interleaved.

    .venv/bin/python benchmarks/plan_startup_ab.py              # against `git archive HEAD deskpod`
    .venv/bin/python benchmarks/plan_startup_ab.py --runs 20

bench_plan.py times the whole process against its 100 ms target; on a shared box that figure moves
with the load more than with the code. This runs the same command (``deskpod plan predict --machine
dgx1-v100 --nodes 1000 --precision fp16 --json``) on this working tree and on another copy of the
package (default: the last commit, extracted with ``git archive``), alternating, so both see the same
load; it prints each side's median and their ratio. Each run is a fresh interpreter that imports
``deskpod`` from the given tree (the editable-install finder is removed so that the path decides).
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from ab_tree import ROOT, cli, tree_at

ARGV = ["plan", "predict", "--machine", "dgx1-v100", "--nodes", "1000", "--precision", "fp16", "--json"]


def run_once(tree: Path) -> float:
    start = time.perf_counter()
    subprocess.run([*cli(tree), *ARGV], check=True, capture_output=True)
    return (time.perf_counter() - start) * 1e3


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--runs", type=int, default=15)
    ap.add_argument("--other", default=None, help="a folder holding another deskpod/ (default: git archive HEAD)")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        other = Path(args.other) if args.other else tree_at("HEAD", Path(tmp))
        times: dict[str, list[float]] = {"this tree": [], "other": []}
        for _ in range(args.runs):
            times["this tree"].append(run_once(ROOT))
            times["other"].append(run_once(other))
    here, there = statistics.median(times["this tree"]), statistics.median(times["other"])
    print(f"deskpod {' '.join(ARGV)}: {args.runs} runs each, interleaved")
    print(f"  this tree: median {here:.0f} ms; other ({args.other or 'git archive HEAD'}): median {there:.0f} ms; "
          f"ratio {here / there:.3f}")  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
