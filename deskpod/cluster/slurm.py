"""Slurm, as deskpod talks to it: its tools, its version, its job states, its jobs.

deskpod drives Slurm through its command-line clients (``sbatch``, ``squeue``, ``scontrol``,
``scancel``, ``sinfo``), which every Slurm site has and every version keeps compatible, rather than
slurmrestd, which few sites run. Answers are read as JSON where the version's serializer plugin gives
it (``squeue --json``: its schema changed in 23.02, 23.11 and 24.05, so the reader takes every shape
it has been seen in, with recorded fixtures per version in the tests) and as text otherwise
(``scontrol show job -o``: one ``Key=Value`` line per job, the same since Slurm 2).

`STATES` is the one table that maps Slurm's job states onto deskpod's.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Any

from deskpod.errors import DeskpodError, UsageError
from deskpod.jobs.states import JobState

S = JobState
TOOLS = ("sbatch", "squeue", "scontrol", "scancel", "sinfo", "srun")

STATES: dict[str, tuple[JobState, str]] = {
    # Slurm job state: (deskpod state, what it means for the user)
    "PENDING": (S.QUEUED, "waiting in Slurm's queue"),
    "REQUEUED": (S.QUEUED, "requeued by Slurm"),
    "REQUEUE_HOLD": (S.QUEUED, "requeued and held (scontrol release to run it)"),
    "REQUEUE_FED": (S.QUEUED, "requeued by the federation"),
    "RESV_DEL_HOLD": (S.QUEUED, "held: its reservation was deleted"),
    "SPECIAL_EXIT": (S.QUEUED, "requeued and held: its exit code is in RequeueExitHold (scontrol release to run it)"),
    "CONFIGURING": (S.STARTING, "nodes allocated, booting or configuring"),
    "RUNNING": (S.RUNNING, "running"),
    "COMPLETING": (S.RUNNING, "finishing: processes ending on its nodes"),
    "SIGNALING": (S.RUNNING, "being signalled"),
    "STAGE_OUT": (S.RUNNING, "staging out"),
    "SUSPENDED": (S.RUNNING, "suspended by Slurm (keeps its nodes)"),
    "STOPPED": (S.RUNNING, "stopped by SIGSTOP (keeps its nodes)"),
    "RESIZING": (S.RUNNING, "changing size"),
    "COMPLETED": (S.SUCCEEDED, "exit code 0 on every node"),
    "FAILED": (S.FAILED, "non-zero exit code"),
    "OUT_OF_MEMORY": (S.FAILED, "out of memory"),
    "TIMEOUT": (S.FAILED, "reached its time limit"),
    "DEADLINE": (S.FAILED, "reached its deadline"),
    "BOOT_FAIL": (S.FAILED, "a node failed to boot"),
    "NODE_FAIL": (S.LOST, "a node of the job failed"),
    "PREEMPTED": (S.PREEMPTED, "preempted by a higher-priority job"),
    "CANCELLED": (S.CANCELLED, "cancelled"),
    "REVOKED": (S.CANCELLED, "revoked by a sibling cluster"),
}


class SlurmError(DeskpodError):
    """Slurm itself failed (its controller unreachable, a command that broke): exit code 1."""


def deskpod_state(slurm_state: str) -> tuple[JobState, str]:
    """deskpod's state for one of Slurm's (``CANCELLED by 0`` and flags like ``+`` are tolerated)."""
    base = slurm_state.split()[0].rstrip("+").upper() if slurm_state.strip() else "PENDING"
    if base not in STATES:
        raise SlurmError(f"unknown Slurm job state {slurm_state!r}; known: {', '.join(STATES)}")
    return STATES[base]


def tool(name: str) -> str:
    """The path of one of Slurm's clients; `UsageError` when Slurm is not on this machine."""
    path = shutil.which(name)
    if path is None:
        raise UsageError(
            f"no Slurm on this machine: {name} is not on PATH; run this on a login node of a Slurm cluster "
            "(or install Slurm's clients: apt-get install slurm-client)"
        )
    return path


UNREACHABLE = re.compile(r"unable to contact slurm controller|connection refused|could not establish a configuration"
                         r"|zero bytes were transmitted|socket timed out|communications connection failure", re.I)  # fmt: skip


