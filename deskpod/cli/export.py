"""``deskpod export RUN``: write a trained run's model into a model repository for ``deskpod serve``."""

from __future__ import annotations

import argparse
from pathlib import Path


def register(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    p = sub.add_parser("export", help="export a training run's model into a model repository")
    p.add_argument("run", type=Path, help="run folder, e.g. runs/t1")
    p.add_argument(
        "--format", default="onnx", choices=["onnx", "torch"], help="onnx (ONNX Runtime) or torch (TorchScript)"
    )
    p.add_argument("--repo", type=Path, default=Path("models"), help="model repository (default ./models)")
    p.add_argument("--name", default=None, help="model name in the repository (default: the run's folder name)")
    p.add_argument(
        "--max-batch-size", type=int, default=32, help="largest batch the dynamic batcher forms (default 32)"
    )
    p.add_argument(
        "--max-queue-delay-us", type=int, default=2000, help="longest wait for a batch to fill (default 2000)"
    )
    p.add_argument("--instances", type=int, default=1, help="model copies executing concurrently (default 1)")
    p.add_argument(
        "--image-input",
        action="store_true",
        help="serve a model that takes an encoded JPEG/PNG (BYTES input, one image per row); the server applies "
        "the run's evaluation transform (size, crop, channels) before the graph",
    )
    p.set_defaults(func=run, extra=("serve", p.prog))


def run(args: argparse.Namespace) -> int:
    from deskpod.errors import UsageError
    from deskpod.serve.export import ExportOptions, export_run

    if not args.run.is_dir():
        raise UsageError(f"run folder {args.run} does not exist")
    options = ExportOptions(
        repo=args.repo,
        name=args.name or args.run.resolve().name,
        format=args.format,
        max_batch_size=args.max_batch_size,
        max_queue_delay_us=args.max_queue_delay_us,
        instances=args.instances,
        image_input=args.image_input,
    )
    path = export_run(args.run, options)
    print(f"exported {args.run} -> {path} (serve it: deskpod serve {args.repo})")
    return 0
