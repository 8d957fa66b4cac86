"""Many nodes on Slurm: 2 nodes against 1, the Slurm path against plain torchrun, a requeue's cost.

    .venv/bin/python benchmarks/bench_cluster.py               # 3 rounds; table + JSON, updates docs/benchmarks.md
    .venv/bin/python benchmarks/bench_cluster.py --rounds 1 --no-docs

A real Slurm cluster on this machine, started here and stopped at the end (also on error):
`tests.cluster.slurm.SlurmCluster` in a temporary folder, one ``slurmctld`` and two ``slurmd`` "nodes"
(node1, node2) on 127.0.0.1, each with the machine's 2 cores and 2 fake GPUs as GRES. Every job is a
ResNet-18 on synthetic 3x64x64 images, global batch 16, fp32 on CPU workers (Gloo over loopback).

1. **2 nodes x 1 worker against 1 node x 2 workers**, both ``deskpod submit --cluster slurm``, in turn
   (the order swapped every round); throughput is each run's ``summary.json`` (``throughput_images_per_s``:
   every step but the first). Beside them: ``deskpod plan predict --machine local`` for both
   configurations, after ``deskpod plan calibrate`` on the same shape and per-worker batch. The two fake
   nodes share the same 2 cores, so each node's one worker would get both (deskpod gives a node's workers
   all its cores) and the 2-node run would run 4 threads on 2 cores; the 2-node jobs are submitted with
   ``DESKPOD_CPU_SLOTS=0`` (one slot: one thread), so both configurations run 2 workers x 1 thread.
2. **Submitted -> first training step**, deskpod on Slurm (2 nodes) against a plain batch script of the
   same training: ``srun torchrun --nnodes 2 --nproc-per-node 1 --rdzv-backend c10d`` running
   `benchmarks/reference_ddp.py`. The clock starts just before ``deskpod submit`` / ``sbatch`` is
   called; the first step is when global rank 0 finished its first optimizer step, written by the
   training: deskpod's ``metrics.jsonl`` row of step 1 (``log_every_steps = 1``; its ``time`` is taken
   right after the step and the loss all-reduce), the reference's ``first-step.json``. Target: <= 1.1x.
3. **A requeue**: a 2-node job checkpointing every K steps is stopped in the middle of an interval by
   Slurm's warning signal (``scancel --signal=USR2``), by SIGKILL of node2's launcher and its worker at
   once (what losing the node does to them), and by SIGKILL of node2's launcher alone. Slurm's requeue
   hold is released as soon as the old attempt's processes are gone and the rendezvous port is free
   (`SlurmCluster.release_requeued`). Steps redone = the step attempt 1 reached (its log) - the step
   attempt 2 resumed from (its log); target <= K. Also timed: signal -> attempt 2's first step.

Nodes are idle before each submission. The machine has 2 cores and other work may share them:
medians over ``--rounds`` (paired ratios per round), with every run listed.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import shlex
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import tomli_w
from docs_section import cpu_model, publish

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from deskpod.train.world import rendezvous_port  # noqa: E402
from tests.cluster.slurm import SlurmCluster, missing  # noqa: E402

SECTION = "## Cluster (Slurm)"
INTRO = (
    "deskpod's Slurm backend (`deskpod/cluster/`) on a real Slurm cluster started on this machine: one\n"
    "`slurmctld` and two `slurmd` nodes on 127.0.0.1 (`tests/cluster/slurm.py`)."
)
SUB = "### Two nodes, the Slurm path, requeues (bench_cluster.py)"
PY = sys.executable
FINAL = {"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "PREEMPTED", "OUT_OF_MEMORY", "BOOT_FAIL"}


def log(text: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {text}", file=sys.stderr, flush=True)


# ---------------------------------------------------------------- the cluster and its jobs
@dataclass
class Bench:
    cluster: SlurmCluster
    home: Path
    work: Path
    args: argparse.Namespace

    def env(self, **extra: str) -> dict[str, str]:
        return {**self.cluster.env, "DESKPOD_HOME": str(self.home), **extra}

    def train(self, steps: int, **more: Any) -> dict[str, Any]:
        a = self.args
        return {"model": a.model, "data": f"synthetic:{a.shape}", "synthetic_samples": steps * a.global_batch,
                "steps": steps, "global_batch_size": a.global_batch, "seed": 3, **more}  # fmt: skip

    def wait_idle(self, timeout: float = 180) -> None:
        """Every node idle (the last job's processes gone and Slurm done with it) before the next submission."""
        deadline = time.monotonic() + timeout
        states: dict[str, str] = {}
        while time.monotonic() < deadline:
            out = self.cluster.run("sinfo", "-h", "-N", "-o", "%N %t", check=False).stdout
            states = dict(line.split() for line in out.splitlines() if line.strip())
            if states and all(s == "idle" for s in states.values()):
                return
            time.sleep(0.3)
        raise SystemExit(f"the Slurm nodes did not become idle in {timeout:.0f} s: {states}")

    def wait_end(self, job_id: str, restarts: int = 0, timeout: float = 600) -> dict[str, str]:
        deadline = time.monotonic() + timeout
        info: dict[str, str] = {}
        while time.monotonic() < deadline:
            info = self.cluster.job(job_id)
            if info.get("JobState") in FINAL and info.get("Restarts") == str(restarts):
                return info
            if int(info.get("Restarts", "0")) > restarts:
                raise SystemExit(f"Slurm job {job_id} was requeued more than {restarts} time(s): {info}")
            time.sleep(0.5)
        raise SystemExit(f"Slurm job {job_id} did not end in {timeout:.0f} s: {info}")

    def submit(self, name: str, nodes: int, devices: int, train: dict[str, Any]) -> tuple[float, str, Path]:
        """``deskpod submit --cluster slurm``; (the time just before it was called, Slurm's job id, its folder)."""
        job = self.work / f"{name}.toml"
        job.write_text(tomli_w.dumps({"name": name, "nodes": nodes, "devices": devices, "max_runtime": 900,
                                      "train": train}))  # fmt: skip
        # The two fake nodes share this machine's cores: one slot (one thread) per node, as on one box.
        env = self.env(**({"DESKPOD_CPU_SLOTS": "0"} if nodes > 1 else {}))
        self.wait_idle()
        t0 = time.time()
        done = subprocess.run([PY, "-m", "deskpod", "submit", "--cluster", "slurm", str(job)], capture_output=True,
                              text=True, env=env, timeout=120)  # fmt: skip
        if done.returncode != 0 or not done.stdout.strip().isdigit():
            raise SystemExit(f"deskpod submit failed ({done.returncode}): {done.stdout}{done.stderr}")
        job_id = done.stdout.strip()
        return t0, job_id, (self.home / "cluster" / "by-id" / job_id).resolve()

    def finished(self, job_id: str, folder: Path, restarts: int = 0) -> None:
        info = self.wait_end(job_id, restarts)
        if info.get("JobState") != "COMPLETED":
            logs = "".join(p.read_text() for p in sorted((folder / "logs").glob("attempt-*.log")))
            raise SystemExit(f"Slurm job {job_id} ended {info.get('JobState')}: {info}\n{logs}")


def metrics_rows(run: Path) -> list[dict[str, Any]]:
    try:
        text = (run / "metrics.jsonl").read_text()
    except OSError:
        return []
    rows = []
    for line in text.splitlines():
        with contextlib.suppress(json.JSONDecodeError):
            rows.append(json.loads(line))
    return [r for r in rows if r.get("kind") == "train"]


def processes_of(folder: Path) -> list[int]:
    """Every live process whose command line names the job's folder (its launchers and workers)."""
    pids = []
    for p in Path("/proc").iterdir():
        if p.name.isdigit() and int(p.name) != os.getpid():
            with contextlib.suppress(OSError):
                if str(folder).encode() in (p / "cmdline").read_bytes() and (p / "stat").read_text().split()[2] != "Z":
                    pids.append(int(p.name))
    return pids


def node_processes(folder: Path, node: str) -> tuple[int | None, list[int]]:
    """The job's processes on ``node`` (``SLURMD_NODENAME``): its launcher's pid (``deskpod cluster launch
    FOLDER``), and the pids of the launcher and its workers."""
    launcher, pids = None, []
    for pid in processes_of(folder):
        with contextlib.suppress(OSError):
            if f"SLURMD_NODENAME={node}".encode() in Path(f"/proc/{pid}/environ").read_bytes().split(b"\0"):
                pids.append(pid)
                if b"launch" in Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0"):
                    launcher = pid
    return launcher, pids


# ---------------------------------------------------------------- 1. two nodes against one
def calibrate(b: Bench) -> dict[str, Any]:
    a = b.args
    per_worker = a.global_batch // 2
    cmd = [PY, "-m", "deskpod", "plan", "calibrate", "--shape", a.shape, "--batch", str(per_worker),
           "--model", a.model, "--steps", str(a.calibrate_steps), "--json"]  # fmt: skip
    log("plan: " + shlex.join(cmd[1:]))
    done = subprocess.run(cmd, capture_output=True, text=True, env=b.env(), timeout=600)
    if done.returncode != 0:
        raise SystemExit(f"deskpod plan calibrate failed: {done.stderr}")
    return dict(json.loads(done.stdout))


def predict(b: Bench, nodes: int, devices: int) -> tuple[float, str]:
    """``deskpod plan predict --machine local`` for ``nodes`` x ``devices``: (images/s, the command)."""
    from deskpod.plan.local import scaled_model

    a = b.args
    c, h, w = (int(v) for v in a.shape.split("x"))
    m = scaled_model(a.model, (c, h, w))  # what calibrate fitted to: the model at this input size
    argv = ["plan", "predict", "--machine", "local", "--nodes", str(nodes), "--devices", str(devices),
            "--gflops", f"{m.forward_gflops:.6g}", "--params", f"{m.params_m:.6g}", "--activations",
            f"{m.activations_m:.6g}", "--batch", str(a.global_batch // (nodes * devices)), "--data", "synthetic",
            "--precision", "fp32"]  # fmt: skip
    if nodes > 1:
        argv += ["--network", a.network]
    done = subprocess.run([PY, "-m", "deskpod", *argv, "--json"], capture_output=True, text=True, env=b.env())
    if done.returncode != 0:
        raise SystemExit(f"deskpod {shlex.join(argv)} failed: {done.stderr}")
    return float(json.loads(done.stdout)[0]["images_per_s"]), "deskpod " + shlex.join(argv)


def throughput_run(b: Bench, label: str, nodes: int, devices: int, r: int) -> dict[str, Any]:
    name = f"tput-{nodes}n{devices}w-r{r}"
    t0, job_id, folder = b.submit(name, nodes, devices, b.train(b.args.steps))
    b.finished(job_id, folder)
    s = json.loads((folder / "runs" / name / "summary.json").read_text())
    threads = json.loads((folder / "runs" / name / "launch.json").read_text())["threads"]
    got = (s["world_size"], s["nodes"], s["global_batch"], s["steps"], threads)
    if got != (2, nodes, b.args.global_batch, b.args.steps, 1):
        raise SystemExit(f"{name}: expected 2 workers of 1 thread on {nodes} node(s), got {got}: {s}")
    log(f"{label} round {r}: {s['throughput_images_per_s']} img/s ({s['train_time_s']} s training, "
        f"{time.time() - t0:.0f} s from submission to the end)")  # fmt: skip
    return {
        "images_per_s": float(s["throughput_images_per_s"]),
        "train_time_s": float(s["train_time_s"]),
        "job": job_id,
    }


def two_nodes_vs_one(b: Bench) -> dict[str, Any]:
    cal = calibrate(b)
    pred1, cmd1 = predict(b, 1, 2)
    pred2, cmd2 = predict(b, 2, 1)
    one: list[dict[str, Any]] = []
    two: list[dict[str, Any]] = []
    for r in range(1, b.args.rounds + 1):
        order = [(one, "1 node x 2 workers", 1, 2), (two, "2 nodes x 1 worker", 2, 1)]
        for out, label, nodes, devices in order if r % 2 else order[::-1]:
            out.append(throughput_run(b, label, nodes, devices, r))
    ratios = [t["images_per_s"] / o["images_per_s"] for o, t in zip(one, two, strict=True)]
    m = cal["measurements"]
    return {
        "one_node": [x["images_per_s"] for x in one], "two_nodes": [x["images_per_s"] for x in two],
        "ratios": ratios, "ratio": statistics.median(ratios),
        "predicted_one_node": pred1, "predicted_two_nodes": pred2, "predict_commands": [cmd1, cmd2],
        "calibration": {"images_per_s": m["images_per_s"], "peak_tflops": m["peak_tflops"],
                        "comm_busbw_gbs": m["comm_busbw_gbs"], "factors": cal["factors"], "when": cal["when"]},
    }  # fmt: skip


# ---------------------------------------------------------------- 2. the Slurm path's overhead
REFERENCE_SCRIPT = """#!/bin/bash
#SBATCH --job-name=reference-ddp
#SBATCH --nodes=2
#SBATCH --ntasks=2
#SBATCH --gpus-per-task=1
#SBATCH --partition=debug
#SBATCH --output={dir}/slurm-%j.out
#SBATCH --time=15
# Plain Slurm + torchrun (as torchx writes it): one elastic agent per node, c10d rendezvous on the first node.
set -u
date +%s.%N > {dir}/batch-started
head=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n 1)
port=$({py} -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
export OMP_NUM_THREADS=1
srun --nodes=2 --ntasks=2 --kill-on-bad-exit=1 {torchrun} --nnodes 2 --nproc-per-node 1 --rdzv-backend c10d \\
    --rdzv-endpoint "$head:$port" --rdzv-id "$SLURM_JOB_ID" {script} --model {model} --shape {shape} \\
    --global-batch {batch} --steps {steps} --first-step-file {dir}/first-step.json
"""


def first_step_deskpod(b: Bench, r: int) -> dict[str, float]:
    name = f"first-r{r}"
    t0, job_id, folder = b.submit(name, 2, 1, b.train(b.args.first_steps, log_every_steps=1))
    b.finished(job_id, folder)
    run = folder / "runs" / name
    rows = metrics_rows(run)
    if not rows or rows[0]["step"] != 1:
        raise SystemExit(f"{name}: no metrics row for step 1 in {run / 'metrics.jsonl'}")
    attempts = json.loads((folder / "attempts.json").read_text())
    return {"first_step_s": rows[0]["time"] - t0, "batch_s": float(attempts[0]["started"]) - t0,
            "launchers_ready_s": (run / "launch.json").stat().st_mtime - t0,
            "workers_started_s": (run / "workers" / "rank0.pid").stat().st_mtime - t0}  # fmt: skip


def first_step_reference(b: Bench, r: int) -> dict[str, float]:
    a = b.args
    folder = b.work / f"reference-r{r}"
    folder.mkdir()
    script = folder / "reference.sbatch"
    torchrun = Path(PY).with_name("torchrun")
    script.write_text(REFERENCE_SCRIPT.format(dir=folder, py=PY, torchrun=torchrun if torchrun.exists() else "torchrun",
                                              script=ROOT / "benchmarks" / "reference_ddp.py", model=a.model,
                                              shape=a.shape, batch=a.global_batch, steps=a.first_steps))  # fmt: skip
    b.wait_idle()
    t0 = time.time()
    done = subprocess.run(["sbatch", "--parsable", str(script)], capture_output=True, text=True, env=b.cluster.env)
    if done.returncode != 0:
        raise SystemExit(f"sbatch failed: {done.stderr}")
    job_id = done.stdout.strip().split(";")[0]
    info = b.wait_end(job_id)
    first = folder / "first-step.json"
    if info.get("JobState") != "COMPLETED" or not first.exists():
        out = "".join(p.read_text() for p in folder.glob("slurm-*.out"))
        raise SystemExit(f"the reference job {job_id} ended {info.get('JobState')}: {out}")
    at = json.loads(first.read_text())
    return {"first_step_s": at["first_step_at"] - t0, "batch_s": float((folder / "batch-started").read_text()) - t0,
            "workers_started_s": at["worker_started_at"] - t0}  # fmt: skip


def slurm_path_overhead(b: Bench) -> dict[str, Any]:
    desk: list[dict[str, float]] = []
    ref: list[dict[str, float]] = []
    for r in range(1, b.args.rounds + 1):
        for side in ("deskpod", "reference") if r % 2 else ("reference", "deskpod"):
            if side == "deskpod":
                desk.append(first_step_deskpod(b, r))
            else:
                ref.append(first_step_reference(b, r))
            got = (desk if side == "deskpod" else ref)[-1]
            log(f"{side} round {r}: first step {got['first_step_s']:.2f} s after submission")
    ratios = [d["first_step_s"] / x["first_step_s"] for d, x in zip(desk, ref, strict=True)]

    def medians(rows: list[dict[str, float]]) -> dict[str, float]:
        return {k: statistics.median(row[k] for row in rows) for k in rows[0]}

    return {"deskpod": [d["first_step_s"] for d in desk], "reference": [x["first_step_s"] for x in ref],
            "ratios": ratios, "ratio": statistics.median(ratios), "met": statistics.median(ratios) <= 1.1,
            "deskpod_parts": medians(desk), "reference_parts": medians(ref)}  # fmt: skip


# ---------------------------------------------------------------- 3. a requeue
def port_free(port: int) -> bool:
    """Whether ``port`` can be bound on 127.0.0.1 the way deskpod's launcher checks it (`check_port_free`:
    ``SO_REUSEADDR``, as the rendezvous store binds it)."""
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def slurm_time(text: str) -> float | None:
    with contextlib.suppress(ValueError):
        return time.mktime(time.strptime(text, "%Y-%m-%dT%H:%M:%S"))
    return None


def requeue(b: Bench, how: str) -> dict[str, Any]:
    """One 2-node job stopped in the middle of a checkpoint interval by ``how``: ``usr2`` (Slurm's warning),
    ``launcher`` (node2's launcher SIGKILLed) or ``node`` (node2's launcher and workers SIGKILLed at once:
    what losing the node does to them)."""
    every = b.args.every
    name = f"requeue-{how}"
    _, job_id, folder = b.submit(name, 2, 1, b.train(b.args.requeue_steps, log_every_steps=1,
                                                     checkpoint_every_steps=every))  # fmt: skip
    run = folder / "runs" / name
    # Past the second checkpoint, halfway through the next interval.
    aim = 2 * every + every // 2
    deadline = time.monotonic() + 600
    while True:
        rows = metrics_rows(run)
        if rows and rows[-1]["step"] >= aim:
            break
        if time.monotonic() > deadline or b.cluster.job(job_id).get("JobState") in FINAL:
            raise SystemExit(f"{name}: training did not reach step {aim}: {b.cluster.job(job_id)}")
        time.sleep(0.1)
    at_signal = int(rows[-1]["step"])  # the last step rank 0 logged before the signal
    orphan = None  # the parent pid of node2's worker just after its launcher was killed, if it lived on
    if how == "usr2":
        t_signal = time.time()
        b.cluster.run("scancel", "--signal=USR2", job_id)  # what --signal=USR2@120 sends before the time limit
    else:
        launcher, pids = node_processes(folder, "node2")
        if launcher is None:
            raise SystemExit(f"{name}: node2's launcher not found")
        t_signal = time.time()
        for pid in [launcher] if how == "launcher" else [launcher, *(p for p in pids if p != launcher)]:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        time.sleep(0.5)
        for pid in pids:  # what became of node2's worker: alive, and whose child now
            with contextlib.suppress(OSError, IndexError):
                if pid != launcher and Path(f"/proc/{pid}/stat").read_text().split()[2] != "Z":
                    orphan = int(Path(f"/proc/{pid}/stat").read_text().split()[3])
    while (info := b.cluster.job(job_id)).get("JobState") != "PENDING":
        if info.get("JobState") in FINAL:
            raise SystemExit(f"{name}: the job ended instead of being requeued: {info}")
        time.sleep(0.1)
    t_requeued = time.time()
    begin = slurm_time(info.get("StartTime", ""))
    # Released once the old attempt's processes are gone and the job's rendezvous port is free again (the first
    # node's launcher refuses to start on a port in use).
    port = rendezvous_port(job_id)
    seen: dict[str, float] = {}
    states: list[str] = []

    def idle() -> bool:
        if processes_of(folder):
            return False
        seen.setdefault("gone", time.time())
        if not port_free(port):
            if not states:  # what holds it, the first time
                out = subprocess.run(["ss", "-Htan", f"sport = :{port}"], capture_output=True, text=True).stdout
                states.extend(sorted({line.split()[0] for line in out.splitlines() if line.strip()}) or ["?"])
            return False
        seen.setdefault("port", time.time())
        return True

    b.cluster.release_requeued(job_id, idle)
    t_released = time.time()
    b.finished(job_id, folder, restarts=1)
    causes = [a.get("cause") for a in json.loads((folder / "attempts.json").read_text())]
    expected = ["warning" if how == "usr2" else "node", None]
    if causes != expected:
        raise SystemExit(f"{name}: attempts ended by {causes}, expected {expected}")
    log1 = (folder / "logs" / "attempt-1.log").read_text()
    log2 = (folder / "logs" / "attempt-2.log").read_text()
    if how == "usr2":
        m = re.search(r"stopped by SIGUSR2 at step (\d+)/", log1)
        stopped = int(m.group(1)) if m else None
    else:
        steps = re.findall(r"step (\d+)/\d+\s", log1)  # the last step rank 0 logged (log_every_steps = 1)
        stopped = int(steps[-1]) if steps else None
    m = re.search(r"resumed from step-\d+\.pt \(step (\d+)\)", log2)
    if stopped is None or m is None:
        raise SystemExit(f"{name}: cannot read the stop and the resume from the logs:\n{log1}\n{log2}")
    resumed = int(m.group(1))
    # Attempt 2's first step; none when attempt 1's workers outlived their launchers and finished the run.
    first2 = next((row for row in metrics_rows(run) if row["step"] == resumed + 1), None)
    if first2 is None and resumed < b.args.requeue_steps:
        raise SystemExit(f"{name}: no metrics row for step {resumed + 1}")
    t_first2 = first2["time"] if first2 else None
    log(f"{name}: signal at step {at_signal}, attempt 1 reached {stopped}, attempt 2 resumed from {resumed}")
    return {
        "how": how, "every": every, "step_at_signal": at_signal, "stopped_at": stopped, "resumed_from": resumed,
        "redone": stopped - resumed, "met": 0 <= stopped - resumed <= every,
        "signal_to_requeued_s": t_requeued - t_signal, "requeued_to_released_s": t_released - t_requeued,
        "processes_gone_s": seen.get("gone", t_released) - t_requeued,
        "port_wait_s": seen.get("port", t_released) - seen.get("gone", t_released), "port_states": states,
        "worker_outlived_launcher_ppid": orphan,
        "released_to_first_step_s": t_first2 - t_released if t_first2 else None,
        "signal_to_first_step_s": t_first2 - t_signal if t_first2 else None,
        "slurm_hold_s": (begin - t_requeued) if begin else None,
    }  # fmt: skip


# ---------------------------------------------------------------- report
def report(res: dict[str, Any], command: str) -> str:
    t, o = res["throughput"], res["overhead"]
    a = res["args"]
    one, two = statistics.median(t["one_node"]), statistics.median(t["two_nodes"])
    p1, p2 = t["predicted_one_node"], t["predicted_two_nodes"]
    c = t["calibration"]

    def runs(xs: list[float]) -> str:
        return ", ".join(f"{x:.1f}" for x in xs)

    dp, rp = o["deskpod_parts"], o["reference_parts"]
    rq = res["requeue"]
    what = {"usr2": "`scancel --signal=USR2` (Slurm's warning)",
            "node": "SIGKILL of node2's launcher and its worker at once (a lost node)",
            "launcher": "SIGKILL of node2's launcher alone"}  # fmt: skip

    short = {"usr2": "the warning signal", "node": "a lost node", "launcher": "a lost launcher"}

    def bound(q: dict[str, Any]) -> str:
        if q["signal_to_first_step_s"] is None:
            return f"not exercised for {short[q['how']]} (its workers finished the run)"
        return f"**{'met' if q['met'] else 'missed'}** for {short[q['how']]} ({q['redone']} of K = {q['every']} steps)"

    def sec(x: float | None, bold: bool = False) -> str:
        return "none (see below)" if x is None else f"**{x:.1f}**" if bold else f"{x:.1f}"

    def done_note(q: dict[str, Any]) -> str:
        return "; the run had already finished" if q["signal_to_first_step_s"] is None else ""

    rows = []
    for q in rq:
        hold = f"{q['slurm_hold_s']:.0f}" if q["slurm_hold_s"] is not None else "?"
        rows.append(f"| {what[q['how']]} | {q['every']} | {q['step_at_signal']} | {q['stopped_at']} | {q['resumed_from']} | "
                    f"**{q['redone']}** ({'met' if q['met'] else 'MISSED'}{done_note(q)}) | {q['signal_to_requeued_s']:.1f} | "
                    f"{q['processes_gone_s']:.1f} + {q['port_wait_s']:.1f} + 2 | {sec(q['released_to_first_step_s'])} | "
                    f"{sec(q['signal_to_first_step_s'], True)} | {hold} |")  # fmt: skip
    nl = "\n"
    alone = next((q for q in rq if q["how"] == "launcher"), None)
    if alone is not None and alone["signal_to_first_step_s"] is None:
        ppid = alone["worker_outlived_launcher_ppid"]
        lived = f"lived on (its parent became pid {ppid})" if ppid else "lived on"
        launcher_note = (
            f"With node2's launcher killed alone, node2's worker {lived} and the job stayed RUNNING: the two "
            f"workers went on training to step {alone['stopped_at']}, the run's last, and wrote its final checkpoint; "
            f"only then did the step end ({alone['signal_to_requeued_s']:.0f} s after the signal) and the job get "
            f"requeued, and attempt 2 resumed from step {alone['resumed_from']} with nothing left to do."
        )
    elif alone is not None and alone["worker_outlived_launcher_ppid"] is None:
        launcher_note = (
            "With node2's launcher killed alone, node2's worker was gone within half a second (a worker dies with its "
            "launcher: `PR_SET_PDEATHSIG` in `deskpod/train/worker.py`), so the job went through the same requeue as "
            "after a lost node."
        )
    else:
        launcher_note = ""
    for q in rq:
        if q["port_wait_s"] > 1:
            launcher_note += (
                f" After {what[q['how']].split(' (')[0]}, the job's rendezvous port could not be bound for "
                f"{q['port_wait_s']:.0f} s after the processes were gone (`ss`: {', '.join(q['port_states'])}); "
                "the benchmark waited before releasing the job."
            )
    return f"""{SUB}

Command: `{command}` ({res["date"]}, {res["minutes"]:.1f} min; {res["slurm"]}; this 2-core VM, {res["cpu"]};
load average {res["load_before"]:.1f} before and {res["load_after"]:.1f} after — other engineers' work shares the cores).
Every job: {a["model"]} on synthetic {a["shape"]} images, global batch {a["global_batch"]}, fp32, CPU workers, Gloo over
loopback, through `deskpod submit --cluster slurm` unless named otherwise; each submission waits for idle nodes.

Targets: 2 nodes against 1 beside `deskpod plan` — no pass mark, {t["ratio"]:.2f}x measured against {p2 / p1:.2f}x
predicted; the Slurm path's overhead <= 1.1x — **{"met" if o["met"] else "missed"}** ({o["ratio"]:.2f}x); the work redone
after a requeue <= one checkpoint interval — {"; ".join(bound(q) for q in rq)}.

**2 nodes x 1 worker against 1 node x 2 workers** ({a["steps"]} steps; `throughput_images_per_s` from each run's
`summary.json`, every step but the first; {a["rounds"]} round{"s" if a["rounds"] != 1 else ""}, the order swapped each round):

| configuration | measured img/s (median) | runs | `deskpod plan` predicts | measured / predicted |
|---|---|---|---|---|
| 1 node x 2 workers (1 thread each) | {one:.1f} | {runs(t["one_node"])} | {p1:.1f} | {one / p1:.2f} |
| 2 nodes x 1 worker (1 thread each) | {two:.1f} | {runs(t["two_nodes"])} | {p2:.1f} | {two / p2:.2f} |
| 2 nodes / 1 node (paired per round) | **{t["ratio"]:.2f}x** | {", ".join(f"{x:.2f}" for x in t["ratios"])} | {p2 / p1:.2f}x | |

The plan is `deskpod plan predict --machine local` after `deskpod plan calibrate --model {a["model"]} --shape {a["shape"]}
--batch {a["global_batch"] // 2} --steps {a["calibrate_steps"]}` in the same run (outside Slurm: {c["images_per_s"]:.1f} img/s on 2
workers, matmul {c["peak_tflops"]:.3f} TFLOP/s per slot, all-reduce {c["comm_busbw_gbs"]:.2f} GB/s busbw; fitted
cpu_compute_efficiency {c["factors"]["cpu_compute_efficiency"]:.3f}, comm_efficiency {c["factors"]["comm_efficiency"]:.3f}):
`{t["predict_commands"][0]}` and `{t["predict_commands"][1]}`. The model's FLOPs, parameters and activations are
ResNet-18's scaled to {a["shape"]} (`deskpod.plan.local.scaled_model`, as calibrate fits them). `plan` does model
nodes (`--nodes`, `--network`), but this box has no NIC in its topology, so the loopback between the two fake nodes is
given as `--network {a["network"]}` (10 GB/s, the nominal bandwidth plan's topology gives this box's in-box ring): the two
predictions then differ only by per-hop latency. It does not know that both "nodes" are the same 2 cores. On this
machine both configurations are the same thing physically — 2 processes with 1 thread each, Gloo over TCP on
loopback — so the ratio says what the multi-node path itself costs (rendezvous across launchers, per-node agents),
not what a second machine would add. The 2-node jobs run with `DESKPOD_CPU_SLOTS=0`: deskpod gives a node's workers
all the cores it sees, and with `TaskPlugin=task/none` each fake node sees both cores, so by default the 2-node run
would put 2 threads per worker on 2 cores.

**Submitted -> first training step** (2 nodes x 1 worker, {a["first_steps"]}-step jobs; the clock starts just before
`deskpod submit` / `sbatch` is called; the first step is when global rank 0 finished its first optimizer step, written
by the training: deskpod's `metrics.jsonl` row of step 1 with `log_every_steps = 1`, the reference's `first-step.json`):

| path | submitted -> first step, s (median) | runs | submitted -> batch script | -> launchers ready | -> rank 0's worker started |
|---|---|---|---|---|---|
| `deskpod submit --cluster slurm` | {statistics.median(o["deskpod"]):.2f} | {runs(o["deskpod"])} | {dp["batch_s"]:.2f} (attempt recorded) | {dp["launchers_ready_s"]:.2f} (`launch.json`) | {dp["workers_started_s"]:.2f} |
| plain `sbatch` + `srun torchrun` (`benchmarks/reference_ddp.py`) | {statistics.median(o["reference"]):.2f} | {runs(o["reference"])} | {rp["batch_s"]:.2f} | - | {rp["workers_started_s"]:.2f} |
| deskpod / reference (paired per round) | **{o["ratio"]:.2f}x** | {", ".join(f"{x:.2f}" for x in o["ratios"])} | | | |

Target <= 1.1x: **{"met" if o["met"] else "missed"}**. The columns on the right are medians of when each stage began
(deskpod: `attempts.json`'s start, `launch.json` written by the launchers, `workers/rank0.pid`; the reference: the
batch script's first line, `reference_ddp.py`'s first line after `import torch` — both import torchvision after
that). deskpod's time includes `deskpod submit` itself (the spec checked, `sbatch --test-only`, then `sbatch`). The
reference's batch script asks for the same allocation as deskpod's on this Slurm (`--nodes=2 --ntasks=2
--gpus-per-task=1`), sets `OMP_NUM_THREADS=1`, and picks a free port for the rendezvous on the first node.

**A requeue** (2 nodes x 1 worker, {a["requeue_steps"]} steps, a checkpoint every K = {a["every"]} steps, stopped once
rank 0 has logged step {2 * a["every"] + a["every"] // 2}, halfway through an interval). The requeued job is released
(`scontrol update StartTime=now`, as `SlurmCluster.release_requeued` does) once the first attempt's processes are gone,
the job's rendezvous port can be bound again (as deskpod's launcher checks it) and 2 more seconds have passed;
"requeued -> released" shows those three parts. Steps redone = the step attempt 1 reached (its log: "stopped by SIGUSR2 at step S", or the last step
rank 0 logged, `log_every_steps = 1`) - the step attempt 2 resumed from (its log: "resumed from ... (step R)"):

| stopped by | K | step at the signal | attempt 1 reached | attempt 2 resumed from | steps redone (target <= K) | signal -> requeued, s | requeued -> released, s (processes gone + port free + 2) | released -> attempt 2's first step, s | signal -> attempt 2's first step, s | Slurm's own hold, s (not waited) |
|---|---|---|---|---|---|---|---|---|---|---|
{nl.join(rows)}

"Slurm's own hold" is the requeued job's `StartTime` minus when it was seen pending (Reason=BeginTime): what a
requeue costs on top on this Slurm when nobody releases the job. {launcher_note.strip()}
"""


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rounds", type=int, default=3, help="rounds of targets 1 and 2 (default 3)")
    p.add_argument("--model", default="resnet18")
    p.add_argument("--shape", default="3x64x64", help="synthetic input CxHxW")
    p.add_argument("--global-batch", type=int, default=16)
    p.add_argument("--steps", type=int, default=30, help="steps of each throughput run")
    p.add_argument("--first-steps", type=int, default=3, help="steps of each submitted -> first step job")
    p.add_argument("--requeue-steps", type=int, default=32, help="steps of each requeue job")
    p.add_argument("--every", type=int, default=8, help="checkpoint interval K of the requeue jobs")
    p.add_argument("--calibrate-steps", type=int, default=3, help="timed steps of deskpod plan calibrate")
    p.add_argument("--network", default="1x80", help="plan's network between the fake nodes (NICSxGBPS)")
    p.add_argument("--only", choices=["throughput", "overhead", "requeue"], help="run one target (JSON only, no docs)")
    p.add_argument("--keep", type=Path, help="work in this folder and keep it (the jobs' folders and logs)")
    p.add_argument("--no-docs", action="store_true")
    args = p.parse_args()
    why = missing()
    if why:
        raise SystemExit(f"bench_cluster needs a real Slurm here: {why}")
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # stop the cluster (the finally below) on SIGTERM too
    started = time.time()
    load_before = os.getloadavg()[0]
    res: dict[str, Any] = {"benchmark": "cluster", "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
                           "cpu": cpu_model(), "load_before": load_before}  # fmt: skip
    with contextlib.ExitStack() as stack:
        if args.keep:
            args.keep.mkdir(parents=True, exist_ok=True)
            tmp = Path(tempfile.mkdtemp(prefix="bench-cluster-", dir=args.keep))
        else:
            tmp = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="deskpod-bench-cluster-")))
        cluster = SlurmCluster(tmp / "slurm", name="deskpod-bench", tag=f"deskpod-bench-{os.getpid()}")
        log(f"starting Slurm in {cluster.root}")
        try:
            cluster.start()
            b = Bench(cluster, tmp / "home", tmp / "jobs", args)
            b.work.mkdir()
            res["slurm"] = "Slurm " + cluster.run("sinfo", "--version").stdout.split()[-1]  # "slurm-wlm 22.05.8"
            if args.only in (None, "throughput"):
                res["throughput"] = two_nodes_vs_one(b)
            if args.only in (None, "overhead"):
                res["overhead"] = slurm_path_overhead(b)
            if args.only in (None, "requeue"):
                res["requeue"] = [requeue(b, how) for how in ("usr2", "node", "launcher")]
        finally:
            cluster.stop()
    res.update(load_after=os.getloadavg()[0], minutes=(time.time() - started) / 60, args=vars(args))
    res["args"]["keep"] = str(args.keep) if args.keep else None
    met = res.get("overhead", {}).get("met", True) and all(q["met"] for q in res.get("requeue", []))
    return publish(res, met, only=bool(args.only), docs=not args.no_docs, report=report,
                   section=SECTION, subsection=SUB, intro=INTRO)  # fmt: skip


if __name__ == "__main__":
    sys.exit(main())
