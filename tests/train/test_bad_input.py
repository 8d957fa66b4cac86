"""Every bad input to ``deskpod train``: one line naming the value and what is valid, exit code 2."""

from __future__ import annotations

from pathlib import Path

import pytest

from .conftest import needs_fashion_mnist, run_deskpod


def one_line_error(err: str) -> str:
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert len(lines) == 1, err
    assert lines[0].startswith("deskpod: ") and "Traceback" not in err
    return lines[0]


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (["--model", "resnet99"], "unknown model 'resnet99'"),
        (["--data", "cifar10"], "unknown dataset 'cifar10'"),
        (["--precision", "fp64"], "precision = 'fp64' is not valid: use one of auto, fp32, bf16, fp16"),
        (["--data", "imagefolder:/no/such/folder"], "imagefolder path '/no/such/folder' does not exist"),
        (["--devices", "9"], "asks for 9 devices but this machine has"),
        (["--devices", "0,5"], "no device 5"),
        (["--batch-size", "0"], "batch_size = 0 is not valid"),
        (
            ["--data", "synthetic:3x64x64", "--model", "alexnet", "--batch-size", "40000", "--devices", "2"],
            "more than the 50000 training samples",
        ),
        (["--model", "alexnet"], "needs images of at least 63×63"),
    ],
)
def test_bad_flags(tmp_path: Path, args: list[str], needle: str) -> None:
    r = run_deskpod("train", *args, "--out", str(tmp_path), timeout=120)
    assert r.code == 2
    assert needle in one_line_error(r.err)


def test_unknown_config_key_and_batch_that_does_not_divide(tmp_path: Path) -> None:
    cfg = tmp_path / "c.toml"
    cfg.write_text("modle = 'mlp'\n")
    r = run_deskpod("train", "--config", str(cfg), "--out", str(tmp_path))
    assert r.code == 2 and "unknown config key 'modle' (did you mean 'model'?)" in one_line_error(r.err)
    cfg.write_text("global_batch_size = 101\ndata = 'synthetic:1x8x8'\nmodel = 'mlp'\n")
    r = run_deskpod("train", "--config", str(cfg), "--devices", "2", "--out", str(tmp_path))
    assert r.code == 2 and "global_batch_size 101 does not divide by 2 devices" in one_line_error(r.err)


def test_resume_without_checkpoint(tmp_path: Path) -> None:
    r = run_deskpod("train", "--resume", "--name", "never-ran", "--out", str(tmp_path))
    assert r.code == 2 and "nothing to resume" in one_line_error(r.err)
    r = run_deskpod("train", "--resume", "--out", str(tmp_path))
    assert r.code == 2 and "no run with a checkpoint" in one_line_error(r.err)


@needs_fashion_mnist
def test_resume_with_another_models_checkpoint_and_a_corrupt_one(tmp_path: Path) -> None:
    r = run_deskpod(
        "train", "--model", "mlp", "--steps", "3", "--batch-size", "16", "--out", str(tmp_path), "--name", "r"
    )
    assert r.code == 0, r.err
    r = run_deskpod("train", "--resume", "--name", "r", "--model", "convnet", "--out", str(tmp_path))
    assert r.code == 2 and "is from model 'mlp', not 'convnet'" in one_line_error(r.err)
    (tmp_path / "r/checkpoints/step-00000003.pt").write_bytes(b"PK\x03\x04 torn")
    r = run_deskpod("train", "--resume", "--name", "r", "--out", str(tmp_path))
    assert r.code == 1
    assert "step-00000003.pt is corrupt and was not loaded" in r.err and "Traceback" not in r.err
    r = run_deskpod("train", "--model", "mlp", "--steps", "3", "--out", str(tmp_path), "--name", "r")
    assert r.code == 2 and "already exists with checkpoints" in one_line_error(r.err)