def run(argv: Sequence[str], *, timeout: float = 60, check: bool = True, stdin: str | None = None,
        env: Mapping[str, str] | None = None) -> subprocess.CompletedProcess[str]:  # fmt: skip
    """Run one Slurm client; an unreachable controller or a failing command is one-line `SlurmError`."""
    cmd = [tool(argv[0]), *argv[1:]]
    try:
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, input=stdin,
                              env=None if env is None else dict(env))  # fmt: skip
    except subprocess.TimeoutExpired:
        raise SlurmError(
            f"{argv[0]} did not answer in {timeout:g} s; is the Slurm controller up? (scontrol ping)"
        ) from None
    if check and done.returncode != 0:
        raise SlurmError(f"{argv[0]} failed: {message(done.stderr) or f'exit code {done.returncode}'}")
    return done


def message(stderr: str) -> str:
    """Slurm's error lines as one line, the ``sbatch: error:`` prefixes removed."""
    lines = [re.sub(r"^\w+: (error|fatal): ", "", ln.strip()) for ln in stderr.splitlines() if ln.strip()]
    lines = [ln for ln in lines if not ln.startswith(("sbatch: Job", "srun: Job"))]
    text = "; ".join(dict.fromkeys(lines))
    if UNREACHABLE.search(text):
        return f"the Slurm controller is unreachable ({text})"
    return text


# ---------------------------------------------------------------- version
@dataclass(frozen=True, slots=True, order=True)
class Version:
    major: int
    minor: int
    micro: int = 0

    def __str__(self) -> str:
        return f"{self.major}.{self.minor:02d}.{self.micro}"


def parse_version(text: str) -> Version:
    """``slurm-wlm 22.05.8`` / ``slurm 23.11.4`` → `Version`."""
    m = re.search(r"(\d+)\.(\d+)(?:\.(\d+))?", text)
    if m is None:
        raise SlurmError(f"cannot read a Slurm version from {text.strip()!r}")
    return Version(int(m.group(1)), int(m.group(2)), int(m.group(3) or 0))


def version() -> Version:
    return parse_version(run(["sbatch", "--version"], timeout=20).stdout)


NTASKS_PER_NODE_BUG = (Version(22, 5, 5), Version(22, 5, 9))
"""22.05.5-22.05.8 refuse some GPU jobs asking for ``--ntasks-per-node`` ("Requested node configuration is
not available"): a regression of 22.05.5 (commit 49826b9264, SchedMD bug 15153) fixed in 22.05.9 (commit
3b8302ed63, SchedMD bug 15857; CHANGELOG/slurm-22.05.md: "Fix regression in 22.05.5 that causes some jobs that
request --ntasks-per-node to be incorrectly rejected")."""


def gpu_options(v: Version, gpus_per_node: int) -> list[str]:
    """How to ask this Slurm for one launcher per node with ``gpus_per_node`` GPUs each.

    - before 19.05 there are no ``--gpus-*`` options: ``--gres=gpu:N`` with ``--ntasks-per-node=1``;
    - 22.05.5-22.05.8: ``--ntasks-per-node`` with GPUs hits a regression, so one task per node comes from
      ``--ntasks = --nodes`` and the GPUs from ``--gpus-per-task`` (one task per node: the same GPUs);
    - otherwise ``--ntasks-per-node=1 --gpus-per-node=N``.
    """
    if v < Version(19, 5):
        return ["--ntasks-per-node=1", *([f"--gres=gpu:{gpus_per_node}"] if gpus_per_node else [])]
    if NTASKS_PER_NODE_BUG[0] <= v < NTASKS_PER_NODE_BUG[1]:
        return [f"--gpus-per-task={gpus_per_node}"] if gpus_per_node else []
    return ["--ntasks-per-node=1", *([f"--gpus-per-node={gpus_per_node}"] if gpus_per_node else [])]


