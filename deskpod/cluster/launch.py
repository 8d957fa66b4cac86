"""One node's part of a cluster job: ``deskpod cluster launch FOLDER``, run by ``srun`` once per node.

For a train job it stages the dataset to node-local scratch when the spec asks (`deskpod.cluster.staging`:
checksummed, shared by the jobs of the node, evicted least-recently-used), then runs ``deskpod train
--nodes N`` on the job's config, resuming from the run's latest checkpoint when there is one (a requeued
job loses at most one checkpoint interval). The trainer's workers take their NIC and cores from the
hardware model (`deskpod.hardware.affinity`). For a video job it runs ``deskpod video index`` over this
node's share of the streams into its own shard database (`deskpod.video.shards`). For a command job it sets the same per-node facts in the
environment (``DESKPOD_NODE_RANK``, ``DESKPOD_NODES``, ``MASTER_ADDR``, ``MASTER_PORT`` from the job id,
and the first local rank's ``NCCL_IB_HCA``/``UCX_NET_DEVICES``) and replaces itself with the command —
in the job's own ``[environment]`` when it has one, built once for all nodes in the shared cache
(``[slurm] env_cache``, else ``DESKPOD_ENV_CACHE``, else ``~/.deskpod/envs``; each node's build output in
``env-build.<node>.log``). Slurm already runs the job as its user, in its cgroup; deskpod adds no sandbox.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from deskpod.cluster.batch import JobFiles, slurm_options
from deskpod.errors import DeskpodError
from deskpod.jobs.kinds import KINDS
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
    if spec.video is not None:
        return _exec_video(spec, files.folder)
    if KINDS[spec.kind].SESSION:
        return _exec_session(spec, files.folder)
    if spec.train is None:
        return _exec_command(spec, files.folder)
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


def _environment(spec: JobSpec, folder: Path, argv: list[str]) -> list[str]:
    """Build (once for the whole cluster: the cache is shared and locked) or find the job's ``[environment]``,
    put it first on PATH and hold its in-use lock across the exec; returns the argv to exec."""
    from deskpod.environment import Environment
    from deskpod.envs.cache import EnvCache

    defn = spec.environment
    if defn is None:
        return argv
    if defn.kind == "image":
        from deskpod.envs.images import check_image, image_argv

        runtime = check_image(defn)
        return image_argv(runtime, str(defn.image), argv, writable=[folder], workdir=Path.cwd(), devices=[], env={})
    env = Environment.read()
    root = slurm_options(spec).get("env_cache") or env.env_cache or env.home / "envs"
    cache = EnvCache(Path(str(root)))
    node = os.environ.get("SLURMD_NODENAME", "node")
    with open(folder / f"env-build.{node}.log", "ab") as log:
        built = cache.ensure(defn, log=log)
    how = f"built in {built.seconds:.1f} s" if built.built else "cached"
    print(f"deskpod: environment {built.key[:12]} on {node}: {how} ({built.path})", flush=True)
    held = os.open(cache.in_use_lock_path(built.key), os.O_RDONLY | os.O_CREAT, 0o644)  # kept across exec
    import fcntl

    fcntl.flock(held, fcntl.LOCK_SH)
    cache.touch(built.key)
    os.environ["PATH"] = f"{built.bin_dir}:{os.environ.get('PATH', os.defpath)}"
    os.environ["VIRTUAL_ENV"] = str(built.path)
    os.environ.pop("PYTHONHOME", None)
    return argv


def _exec_video(spec: JobSpec, folder: Path) -> int:
    """A video job: one indexer per node, each over its share of the sources into its own shard database
    (`deskpod.jobs.kinds.video.node_argv`); on one node, the job's plain ``deskpod video index``."""
    from deskpod.jobs.kinds.video import node_argv
    from deskpod.train.world import slurm_world

    video = spec.video or {}
    if spec.nodes == 1:
        argv = spec.argv(folder)
    else:
        world = slurm_world(spec.nodes)
        argv = node_argv(video, spec.name, folder, world.node_rank, world.nodes)
    print(f"deskpod: {os.environ.get('SLURMD_NODENAME', 'node')}: {' '.join(argv[2:])}", flush=True)
    os.execv(argv[0], argv)


def _exec_command(spec: JobSpec, folder: Path) -> int:
    from deskpod.train.world import slurm_world

    argv = _environment(spec, folder, list(spec.command))
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
    os.execvp(argv[0], argv)


def _exec_session(spec: JobSpec, folder: Path) -> int:
    """A session (a notebook): its server on this node's address (``NodeAddr``, where the pod reaches it), behind
    the secret the pod wrote in the folder (`deskpod.jobs.kinds.session`), in the job's environment."""
    from deskpod.cluster.slurm import node_address
    from deskpod.jobs.kinds.session import LISTEN_ENV

    node = os.environ.get("SLURMD_NODENAME", "")
    os.environ[LISTEN_ENV] = node_address(node) if node else "127.0.0.1"
    argv = _environment(spec, folder, spec.argv(folder))
    print(f"deskpod: {node or 'node'}: session on {os.environ[LISTEN_ENV]}", flush=True)
    os.execv(argv[0], argv)
