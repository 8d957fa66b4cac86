"""Export: a run folder (through deskpod.train.checkpoint.load_model) -> a repository version with its spec and labels."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

from deskpod.cli import main
from deskpod.serve.repository import read_config, versions
from tests.serve.conftest import Server, make_mlp, torch


def test_export_run_through_the_cli(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import deskpod.train.checkpoint as checkpoint

    model = make_mlp()
    loaded = SimpleNamespace(model=model, model_name="mlp", input_shape=(2, 4, 4), class_names=["x", "y", "z"],
                             mean=(0.1, 0.2), std=(0.5, 0.25))  # fmt: skip
    monkeypatch.setattr(checkpoint, "load_model", lambda run_dir: loaded)
    run = tmp_path / "runs" / "t1"
    run.mkdir(parents=True)
    repo = tmp_path / "models"
    for _ in range(2):
        assert main(["export", str(run), "--repo", str(repo), "--max-batch-size", "8"]) == 0
    cfg = read_config(repo / "t1")
    assert versions(repo / "t1") == [1, 2]
    assert cfg.labels == ("x", "y", "z") and cfg.max_batch_size == 8 and cfg.inputs[0].dims == (2, 4, 4)
    import onnxruntime as ort

    x = np.random.default_rng(0).random((3, 2, 4, 4), dtype=np.float32)
    got = ort.InferenceSession(str(repo / "t1" / "2" / "model.onnx")).run(None, {"input": x})[0]
    mean, std = torch.tensor([0.1, 0.2]).view(1, 2, 1, 1), torch.tensor([0.5, 0.25]).view(1, 2, 1, 1)
    with torch.no_grad():
        want = model((torch.from_numpy(x) - mean) / std).numpy()  # type: ignore[operator]
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)


def test_export_refuses_bad_input(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["export", str(tmp_path / "missing"), "--repo", str(tmp_path)]) == 2
    assert "does not exist" in capsys.readouterr().err


@pytest.mark.slow
def test_trained_run_export_serve_infer(server: Server, tmp_path: Path) -> None:
    """A real (tiny) training run -> deskpod export -> load into the running server -> same predictions as torch."""
    import subprocess
    import sys

    import tritonclient.http as tc

    from deskpod.train.checkpoint import load_model

    cmd = [sys.executable, "-m", "deskpod", "train", "--data", "synthetic:1x16x16", "--model", "mlp", "--devices", "1",
           "--steps", "2", "--batch-size", "8", "--quiet", "--out", str(tmp_path), "--name", "tiny"]  # fmt: skip
    subprocess.run(cmd, check=True, capture_output=True, timeout=240)
    run = tmp_path / "tiny"
    assert main(["export", str(run), "--repo", str(server.repo), "--name", "trained"]) == 0
    client = tc.InferenceServerClient(server.url)
    client.load_model("trained")
    m = load_model(run)
    x = np.random.default_rng(0).random((4, *m.input_shape), dtype=np.float32)
    inp = tc.InferInput("input", list(x.shape), "FP32")
    inp.set_data_from_numpy(x)
    got = client.infer("trained", [inp]).as_numpy("logits")
    mean, std = torch.tensor(m.mean).view(1, -1, 1, 1), torch.tensor(m.std).view(1, -1, 1, 1)
    with torch.no_grad():
        want = m.model((torch.from_numpy(x) - mean) / std).numpy()
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)
    assert (got.argmax(1) == want.argmax(1)).all()
