"""``deskpod doctor``: check this box's devices — matmul, memory copy, all-reduce, peer bandwidth.

Exit status 1 when any check fails. A default run takes a few seconds.
"""

from __future__ import annotations

import argparse


def register(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    p = sub.add_parser("doctor", help="quick health check of this box's devices (pass/warn/fail per device)")
    p.add_argument("--json", action="store_true", help="print JSON instead of a table")
    p.add_argument("--seconds", type=float, default=0.2, help="time per timed measurement (default 0.2)")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from deskpod.errors import UsageError
    from deskpod.hardware.doctor import run_doctor

    if not args.seconds > 0:
        raise UsageError(f"--seconds {args.seconds}: must be a positive number of seconds, e.g. 0.2")
    report = run_doctor(seconds=args.seconds)
    print(report.to_json() if args.json else report.to_table())
    return 1 if report.failed else 0
