"""Many nodes: the world of a multi-node run, read from Slurm's environment.

``deskpod train --nodes N`` runs one launcher per node; each launcher's elastic agent joins a c10d
rendezvous on the first node of the allocation and starts its node's workers. Everything a launcher
needs comes from the Slurm step it runs in:

- the nodes: ``SLURM_JOB_NODELIST`` expanded by ``scontrol show hostnames`` (Slurm's own hostlist
  syntax, ``node[1-4,7]``) and each name resolved to an address;
- this node's place: ``SLURM_NODEID`` (checked against ``SLURMD_NODENAME``), ``SLURM_NNODES`` and the
  step's task count (exactly one launcher per node);
- the rendezvous port: derived from ``SLURM_JOB_ID``, so every node computes the same port without
  talking, and two jobs sharing a node never share one (the classic "29500 in use" on shared nodes).

Whatever is missing or inconsistent is refused with one line that names it. Nothing here falls back
to a one-node world: a launcher that silently trained alone would wait for the others for ever, or
worse, train a different model on every node.

Outside a step but inside an allocation (``salloc`` shell, ``sbatch`` script), `srun_argv` turns the
same command into one launcher per node through ``srun``.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from deskpod.errors import ConfigError, UsageError

PORT_BASE = 20000
PORT_SPAN = 40000
"""Rendezvous ports lie in 20000-59999: below Linux's ephemeral range (32768+ is shared, so the port
is also checked free on the first node), away from 29500 (torch's default) only by chance."""


@dataclass(frozen=True, slots=True)
class NodeWorld:
    """Where this launcher stands among the nodes of one run."""

    nodes: int
    node_rank: int
    hosts: tuple[str, ...]
    """Node names, in Slurm's order (node rank i runs on hosts[i])."""
    master_addr: str
    """The first node's address: it hosts the rendezvous."""
    local_addr: str
    """This node's address (what the other nodes reach it by)."""
    port: int
    job_id: str
    restart: int
    """``SLURM_RESTART_COUNT``: 0 for the first run, n after the n-th requeue."""

    @property
    def endpoint(self) -> str:
        return f"{self.master_addr}:{self.port}"

    @property
    def run_id(self) -> str:
        """One rendezvous per job and attempt: a requeued job never meets its previous attempt's agents."""
        return f"slurm-{self.job_id}-{self.restart}"


def rendezvous_port(job_id: str) -> int:
    """The rendezvous port of a Slurm job: the same on every node of the job, different for jobs that
    run at the same time (consecutive ids never collide; ids 40,000 apart would)."""
    base = job_id.split("_")[0].split("+")[0]  # array (123_4) and heterogeneous (123+1) jobs: the id itself
    if not base.isdigit():
        raise ConfigError(f"SLURM_JOB_ID={job_id!r}: expected a job number like 1234")
    return PORT_BASE + int(base) % PORT_SPAN


def expand_hostnames(nodelist: str) -> tuple[str, ...]:
    """``node[1-2]`` → ``("node1", "node2")`` by ``scontrol show hostnames`` (Slurm's own parser)."""
    scontrol = shutil.which("scontrol")
    if scontrol is None:
        raise UsageError(
            f"--nodes: cannot expand SLURM_JOB_NODELIST={nodelist!r}: scontrol is not on PATH; "
            "multi-node training needs Slurm's client tools on every node"
        )
    done = subprocess.run([scontrol, "show", "hostnames", nodelist], capture_output=True, text=True, timeout=30)
    if done.returncode != 0:
        raise ConfigError(f"SLURM_JOB_NODELIST={nodelist!r}: scontrol cannot expand it: {done.stderr.strip()}")
    hosts = tuple(h for h in done.stdout.split() if h)
    if not hosts:
        raise ConfigError(f"SLURM_JOB_NODELIST={nodelist!r} names no nodes")
    return hosts


def resolve(host: str) -> str:
    """A node name's IPv4 address; a name that does not resolve is an error, never ``localhost``."""
    try:
        infos = socket.getaddrinfo(host, None, socket.AF_INET, socket.SOCK_STREAM)
    except socket.gaierror as e:
        raise ConfigError(
            f"node name {host!r} (from SLURM_JOB_NODELIST) does not resolve to an address ({e.strerror}); "
            "every node of the allocation must be able to reach the first by its Slurm name"
        ) from None
    return str(infos[0][4][0])


def in_allocation(environ: Mapping[str, str] | None = None) -> bool:
    return bool((os.environ if environ is None else environ).get("SLURM_JOB_ID"))


def in_step(environ: Mapping[str, str] | None = None) -> bool:
    """Inside a job step (an ``srun`` task), not the batch script or an ``salloc`` shell."""
    env = os.environ if environ is None else environ
    return bool(env.get("SLURM_JOB_ID")) and env.get("SLURM_STEP_ID") not in (None, "", "batch", "extern")


def _int(env: Mapping[str, str], key: str) -> int:
    value = env.get(key)
    if value is None:
        raise ConfigError(f"--nodes: {key} is not set; this is not a Slurm job step (run the launcher with srun)")
    if not value.isdigit():
        raise ConfigError(f"{key}={value!r}: expected a number")
    return int(value)


def slurm_world(nodes: int, environ: Mapping[str, str] | None = None) -> NodeWorld:
    """This launcher's `NodeWorld`, from the Slurm step it runs in; refuses any inconsistency."""
    env = os.environ if environ is None else environ
    if not in_allocation(env):
        raise UsageError(
            f"--nodes {nodes}: not inside a Slurm allocation (SLURM_JOB_ID is unset); run it under "
            f"salloc/sbatch, or submit it with: deskpod submit --cluster slurm --nodes {nodes} JOB.toml"
        )
    nnodes = _int(env, "SLURM_NNODES")
    node_id = _int(env, "SLURM_NODEID")
    if nnodes != nodes:
        raise UsageError(
            f"--nodes {nodes}, but this Slurm step runs on {nnodes} node{'s' if nnodes != 1 else ''} "
            f"(SLURM_NNODES={nnodes}); ask Slurm for {nodes} nodes (sbatch/salloc --nodes {nodes}) or pass --nodes {nnodes}"
        )
    tasks = env.get("SLURM_STEP_NUM_TASKS") or env.get("SLURM_NTASKS")
    if tasks is not None and tasks.isdigit() and int(tasks) != nnodes:
        raise UsageError(
            f"this Slurm step runs {tasks} tasks on {nnodes} nodes; deskpod needs exactly one launcher per node "
            f"(srun --nodes {nnodes} --ntasks {nnodes}); each launcher starts its node's workers itself"
        )
    nodelist = env.get("SLURM_JOB_NODELIST") or env.get("SLURM_NODELIST")
    if not nodelist:
        raise ConfigError("--nodes: SLURM_JOB_NODELIST is not set; cannot find the first node of the allocation")
    hosts = expand_hostnames(nodelist)
    if len(hosts) != nnodes:
        raise ConfigError(
            f"SLURM_JOB_NODELIST={nodelist!r} names {len(hosts)} nodes but SLURM_NNODES={nnodes}; "
            "the step's environment is inconsistent"
        )
    if not 0 <= node_id < nnodes:
        raise ConfigError(f"SLURM_NODEID={node_id} is outside 0-{nnodes - 1} for SLURM_NNODES={nnodes}")
    me = env.get("SLURMD_NODENAME")
    if me and hosts[node_id] != me:
        raise ConfigError(
            f"SLURM_NODEID={node_id} names node {hosts[node_id]!r} but this task runs on {me!r} (SLURMD_NODENAME); "
            "the step's environment is inconsistent"
        )
    job_id = env["SLURM_JOB_ID"]
    restart = env.get("SLURM_RESTART_COUNT", "0")
    return NodeWorld(
        nodes=nnodes,
        node_rank=node_id,
        hosts=hosts,
        master_addr=resolve(hosts[0]),
        local_addr=resolve(hosts[node_id]),
        port=rendezvous_port(job_id),
        job_id=job_id,
        restart=int(restart) if restart.isdigit() else 0,
    )


def check_port_free(world: NodeWorld) -> None:
    """On the first node: the job's rendezvous port must be free (another program may hold it)."""
    if world.node_rank != 0:
        return
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        # As the rendezvous store binds it: a previous attempt's connections in TIME-WAIT do not hold the port.
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((world.master_addr, world.port))
        except OSError as e:
            raise ConfigError(
                f"the rendezvous port {world.port} of Slurm job {world.job_id} (20000 + job id mod 40000) is in use on "
                f"{world.hosts[0]} ({e.strerror}); another program holds it: requeue the job (scontrol requeue "
                f"{world.job_id}) or free the port"
            ) from None


def srun_argv(nodes: int, argv: Sequence[str], environ: Mapping[str, str] | None = None) -> list[str]:
    """The command that runs ``argv`` once per node of the current allocation through ``srun``.

    ``--nodes N --ntasks N`` puts one task on each node without ``--ntasks-per-node`` (which Slurm
    22.05.5-22.05.8 refuses for some GPU jobs); ``--kill-on-bad-exit`` ends every node's launcher when
    one dies, so a lost node ends the step at once instead of leaving agents waiting at a rendezvous.
    """
    env = os.environ if environ is None else environ
    srun = shutil.which("srun")
    if srun is None:
        raise UsageError(f"--nodes {nodes}: srun is not on PATH; run on a node with Slurm's client tools")
    have = env.get("SLURM_JOB_NUM_NODES") or env.get("SLURM_NNODES")
    if have and have.isdigit() and int(have) < nodes:
        raise UsageError(
            f"--nodes {nodes}: this allocation has {have} node{'s' if have != '1' else ''} "
            f"(SLURM_JOB_NUM_NODES={have}); valid: 1-{have}"
        )
    return [srun, f"--nodes={nodes}", f"--ntasks={nodes}", "--kill-on-bad-exit=1", "--export=ALL", *argv]
