"""A fleet with a cluster behind one of its members: ``deskpod up --backend slurm`` in front of the suite's real
Slurm (slurmctld and two slurmd on 127.0.0.1, `tests.cluster.slurm`), beside a one-box member. A job only the
cluster fits (two nodes) is routed there with the documented reason, runs through Slurm to ``succeeded`` and its log
reads through the fleet; a stack's rollout reaches the cluster member too (its smoke job runs as a Slurm job)."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.cluster.slurm import GPUS_PER_NODE, NODES, SlurmCluster
from tests.fleet.members import start_fleet
from tests.jobs.pods import Pod, Pods, wait_state
from tests.unix_users import make_users

pytestmark = [
    pytest.mark.skipif(os.geteuid() != 0, reason="members run jobs as their users' accounts only as root"),
    pytest.mark.slow,
]


@dataclass
class Fleet:
    fleet: Pod
    box: Pod
    hpc: Pod
    tokens: dict[str, Path]

    def cli(self, user: str, *argv: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
        """``deskpod COMMAND --fleet URL ARGS`` as ``user`` (the flag before any ``--``)."""
        at = 3 if argv[:2] == ("fleet", "stack") else 2 if argv[0] == "fleet" else 1
        env = dict(self.fleet.env, DESKPOD_URL=self.fleet.url, DESKPOD_TOKEN_FILE=str(self.tokens[user]))
        argv = (*argv[:at], "--fleet", self.fleet.url, *argv[at:])
        return subprocess.run([sys.executable, "-m", "deskpod", *argv], env=env, capture_output=True, text=True,
                              timeout=timeout)  # fmt: skip


@pytest.fixture(scope="module")
def fleet(slurm: SlurmCluster, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Fleet]:
    """The fleet, box (this box's CPU slots) and hpc (a Slurm login node's pod); both share one environment cache, as
    a box and its cluster's login node on one file system may, so a stack is built once."""
    root = tmp_path_factory.mktemp("slurm-fleet")
    pods = Pods(root)
    cache = root / "envs"
    with make_users("ann") as (ann,):
        try:
            members = {"box": (("--env-cache", str(cache)), {}),
                       "hpc": (("--backend", "slurm"), {"DESKPOD_ENV_CACHE": str(cache)})}  # fmt: skip
            hub, made, tokens = start_fleet(pods, ("--lease", "4", "--no-dashboard"), members, {"ann": ann})
            f = Fleet(hub, made["box"], made["hpc"], tokens)
            for name, pod in made.items():
                done = f.cli("admin", "fleet", "add", name, pod.url)
                assert done.returncode == 0, done.stderr
            yield f
        finally:
            pods.stop_all()


def test_a_job_only_the_cluster_fits_goes_there_runs_through_slurm_and_its_log_reads_through_the_fleet(
    fleet: Fleet, slurm: SlurmCluster
) -> None:
    f = fleet
    code = "import os; print('rank', os.environ['DESKPOD_NODE_RANK'], 'of', os.environ['DESKPOD_NODES'], flush=True)"
    done = f.cli("ann", "submit", "--nodes", "2", "--devices", "1", "--name", "two", "--", sys.executable, "-c", code)
    assert done.returncode == 0, done.stderr
    job_id = done.stdout.strip()
    parts = f"debug: {len(NODES)} nodes x {GPUS_PER_NODE} GPUs"
    assert "routed to hpc" in done.stderr and "hpc: a Slurm cluster, which decides when" in done.stderr, done.stderr
    assert "box: one box; the job needs 2 nodes" in done.stderr, done.stderr
    ann = f.fleet.client(f.tokens["ann"].read_text().strip())
    job = wait_state(ann, job_id, "succeeded", "failed", "lost", timeout=120)
    assert job["state"] == "succeeded", (job, ann.log(job_id)[0])
    member, there = job["external"].split(":")
    assert member == "hpc"
    slurm_id = f.hpc.client().job(there)["external"]
    assert slurm.job(slurm_id)["JobState"] == "COMPLETED" and slurm.job(slurm_id)["NumNodes"] == "2"
    log = f.cli("ann", "logs", job_id)
    assert log.returncode == 0 and "rank 0 of 2" in log.stdout and "rank 1 of 2" in log.stdout, log
    assert [e["to"] for e in job["events"] if e["from"] != e["to"]] == ["queued", "starting", "running", "succeeded"]
    # a job no member fits is refused with each member's reason, the cluster's partitions named
    big = f.cli("ann", "submit", "--nodes", "3", "--", "true")
    assert big.returncode == 2 and "hpc: no partition has 3 node(s) of 1 GPUs (" in big.stderr, big.stderr
    assert parts in big.stderr, big.stderr  # each partition named, in the order sinfo gives them


def test_a_stack_rollout_reaches_the_cluster_member(fleet: Fleet, tmp_path: Path) -> None:
    f = fleet
    (tmp_path / "requirements.txt").write_text("torch==2.13.0\n")
    published = f.cli("admin", "fleet", "stack", "publish", "pt", str(tmp_path / "requirements.txt"), "--python",
                      "3.11")  # fmt: skip
    assert published.returncode == 0, published.stderr
    rolled = f.cli("admin", "fleet", "stack", "rollout", "pt", timeout=600)
    assert rolled.returncode == 0, rolled.stdout + rolled.stderr
    assert "box: passed v1" in rolled.stdout and "hpc: passed v1" in rolled.stdout, rolled.stdout
    on_hpc = next(line for line in rolled.stdout.splitlines() if "hpc: passed v1" in line)
    assert f"all-reduce over {GPUS_PER_NODE} " in on_hpc, on_hpc  # a node's GPUs (GRES), through Slurm
    smoke = [j for j in f.hpc.client().jobs() if j["name"].startswith("smoke-pt")]
    assert len(smoke) == 1 and str(smoke[0]["external"]).isdigit(), smoke  # a Slurm job id
    status = f.cli("admin", "fleet", "stack", "status")
    assert status.returncode == 0 and status.stdout.count("has v1 (current)") == 2, status.stdout
