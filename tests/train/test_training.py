"""Real multi-process training: the ``deskpod`` command, 2 Gloo workers, real checkpoints and signals."""

from __future__ import annotations

import math
import os
import signal
import time
from pathlib import Path

import pytest
import torch

from deskpod.train.config import TrainConfig

from .conftest import metrics, needs_fashion_mnist, run_deskpod, spawn_deskpod

pytestmark = [pytest.mark.slow, needs_fashion_mnist]


def config(tmp_path: Path, **keys: object) -> Path:
    base: dict[str, object] = {
        "devices": "2",  # named: `all` on a CPU box is one worker per NUMA node, and these test the multi-process paths
        "batch_size": 32,
        "log_every_steps": 5,
        "checkpoint_every_minutes": 0.0,
        "warmup_epochs": 0.0,
    }
    base.update(keys)
    lines = [
        f"{k} = {v!r}".replace("'", '"').replace("True", "true").replace("False", "false") for k, v in base.items()
    ]
    path = tmp_path / f"cfg-{len(list(tmp_path.glob('cfg-*')))}.toml"
    path.write_text("\n".join(lines) + "\n")
    return path


def test_quick_start_two_workers_converge(tmp_path: Path) -> None:
    """`deskpod train` with the demo's defaults (shortened) on 2 CPU workers: they learn Fashion-MNIST."""
    r = run_deskpod("train", "--steps", "60", "--devices", "2", "--out", str(tmp_path), "--name", "demo")
    assert r.code == 0, r.err
    run = tmp_path / "demo"
    s = r.summary(run)
    assert s["state"] == "completed" and s["world_size"] == 2 and s["steps"] == 60
    assert s["test_accuracy"] > 0.70, s
    assert s["throughput_images_per_s"] > 0 and s["data_wait_fraction"] < 0.2
    assert "test accuracy" in r.out and "run folder" in r.out
    losses = [m["loss"] for m in metrics(run)]
    eps, k = TrainConfig().label_smoothing, 10
    floor = -(1 - eps + eps / k) * math.log(1 - eps + eps / k) - (k - 1) * (eps / k) * math.log(eps / k) if eps else 0
    assert losses[-1] - floor < (losses[0] - floor) * 0.6, (losses, floor)  # the way down to what smoothing allows
    for f in (
        "config.toml",
        "metrics.jsonl",
        "summary.json",
        "plots/loss.png",
        "plots/accuracy.png",
        "plots/throughput.png",
    ):
        assert (run / f).is_file(), f
    assert (run / "plots/loss.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert list((run / "tb").glob("events.out.tfevents.*"))
    assert [p.name for p in (run / "checkpoints").iterdir()] == ["step-00000060.pt"]


def test_two_workers_match_one_worker(tmp_path: Path) -> None:
    """Same global batch (1×16 vs 2×8), same samples per step: the same parameters after N steps."""
    cfg = config(tmp_path, model="mlp", steps=12, lr=0.05)
    one = run_deskpod(
        "train", "--config", str(cfg), "--devices", "1", "--batch-size", "16", "--out", str(tmp_path), "--name", "one"
    )
    two = run_deskpod(
        "train", "--config", str(cfg), "--devices", "2", "--batch-size", "8", "--out", str(tmp_path), "--name", "two"
    )
    assert one.code == 0 and two.code == 0, one.err + two.err
    a = torch.load(tmp_path / "one/checkpoints/step-00000012.pt", weights_only=True)["model"]
    b = torch.load(tmp_path / "two/checkpoints/step-00000012.pt", weights_only=True)["model"]
    for k in a:
        torch.testing.assert_close(a[k], b[k], rtol=1e-4, atol=1e-5, msg=f"parameter {k} differs")


def test_resume_after_sigterm_matches_an_uninterrupted_run(tmp_path: Path) -> None:
    cfg = config(tmp_path, steps=40, log_every_steps=2, checkpoint_every_steps=10)
    full = run_deskpod("train", "--config", str(cfg), "--out", str(tmp_path), "--name", "full")
    assert full.code == 0, full.err

    with spawn_deskpod("train", "--config", str(cfg), "--out", str(tmp_path), "--name", "cut") as proc:
        first = tmp_path / "cut/checkpoints/step-00000010.pt"
        deadline = time.monotonic() + 120
        while not first.exists() and time.monotonic() < deadline and proc.poll() is None:
            time.sleep(0.05)
        assert first.exists(), "the first checkpoint never appeared"
        proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=120)
    assert proc.returncode == 143, err
    summary = (tmp_path / "cut/summary.json").read_text()
    assert '"state": "stopped"' in summary and "--resume --name cut" in out
    stopped_at = max(int(p.stem.split("-")[1]) for p in (tmp_path / "cut/checkpoints").glob("step-*.pt"))
    assert 10 <= stopped_at < 40

    resumed = run_deskpod("train", "--resume", "--name", "cut", "--out", str(tmp_path))
    assert resumed.code == 0, resumed.err
    assert f"resumed from step-{stopped_at:08d}.pt" in resumed.out
    want = {m["step"]: m["loss"] for m in metrics(tmp_path / "full")}
    got = {m["step"]: m["loss"] for m in metrics(tmp_path / "cut")}
    assert sorted(got) == sorted(want), "metrics.jsonl reads as one run"
    for step in want:
        assert got[step] == pytest.approx(want[step], rel=1e-5, abs=1e-6), f"step {step}"