# ---------------------------------------------------------------- jobs
@dataclass(frozen=True, slots=True)
class SlurmJob:
    """What deskpod reads of one Slurm job."""

    job_id: str
    name: str
    state: str
    """Slurm's own state name (``PENDING``, ``RUNNING``, ...)."""
    reason: str
    """Why it waits (``Resources``, ``Priority``, ...) or why it ended; ``None`` is given as ''."""
    restarts: int
    exit_code: int | None
    signal: int | None
    nodes: str
    stdout: str
    comment: str
    user: str
    submit_time: float | None = None
    start_time: float | None = None
    end_time: float | None = None

    @property
    def deskpod_state(self) -> JobState:
        return deskpod_state(self.state)[0]

    def describe(self) -> str:
        """One line: Slurm's state, what it means, and its reason."""
        meaning = deskpod_state(self.state)[1]
        why = f" ({self.reason})" if self.reason else ""
        return f"Slurm {self.state}{why}: {meaning}"

    def to_json(self) -> dict[str, Any]:
        """Every field, the job id and Slurm's state named ``slurm_id`` and ``slurm_state``, beside deskpod's."""
        doc = asdict(self)
        ids = {"slurm_id": doc.pop("job_id"), "slurm_state": doc.pop("state")}
        return ids | {"state": self.deskpod_state.value} | doc


def _clean(value: str | None) -> str:
    return "" if value in (None, "(null)", "None", "N/A") else str(value)


def parse_scontrol_jobs(text: str) -> list[SlurmJob]:
    """``scontrol show job -o``: one line per job of ``Key=Value`` tokens (values without spaces, except
    the last keys; ``Command=`` and ``Comment=`` may hold spaces, so a token without ``=`` extends the previous)."""
    jobs = []
    for line in text.splitlines():
        if not line.startswith("JobId="):
            continue
        fields: dict[str, str] = {}
        last = ""
        for tok in line.split(" "):
            key, eq, value = tok.partition("=")
            if eq and re.fullmatch(r"[A-Za-z][A-Za-z0-9_:/]*", key) and (key not in fields or key == last):
                fields[key], last = value, key
            elif last:
                fields[last] += " " + tok
        code, _, sig = fields.get("ExitCode", "").partition(":")
        jobs.append(
            SlurmJob(
                job_id=fields["JobId"],
                name=fields.get("JobName", ""),
                state=fields.get("JobState", "PENDING"),
                reason=_clean(fields.get("Reason")),
                restarts=int(fields.get("Restarts", "0") or 0),
                exit_code=int(code) if code.isdigit() else None,
                signal=int(sig) if sig.isdigit() and int(sig) else None,
                nodes=_clean(fields.get("NodeList")),
                stdout=_clean(fields.get("StdOut")),
                comment=_clean(fields.get("Comment")),
                user=fields.get("UserId", "").split("(")[0],
            )
        )
    return jobs


def _number(value: Any) -> float | None:
    """Slurm JSON numbers: plain (22.05) or ``{"set": true, "infinite": false, "number": N}`` (23.02+)."""
    if isinstance(value, dict):
        if not value.get("set", True) or value.get("infinite"):
            return None
        value = value.get("number")
    return float(value) if isinstance(value, int | float) and not isinstance(value, bool) else None


def _exit(value: Any) -> tuple[int | None, int | None]:
    """``exit_code`` as (exit code, signal).

    - 22.05 (openapi v0.0.38): the raw wait status as a plain int;
    - 23.02 (data_parser v0.0.39): the same raw status, wrapped as ``{"set", "infinite", "number"}``;
    - 23.11+ (v0.0.40+): ``{"status": [...], "return_code": {number}, "signal": {"id": {number}, "name"}}``.
    A raw status above 16 bits is Slurm's NO_VAL/INFINITE (a job that never ran, e.g. an ``srun`` allocation
    cancelled while pending: 4294967295 in the 22.05 fixture): no exit code, no signal."""
    if isinstance(value, dict) and ("return_code" in value or "signal" in value or "status" in value):
        code = _number(value.get("return_code"))
        sig = value.get("signal", {})
        signum = _number(sig.get("id") if isinstance(sig, dict) else sig)
        return (int(code) if code is not None else None), (int(signum) if signum else None)
    n = _number(value)
    if n is None or not 0 <= n <= 0xFFFF:
        return None, None
    # the raw wait status: exit code in the high byte, signal in the low 7 bits
    raw = int(n)
    return raw >> 8, (raw & 0x7F) or None


def _time(value: Any) -> float | None:
    """A Unix time; Slurm writes 0 (or an unset number) for "not yet"."""
    t = _number(value)
    return t if t else None


