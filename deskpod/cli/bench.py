"""``deskpod bench``: measure this box. Subcommands: ``train``, ``serve``, ``comm``."""

from __future__ import annotations

import argparse


def register(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    p = sub.add_parser("bench", help="measure this box (training throughput, …)")
    bench = p.add_subparsers(dest="bench_command", metavar="WHAT", required=True)
    register_train(bench)
    # `deskpod bench serve` (inference serving): its parser and handler live in deskpod/cli/serve.py.
    from deskpod.cli.serve import register_bench as register_serve

    register_serve(bench)
    # `deskpod bench comm` (collectives): its parser and handler live in deskpod/cli/comm.py.
    from deskpod.cli.comm import register_bench as register_comm

    register_comm(bench)


def register_train(bench: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    p = bench.add_parser("train", help="training throughput on 1..N devices, against a plain DDP reference")
    p.add_argument("--model", default="resnet18")
    p.add_argument(
        "--data", default="synthetic:3x64x64", help="input shape as synthetic:CxHxW (default synthetic:3x64x64)"
    )
    p.add_argument("--batch-size", type=int, default=32, metavar="PER_DEVICE")
    p.add_argument("--steps", type=int, default=30, help="timed steps per measurement")
    p.add_argument("--warmup", type=int, default=5, help="untimed steps before timing")
    p.add_argument("--devices", default="all", help="largest device set; measured at 1, 2, 4, … up to it")
    p.add_argument("--precision", default="auto")
    p.add_argument("--repeats", type=int, default=1, help="alternate deskpod and the reference this many times")
    p.add_argument("--no-reference", action="store_true", help="skip the plain torchrun + DDP reference")
    p.add_argument("--json", action="store_true", help="print only JSON")
    p.set_defaults(func=run_train)


def run_train(args: argparse.Namespace) -> int:
    from deskpod.cli.comm import print_result
    from deskpod.train.bench import BenchRequest, format_table, run_bench

    req = BenchRequest(
        model=args.model, data=args.data, batch_size=args.batch_size, steps=args.steps, warmup=args.warmup,
        devices=args.devices, precision=args.precision, repeats=args.repeats, reference=not args.no_reference,
    )  # fmt: skip
    result = run_bench(req, log=None if args.json else print)
    print_result(result, format_table, args.json)
    return 0