def test_killed_worker_is_restarted_from_checkpoint(tmp_path: Path) -> None:
    cfg = config(tmp_path, steps=60, checkpoint_every_steps=10)
    run = tmp_path / "kill"
    with spawn_deskpod("train", "--config", str(cfg), "--out", str(tmp_path), "--name", "kill") as proc:
        deadline = time.monotonic() + 120
        while (
            not (run / "checkpoints/step-00000010.pt").exists() and time.monotonic() < deadline and proc.poll() is None
        ):
            time.sleep(0.05)
        pid = int((run / "workers/rank1.pid").read_text())
        os.kill(pid, signal.SIGKILL)
        out, err = proc.communicate(timeout=180)
    assert proc.returncode == 0, err
    s = (run / "summary.json").read_text()
    assert '"restarts": 1' in s and '"steps": 60' in s and '"state": "completed"' in s
    assert "restarted after a worker failure from step-" in out


def test_failing_worker_reports_root_cause(tmp_path: Path) -> None:
    cfg = config(tmp_path, model="tests.train.models_for_tests:crashing", steps=20, max_restarts=1)
    r = run_deskpod("train", "--config", str(cfg), "--out", str(tmp_path), "--name", "crash")
    assert r.code == 1
    assert "worker rank 1" in r.err and "after 1 restart (max_restarts)" in r.err
    assert "injected failure: rank 1 cannot go on" in r.err and "Traceback" in r.err


def test_stalled_collective_fails_instead_of_hanging(tmp_path: Path) -> None:
    cfg = config(
        tmp_path, model="tests.train.models_for_tests:stalling", steps=20, max_restarts=0, collective_timeout_s=4.0
    )
    start = time.monotonic()
    r = run_deskpod("train", "--config", str(cfg), "--out", str(tmp_path), "--name", "stall", timeout=120)
    assert r.code == 1, r.err
    assert time.monotonic() - start < 90
    assert "training failed" in r.err


def test_corrupt_images_stop_the_run_when_too_many(tmp_path: Path) -> None:
    from .test_models_data import make_imagefolder

    root = make_imagefolder(tmp_path / "imgs", per_class=8, corrupt=3)
    ok = config(tmp_path, model="tests.train.models_for_tests:tiny", data=f"imagefolder:{root}", image_size=32,
                batch_size=4, epochs=1, max_bad_fraction=0.5, loader_workers=0)  # fmt: skip
    r = run_deskpod("train", "--config", str(ok), "--out", str(tmp_path), "--name", "folder")
    assert r.code == 0, r.err
    strict = config(tmp_path, model="tests.train.models_for_tests:tiny", data=f"imagefolder:{root}", image_size=32,
                    batch_size=4, epochs=1, max_bad_fraction=0.0, loader_workers=0, log_every_steps=1)  # fmt: skip
    r = run_deskpod("train", "--config", str(strict), "--out", str(tmp_path), "--name", "strict")
    assert r.code == 2, r.err
    assert "could not be decoded, more than max_bad_fraction 0" in r.err
    assert "Traceback" not in r.err


def test_two_trainings_at_once_do_not_collide(tmp_path: Path) -> None:
    """Each launch picks its own free rendezvous port: no clash on 29500."""
    cfg = config(tmp_path, model="mlp", steps=8)
    with (
        spawn_deskpod("train", "--config", str(cfg), "--out", str(tmp_path), "--name", "a") as a,
        spawn_deskpod("train", "--config", str(cfg), "--out", str(tmp_path), "--name", "b") as b,
    ):
        _, err_a = a.communicate(timeout=180)
        _, err_b = b.communicate(timeout=180)
    assert a.returncode == 0 and b.returncode == 0, err_a + err_b
    assert [m["loss"] for m in metrics(tmp_path / "a")] == [m["loss"] for m in metrics(tmp_path / "b")]
