"""``deskpod run``: real scripts of the torchrun kind, written here, on 2 CPU workers (Gloo)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import textwrap
import time
from pathlib import Path

import numpy as np
import pytest

from .conftest import deskpod_cmd, deskpod_env, run_deskpod

# A script as PyTorch's examples write them for torchrun: the env vars, init_process_group() with no arguments.
DDP = """
import json, os, sys
import torch, torch.distributed as dist
import deskpod.train

dist.init_process_group("gloo")
rank, world = dist.get_rank(), dist.get_world_size()
env = {k: os.environ[k] for k in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "MASTER_ADDR",
                                  "MASTER_PORT", "TORCHELASTIC_RESTART_COUNT")}
torch.manual_seed(0)
model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(4, 1))
opt = torch.optim.SGD(model.parameters(), lr=0.1)
w = torch.tensor([[1.0, -2.0, 3.0, 0.5]])
for step in range(int(sys.argv[1])):
    x = torch.randn(32, 4, generator=torch.Generator().manual_seed(step * world + rank))
    loss = ((model(x) - x @ w.T) ** 2).mean()
    opt.zero_grad(); loss.backward(); opt.step()
    deskpod.train.log(step=step, loss=loss.item())
    if rank == 0 and step % 10 == 0:
        print(f"step {step} loss {loss.item():.4f}", flush=True)
print(json.dumps({"rank": rank, "env": env, "argv": sys.argv[1:], "threads": torch.get_num_threads(),
                  "weight": model.module.weight.tolist()}))
