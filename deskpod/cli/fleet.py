"""``deskpod fleet``: many pods run as one (deskpod/fleet/); its stacks are `deskpod.cli.stack`'s."""

from __future__ import annotations

import argparse

from deskpod.cli.stack import register_stack


def register(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    p = sub.add_parser("fleet", help="many pods as one: stacks")
    fleet = p.add_subparsers(dest="fleet_command", metavar="WHAT")
    fleet.required = True
    register_stack(fleet)
