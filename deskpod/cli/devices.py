"""``deskpod devices``: list the local accelerators deskpod would train on."""

from __future__ import annotations

import argparse
import json


def register(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    p = sub.add_parser("devices", help="list this machine's accelerators (or CPU worker slots)")
    p.add_argument("--json", action="store_true", help="print JSON instead of a table")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from deskpod.hardware.devices import discover, iter_describe

    inv = discover()
    if args.json:
        print(
            json.dumps(
                {
                    "kind": inv.kind,
                    "source": inv.source,
                    "cores": inv.cores,
                    "devices": [
                        {
                            "index": d.index,
                            "kind": d.kind,
                            "name": d.name,
                            "memory_bytes": d.memory_bytes,
                            "uuid": d.uuid,
                            "threads": d.threads,
                        }
                        for d in inv.devices
                    ],
                },
                indent=2,
            )
        )
        return 0
    what = "GPUs" if inv.kind == "cuda" else f"CPU worker slots on {inv.cores} cores (no GPU found)"
    print(f"{len(inv.devices)} {what}, from {inv.source}:")
    for line in iter_describe(inv.devices):
        print("  " + line)
    return 0
