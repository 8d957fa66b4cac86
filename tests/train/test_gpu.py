"""GPU paths of the trainer: NCCL, bf16 autocast, channels_last. Run on a machine with CUDA GPUs."""

from __future__ import annotations

from pathlib import Path

import pytest

from .conftest import run_deskpod

pytestmark = pytest.mark.gpu


def cuda_count() -> int:
    torch = pytest.importorskip("torch")
    return int(torch.cuda.device_count()) if torch.cuda.is_available() else 0


def test_resnet50_bf16_channels_last_on_one_gpu(tmp_path: Path) -> None:
    if cuda_count() < 1:
        pytest.skip("needs a CUDA GPU")
    r = run_deskpod("train", "--model", "resnet50", "--data", "synthetic:3x224x224", "--devices", "1", "--steps", "30",
                    "--batch-size", "128", "--precision", "auto", "--out", str(tmp_path), "--name", "gpu", timeout=600)  # fmt: skip
    assert r.code == 0, r.err
    s = r.summary(tmp_path / "gpu")
    assert s["device_kind"] == "cuda" and s["precision"] in ("bf16", "fp16") and s["throughput_images_per_s"] > 0
    print(f"resnet50 bf16 1 GPU: {s['throughput_images_per_s']} img/s")


def test_nccl_on_all_gpus(tmp_path: Path) -> None:
    n = cuda_count()
    if n < 1:
        pytest.skip("needs a CUDA GPU")
    r = run_deskpod("train", "--model", "resnet18", "--data", "synthetic:3x64x64", "--steps", "20", "--out", str(tmp_path),
                    "--name", "nccl", timeout=600)  # fmt: skip
    assert r.code == 0, r.err
    assert r.summary(tmp_path / "nccl")["world_size"] == n