NO_VAL = 0xFFFFFFFE
"""Slurm's "not set" for 32-bit fields (an array task id of a job that is not an array task)."""


def _stdout(j: Mapping[str, Any], job_id: str, name: str, user: str) -> str:
    """The job's output file as ``scontrol show job`` gives it (``StdOut=``), mirroring Slurm's own
    ``slurm_get_job_stdout`` (src/api/job_info.c): ``%A %a %j %u %x`` replaced, a relative path put under
    the working directory, and sbatch's default ``slurm-%j.out`` (``slurm-%A_%a.out`` for an array task) when
    none was given. 25.05+ gives the result itself (``stdout_expanded``); before, ``standard_output`` is the
    pattern as submitted (``/runs/x/slurm-%j.out``), or '' for the default."""
    expanded = _clean(j.get("stdout_expanded"))
    if expanded:
        return expanded
    pattern = _clean(j.get("standard_output"))
    cwd = _clean(j.get("current_working_directory"))
    task = _number(j.get("array_task_id"))
    array = int(_number(j.get("array_job_id")) or 0)
    task_id = int(task) if task is not None and task < NO_VAL else NO_VAL
    if not pattern:
        if not j.get("batch_flag"):
            return ""
        default = f"slurm-{array}_{task_id}.out" if array else f"slurm-{job_id}.out"
        return f"{cwd}/{default}"
    for key, value in (("%A", str(array) if task_id != NO_VAL else job_id), ("%a", str(task_id)),
                       ("%j", job_id), ("%u", user), ("%x", name)):  # fmt: skip
        pattern = pattern.replace(key, value)
    return pattern if pattern.startswith("/") else f"{cwd}/{pattern}"


def parse_squeue_json(text: str) -> list[SlurmJob]:
    """``squeue --json`` of Slurm 21.08-24.x (openapi v0.0.37 ... data_parser v0.0.41)."""
    try:
        data = json.loads(text)
    except json.JSONDecodeError as e:
        raise SlurmError(f"squeue --json gave no JSON ({e})") from None
    errors = data.get("errors") or []
    if errors:  # e.g. an unreachable controller: squeue still exits 0, with no jobs and this list
        first = errors[0] if isinstance(errors[0], dict) else {"error": str(errors[0])}
        what = "; ".join(str(first[k]) for k in ("source", "description", "error") if first.get(k))
        raise SlurmError(f"squeue --json reported an error: {what or first}")
    out = []
    for j in data.get("jobs", []):
        state = j.get("job_state")
        if isinstance(state, list):  # 23.11+: a list of the base state and its flags
            state = next((s for s in state if s in STATES), state[0] if state else "PENDING")
        code, sig = _exit(j.get("exit_code"))
        job_id, name, user = str(j.get("job_id")), str(j.get("name", "")), str(j.get("user_name", ""))
        out.append(
            SlurmJob(
                job_id=job_id,
                name=name,
                state=str(state or "PENDING"),
                reason=_clean(j.get("state_reason")),
                restarts=int(_number(j.get("restart_cnt")) or 0),
                exit_code=code,
                signal=sig,
                nodes=_clean(j.get("nodes")),
                stdout=_stdout(j, job_id, name, user),
                comment=_clean(
                    j.get("comment") if isinstance(j.get("comment"), str) else (j.get("comment") or {}).get("job")
                ),
                user=user,
                submit_time=_time(j.get("submit_time")),
                start_time=_time(j.get("start_time")),
                end_time=_time(j.get("end_time")),
            )
        )
    return out


def jobs(job_ids: Sequence[str] | None = None, *, user: str | None = None) -> list[SlurmJob]:
    """The controller's view of these jobs (pending, running, and ended ones it still holds: ``MinJobAge``).

    Text (``scontrol show job -o``) is the source of truth here: it holds every field deskpod needs on every
    version; ``squeue --json`` lacks the restart count before 23.02 on some builds. An id the controller
    no longer knows is simply missing from the answer."""
    if job_ids is not None and not job_ids:
        return []
    if job_ids is not None and len(job_ids) == 1:
        done = run(["scontrol", "show", "job", "-o", job_ids[0]], check=False)
        if done.returncode != 0:
            if "invalid job id" in done.stderr.lower():
                return []
            raise SlurmError(f"scontrol failed: {message(done.stderr)}")
        return parse_scontrol_jobs(done.stdout)
    done = run(["scontrol", "show", "job", "-o"], check=False)
    if done.returncode != 0 and "no jobs in the system" not in (done.stdout + done.stderr).lower():
        raise SlurmError(f"scontrol failed: {message(done.stderr)}")
    found = parse_scontrol_jobs(done.stdout)
    wanted = set(job_ids) if job_ids is not None else None
    return [j for j in found if (wanted is None or j.job_id in wanted) and (user is None or j.user == user)]


