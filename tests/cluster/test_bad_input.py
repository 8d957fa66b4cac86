"""Bad input on the cluster path: one line naming the value and what is valid, exit 2 (1 when Slurm itself
fails), and nothing submitted. Also the multi-node world read from Slurm's environment."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from deskpod.errors import ConfigError, UsageError
from deskpod.train.world import rendezvous_port, slurm_world, srun_argv
from tests.cluster.slurm import SlurmCluster


def deskpod(*argv: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "deskpod", *argv], capture_output=True, text=True, env=env, timeout=120
    )


def job_count(slurm: SlurmCluster) -> int:
    return len(slurm.run("squeue", "-h", "-t", "all", "-o", "%i").stdout.split())


@pytest.fixture
def env(slurm: SlurmCluster, tmp_path: Path) -> dict[str, str]:
    return {**slurm.env, "DESKPOD_HOME": str(tmp_path / "home")}


CMD = ["submit", "--cluster", "slurm", "--name", "bad"]


@pytest.mark.parametrize(
    ("flags", "says"),
    [
        (["--partition", "nope"], "slurm partition 'nope' does not exist; valid: debug, short"),
        (["--nodes", "3"], "nodes = 3: partition 'debug' has 2 nodes; valid: 1-2"),
        (["--devices", "5"], "devices = 5 GPUs per node: the nodes of partition 'debug' have at most 2"),
        (["--device-kind", "cpu"], "device_kind = 'cpu': the nodes of partition 'debug' have GPUs (GRES gpu:2)"),
    ],
)
def test_what_the_cluster_cannot_run_is_refused_before_anything_is_queued(
    slurm: SlurmCluster, env: dict[str, str], flags: list[str], says: str
) -> None:
    before = job_count(slurm)
    done = deskpod(*CMD, *flags, "--", "true", env=env)
    assert done.returncode == 2, done.stderr
    assert says in done.stderr and len(done.stderr.strip().splitlines()) == 1, done.stderr
    assert job_count(slurm) == before


def test_a_request_slurm_itself_refuses_is_one_line_and_not_queued(
    slurm: SlurmCluster, env: dict[str, str], tmp_path: Path
) -> None:
    spec = tmp_path / "job.toml"
    # partition "short" allows 1 minute (MaxTime=1, EnforcePartLimits=ALL): only the controller knows that
    spec.write_text('name = "long"\ncommand = ["true"]\nmax_runtime = 3600\n[slurm]\npartition = "short"\n')
    before = job_count(slurm)
    done = deskpod("submit", "--cluster", "slurm", str(spec), env=env)
    assert done.returncode == 2, done.stderr
    assert done.stderr.startswith("deskpod: Slurm refuses this job:") and "time limit" in done.stderr.lower(), (
        done.stderr
    )
    assert job_count(slurm) == before


def test_no_slurm_on_the_machine(tmp_path: Path) -> None:
    env = {"PATH": "/nonexistent", "HOME": str(tmp_path), "DESKPOD_HOME": str(tmp_path / "home")}
    done = deskpod(*CMD, "--", "true", env=env)
    assert done.returncode == 2
    assert "no Slurm on this machine: sbatch is not on PATH" in done.stderr


def test_an_unreachable_controller_is_a_failure_of_slurm(slurm: SlurmCluster, tmp_path: Path) -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        dead = s.getsockname()[1]
    conf = tmp_path / "slurm.conf"
    text = slurm.conf.read_text()
    port_line = next(ln for ln in text.splitlines() if ln.startswith("SlurmctldPort="))
    conf.write_text(
        text.replace(port_line, f"SlurmctldPort={dead}").replace("SlurmctldTimeout=30", "SlurmctldTimeout=3")
    )
    env = {**os.environ, "SLURM_CONF": str(conf), "DESKPOD_HOME": str(tmp_path / "home")}
    done = deskpod(*CMD, "--", "true", env=env)
    assert done.returncode == 1, done.stderr
    assert "unreachable" in done.stderr.lower() or "did not answer" in done.stderr, done.stderr
    assert len(done.stderr.strip().splitlines()) == 1, done.stderr


def test_dry_run_prints_the_script_and_submits_nothing(slurm: SlurmCluster, env: dict[str, str]) -> None:
    before = job_count(slurm)
    done = deskpod(*CMD, "--dry-run", "--nodes", "2", "--devices", "2", "--max-runtime", "3600", "--", "true", env=env)
    assert done.returncode == 0, done.stderr
    script = done.stdout
    assert script.startswith("#!/bin/bash\n")
    # Slurm 22.05.8 (Debian 12) has the --ntasks-per-node regression: one task per node by --ntasks, GPUs per task
    assert "#SBATCH --nodes=2\n#SBATCH --ntasks=2\n#SBATCH --gpus-per-task=2\n" in script
    assert "#SBATCH --time=60\n#SBATCH --signal=USR2@120\n" in script and "--requeue" in script
    assert "srun --nodes=2 --ntasks=2 --kill-on-bad-exit=1" in script
    assert job_count(slurm) == before


def test_train_nodes_outside_an_allocation(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("SLURM_")}
    done = deskpod("train", "--nodes", "2", "--data", "synthetic", "--steps", "1", "--out", str(tmp_path), env=env)
    assert done.returncode == 2
    assert "--nodes 2: not inside a Slurm allocation (SLURM_JOB_ID is unset)" in done.stderr


STEP = {"SLURM_JOB_ID": "4242", "SLURM_STEP_ID": "0", "SLURM_NNODES": "2", "SLURM_NODEID": "1",
        "SLURM_JOB_NODELIST": "node[1-2]", "SLURMD_NODENAME": "node2", "SLURM_STEP_NUM_TASKS": "2"}  # fmt: skip


def test_the_world_of_a_step(slurm: SlurmCluster) -> None:
    w = slurm_world(2, STEP)
    assert (w.nodes, w.node_rank, w.hosts) == (2, 1, ("node1", "node2"))
    assert w.master_addr == "127.0.0.1" and w.local_addr == "127.0.0.1"  # node names resolve to loopback here
    assert w.port == rendezvous_port("4242") == 20000 + 4242
    assert w.run_id == "slurm-4242-0"


@pytest.mark.parametrize(
    ("change", "says"),
    [
        ({"SLURM_NNODES": "3"}, "--nodes 2, but this Slurm step runs on 3 nodes"),
        ({"SLURM_NODEID": "5"}, "SLURM_NODEID=5 is outside 0-1"),
        ({"SLURMD_NODENAME": "node1"}, "SLURM_NODEID=1 names node 'node2' but this task runs on 'node1'"),
        ({"SLURM_STEP_NUM_TASKS": "4"}, "runs 4 tasks on 2 nodes; deskpod needs exactly one launcher per node"),
        ({"SLURM_JOB_NODELIST": "node[1-3]"}, "names 3 nodes but SLURM_NNODES=2"),
        (
            {"SLURM_JOB_NODELIST": "nosuch[1-2]", "SLURMD_NODENAME": "nosuch2"},
            "'nosuch1' (from SLURM_JOB_NODELIST) does not resolve",
        ),
        ({"SLURM_NODEID": "x"}, "SLURM_NODEID='x': expected a number"),
    ],
)
def test_an_inconsistent_step_fails_loudly(slurm: SlurmCluster, change: dict[str, str], says: str) -> None:
    with pytest.raises((ConfigError, UsageError), match=None) as got:
        slurm_world(2, {**STEP, **change})
    assert says in str(got.value)


def test_no_scontrol_is_loud_not_a_one_node_world(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PATH", "/nonexistent")
    with pytest.raises(UsageError, match="scontrol is not on PATH"):
        slurm_world(2, STEP)


def test_ports_of_jobs_that_share_a_node_differ() -> None:
    ports = {rendezvous_port(str(i)) for i in range(100000, 100500)}
    assert len(ports) == 500 and all(20000 <= p < 60000 for p in ports)
    assert rendezvous_port("77_3") == rendezvous_port("77")
    with pytest.raises(ConfigError, match="SLURM_JOB_ID='abc'"):
        rendezvous_port("abc")


def test_srun_line_in_an_allocation(slurm: SlurmCluster) -> None:
    argv = srun_argv(2, ["python", "-m", "deskpod", "train", "--nodes", "2"], {"SLURM_JOB_NUM_NODES": "2"})
    assert argv[1:5] == ["--nodes=2", "--ntasks=2", "--kill-on-bad-exit=1", "--export=ALL"]
    with pytest.raises(UsageError, match="--nodes 3: this allocation has 2 nodes"):
        srun_argv(3, ["x"], {"SLURM_JOB_NUM_NODES": "2"})
