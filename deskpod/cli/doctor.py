"""``deskpod doctor``: check this box's devices — matmul, memory copy, all-reduce, peer bandwidth.

``deskpod doctor --cluster`` checks the Slurm cluster instead (deskpod/cluster/doctor.py): clients,
configuration, version and its known bugs, controller, munge, partitions and GPU GRES, JSON and text
answers, accounting, node names.

Exit status 1 when any check fails. A default run takes a few seconds. With no Slurm on the machine,
``--cluster`` still prints its report (the ``clients`` line fails and says what to install) and exits 1:
the doctor's answer to "can this machine use a cluster?" is a failed check, not bad input (exit 2 is for
commands that need Slurm to do what they were asked, like ``deskpod submit --cluster slurm``).
"""

from __future__ import annotations

import argparse


def register(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    p = sub.add_parser("doctor", help="quick health check of this box's devices (pass/warn/fail per device)")
    p.add_argument("--json", action="store_true", help="print JSON instead of a table")
    p.add_argument("--seconds", type=float, default=0.2, help="time per timed measurement (default 0.2)")
    p.add_argument(
        "--cluster", action="store_true", help="check the Slurm cluster instead of this box's devices (no job is run)"
    )
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from deskpod.errors import UsageError

    if args.cluster:
        from deskpod.cluster.doctor import check_cluster

        cluster = check_cluster()
        print(cluster.to_json() if args.json else cluster.to_table())
        return 1 if cluster.failed else 0

    from deskpod.hardware.doctor import run_doctor

    if not args.seconds > 0:
        raise UsageError(f"--seconds {args.seconds}: must be a positive number of seconds, e.g. 0.2")
    report = run_doctor(seconds=args.seconds)
    print(report.to_json() if args.json else report.to_table())
    return 1 if report.failed else 0
