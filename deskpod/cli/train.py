"""``deskpod train``: data-parallel training on every local accelerator with one command."""

from __future__ import annotations

import argparse
import sys
from typing import Any

EPILOG = """examples:
  deskpod train                                   Fashion-MNIST, small convnet, every device
  deskpod train --model resnet50 --data synthetic:3x224x224 --steps 100 --precision bf16
  deskpod train --data imagefolder:~/photos --model resnet18 --epochs 10
  deskpod train --resume --name my-run            continue a run from its latest checkpoint
  deskpod train --config run.toml --devices 0,1   any config key can be set in the TOML file
"""


def register(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    p = sub.add_parser(
        "train",
        help="train a network data-parallel on every local accelerator",
        description="Train a network data-parallel on every GPU of this box (NCCL), or on CPU workers (Gloo).",
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--config", metavar="FILE.toml", help="a TOML file of config keys (flags override it)")
    p.add_argument("--task", help="classify (default), or a task factory package.module:function")
    p.add_argument("--task-options", metavar="K=V,...", help="options of that task (it lists its keys)")
    p.add_argument("--model", help="convnet, mlp, alexnet, resnet18, resnet50, or package.module:factory")
    p.add_argument("--data", help="fashion-mnist, synthetic[:CxHxW], or imagefolder:PATH")
    p.add_argument("--batch-size", type=int, metavar="PER_DEVICE", help="samples per device per step (default 128)")
    p.add_argument("--compile", action="store_const", const=True, help="compile the model with torch.compile")
    p.add_argument("--lr", type=float, help="peak learning rate (default: linear scaling rule)")
    p.add_argument("--optimizer", help="sgd (default) or adamw")
    add_run_arguments(p, "passes over the training data (default 3)")
    p.set_defaults(func=run)


def add_run_arguments(p: argparse.ArgumentParser, epochs_help: str) -> None:
    """The flags of where and how a training runs, shared by ``deskpod train`` and the commands built on it
    (``deskpod lung train``): devices, length, precision, the run folder, resume, nodes, submit, output."""
    p.add_argument("--devices", help="all (default), a count N, or indices like 0,2,3")
    length = p.add_mutually_exclusive_group()
    length.add_argument("--epochs", type=int, help=epochs_help)
    length.add_argument("--steps", type=int, help="optimizer steps instead of epochs")
    p.add_argument("--precision", help="auto (default), fp32, bf16 or fp16")
    p.add_argument("--resume", action="store_true", help="continue the named (or latest) run from its last checkpoint")
    p.add_argument("--out", metavar="DIR", help="folder of run folders (default runs)")
    p.add_argument("--name", help="run name (default <model>-<data>-<date>-<time>)")
    p.add_argument("--seed", type=int, help="random seed (default 0)")
    p.add_argument(
        "--nodes",
        type=int,
        default=1,
        metavar="N",
        help="train on N nodes of the Slurm allocation this runs in (salloc/sbatch): one launcher per node",
    )
    p.add_argument("--submit", action="store_true", help="queue this training on the pod service (deskpod up) instead")
    out = p.add_mutually_exclusive_group()
    out.add_argument("--quiet", action="store_true", help="print only errors and the final summary")
    out.add_argument("--json", action="store_true", help="print JSON lines (one event each) for scripts")


FLAG_KEYS = ("task", "task_options", "model", "data", "devices", "epochs", "steps", "batch_size", "precision",
             "compile", "out", "name", "seed", "lr", "optimizer")  # fmt: skip


def overrides_from(args: argparse.Namespace) -> dict[str, Any]:
    return {k: getattr(args, k) for k in FLAG_KEYS if getattr(args, k, None) is not None}


def run(args: argparse.Namespace) -> int:
    from deskpod.train.launcher import exit_code, format_summary, launch, prepare
    from deskpod.train.progress import pick_mode

    if args.submit:
        return submit(args)

    once_per_node(args.nodes, args.argv)
    plan = prepare(args.config, overrides_from(args), resume=args.resume, nodes=args.nodes)
    mode = pick_mode(args.quiet, args.json)
    follower = plan.world is not None and plan.world.node_rank > 0
    summary = launch(plan, mode)  # one node speaks for the run: the first
    if args.quiet and not follower:
        print(format_summary(summary))
    return exit_code(plan, summary)


def once_per_node(nodes: int, argv: list[str]) -> None:
    """In an sbatch script or an salloc shell (not yet in a step), ``--nodes N`` means this same command once per
    node: replace this process with it under srun (``deskpod train``, ``deskpod run``)."""
    if nodes <= 1:
        return
    from deskpod.train.world import in_allocation, in_step, srun_argv

    if in_allocation() and not in_step():
        import os

        full = srun_argv(nodes, [sys.executable, "-m", "deskpod", *argv])
        os.execv(full[0], full)


def submit(args: argparse.Namespace) -> int:
    """``deskpod train --submit``: validate the config here, then queue it as a pod-service job."""
    from deskpod.errors import ConfigError
    from deskpod.jobs.client import submit_train
    from deskpod.train.config import build_config, read_config_file

    if args.resume:
        raise ConfigError("--resume does not go with --submit: the pod service resumes its train jobs itself")
    overrides = overrides_from(args)
    devices = overrides.pop("devices", "all")
    build_config(args.config, overrides)  # bad keys and values fail here, before anything is queued
    train = {**(read_config_file(args.config) if args.config else {}), **overrides}
    train.pop("devices", None)
    devices_value: int | str = int(devices) if str(devices).isascii() and str(devices).isdigit() else str(devices)
    job = submit_train(train, devices=devices_value, name=train.pop("name", None))
    print(f"submitted job {job}; follow it with: deskpod logs -f {job}")
    return 0