dist.destroy_process_group()
"""


def write(folder: Path, name: str, code: str) -> Path:
    path = folder / name
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(textwrap.dedent(code))
    return path


def rank_lines(run: Path, rank: int, attempt: int = 0) -> list[dict[str, object]]:
    text = (run / "logs" / f"rank{rank}.attempt{attempt}.stdout").read_text()
    return [json.loads(line) for line in text.splitlines() if line.startswith("{")]


def test_a_torchrun_script_trains_on_two_workers_unchanged(tmp_path: Path) -> None:
    script = write(tmp_path, "ddp.py", DDP)
    r = run_deskpod("run", "--devices", "2", "--name", "ddp", "--out", str(tmp_path / "runs"), str(script), "60",
                    "--devices", "9", cwd=tmp_path)  # fmt: skip
    assert r.code == 0, r.err
    run = tmp_path / "runs" / "ddp"
    ranks = [rank_lines(run, k)[-1] for k in (0, 1)]
    # The environment torchrun gives, one rank per worker, the script's own arguments (deskpod's flag names too).
    assert [d["env"]["RANK"] for d in ranks] == ["0", "1"] and {d["env"]["WORLD_SIZE"] for d in ranks} == {"2"}
    assert {d["env"]["LOCAL_WORLD_SIZE"] for d in ranks} == {"2"} and ranks[0]["env"]["MASTER_ADDR"] == "127.0.0.1"
    assert {d["env"]["TORCHELASTIC_RESTART_COUNT"] for d in ranks} == {"0"}
    assert all(d["argv"] == ["60", "--devices", "9"] for d in ranks)
    assert {d["threads"] for d in ranks} == {max(1, len(os.sched_getaffinity(0)) // 2)}
    assert ranks[0]["weight"] == ranks[1]["weight"], "DDP keeps the replicas equal"
    assert ranks[0]["weight"][0] == pytest.approx([1.0, -2.0, 3.0, 0.5], abs=1e-3), "it converged"
    # Rank 0 speaks on the console, the other rank only in its file; the metrics helper wrote rank 0's steps.
    assert "step 50 loss" in r.out and '"rank": 1' not in r.out and '"rank": 0' in r.out
    steps = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert [s["step"] for s in steps] == list(range(60)) and steps[-1]["loss"] < steps[0]["loss"] * 1e-3
    summary = json.loads((run / "summary.json").read_text())
    assert (summary["state"], summary["world_size"], summary["restarts"]) == ("completed", 2, 0)


def test_two_runs_at_once_on_one_box_and_a_module_with_its_arguments(tmp_path: Path) -> None:
    write(tmp_path, "ddp.py", DDP)
    write(tmp_path, "mypkg/__init__.py", "")
    write(tmp_path, "mypkg/train.py", DDP)
    runs = str(tmp_path / "runs")
    procs = [
        subprocess.Popen(
            deskpod_cmd("run", "--devices", "2", "--name", name, "--out", runs, *target),
            cwd=tmp_path,
            env=deskpod_env(),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for name, target in (("a", ["ddp.py", "40"]), ("b", ["-m", "mypkg.train", "40", "-m", "x"]))
    ]
    results = [p.communicate(timeout=240) for p in procs]
    assert [p.returncode for p in procs] == [0, 0], [err[-2000:] for _, err in results]
    a, b = (rank_lines(tmp_path / "runs" / n, 1)[-1] for n in ("a", "b"))
    assert a["env"]["MASTER_PORT"] != b["env"]["MASTER_PORT"], "each run its own free rendezvous port"
    assert b["argv"] == ["40", "-m", "x"]


def test_a_failing_rank_is_reported_once_with_its_traceback_after_the_restarts(tmp_path: Path) -> None:
    script = write(
        tmp_path,
        "crash.py",
        """
        import os, time
        import torch.distributed as dist
        dist.init_process_group("gloo")
        print("attempt", os.environ["TORCHELASTIC_RESTART_COUNT"], flush=True)
        if dist.get_rank() == 1:
            raise RuntimeError("injected: rank 1 cannot go on")
        time.sleep(60)
    """,
    )
    r = run_deskpod("run", "--devices", "2", "--max-restarts", "1", "--name", "crash", "--out", str(tmp_path),
                    str(script), cwd=tmp_path)  # fmt: skip
    assert r.code == 1
    assert "rank 1 failed first (exit code 1) after 1 restart (--max-restarts 1)" in r.err
    assert r.err.count("Traceback (most recent call last)") == 1 and r.err.count("RuntimeError: injected") == 1
    assert f'File "{script}", line 7' in r.err and "runpy" not in r.err, "the script's traceback, not the wrapper's"
    assert "attempt 0" in r.out and "attempt 1" in r.out
    logs = tmp_path / "crash" / "logs"
    assert "injected: rank 1" in (logs / "rank1.attempt1.stderr").read_text()
    assert (logs / "rank0.attempt0.stdout").read_text().strip() == "attempt 0"


def test_a_rank_killed_with_sigkill_is_restarted_and_the_script_resumes_from_its_checkpoint(tmp_path: Path) -> None:
    script = write(
        tmp_path,
        "resume.py",
        """
        import os, time
        import torch, torch.distributed as dist
        dist.init_process_group("gloo")
        ckpt = os.path.join(os.environ["DESKPOD_RUN_DIR"], "ckpt.pt")
        state = torch.load(ckpt) if os.path.exists(ckpt) else {"step": 0, "x": torch.zeros(1)}
        print("starting at", state["step"], flush=True)
        for step in range(state["step"], 40):
            t = torch.ones(1)
            dist.all_reduce(t)
            state = {"step": step + 1, "x": state["x"] + t}
            if dist.get_rank() == 0:
                torch.save(state, ckpt + ".tmp"); os.replace(ckpt + ".tmp", ckpt)
            time.sleep(0.05)
        if dist.get_rank() == 0:
            print("done at", state["step"], "sum", float(state["x"]), flush=True)
    """,
    )
    run = tmp_path / "kill"
    proc = subprocess.Popen(deskpod_cmd("run", "--devices", "2", "--max-restarts", "2", "--name", "kill", "--out",
                                        str(tmp_path), str(script)),
                            cwd=tmp_path, env=deskpod_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)  # fmt: skip
    try:
        deadline = time.monotonic() + 120
        while not (run / "ckpt.pt").exists() and time.monotonic() < deadline and proc.poll() is None:
            time.sleep(0.05)
        os.kill(int((run / "workers" / "rank1.pid").read_text()), signal.SIGKILL)
        out, err = proc.communicate(timeout=180)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.communicate()
    assert proc.returncode == 0, err[-3000:]
    assert "starting at 0" in out and "done at 40 sum 80.0" in out
    resumed = [int(line.split()[-1]) for line in out.splitlines() if line.startswith("starting at")]
    assert len(resumed) == 2 and resumed[1] > 0, out
    assert json.loads((run / "summary.json").read_text())["restarts"] == 1


def test_a_quiet_rank_is_named(tmp_path: Path) -> None:
    script = write(
        tmp_path,
        "quiet.py",
        """
        import os, time
        import torch.distributed as dist
        from torch.utils.tensorboard import SummaryWriter
        dist.init_process_group("gloo")
        tb = SummaryWriter(os.environ["DESKPOD_RUN_DIR"]) if dist.get_rank() == 0 else None
        for i in range(100):
            if tb is not None:
                print("tick", i, flush=True)
                tb.add_scalar("train/tick", i * 0.5, i)
            time.sleep(0.1)
        if tb is not None:
            tb.close()
    """,
    )
    r = run_deskpod("run", "--devices", "2", "--stall-after", "4", "--name", "q", "--out", str(tmp_path), str(script),
                    cwd=tmp_path)  # fmt: skip
    assert r.code == 0, r.err
    warned = [line for line in r.err.splitlines() if "written nothing for" in line]
    assert any(line.startswith("deskpod run: rank 1 has written nothing for") and "rank 0 wrote" in line
               for line in warned), r.err  # fmt: skip
    assert "tick 99" in r.out
    # TensorBoard's scalars, written under DESKPOD_RUN_DIR, reach metrics.jsonl for the dashboard's charts.
    rows = [json.loads(line) for line in (tmp_path / "q" / "metrics.jsonl").read_text().splitlines()]
    assert sorted(r["step"] for r in rows) == list(range(100)) and {r["kind"] for r in rows} == {"train"}
    assert all(r["train/tick"] == r["step"] * 0.5 for r in rows)


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (["missing.py"], "script 'missing.py' not found"),
        (["--devices", "0,7", "x.py"], "no device 7"),
        (["-m", "no_such_module_here"], "no module 'no_such_module_here'"),
        (["--name", "../up", "x.py"], "--name '../up'"),
        (["--max-restarts", "-1", "x.py"], "--max-restarts -1"),
        ([], "give a script to run"),
    ],
)
def test_bad_input_is_one_line_and_exit_2(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], args: list[str], needle: str
) -> None:
    from deskpod import cli

    (tmp_path / "x.py").write_text("print('never')\n")
    monkeypatch.chdir(tmp_path)
    code = cli.main(["run", "--out", str(tmp_path / "runs"), *args])
    err = capsys.readouterr().err
    assert code == 2 and len(err.strip().splitlines()) == 1 and needle in err, err
    assert not (tmp_path / "runs").exists()


def test_the_metrics_helper_refuses_what_is_not_a_number(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import deskpod.train

    monkeypatch.delenv("DESKPOD_RUN_DIR", raising=False)
    deskpod.train.log(step=1, loss=0.5)  # outside deskpod run: nothing, no error
    with pytest.raises(TypeError, match=r"loss=\[1\.0\] is not a number"):
        deskpod.train.log(step=1, loss=[1.0])  # type: ignore[arg-type]
    monkeypatch.setenv("DESKPOD_RUN_DIR", str(tmp_path))
    monkeypatch.setenv("RANK", "1")
    deskpod.train.log(step=2, loss=0.25)
    assert not (tmp_path / "metrics.jsonl").exists(), "only rank 0 writes"
    monkeypatch.setenv("RANK", "0")
    deskpod.train.log(step=3, loss=float("nan"), acc=0.5)
    rec = json.loads((tmp_path / "metrics.jsonl").read_text())
    assert (rec["step"], rec["loss"], rec["acc"]) == (3, None, 0.5)


def test_submit_runs_the_script_as_a_pod_job(tmp_path: Path) -> None:
    from tests.jobs.pods import Pods, wait_state

    script = write(tmp_path, "ddp.py", DDP)
    (tmp_path / "pods").mkdir()
    pods = Pods(tmp_path / "pods")
    try:
        pod = pods()
        r = pod.cli("run", "--submit", "--devices", "2", "--name", "mine", str(script), "30")
        assert r.returncode == 0, r.stderr
        job_id = r.stdout.split()[2].rstrip(";")
        done = wait_state(pod.client(), job_id, "succeeded", "failed", timeout=180)
        assert done["state"] == "succeeded", pod.client().log(job_id)[0].decode()[-3000:]
        run = pod.home / "jobs" / job_id / "runs" / "mine"
        assert len((run / "metrics.jsonl").read_text().splitlines()) == 30
        assert json.loads((run / "summary.json").read_text())["world_size"] == 2
        assert "step 20 loss" in pod.client().log(job_id)[0].decode()
    finally:
        pods.stop_all()


def test_runs_without_a_name_get_folders_of_their_own_and_a_named_rerun_keeps_the_last_logs(tmp_path: Path) -> None:
    from deskpod.train.script import _write_run_file, prepare_script

    script = write(tmp_path, "x.py", "print('hi')")
    a, b = (prepare_script([str(script)], devices="1", out=tmp_path / "runs") for _ in range(2))
    assert a.run_dir != b.run_dir and a.run_dir.is_dir() and b.run_dir.is_dir(), "the same second, two folders"
    named = prepare_script([str(script)], devices="1", out=tmp_path / "runs", name="again")
    _write_run_file(named)
    (named.logs / "rank0.attempt0.stdout").write_text("the first launch\n")
    _write_run_file(named)
    assert not any(named.logs.iterdir()), "the second launch starts with empty logs"
    kept = [p for p in named.run_dir.glob("logs-*/rank0.attempt0.stdout")]
    assert [p.read_text() for p in kept] == ["the first launch\n"]


def test_tensorboard_scalars_are_copied_once_each_as_they_are_flushed(tmp_path: Path) -> None:
    from torch.utils.tensorboard import SummaryWriter

    from deskpod.train.script import TensorBoardScalars

    writer = SummaryWriter(str(tmp_path / "tb"))
    copy = TensorBoardScalars(tmp_path)
    assert copy.poll() == 0
    for step in range(3):
        writer.add_scalar("loss", 1.0 / (step + 1), step)
        writer.add_scalar("lr", 0.1, step)
    writer.add_histogram("weights", np.arange(10.0), 0)  # not a curve: left out
    writer.flush()
    assert copy.poll() == 3
    writer.add_scalar("loss", float("nan"), 3)
    writer.close()
    assert copy.poll() == 1 and copy.poll() == 0, "what was read is not read again"
    rows = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [0, 1, 2, 3] and rows[1]["loss"] == pytest.approx(0.5)
    assert rows[0]["lr"] == pytest.approx(0.1) and "weights" not in rows[0] and rows[3]["loss"] is None
