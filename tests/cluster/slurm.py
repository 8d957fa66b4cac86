"""A real Slurm cluster on this machine, on loopback only: one ``slurmctld`` and two ``slurmd -N nodeN``.

Debian's Slurm is built with multiple-slurmd support, so two "nodes" run on one host, each a slurmd
with its own port on 127.0.0.1 (slurmd(8), option -N). Everything lives in one temporary
folder (config, state, spool, logs, pid files); the only thing outside it is one ``/etc/hosts`` line
that maps the node names to 127.0.0.1 (Slurm's node names must resolve), added at start and removed at
stop. Nodes get two GPUs each as GRES on harmless character devices (``mknod c 1 3``), so jobs can ask
for ``--gpus-per-node`` and see ``CUDA_VISIBLE_DEVICES`` set as on a real cluster.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from deskpod.environment.network import free_port

HOSTS = Path("/etc/hosts")
NODES = ("node1", "node2")
CPUS_PER_NODE = 2
GPUS_PER_NODE = 2


def missing() -> str | None:
    """Why a Slurm cluster cannot run here, or None (``make slurm`` installs what is missing)."""
    for tool in ("slurmctld", "slurmd", "sbatch", "munged"):
        if shutil.which(tool) is None and not Path(f"/usr/sbin/{tool}").exists():
            return f"{tool} is not installed (make slurm installs Debian's slurm-wlm and munge)"
    if os.geteuid() != 0:
        return "slurmd must run as root (the test suite runs as root)"
    return None


@dataclass
class SlurmCluster:
    """Start with `start`, stop with `stop`; `env` is what every client command needs (``SLURM_CONF``)."""

    root: Path
    name: str = "deskpod-test"
    tag: str = field(default_factory=lambda: f"deskpod-test-{os.getpid()}")
    first_job_id: int = field(default_factory=lambda: 1000 + 50 * (os.getpid() % 700))
    """Job ids start here: two clusters on one host (the tests and a benchmark) never hand out the same
    ids at once, so their jobs' rendezvous ports (derived from the job id) differ too."""

    @property
    def conf(self) -> Path:
        return self.root / "slurm.conf"

    @property
    def env(self) -> dict[str, str]:
        return {**os.environ, "SLURM_CONF": str(self.conf)}

    def write_config(self) -> None:
        r = self.root
        for sub in ("state", "spool", "log", "dev"):
            (r / sub).mkdir(parents=True, exist_ok=True)
        for i in range(GPUS_PER_NODE):
            dev = r / "dev" / f"gpu{i}"
            if not dev.exists():
                os.mknod(dev, 0o666 | 0o020000, os.makedev(1, 3))  # a character device like /dev/null
        ports = [free_port() for _ in range(2 + len(NODES))]
        nodes = "\n".join(
            f"NodeName={n} NodeHostname=localhost NodeAddr=127.0.0.1 Port={ports[2 + i]} CPUs={CPUS_PER_NODE} "
            f"RealMemory=8000 Gres=gpu:{GPUS_PER_NODE}"
            for i, n in enumerate(NODES)
        )
        self.conf.write_text(
            f"""ClusterName={self.name}
SlurmctldHost=localhost
SlurmctldPort={ports[0]}
SlurmdPort={ports[1]}
SlurmUser=root
AuthType=auth/munge
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core_Memory
MpiDefault=none
GresTypes=gpu
ReturnToService=2
JobRequeue=1
MinJobAge=3600
FirstJobId={self.first_job_id}
KillWait=10
EnforcePartLimits=ALL
SlurmctldTimeout=30
SlurmdTimeout=30
StateSaveLocation={r}/state
SlurmdSpoolDir={r}/spool/%n
SlurmctldPidFile={r}/slurmctld.pid
SlurmdPidFile={r}/slurmd-%n.pid
SlurmctldLogFile={r}/log/slurmctld.log
SlurmdLogFile={r}/log/slurmd-%n.log
{nodes}
PartitionName=debug Nodes=node[1-{len(NODES)}] Default=YES State=UP MaxTime=INFINITE
PartitionName=short Nodes=node1 State=UP MaxTime=1
"""
        )
        (r / "gres.conf").write_text(
            "".join(f"NodeName={n} Name=gpu File={r}/dev/gpu{i}\n" for n in NODES for i in range(GPUS_PER_NODE))
        )

    def start(self) -> SlurmCluster:
        why = missing()
        if why:
            raise RuntimeError(f"cannot start a Slurm cluster: {why}")
        self.write_config()
        _start_munge()
        self._add_hosts()
        subprocess.run(["slurmctld", "-f", str(self.conf)], check=True, env=self.env)
        for n in NODES:
            subprocess.run(["slurmd", "-f", str(self.conf), "-N", n], check=True, env=self.env)
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            out = subprocess.run(["sinfo", "-h", "-N", "-o", "%N %t"], capture_output=True, text=True, env=self.env)
            states = dict(line.split() for line in out.stdout.splitlines() if line.strip())
            if len(states) == len(NODES) and all(s == "idle" for s in states.values()):
                return self
            time.sleep(0.3)
        self.stop()
        raise RuntimeError(f"Slurm nodes did not become idle in 60 s: {states}; logs in {self.root / 'log'}")

    def stop(self) -> None:
        subprocess.run(["scancel", "--full", "--user", "root"], capture_output=True, env=self.env)
        for pidfile in [self.root / "slurmctld.pid", *(self.root / f"slurmd-{n}.pid" for n in NODES)]:
            _stop_pid(pidfile)
        self._remove_hosts()

    def run(self, *argv: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        return subprocess.run(list(argv), capture_output=True, text=True, env=self.env, check=check, timeout=60)

    def job(self, job_id: str) -> dict[str, str]:
        """``scontrol show job -o``, as a dict (JobState, Reason, Restarts, ExitCode, ...)."""
        out = self.run("scontrol", "show", "job", "-o", job_id).stdout
        return dict(tok.split("=", 1) for tok in out.split() if "=" in tok)

    def wait_state(self, job_id: str, states: set[str], timeout: float = 240) -> dict[str, str]:
        deadline = time.monotonic() + timeout
        info: dict[str, str] = {}
        while time.monotonic() < deadline:
            info = self.job(job_id)
            if info.get("JobState") in states:
                return info
            time.sleep(0.5)
        raise AssertionError(f"Slurm job {job_id} did not reach {states} in {timeout} s: {info}")

    def release_requeued(self, job_id: str, idle: Callable[[], bool], timeout: float = 120) -> None:
        """Start a requeued job once its previous attempt's processes are gone (``idle()``): Slurm holds a
        requeued batch job for about two minutes (``Reason=BeginTime``) so that its nodes finish with it
        (a slurmd refuses to launch a job it is still killing); the tests do not wait that out."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            info = self.job(job_id)
            if info.get("JobState") == "PENDING" and info.get("Reason") == "BeginTime" and idle():
                time.sleep(2)  # slurmd's "done with job" comes just after its last process ends
                self.run("scontrol", "update", f"JobId={job_id}", "StartTime=now")
                return
            if info.get("JobState") in ("RUNNING", "COMPLETED", "FAILED", "CANCELLED") and info.get("Restarts") != "0":
                return
            time.sleep(0.3)
        raise AssertionError(f"Slurm job {job_id} was not requeued in {timeout} s: {self.job(job_id)}")

    def _add_hosts(self) -> None:
        text = HOSTS.read_text()
        line = f"127.0.0.1 {' '.join(NODES)} # {self.tag}\n"
        if line not in text:
            HOSTS.write_text(text + ("" if text.endswith("\n") or not text else "\n") + line)

    def _remove_hosts(self) -> None:
        lines = HOSTS.read_text().splitlines(keepends=True)
        HOSTS.write_text("".join(ln for ln in lines if not ln.rstrip().endswith(f"# {self.tag}")))


def _start_munge() -> None:
    if subprocess.run(["pgrep", "-x", "munged"], capture_output=True).returncode == 0:
        return
    Path("/run/munge").mkdir(parents=True, exist_ok=True)
    shutil.chown("/run/munge", "munge", "munge")
    subprocess.run(["runuser", "-u", "munge", "--", "/usr/sbin/munged"], check=True)


def _stop_pid(pidfile: Path, grace: float = 10.0) -> None:
    try:
        pid = int(pidfile.read_text().strip())
    except (OSError, ValueError):
        return
    try:
        os.kill(pid, signal.SIGTERM)
    except ProcessLookupError:
        return
    deadline = time.monotonic() + grace
    while time.monotonic() < deadline:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return
        time.sleep(0.1)
    os.kill(pid, signal.SIGKILL)
