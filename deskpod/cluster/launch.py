"""One node's part of a cluster job: ``deskpod cluster launch FOLDER``, run by ``srun`` once per node.

For a train job it stages the dataset to node-local scratch when the spec asks (`deskpod.cluster.staging`:
checksummed, shared by the jobs of the node, evicted least-recently-used), then runs ``deskpod train
--nodes N`` on the job's config, resuming from the run's latest checkpoint when there is one (a requeued
job loses at most one checkpoint interval). The trainer's workers take their NIC and cores from the
hardware model (`deskpod.hardware.affinity`). For a command job it sets the same per-node facts in the
environment (``DESKPOD_NODE_RANK``, ``DESKPOD_NODES``, ``MASTER_ADDR``, ``MASTER_PORT`` from the job id,
and the first local rank's ``NCCL_IB_HCA``/``UCX_NET_DEVICES``) and replaces itself with the command.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from deskpod.cluster.batch import JobFiles, slurm_options
from deskpod.errors import DeskpodError
from deskpod.jobs.spec import JobSpec


def _stage(spec: JobSpec, train: dict[str, Any]) -> tuple[dict[str, Any], dict[str, str]]:
    """The train config pointing at this node's staged copy of its dataset, and the env it needs."""
    from deskpod.cluster.staging import resolve_data_path, rewrite_data, stage

    data = str(train.get("data", "fashion-mnist"))
    source = resolve_data_path(data)
    if source is None:  # synthetic data: nothing to copy
        return train, {}
    limit_gb = slurm_options(spec).get("scratch_limit_gb")
    staged = stage(
        source,
        Path(str(slurm_options(spec).get("scratch", "/tmp/deskpod-scratch"))),
        limit_bytes=int(float(limit_gb) * 1e9) if limit_gb else None,
        lease=f"slurm-{os.environ.get('SLURM_JOB_ID', 'local')}",
        lease_pid=os.getpid(),
    )
    new_data, env = rewrite_data(data, staged.path)
    verb = "copied" if staged.copied else "already there"
    print(f"deskpod: staged {source} to {staged.path} ({verb}, {staged.size / 1e6:.1f} MB)", flush=True)
    return {**train, "data": new_data}, env


def launch_node(folder: Path) -> int:
    """Run this node's launcher for the job in ``folder``; its exit code (see `deskpod.train.launcher.exit_code`)."""
    from deskpod.train.launcher import exit_code, launch, prepare

    files = JobFiles(folder)
    spec = files.read_spec()
    os.environ.update({k: v for k, v in spec.env.items() if k not in os.environ})
    if spec.train is None:
        return _exec_command(spec)
    train, env = dict(spec.train), dict[str, str]()
    if slurm_options(spec).get("stage_data"):
        train, env = _stage(spec, train)
    os.environ.update(env)
    config = files.folder / "train.toml"
    if train != dict(spec.train):  # staged: this node's own copy of the config
        import tomli_w

        config = files.folder / f"train.{os.environ.get('SLURMD_NODENAME', 'node')}.toml"
        config.write_text(tomli_w.dumps(train))
    # Every node the same config; a requeued attempt resumes from the run's latest checkpoint.
    resume = any((files.run_dir / spec.name / "checkpoints").glob("*.pt"))
    overrides = {"out": str(files.run_dir), "name": spec.name, "devices": str(spec.devices)}
    plan = prepare(str(config), overrides, resume=resume, nodes=spec.nodes)
    return exit_code(plan, launch(plan, "lines"))


def _exec_command(spec: JobSpec) -> int:
    from deskpod.train.world import slurm_world

    world = slurm_world(spec.nodes)
    os.environ.update(
        DESKPOD_NODE_RANK=str(world.node_rank), DESKPOD_NODES=str(world.nodes),
        MASTER_ADDR=world.master_addr, MASTER_PORT=str(world.port),
    )  # fmt: skip
    try:
        from deskpod.hardware.affinity import rank_affinity
        from deskpod.hardware.placement import local_topology

        topo = local_topology()
        if topo.kind == "cuda":
            for key, value in rank_affinity(topo, 0).env.items():
                os.environ.setdefault(key, value)
    except DeskpodError:
        pass  # no topology to read: the command runs unpinned
    os.execvp(spec.command[0], list(spec.command))