def node_address(node: str) -> str:
    """The address Slurm reaches ``node`` at (``NodeAddr`` of ``scontrol show node``): where a service the pod
    reaches on the node listens."""
    text = run(["scontrol", "show", "node", "--oneliner", node]).stdout
    m = re.search(r"\bNodeAddr=(\S+)", text)
    if m is None:
        raise SlurmError(f"scontrol show node {node} gave no NodeAddr: {text.strip()[:200]!r}")
    return m.group(1)


def cancel(job_id: str, *, signal: str | None = None) -> None:
    """``scancel`` (every step and the batch script), or send one signal to the job's steps."""
    run(["scancel", *([f"--signal={signal}"] if signal else []), job_id])


def requeue(job_id: str) -> None:
    run(["scontrol", "requeue", job_id])


# ---------------------------------------------------------------- the cluster's shape
@dataclass(frozen=True, slots=True)
class Partition:
    name: str
    nodes: int
    default: bool
    gpus_per_node: int
    """The most GPUs a node of it has (0: no GPU GRES)."""
    gres: tuple[str, ...]
    """GRES names its nodes have (``gpu``, ...)."""
    state: str


def partitions() -> list[Partition]:
    """Every partition with its node count and GPU GRES, from ``sinfo`` (one line per node and partition)."""
    return parse_partitions(run(["sinfo", "-h", "-N", "-o", PARTITION_FORMAT]).stdout)


PARTITION_FORMAT = "%R|%N|%G|%a|%P"
"""``sinfo -h -N -o`` for `parse_partitions`: partition, node, GRES, availability, partition as shown
(``debug*`` for the default)."""


def parse_partitions(text: str) -> list[Partition]:
    """``sinfo -h -N -o PARTITION_FORMAT`` → `Partition` per partition (GRES like ``gpu:2``,
    ``gpu:a100:4(S:0-1)``, ``gpu:2,shard:8``)."""
    by: dict[str, dict[str, Any]] = {}
    for line in text.splitlines():
        parts = line.strip().split("|")
        if len(parts) != 5:
            continue
        name, node, gres, avail, shown = parts
        p = by.setdefault(
            name, {"nodes": set(), "gpus": 0, "gres": set(), "default": shown.endswith("*"), "state": avail}
        )
        p["nodes"].add(node)
        for item in gres.split(","):
            m = re.match(r"(\w+)(?::[\w.-]+)?:(\d+)", item.strip())
            if m:
                p["gres"].add(m.group(1))
                if m.group(1) == "gpu":
                    p["gpus"] = max(p["gpus"], int(m.group(2)))
    return [
        Partition(n, len(p["nodes"]), p["default"], p["gpus"], tuple(sorted(p["gres"])), p["state"])
        for n, p in by.items()
    ]


def parse_config(text: str) -> dict[str, str]:
    """``scontrol show config``: its ``Key = Value`` lines as a dict (``MinJobAge`` → ``3600 sec``);
    ``SlurmctldHost[0]`` keeps its index; the trailing sections (plugin settings) are read the same way."""
    out: dict[str, str] = {}
    for line in text.splitlines():
        key, eq, value = line.partition("=")
        key = key.strip()
        if eq and key and " " not in key:
            out.setdefault(key, value.strip())
    return out


def ping() -> str:
    """``scontrol ping``: the controller's answer; `SlurmError` when it is down."""
    done = run(["scontrol", "ping"], check=False, timeout=20)
    text = (done.stdout + done.stderr).strip()
    if done.returncode != 0 or "UP" not in text:
        raise SlurmError(f"the Slurm controller is unreachable: {text or 'scontrol ping gave no answer'}")
    return text
