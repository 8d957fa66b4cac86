"""Training throughput, deskpod against the plain DDP reference, written up as Markdown.

    .venv/bin/python benchmarks/bench_train.py --model resnet18 --data synthetic:3x64x64 --batch-size 32 \
        --steps 30 --warmup 5 --repeats 3

Runs `deskpod bench train` (deskpod's launcher and loop, then `benchmarks/ddp_reference.py` under
torchrun, alternating, same model/shape/batch/devices) and prints a Markdown block — the table, the
exact command, the date and the machine — for docs/benchmarks.md. Exit code 1 when deskpod is
below --target × the reference on any device count.
"""

from __future__ import annotations

import argparse
import platform
import shlex
import sys
from datetime import date

from deskpod.train.bench import BenchRequest, format_table, run_bench


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--model", default="resnet18")
    p.add_argument("--data", default="synthetic:3x64x64")
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--steps", type=int, default=30)
    p.add_argument("--warmup", type=int, default=5)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--devices", default="all")
    p.add_argument("--precision", default="auto")
    p.add_argument("--target", type=float, default=0.98)
    a = p.parse_args()
    req = BenchRequest(model=a.model, data=a.data, batch_size=a.batch_size, steps=a.steps, warmup=a.warmup,
                       devices=a.devices, precision=a.precision, repeats=a.repeats)  # fmt: skip
    result = run_bench(req, log=lambda m: print(m, file=sys.stderr))
    cmd = "python benchmarks/bench_train.py " + shlex.join(sys.argv[1:])
    print(f"Measured {date.today()} on {platform.machine()} ({result['cores']} cores, {result['device_kind']}):\n")
    print(f"`{cmd}`\n")
    print("```")
    print(format_table(result))
    print("```")
    for r in result["rows"]:
        samples = ", ".join(f"{x:,.1f}" for x in r["samples"])
        refs = ", ".join(f"{x:,.1f}" for x in r["reference_samples"])
        print(f"- {r['devices']} device(s): deskpod runs {samples} img/s; reference runs {refs} img/s")
    worst = min((r["vs_reference"] for r in result["rows"] if r["vs_reference"]), default=None)
    return 0 if worst is None or worst >= a.target else 1


if __name__ == "__main__":
    raise SystemExit(main())
