"""``deskpod run SCRIPT``: your own training script on every device, with deskpod's launcher."""

from __future__ import annotations

import argparse
import os
import sys

EPILOG = """examples:
  deskpod run train.py --lr 0.1              one process per device; the script reads RANK, LOCAL_RANK, ...
  deskpod run --devices 2 -m mypkg.train     a module, on two devices (CPU: two workers)
  deskpod run --max-restarts 3 train.py      restart the group when a rank fails (resume from your checkpoint)
  deskpod run --submit --devices 4 train.py  queue it on the pod service (deskpod up) as a job

The script sees what torchrun gives it (init_process_group() with no arguments works) and
DESKPOD_RUN_DIR, its run folder; `import deskpod.train; deskpod.train.log(step=s, loss=l)` writes
metrics the dashboard charts. Every rank's output is kept in runs/<name>/logs/.
"""


def register(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    p = sub.add_parser(
        "run",
        help="run your own training script on every device (torchrun-compatible)",
        description="Run a training script of your own once per device, through deskpod's launcher: free "
        "rendezvous port, devices, NICs and CPU threads laid out, restarts, one root cause when it fails.",
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--devices", default="all", help="all (default), a count N, or indices like 0,2,3")
    p.add_argument("--nodes", type=int, default=1, metavar="N",
                   help="span N nodes of the Slurm allocation this runs in (salloc/sbatch): one launcher per node")  # fmt: skip
    p.add_argument("--max-restarts", type=int, default=0, metavar="K",
                   help="start the group again up to K times when a rank fails (default 0)")  # fmt: skip
    p.add_argument("--name", help="run name (default <script>-<date>-<time>)")
    p.add_argument("--out", metavar="DIR", help="folder of run folders (default runs; in a pod job, the job's folder)")
    p.add_argument("--stall-after", type=float, default=300.0, metavar="S",
                   help="name ranks whose output has not grown for S seconds (default 300)")  # fmt: skip
    p.add_argument("--submit", action="store_true", help="queue it on the pod service (deskpod up) instead")
    p.add_argument("-m", dest="module", action="store_true", help="run a module, as python -m does")
    p.add_argument("script", nargs="?", metavar="SCRIPT|MODULE", help="the script (or with -m the module)")
    p.add_argument("args", nargs=argparse.REMAINDER, help="its arguments, passed on unchanged")
    p.set_defaults(func=run)


def target_of(args: argparse.Namespace) -> list[str]:
    if args.script is None:
        return []
    return ["-m", args.script, *args.args] if args.module else [args.script, *args.args]


def run(args: argparse.Namespace) -> int:
    from deskpod.train.script import exit_code, launch_script, prepare_script

    if args.submit:
        return submit(args)
    from deskpod.cli.train import once_per_node

    once_per_node(args.nodes, args.argv)
    job_dir = os.environ.get("DESKPOD_JOB_DIR")
    out = args.out or (os.path.join(job_dir, "runs") if job_dir else "runs")
    plan = prepare_script(target_of(args), devices=args.devices, nodes=args.nodes, max_restarts=args.max_restarts,
                          name=args.name, out=out, stall_after_s=args.stall_after)  # fmt: skip
    follower = plan.world is not None and plan.world.node_rank > 0
    if not follower:
        what = f"{len(plan.devices)} × {plan.devices[0].name}" + (
            f" ({plan.devices[0].threads} thread{'s' if plan.devices[0].threads != 1 else ''} each)"
            if plan.kind == "cpu"
            else ""
        )
        nodes = f" on {plan.world.nodes} nodes" if plan.world else ""
        print(f"deskpod run: {what}{nodes} → {plan.run_dir}", file=sys.stderr, flush=True)
    summary = launch_script(plan)
    if not follower:
        restarts = summary["restarts"]
        again = f", {restarts} restart{'s' if restarts != 1 else ''}" if restarts else ""
        print(f"deskpod run: {summary['state']} in {summary['wall_time_s']:.1f} s ({summary['world_size']} ranks"
              f"{again}); every rank's output in {plan.logs}", file=sys.stderr)  # fmt: skip
    return exit_code(summary)


def submit(args: argparse.Namespace) -> int:
    """``deskpod run --submit``: check the script here, then queue ``deskpod run`` as a pod-service job."""
    from deskpod.errors import ConfigError
    from deskpod.jobs.client import PodClient
    from deskpod.jobs.kinds.run import spec as run_job

    if args.out:
        raise ConfigError("--out does not go with --submit: a pod job keeps its run in its own folder")
    if args.nodes > 1:
        raise ConfigError("--nodes does not go with --submit: for many nodes, deskpod submit --cluster slurm a job "
                          "whose command is deskpod run --nodes N ...")  # fmt: skip
    spec = run_job(target_of(args), devices=args.devices, max_restarts=args.max_restarts, name=args.name,
                   stall_after_s=args.stall_after, workdir=os.getcwd())  # fmt: skip
    with PodClient.from_environment() as client:
        job = client.submit(spec)
    print(f"submitted job {job['id']}; follow it with: deskpod logs -f {job['id']}")
    return 0
