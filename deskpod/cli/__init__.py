"""The ``deskpod`` command: thin functions over the library.

Each subcommand lives in its own module here and exposes ``register(subparsers)``; the handler it
sets parses nothing itself beyond argparse, builds a config, calls one library function and prints.
Errors are caught once, below: a `DeskpodError` becomes one line on stderr and exit code 2 (bad
input) or 1 (failure). A command of an extra (``deskpod lung``, ``deskpod serve``) sets ``extra=(NAME, PROG)``
among its parser's defaults; without that extra installed it stops there, saying what to install.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Sequence

from deskpod import __version__
from deskpod.errors import DeskpodError, WorkerError, require_extra

# Modules that add subcommands, in the order `deskpod --help` lists them.
COMMAND_MODULES = (
    "deskpod.cli.train",
    "deskpod.cli.run",
    "deskpod.cli.bench",
    "deskpod.cli.devices",
    "deskpod.cli.export",
    "deskpod.cli.serve",
    "deskpod.cli.pod",
    "deskpod.cli.session",
    "deskpod.cli.shell",
    "deskpod.cli.fleet",
    "deskpod.cli.topo",
    "deskpod.cli.doctor",
    "deskpod.cli.plan",
    "deskpod.cli.cluster",
    "deskpod.cli.env",
    "deskpod.cli.lung",
    "deskpod.cli.video",
)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="deskpod",
        description="Every accelerator of this box for deep learning, with nothing to set up.",
    )
    parser.add_argument("--version", action="version", version=f"deskpod {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for name in COMMAND_MODULES:
        importlib.import_module(name).register(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    args.argv = list(sys.argv[1:] if argv is None else argv)  # what was asked, for commands that re-run it (srun)
    try:
        if getattr(args, "extra", None):
            require_extra(*args.extra)
        return int(args.func(args) or 0)
    except DeskpodError as e:
        print(f"deskpod: {e}", file=sys.stderr)
        if isinstance(e, WorkerError) and e.root_cause:
            print("root cause (the first worker to fail):", file=sys.stderr)
            print(e.root_cause.rstrip(), file=sys.stderr)
        return e.exit_code
    except KeyboardInterrupt:
        print("deskpod: interrupted", file=sys.stderr)
        return 130
