from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from deskpod.errors import CheckpointError
from deskpod.train import checkpoint as ckpt
from deskpod.train.models import MLP, ConvNet


def state(step: int, model: torch.nn.Module, name: str = "convnet") -> dict[str, object]:
    return {"format": ckpt.FORMAT, "model_name": name, "model": model.state_dict(), "step": step}


def test_save_prune_and_load_latest(tmp_path: Path) -> None:
    m = ConvNet(10, 1)
    for step in (10, 20, 30, 40):
        ckpt.save_atomic(state(step, m), ckpt.path_for(tmp_path, step))
    ckpt.prune(tmp_path, keep=2)
    assert [p.name for p in ckpt.list_checkpoints(tmp_path)] == ["step-00000030.pt", "step-00000040.pt"]
    path, loaded = ckpt.load_latest(tmp_path)
    assert path.name == "step-00000040.pt" and loaded["step"] == 40


def test_corrupt_checkpoint_is_reported_and_skipped(tmp_path: Path) -> None:
    m = ConvNet(10, 1)
    ckpt.save_atomic(state(10, m), ckpt.path_for(tmp_path, 10))
    bad = ckpt.path_for(tmp_path, 20)
    bad.write_bytes(ckpt.path_for(tmp_path, 10).read_bytes()[:500])
    warnings: list[str] = []
    _path, loaded = ckpt.load_latest(tmp_path, warn=warnings.append)
    assert loaded["step"] == 10 and "step-00000020.pt is corrupt" in warnings[0]
    with pytest.raises(CheckpointError, match="corrupt"):
        ckpt.load(bad)


def test_no_checkpoint_is_bad_input(tmp_path: Path) -> None:
    with pytest.raises(CheckpointError) as e:
        ckpt.load_latest(tmp_path)
    assert e.value.exit_code == 2 and "no checkpoint" in str(e.value)


def test_checkpoint_of_another_model_is_refused(tmp_path: Path) -> None:
    s = state(1, MLP(10, 784), name="mlp")
    with pytest.raises(CheckpointError, match="from model 'mlp', not 'convnet'"):
        ckpt.check_compatible(s, "convnet", ConvNet(10, 1), tmp_path / "x.pt")
    with pytest.raises(CheckpointError, match="does not fit model"):
        ckpt.check_compatible(state(1, ConvNet(10, 3)), "convnet", ConvNet(10, 1), tmp_path / "x.pt")


WRITER = """
import sys, time, torch
from pathlib import Path
from deskpod.train import checkpoint as ckpt
from deskpod.train.models import ConvNet
run = Path(sys.argv[1])
big = {"format": ckpt.FORMAT, "model_name": "convnet", "model": ConvNet(10, 1).state_dict(), "step": 2,
       "pad": torch.zeros(64 * 2**20 // 4)}
print("writing", flush=True)
stage = sys.argv[2]
if stage == "rename":
    ckpt.save_atomic(big, ckpt.path_for(run, 2), before_rename=lambda: (print("durable", flush=True), time.sleep(60)))
else:
    while True:
        ckpt.save_atomic(big, ckpt.path_for(run, 2))
"""


@pytest.mark.parametrize("stage", ["rename", "write"])
def test_kill_during_write_leaves_previous_checkpoint_loadable(tmp_path: Path, stage: str) -> None:
    good = state(1, ConvNet(10, 1))
    ckpt.save_atomic(good, ckpt.path_for(tmp_path, 1))
    proc = subprocess.Popen([sys.executable, "-c", WRITER, str(tmp_path), stage], stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None
    assert proc.stdout.readline().strip() == "writing"
    if stage == "rename":
        assert proc.stdout.readline().strip() == "durable"
    else:
        deadline = time.monotonic() + 30
        while not list((tmp_path / "checkpoints").glob(".step-*")) and time.monotonic() < deadline:
            time.sleep(0.005)
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    proc.stdout.close()
    _path, loaded = ckpt.load_latest(tmp_path, warn=lambda _m: None)
    assert loaded["step"] in (1, 2)  # 2 only if a full write+rename completed before the kill
    for p in ckpt.list_checkpoints(tmp_path):
        ckpt.load(p)  # every file under a checkpoint name is whole
    ckpt.prune(tmp_path, keep=5)
    assert not list((tmp_path / "checkpoints").glob(".step-*")), "the dead writer's temp file is cleaned up"
