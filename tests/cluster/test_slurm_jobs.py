"""deskpod jobs on a real Slurm cluster (slurmctld + two slurmd on 127.0.0.1): train across nodes,
follow, cancel, lose a node's step, get the time-limit warning, and the pod service's Slurm backend."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch

from tests.cluster.slurm import SlurmCluster
from tests.jobs.pods import Pods, wait_for

pytestmark = pytest.mark.slow


def deskpod(*argv: str, home: Path, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    e = {**os.environ, "DESKPOD_HOME": str(home), **(env or {})}
    return subprocess.run([sys.executable, "-m", "deskpod", *argv], capture_output=True, text=True, env=e, timeout=120)


def write_job(path: Path, name: str, *, nodes: int, devices: int, steps: int, every: int = 0, **extra: Any) -> Path:
    import tomli_w

    spec: dict[str, Any] = {"name": name, "nodes": nodes, "devices": devices, "max_runtime": 900, **extra}
    spec["train"] = {"model": "mlp", "data": "synthetic:1x16x16", "synthetic_samples": 512, "steps": steps,
                     "global_batch_size": 16, "seed": 3, "checkpoint_every_steps": every, "val_fraction": 0.1}  # fmt: skip
    path.write_text(tomli_w.dumps(spec))
    return path


def submit(home: Path, job: Path) -> tuple[str, Path]:
    done = deskpod("submit", "--cluster", "slurm", str(job), home=home)
    assert done.returncode == 0, done.stderr
    job_id = done.stdout.strip()
    assert job_id.isdigit(), done.stdout
    return job_id, (home / "cluster" / "by-id" / job_id).resolve()


def show(home: Path, job_id: str) -> dict[str, Any]:
    done = deskpod("show", "--cluster", "slurm", "--json", job_id, home=home)
    assert done.returncode == 0, done.stderr
    return dict(json.loads(done.stdout))


def wait_final(home: Path, job_id: str, timeout: float = 300) -> dict[str, Any]:
    def ended() -> dict[str, Any] | None:
        row = show(home, job_id)
        return row if row["state"] in ("succeeded", "failed", "cancelled", "lost") else None

    return wait_for(ended, timeout, f"cluster job {job_id} to end")  # type: ignore[return-value]


def latest_checkpoint(run: Path) -> Path | None:
    found = sorted((run / "checkpoints").glob("step-*.pt"))
    return found[-1] if found else None


def wait_checkpoint(run: Path, timeout: float = 240) -> Path:
    return wait_for(lambda: latest_checkpoint(run), timeout, f"a checkpoint in {run}")  # type: ignore[return-value]


def launcher_pids(folder: Path) -> dict[str, int]:
    """The node launchers of a job (``deskpod cluster launch FOLDER``), by the node they run on."""
    out: dict[str, int] = {}
    for p in Path("/proc").iterdir():
        if not p.name.isdigit():
            continue
        try:
            cmd = (p / "cmdline").read_bytes().split(b"\0")
            if b"launch" not in cmd or str(folder).encode() not in cmd:
                continue
            env = dict(
                kv.split("=", 1)
                for kv in (p / "environ").read_bytes().decode(errors="replace").split("\0")
                if "=" in kv
            )
        except OSError:
            continue
        out[env.get("SLURMD_NODENAME", "?")] = int(p.name)
    return out


def processes_of(folder: Path) -> list[int]:
    """Every live process whose command line names the job's folder (launchers, workers' run folder)."""
    pids = []
    for p in Path("/proc").iterdir():
        if p.name.isdigit() and int(p.name) != os.getpid():
            try:
                if str(folder).encode() in (p / "cmdline").read_bytes() and (p / "stat").read_text().split()[2] != "Z":
                    pids.append(int(p.name))
            except OSError:
                continue
    return pids


def resumed_step(log: str) -> int:
    m = re.search(r"resumed from step-\d+\.pt \(step (\d+)\)", log)
    assert m, f"no resume in: {log}"
    return int(m.group(1))


def params(checkpoint: Path) -> dict[str, torch.Tensor]:
    state = torch.load(checkpoint, map_location="cpu", weights_only=False)
    return {k: v for k, v in state["model"].items()}


def test_two_nodes_train_like_one_and_the_cli_follows_them(slurm: SlurmCluster, tmp_path: Path) -> None:
    import tomli_w

    home = tmp_path / "home"
    train = {"model": "mlp", "data": "fashion-mnist", "steps": 40, "global_batch_size": 64, "seed": 3}
    # 2 nodes x 1 worker: `deskpod train --nodes 2` in a plain sbatch script (it runs itself once per node via srun)
    (tmp_path / "two.toml").write_text(tomli_w.dumps(train))
    runs = tmp_path / "runs"
    cmd = (f"{sys.executable} -m deskpod train --nodes 2 --config {tmp_path / 'two.toml'} --out {runs} --name two "
           "--devices 1")  # fmt: skip
    two_id = slurm.run(
        "sbatch", "--parsable", "--nodes=2", f"--output={tmp_path}/two.out", f"--wrap={cmd}"
    ).stdout.strip()
    # 1 node x 2 workers, the same global batch: through deskpod submit --cluster slurm
    spec = {"name": "one", "nodes": 1, "devices": 2, "max_runtime": 900, "train": train}
    (tmp_path / "one.toml").write_text(tomli_w.dumps(spec))
    one_id, one = submit(home, tmp_path / "one.toml")
    listed = deskpod("jobs", "--cluster", "slurm", home=home)
    assert listed.returncode == 0 and one_id in listed.stdout
    row = wait_final(home, one_id)
    assert row["state"] == "succeeded", (row, (Path(row["folder"]) / "logs" / "attempt-1.log").read_text())
    info = slurm.wait_state(two_id, {"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL"})
    assert info["JobState"] == "COMPLETED", (tmp_path / "two.out").read_text()
    log = deskpod("logs", "--cluster", "slurm", one_id, home=home).stdout
    assert "attempt 1" in log and "done:" in log
    two_summary = json.loads((runs / "two" / "summary.json").read_text())
    one_summary = json.loads((one / "runs" / "one" / "summary.json").read_text())
    assert (two_summary["world_size"], two_summary["nodes"], one_summary["nodes"]) == (2, 2, 1)
    assert two_summary["global_batch"] == one_summary["global_batch"] == 64
    assert two_summary["test_accuracy"] > 0.6  # it learns: 10 classes, chance is 0.1
    assert abs(two_summary["test_accuracy"] - one_summary["test_accuracy"]) < 0.01
    a = params(latest_checkpoint(runs / "two"))  # type: ignore[arg-type]
    b = params(latest_checkpoint(one / "runs" / "one"))  # type: ignore[arg-type]
    assert a.keys() == b.keys()
    for k in a:
        assert torch.allclose(a[k].float(), b[k].float(), rtol=1e-4, atol=1e-5), k
    script = (one / "job.sbatch").read_text()
    assert "#SBATCH --nodes=1" in script and "--requeue" in script and "--signal=USR2@120" in script


def test_cancel_leaves_no_process_on_any_node(slurm: SlurmCluster, tmp_path: Path) -> None:
    home = tmp_path / "home"
    job_id, folder = submit(home, write_job(tmp_path / "c.toml", "c", nodes=2, devices=1, steps=100000, every=5))
    wait_checkpoint(folder / "runs" / "c")
    assert set(launcher_pids(folder)) == {"node1", "node2"}
    done = deskpod("cancel", "--cluster", "slurm", job_id, home=home)
    assert done.returncode == 0, done.stderr
    assert wait_final(home, job_id)["state"] == "cancelled"
    wait_for(lambda: not processes_of(folder), 60, f"every process of {folder} to end")
    assert [a.get("cause") for a in json.loads((folder / "attempts.json").read_text())] in ([None], ["cancelled"])


def test_a_step_killed_on_one_node_is_requeued_and_resumes(slurm: SlurmCluster, tmp_path: Path) -> None:
    home = tmp_path / "home"
    job_id, folder = submit(home, write_job(tmp_path / "k.toml", "k", nodes=2, devices=1, steps=240, every=20))
    run = folder / "runs" / "k"
    first = wait_checkpoint(run)
    pids = wait_for(lambda: launcher_pids(folder).get("node2"), 30, "node2's launcher")
    os.kill(int(pids), signal.SIGKILL)  # type: ignore[call-overload]
    slurm.release_requeued(job_id, lambda: not processes_of(folder))
    row = wait_final(home, job_id)
    assert row["state"] == "succeeded", row
    attempts = json.loads((folder / "attempts.json").read_text())
    assert [a["cause"] for a in attempts] == ["node", None], attempts
    log2 = (folder / "logs" / "attempt-2.log").read_text()
    assert "--- deskpod: attempt 2" in log2
    assert int(first.stem.split("-")[1]) <= resumed_step(log2), log2
    assert "attempt 1" in (folder / "logs" / "attempt-1.log").read_text()  # never overwritten


def test_the_warning_signal_checkpoints_requeues_and_resumes(slurm: SlurmCluster, tmp_path: Path) -> None:
    home = tmp_path / "home"
    every = 20
    job_id, folder = submit(home, write_job(tmp_path / "w.toml", "w", nodes=2, devices=1, steps=240, every=every))
    run = folder / "runs" / "w"
    wait_checkpoint(run)
    slurm.run("scancel", "--signal=USR2", job_id)  # what --signal=USR2@120 sends 120 s before the time limit
    slurm.release_requeued(job_id, lambda: not processes_of(folder))
    row = wait_final(home, job_id)
    assert row["state"] == "succeeded", row
    attempts = json.loads((folder / "attempts.json").read_text())
    assert [a["cause"] for a in attempts] == ["warning", None], attempts
    log1 = (folder / "logs" / "attempt-1.log").read_text()
    m = re.search(r"stopped by SIGUSR2 at step (\d+)/", log1)
    assert m, log1
    # Work redone after the requeue: steps trained in attempt 1 after the checkpoint attempt 2 resumed from.
    redone = int(m.group(1)) - resumed_step((folder / "logs" / "attempt-2.log").read_text())
    assert 0 <= redone <= every, log1
    assert slurm.job(job_id)["Restarts"] == "1"


def test_pod_service_hands_jobs_to_slurm(slurm: SlurmCluster, tmp_path: Path) -> None:
    pods = Pods(tmp_path)
    try:
        pod = pods("--backend", "slurm")
        c = pod.client()
        code = "import os; print('hello from node', os.environ['DESKPOD_NODE_RANK'], 'of', os.environ['DESKPOD_NODES'])"
        job = c.submit({"name": "hello", "command": [sys.executable, "-c", code], "nodes": 2, "devices": 1})

        def ended() -> dict[str, Any] | None:
            j = c.job(job["id"])
            return j if j["state"] in ("succeeded", "failed", "cancelled", "lost") else None

        final = wait_for(ended, 180, "the pod's Slurm job to end")
        assert final["state"] == "succeeded", final  # type: ignore[index]
        assert str(final["external"]).isdigit()  # type: ignore[index]
        data, _, _ = c.log(job["id"], 0)
        text = data.decode()
        assert "hello from node 0 of 2" in text and "hello from node 1 of 2" in text
        status = c.status()
        parts = {p["name"]: p for p in status["backend"]["partitions"]}
        assert status["backend"]["name"] == "slurm" and parts["debug"]["nodes"] == 2 and parts["debug"]["default"]
        # a job Slurm can never run is refused at the door, and nothing is stored
        from deskpod.errors import DeskpodError

        with pytest.raises(DeskpodError, match="nodes = 3"):
            c.submit({"name": "big", "command": ["true"], "nodes": 3})
        # cancel a running job: Slurm's scancel, the pod's state
        sleeper = c.submit({"name": "sleeper", "command": [sys.executable, "-c", "import time; time.sleep(600)"]})
        wait_for(lambda: c.job(sleeper["id"])["state"] == "running", 120, "the sleeper to run")
        c.cancel(sleeper["id"])
        wait_for(lambda: c.job(sleeper["id"])["state"] == "cancelled", 60, "the sleeper to be cancelled")
        ext = c.job(sleeper["id"])["external"]
        assert slurm.job(ext)["JobState"] == "CANCELLED"
        # the dashboard shows the pod's Slurm jobs, with their attempt logs
        from tests.web.browser import sign_in

        ui = sign_in(pod)
        try:
            page = ui.get(f"/ui/jobs/{job['id']}")
            assert page.status_code == 200 and "hello" in page.text and "logs/attempt-1.log" in page.text
            home = ui.get("/ui/")
            assert home.status_code == 200, home.text
        finally:
            ui.close()
    finally:
        pods.stop_all()


def test_a_job_stages_its_dataset_to_node_local_scratch(slurm: SlurmCluster, tmp_path: Path) -> None:
    import tomli_w

    from tests.train.test_models_data import make_imagefolder

    data = make_imagefolder(tmp_path / "shared" / "imgs", per_class=12, corrupt=0)
    scratch = tmp_path / "scratch"
    spec = {"name": "staged", "nodes": 2, "devices": 1, "max_runtime": 600,
            "slurm": {"stage_data": True, "scratch": str(scratch)},
            "train": {"model": "mlp", "data": f"imagefolder:{data}", "image_size": 16, "steps": 4, "batch_size": 4,
                      "val_fraction": 0.25}}  # fmt: skip
    (tmp_path / "s.toml").write_text(tomli_w.dumps(spec))
    home = tmp_path / "home"
    job_id, folder = submit(home, tmp_path / "s.toml")
    row = wait_final(home, job_id)
    log = (folder / "logs" / "attempt-1.log").read_text()
    assert row["state"] == "succeeded", log
    # both nodes staged into their (here: one shared) scratch; one copied, the other found it there
    staged = re.findall(r"deskpod: staged (\S+) to (\S+) \((copied|already there)", log)
    assert len(staged) == 2 and sorted(s[2] for s in staged) == ["already there", "copied"], log
    assert staged[0][0] == str(data) and Path(staged[0][1]).is_relative_to(scratch)
    summary = json.loads((folder / "runs" / "staged" / "summary.json").read_text())
    assert summary["data"].startswith("imagefolder:") and str(scratch) in summary["data_spec"]["name"] + summary["data"]
    listed = deskpod("cluster", "staged", "--scratch", str(scratch), home=home)
    assert listed.returncode == 0 and str(data) in listed.stdout


def test_a_command_job_runs_in_its_environment_on_every_node_built_once(slurm: SlurmCluster, tmp_path: Path) -> None:
    import tomli_w

    home, cache = tmp_path / "home", tmp_path / "envs"
    code = "import os, tabulate; print('TAB', os.environ['DESKPOD_NODE_RANK'], tabulate.__version__, flush=True)"
    spec = {"name": "env-job", "nodes": 2, "devices": 1, "command": ["python", "-c", code],
            "environment": {"packages": ["tabulate==0.8.10"]}, "slurm": {"env_cache": str(cache)}}  # fmt: skip
    (tmp_path / "e.toml").write_text(tomli_w.dumps(spec))
    job_id, folder = submit(home, tmp_path / "e.toml")
    done = wait_final(home, job_id)
    log = deskpod("logs", "--cluster", "slurm", job_id, home=home).stdout
    assert done["state"] == "succeeded", log
    assert "TAB 0 0.8.10" in log and "TAB 1 0.8.10" in log
    builds = "".join(p.read_text() for p in folder.glob("env-build.*.log"))
    assert builds.count("building environment") == 1, builds  # two nodes, one shared cache, one build
