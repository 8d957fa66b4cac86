"""``deskpod cluster``: deskpod on a Slurm cluster; each ``cluster WHAT`` is one function below.

deskpod cluster env --machine dgx1-v100 --local-rank 3      what local rank 3 of a DGX-1 node gets
deskpod cluster env --topo topo.txt --local-rank 0          the same for a saved `nvidia-smi topo -m`
deskpod cluster env --local-rank "$SLURM_LOCALID"           this node's own topology
... --devices 4,5,6,7                                       rank r uses device r of this list
... --json                                                  a JSON object instead of shell lines

In a job step: ``eval "$(deskpod cluster env --local-rank "$SLURM_LOCALID")"`` before the worker.
"""

from __future__ import annotations

import argparse
import json
import shlex
import sys

from deskpod.cli.topo import find_topology


def register(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    p = sub.add_parser("cluster", help="deskpod on a Slurm cluster: what each local rank gets")
    cluster = p.add_subparsers(dest="cluster_command", metavar="WHAT", required=True)
    _register_env(cluster)
    _register_job_steps(cluster)
    _register_staging(cluster)


def _register_job_steps(cluster: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    """What a cluster job's batch script runs (see deskpod.cluster.batch); not for typing by hand."""
    from pathlib import Path

    e = cluster.add_parser("launch", help="(batch scripts) this node's launcher of the job in FOLDER, run by srun")
    e.add_argument("folder", type=Path)
    e.set_defaults(func=run_launch)
    a = cluster.add_parser("attempt", help="(batch scripts) begin or end an attempt of the job in FOLDER")
    steps = a.add_subparsers(dest="attempt_command", metavar="begin|end", required=True)
    b = steps.add_parser("begin", help="record a new attempt and print its number")
    b.add_argument("folder", type=Path)
    b.set_defaults(func=run_attempt_begin)
    d = steps.add_parser("end", help="record how attempt N ended; requeue the job when its budget allows")
    d.add_argument("folder", type=Path)
    d.add_argument("attempt", type=int)
    d.add_argument("code", type=int)
    d.set_defaults(func=run_attempt_end)


def run_launch(args: argparse.Namespace) -> int:
    from deskpod.cluster.launch import launch_node

    return launch_node(args.folder)


def run_attempt_begin(args: argparse.Namespace) -> int:

    from deskpod.cluster.attempts import BudgetSpent, begin

    try:
        print(begin(args.folder))
    except BudgetSpent as e:
        print(f"deskpod: the job may not run again: {e}", file=sys.stderr)
        return 1
    return 0


def run_attempt_end(args: argparse.Namespace) -> int:
    from deskpod.cluster.attempts import end

    return end(args.folder, args.attempt, args.code)


def _register_staging(cluster: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    from pathlib import Path

    s = cluster.add_parser("stage", help="copy a dataset to node-local scratch (checksummed, shared, LRU-evicted)")
    s.add_argument("data", help="fashion-mnist or imagefolder:PATH (what --data takes)")
    s.add_argument("--scratch", type=Path, default=Path("/tmp/deskpod-scratch"), help="node-local folder")
    s.add_argument("--limit-gb", type=float, help="keep the scratch folder under this size (evicts LRU copies)")
    s.add_argument("--verify", action="store_true", help="re-hash a copy that is already there; repair damage")
    s.set_defaults(func=run_stage)
    ls = cluster.add_parser("staged", help="the datasets staged in a scratch folder, least recently used first")
    ls.add_argument("--scratch", type=Path, default=Path("/tmp/deskpod-scratch"))
    ls.add_argument("--json", action="store_true")
    ls.set_defaults(func=run_staged)
    ev = cluster.add_parser("evict", help="evict unused staged datasets, oldest first, down to a size")
    ev.add_argument("--scratch", type=Path, default=Path("/tmp/deskpod-scratch"))
    ev.add_argument("--limit-gb", type=float, required=True, help="what may stay (0: evict every unused copy)")
    ev.set_defaults(func=run_evict)


def run_stage(args: argparse.Namespace) -> int:
    from deskpod.cluster.staging import resolve_data_path, rewrite_data, stage
    from deskpod.errors import ConfigError

    source = resolve_data_path(args.data)
    if source is None:
        raise ConfigError(f"--data {args.data!r} is generated, not read from files: there is nothing to stage")
    limit = int(args.limit_gb * 1e9) if args.limit_gb is not None else None
    staged = stage(source, args.scratch, limit_bytes=limit, verify=args.verify)
    data, env = rewrite_data(args.data, staged.path)
    verb = "copied" if staged.copied else "already staged"
    print(f"# {verb}: {source} -> {staged.path} ({staged.size / 1e6:.1f} MB)")
    for k, v in env.items():
        print(f"export {k}={shlex.quote(v)}")
    print(f"# train with: --data {shlex.quote(data)}")
    return 0


def run_staged(args: argparse.Namespace) -> int:
    from deskpod.cluster.staging import staged_list

    rows = staged_list(args.scratch)
    if args.json:
        print(json.dumps([{"key": r.key, "source": str(r.source), "path": str(r.path), "bytes": r.size,
                           "files": r.files, "last_used": r.last_used, "leases": [x.name for x in r.leases]}
                          for r in rows], indent=2))  # fmt: skip
        return 0
    for r in rows:
        held = f", in use by {', '.join(x.name for x in r.leases)}" if r.leases else ""
        print(f"{r.size / 1e6:10.1f} MB  {r.key}  {r.source}{held}")
    return 0


def run_evict(args: argparse.Namespace) -> int:
    from deskpod.cluster.staging import evict
    from deskpod.errors import ConfigError

    if args.limit_gb < 0:
        raise ConfigError(f"--limit-gb {args.limit_gb}: expected 0 or more gigabytes")
    for key in evict(args.scratch, int(args.limit_gb * 1e9)):
        print(f"evicted {key}")
    return 0


def _register_env(cluster: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    e = cluster.add_parser("env", help="the NIC, CPU cores and environment variables one local rank gets")
    src = e.add_mutually_exclusive_group()
    src.add_argument("--machine", metavar="NAME", help="a reference machine from the catalog (deskpod topo --list)")
    src.add_argument("--topo", metavar="FILE", help="a file holding `nvidia-smi topo -m` output")
    e.add_argument("--local-rank", type=int, required=True, metavar="N", help="the rank on its node (SLURM_LOCALID)")
    e.add_argument(
        "--devices", metavar="LIST", help="devices of the job, rank r uses the r-th (default: all, in order)"
    )
    e.add_argument("--json", action="store_true", help="print a JSON object instead of export lines")
    e.set_defaults(func=run_env)


def run_env(args: argparse.Namespace) -> int:
    from deskpod.hardware.affinity import rank_affinity

    topology = find_topology(args.machine, args.topo)
    devices = _device_list(args.devices) if args.devices is not None else None
    rank = rank_affinity(topology, args.local_rank, devices)
    if args.json:
        print(json.dumps({"machine": topology.name, "source": topology.source, **rank.as_dict()}, indent=2))
        return 0
    print(f"# {rank.reason}")
    for name, value in rank.env.items():
        quoted = shlex.quote(value)
        if quoted == value and value.startswith("="):
            quoted = f"'{value}'"  # NCCL_IB_HCA='=mlx5_0' reads better than NCCL_IB_HCA==mlx5_0 (same value)
        print(f"export {name}={quoted}")
    return 0


def _device_list(text: str) -> list[int]:
    from deskpod.errors import UsageError

    parts = [x.strip() for x in text.split(",")]
    if not text.strip() or not all(x.isascii() and x.isdigit() for x in parts):
        raise UsageError(f"--devices {text!r}: not a device list; use indices like 0,1,2,3")
    return [int(x) for x in parts]
