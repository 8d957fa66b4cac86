"""``deskpod serve REPO``: serve a model repository over the KServe/Triton v2 protocol (HTTP)."""

from __future__ import annotations

import argparse
from pathlib import Path


def register(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    p = sub.add_parser("serve", help="serve a model repository over the v2 inference protocol (HTTP)")
    p.add_argument("repo", type=Path, help="model repository: one folder per model (see `deskpod export`)")
    p.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1)")
    p.add_argument("--port", type=int, default=8000, help="port (default 8000; 0 = any free port, printed)")
    p.add_argument("--models", default=None, help="comma-separated models to load at startup (default: all)")
    p.add_argument("--max-body-mb", type=int, default=64, help="largest request body accepted (default 64)")
    p.add_argument(
        "--loop", default="auto", choices=["auto", "uvloop", "asyncio"], help="event loop (auto: uvloop when installed)"
    )
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    import asyncio
    import logging

    from deskpod.errors import UsageError
    from deskpod.serve.repository import model_names
    from deskpod.serve.server import ServeConfig, serve

    logging.basicConfig(level=logging.INFO, format="deskpod serve: %(message)s")
    config = ServeConfig(
        repo=args.repo,
        host=args.host,
        port=args.port,
        models=None if args.models is None else tuple(m for m in args.models.split(",") if m),
        max_body_bytes=args.max_body_mb << 20,
    )
    model_names(config.repo)  # a missing repository is bad input: say so before binding
    if args.loop != "asyncio":
        try:
            import uvloop  # libuv's event loop: measured faster per request (docs/benchmarks.md)
        except ImportError:
            if args.loop == "uvloop":
                raise UsageError("--loop uvloop: uvloop is not installed (pip install uvloop)") from None
        else:
            uvloop.run(serve(config))
            return 0
    asyncio.run(serve(config))
    return 0


def register_bench(bench_sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    """``deskpod bench serve``: added to the ``bench`` group by deskpod/cli/bench.py."""
    p = bench_sub.add_parser("serve", help="load-test a v2 inference server: closed and open loop, p50/p90/p99")
    p.add_argument("--url", default="127.0.0.1:8000", help="server host:port (default 127.0.0.1:8000)")
    p.add_argument("--model", required=True, help="model to send requests to")
    p.add_argument("--batch", type=int, default=1, help="rows per request (default 1)")
    p.add_argument("--concurrency", default="1,8,32", help="closed-loop client counts, comma-separated ('' for none)")
    p.add_argument("--rate", default="", help="open-loop request rates per second, comma-separated")
    p.add_argument("--duration", type=float, default=5.0, help="measured seconds per level (default 5)")
    p.add_argument("--warmup", type=float, default=1.0, help="unmeasured seconds before each level (default 1)")
    p.add_argument("--json-data", action="store_true", help="send tensors as JSON instead of binary")
    p.add_argument("--json", action="store_true", help="print JSON instead of a table")
    p.set_defaults(func=run_bench)


def _numbers(text: str, what: str) -> list[float]:
    from deskpod.errors import UsageError

    try:
        return [float(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise UsageError(f"{what} {text!r} must be comma-separated numbers, e.g. 1,8,32") from None


def run_bench(args: argparse.Namespace) -> int:
    from deskpod.errors import UsageError
    from deskpod.serve.loadgen import LoadSpec, format_table, inputs_from_metadata, run_load, to_json

    host, _, port = args.url.rpartition(":")
    if not host or not port.isdigit():
        raise UsageError(f"--url {args.url!r} must be host:port, e.g. 127.0.0.1:8000")
    spec = LoadSpec(
        host=host,
        port=int(port),
        model=args.model,
        inputs=inputs_from_metadata(host, int(port), args.model, args.batch),
        binary=not args.json_data,
        duration_s=args.duration,
        warmup_s=args.warmup,
    )
    concurrencies = [int(c) for c in _numbers(args.concurrency, "--concurrency")]
    results = run_load(spec, concurrencies, _numbers(args.rate, "--rate"))
    print(to_json(results) if args.json else format_table(results))
    return 0
