"""``deskpod serve REPO``: serve a model repository over the KServe/Triton v2 protocol (HTTP, and gRPC with
``--grpc-port P``).

``--export RUN`` first exports a training run's latest checkpoint into REPO (as a new version of model
``--name``), unless the model's latest version already came from that very checkpoint file
(`deskpod.jobs.kinds.serve.export_if_new`), so a restarted serve job does not export again. ``--port-file PATH``
writes where the server listens, atomically, once it listens and again when its models are loaded (``"ready": true``); the pod's ``[serve]`` jobs use both::

    deskpod serve JOB/models --export RUN --name my-run --port 0 --port-file JOB/serve.json
"""

from __future__ import annotations

import argparse
from collections.abc import Coroutine
from pathlib import Path
from typing import Any


def register(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    from deskpod.jobs.kinds.serve import FORMATS

    p = sub.add_parser("serve", help="serve a model repository over the v2 inference protocol (HTTP, gRPC)")
    p.add_argument("repo", type=Path, help="model repository: one folder per model (see `deskpod export`)")
    p.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1)")
    p.add_argument("--port", type=int, default=8000, help="port (default 8000; 0 = any free port, printed)")
    p.add_argument(
        "--grpc-port", type=int, default=None, metavar="P",
        help="also serve the v2 gRPC service on port P (0 = any free port, printed; default: HTTP only)",
    )  # fmt: skip
    p.add_argument("--models", default=None, help="comma-separated models to load at startup (default: all)")
    p.add_argument("--max-body-mb", type=int, default=64, help="largest request body accepted (default 64)")
    p.add_argument(
        "--loop", default="auto", choices=["auto", "uvloop", "asyncio"], help="event loop (auto: uvloop when installed)"
    )
    p.add_argument(
        "--port-file", type=Path, default=None, metavar="PATH",
        help='write {"url", "pid", "models", "ready"} (and "grpc") to PATH (atomically) once listening, and again when ready',
    )  # fmt: skip
    g = p.add_argument_group("export a run first (--export RUN; the other options only with it)")
    g.add_argument(
        "--export", type=Path, default=None, metavar="RUN",
        help="export RUN's latest checkpoint into REPO before serving (skipped if its latest version came from it)",
    )  # fmt: skip
    g.add_argument("--name", default=None, help="model name in REPO (default: the run's folder name)")
    g.add_argument("--format", default=None, choices=FORMATS, help="onnx (default) or torch")
    g.add_argument("--max-batch-size", type=int, default=None, help="largest batch the batcher forms (default 32)")
    g.add_argument("--max-queue-delay-us", type=int, default=None, help="longest wait for a batch (default 2000)")
    g.add_argument("--instances", type=int, default=None, help="model copies executing concurrently (default 1)")
    g.add_argument(
        "--image-input", action="store_true",
        help="the model takes encoded JPEG/PNG and the server applies RUN's evaluation transform (see deskpod export)",
    )  # fmt: skip
    p.set_defaults(func=run, extra=("serve", p.prog))


def run(args: argparse.Namespace) -> int:
    import asyncio
    import logging

    from deskpod.errors import UsageError
    from deskpod.jobs.kinds.serve import export_if_new
    from deskpod.serve.repository import model_names
    from deskpod.serve.server import Listener, ServeConfig, serve

    logging.basicConfig(level=logging.INFO, format="deskpod serve: %(message)s")
    config = ServeConfig(
        repo=args.repo,
        host=args.host,
        port=args.port,
        models=None if args.models is None else tuple(m for m in args.models.split(",") if m),
        max_body_bytes=args.max_body_mb << 20,
        port_file=args.port_file,
    )
    if args.port_file is not None:
        args.port_file.unlink(missing_ok=True)  # a previous attempt's file must not say "ready" for this one
    if args.export is not None:
        version, exported = export_if_new(args.export, export_options(args))
        what = "exported" if exported else "already exported (same checkpoint)"
        print(f"deskpod serve: {args.export} {what}: {version}", flush=True)
    else:
        given = [f for f in ("name", "format", "max_batch_size", "max_queue_delay_us", "instances")
                 if getattr(args, f) is not None] + (["image_input"] if args.image_input else [])  # fmt: skip
        if given:
            raise UsageError(f"--{given[0].replace('_', '-')} goes with --export RUN (it sets how RUN is exported)")
    model_names(config.repo)  # a missing repository is bad input: say so before binding
    listeners: list[Listener] = []
    if args.grpc_port is not None:
        try:  # grpcio and the protocol's compiled protos (tritonclient[grpc]): only when asked for
            from deskpod.serve.grpc_server import GrpcListener
        except ImportError as e:
            raise UsageError(
                f"--grpc-port needs grpcio and tritonclient[grpc] ({e}); pip install 'tritonclient[grpc]'"
            ) from None
        listeners.append(GrpcListener(args.host, args.grpc_port, config.max_body_bytes))

    def main() -> Coroutine[Any, Any, int]:  # HTTP alone: serve(config), the call it has always been
        return serve(config, listeners=listeners) if listeners else serve(config)

    if args.loop != "asyncio":
        try:
            import uvloop  # libuv's event loop: measured faster per request (docs/benchmarks.md)
        except ImportError:
            if args.loop == "uvloop":
                raise UsageError("--loop uvloop: uvloop is not installed (pip install uvloop)") from None
        else:
            return 128 + uvloop.run(main())
    # stopped by a signal: 143 for SIGTERM, like a stopped training
    return 128 + asyncio.run(main())


