"""``deskpod bench comm``: collectives over ``torch.distributed`` (nccl-tests style); added to ``bench`` by bench.py."""

from __future__ import annotations

import argparse
import json
from collections.abc import Callable
from typing import Any


def register_bench(bench_sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    p = bench_sub.add_parser(
        "comm", help="collective bandwidth (all-reduce, all-gather, …) over NCCL or Gloo, nccl-tests style"
    )
    p.add_argument("--collectives", default="all", help="comma list (all_reduce, all_gather, reduce_scatter, "
                   "broadcast, all_to_all) or all")  # fmt: skip
    p.add_argument("--min-bytes", default="8", help="smallest message, e.g. 8, 64K (default 8)")
    p.add_argument("--max-bytes", default="4M", help="largest message, up to 1G (default 4M)")
    p.add_argument("--step-factor", type=int, default=2, help="multiply the size by this each step (default 2)")
    p.add_argument("--iters", type=int, default=20, help="timed iterations per size (default 20)")
    p.add_argument("--warmup", type=int, default=5, help="untimed iterations per size (default 5)")
    p.add_argument("--devices", type=int, default=0, help="ranks (default: every GPU, or 2 CPU workers)")
    p.add_argument("--backend", default="auto", choices=["auto", "gloo", "nccl"])
    p.add_argument("--dtype", default="float32", choices=["float32", "bfloat16", "float16"])
    p.add_argument("--threads", type=int, default=0, help="threads per CPU worker (default: cores / ranks)")
    p.add_argument("--json", action="store_true", help="print only JSON")
    p.set_defaults(func=run_bench_comm)


def run_bench_comm(args: argparse.Namespace) -> int:
    from deskpod.comm.bench import CommBenchConfig, format_table, run_comm_bench
    from deskpod.comm.collectives import parse_collectives
    from deskpod.environment.sizes import parse_size
    from deskpod.errors import RunError

    config = CommBenchConfig(
        collectives=parse_collectives(args.collectives), min_bytes=parse_size(args.min_bytes, "--min-bytes"),
        max_bytes=parse_size(args.max_bytes, "--max-bytes"), step_factor=args.step_factor, iters=args.iters,
        warmup=args.warmup, devices=args.devices, backend=args.backend, dtype=args.dtype, threads=args.threads,
    )  # fmt: skip
    result = run_comm_bench(config, log=None if args.json else print)
    print_result(result, format_table, args.json)
    if result["wrong"]:
        raise RunError(f"{result['wrong']} wrong elements: the collectives returned bad results (see #wrong)")
    return 0


def print_result(result: dict[str, Any], table: Callable[[dict[str, Any]], str], as_json: bool) -> None:
    """A benchmark's result (``deskpod bench comm``, ``bench train``): the JSON alone with ``--json``, else the
    table and then the JSON on one line."""
    if as_json:
        print(json.dumps(result, indent=2))
    else:
        print(table(result))
        print(json.dumps(result))