def export_options(args: argparse.Namespace) -> Any:
    """The `ExportOptions` of ``--export``: flags, else a serve job's defaults; a bad name is refused here."""
    from deskpod.environment import Environment
    from deskpod.errors import UsageError
    from deskpod.jobs.kinds.serve import FORMATS, LIMITS, model_name
    from deskpod.serve.export import ExportOptions
    from deskpod.train.runs import NAME_HELP, NAME_RE

    run_dir: Path = args.export
    name = model_name(run_dir.resolve()) if args.name is None else args.name
    if not NAME_RE.match(name or ""):
        raise UsageError(f"--name {name!r}: use {NAME_HELP}")
    numbers = {}
    for key, (default, low, _) in LIMITS.items():
        value = default if getattr(args, key) is None else int(getattr(args, key))
        if value < low:
            raise UsageError(f"--{key.replace('_', '-')} {value}: must be at least {low}")
        numbers[key] = value
    slots = Environment.read().cpu_slots  # a pod job on CPU slots: as many threads as slots it holds
    return ExportOptions(
        repo=args.repo, name=name, format=args.format or FORMATS[0], threads=len(slots) if slots else 0,
        max_batch_size=numbers["max_batch_size"], max_queue_delay_us=numbers["max_queue_delay_us"],
        instances=numbers["instances"], image_input=args.image_input,
    )  # fmt: skip


def register_bench(bench_sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    """``deskpod bench serve``: added to the ``bench`` group by deskpod/cli/bench.py."""
    p = bench_sub.add_parser("serve", help="load-test a v2 inference server: closed and open loop, p50/p90/p99")
    p.add_argument("--url", default=None, help="server host:port (default 127.0.0.1:8000; over gRPC 127.0.0.1:8001)")
    p.add_argument(
        "--protocol",
        default="http",
        choices=["http", "grpc", "grpc-stream"],
        help="v2 over HTTP (default), gRPC (unary ModelInfer calls) or grpc-stream (one ModelStreamInfer stream per client)",
    )
    p.add_argument("--model", required=True, help="model to send requests to")
    p.add_argument("--batch", type=int, default=1, help="rows per request (default 1)")
    p.add_argument("--concurrency", default="1,8,32", help="closed-loop client counts, comma-separated ('' for none)")
    p.add_argument("--rate", default="", help="open-loop request rates per second, comma-separated")
    p.add_argument("--duration", type=float, default=5.0, help="measured seconds per level (default 5)")
    p.add_argument("--warmup", type=float, default=1.0, help="unmeasured seconds before each level (default 1)")
    p.add_argument(
        "--json-data", action="store_true", help="send tensors as JSON (gRPC: typed contents) instead of binary"
    )
    p.add_argument("--json", action="store_true", help="print JSON instead of a table")
    p.set_defaults(func=run_bench, extra=("serve", p.prog))


def _numbers(text: str, what: str) -> list[float]:
    from deskpod.errors import UsageError

    try:
        return [float(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise UsageError(f"{what} {text!r} must be comma-separated numbers, e.g. 1,8,32") from None


def run_bench(args: argparse.Namespace) -> int:
    from deskpod.errors import UsageError
    from deskpod.serve.loadgen import LoadSpec, format_table, inputs_from_metadata, run_load, to_json

    url = args.url or ("127.0.0.1:8000" if args.protocol == "http" else "127.0.0.1:8001")
    host, _, port = url.rpartition(":")
    if not host or not (port.isascii() and port.isdigit()):
        raise UsageError(f"--url {url!r} must be host:port, e.g. 127.0.0.1:8000")
    spec = LoadSpec(
        host=host,
        port=int(port),
        protocol=args.protocol,
        model=args.model,
        inputs=inputs_from_metadata(host, int(port), args.model, args.batch, protocol=args.protocol),
        binary=not args.json_data,
        duration_s=args.duration,
        warmup_s=args.warmup,
    )
    concurrencies = [int(c) for c in _numbers(args.concurrency, "--concurrency")]
    results = run_load(spec, concurrencies, _numbers(args.rate, "--rate"))
    print(to_json(results) if args.json else format_table(results))
    return 0
