"""``deskpod serve REPO --export RUN --port-file F``: what a pod ``[serve]`` job runs.

The run folders here hold a checkpoint written the way the trainer writes one (no training needed: a tiny
registry MLP with random weights); the port file and the skip-export rule are checked on a real server process.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import numpy as np
import pytest

from deskpod.cli import main
from deskpod.serve.repository import read_config, versions
from tests.serve.conftest import torch

LABELS = ("cat", "dog", "eel")
STOPPED = 128 + int(signal.SIGTERM)
"""``deskpod serve``'s exit code after SIGTERM (fake servers here stop as if they got it)."""


def make_run(run: Path, step: int, seed: int = 0) -> Path:
    """A run folder with one checkpoint of the registry's ``mlp`` on 1x8x8 inputs, 3 classes."""
    from deskpod.train import checkpoint as ckpt
    from deskpod.train.models import ModelSpec, build_model

    torch.manual_seed(seed)
    model = build_model("mlp", ModelSpec(len(LABELS), 1, (8, 8)))
    state = {
        "format": ckpt.FORMAT,
        "model": model.state_dict(),
        "model_name": "mlp",
        "step": step,
        "data_spec": {"input_shape": [1, 8, 8], "num_classes": len(LABELS), "class_names": list(LABELS),
                      "mean": [0.5], "std": [0.25]},
    }  # fmt: skip
    ckpt.save_atomic(state, ckpt.path_for(run, step))
    return run


def source_of(repo: Path, name: str, version: int) -> dict[str, object]:
    doc = json.loads((repo / name / str(version) / "source.json").read_text())
    assert isinstance(doc, dict)
    return doc


def test_export_once_per_checkpoint(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The first start exports; a restart on the same checkpoint does not; a new checkpoint or new options do."""
    import deskpod.serve.server as server

    served: list[Path] = []

    async def fake_serve(config: server.ServeConfig, started: object = None) -> int:
        served.append(config.repo)
        return int(signal.SIGTERM)

    monkeypatch.setattr(server, "serve", fake_serve)
    run = make_run(tmp_path / "runs" / "r1", 5)
    repo = tmp_path / "models"
    argv = ["serve", str(repo), "--export", str(run), "--name", "m", "--port", "0", "--loop", "asyncio"]
    assert main(argv) == STOPPED
    assert versions(repo / "m") == [1]
    src = source_of(repo, "m", 1)
    assert src["checkpoint"] == str((run / "checkpoints" / "step-00000005.pt").resolve()) and src["step"] == 5
    cfg = read_config(repo / "m")
    assert cfg.labels == LABELS and cfg.inputs[0].dims == (1, 8, 8) and cfg.max_batch_size == 32

    assert main(argv) == STOPPED  # same checkpoint, same options: nothing exported
    assert versions(repo / "m") == [1]

    make_run(run, 9, seed=1)  # the run went on: its newest checkpoint is exported
    assert main(argv) == STOPPED
    assert versions(repo / "m") == [1, 2] and source_of(repo, "m", 2)["step"] == 9

    assert main([*argv, "--max-batch-size", "4"]) == STOPPED  # other options: a new version with them
    assert versions(repo / "m") == [1, 2, 3] and read_config(repo / "m").max_batch_size == 4
    assert served == [repo] * 4

    import onnxruntime as ort

    from deskpod.train.checkpoint import load_model

    m = load_model(run)
    x = np.random.default_rng(0).random((2, 1, 8, 8), dtype=np.float32)
    got = ort.InferenceSession(str(repo / "m" / "3" / "model.onnx")).run(None, {"input": x})[0]
    with torch.no_grad():
        want = m.model((torch.from_numpy(x) - 0.5) / 0.25).numpy()
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)  # the step-9 weights, normalisation baked in


def test_export_default_name_is_the_run_name(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import deskpod.serve.server as server

    async def fake_serve(config: server.ServeConfig, started: object = None) -> int:
        return int(signal.SIGINT)

    monkeypatch.setattr(server, "serve", fake_serve)
    run = make_run(tmp_path / "runs" / "my run+1", 3)
    assert main(["serve", str(tmp_path / "repo"), "--export", str(run), "--loop", "asyncio"]) == 130  # as after ^C
    assert versions(tmp_path / "repo" / "my-run-1") == [1]


@pytest.mark.parametrize(
    ("setup", "extra", "message"),
    [
        ("none", (), "no such run folder"),
        ("empty", (), "has no checkpoint yet"),
        ("run", ("--name", "../evil"), "--name '../evil'"),
        ("run", ("--name", ""), "--name ''"),
        ("run", ("--max-batch-size", "0"), "--max-batch-size 0"),
    ],
)
def test_export_bad_input_is_one_line_exit_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], setup: str, extra: tuple[str, ...], message: str
) -> None:
    run = tmp_path / "runs" / "r"
    if setup == "empty":
        (run / "checkpoints").mkdir(parents=True)
    elif setup == "run":
        make_run(run, 1)
    port_file = tmp_path / "serve.json"
    port_file.write_text('{"ready": true}')  # a previous attempt's: removed before anything else
    code = main(["serve", str(tmp_path / "repo"), "--export", str(run), *extra, "--port-file", str(port_file)])
    err = capsys.readouterr().err
    assert code == 2, err
    assert message in err and len(err.strip().splitlines()) == 1, err
    assert not port_file.exists()
    assert not (tmp_path / "repo").exists() or not any((tmp_path / "repo").iterdir())


def test_export_options_need_export(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "repo").mkdir()
    assert main(["serve", str(tmp_path / "repo"), "--name", "x"]) == 2
    assert "--name goes with --export" in capsys.readouterr().err


def test_port_file_says_where_and_when_ready(tmp_path: Path) -> None:
    """A real server process: the port file appears with its URL and pid, says ready, and says stopped on SIGTERM."""
    run = make_run(tmp_path / "runs" / "r", 2)
    port_file = tmp_path / "job" / "serve.json"
    port_file.parent.mkdir()
    cmd = [sys.executable, "-m", "deskpod", "serve", str(tmp_path / "job" / "models"), "--export", str(run),
           "--name", "tiny", "--port", "0", "--port-file", str(port_file)]  # fmt: skip
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        doc: dict[str, object] = {}
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and not doc.get("ready"):
            assert proc.poll() is None, proc.stdout.read() if proc.stdout else ""
            if port_file.exists():
                doc = json.loads(port_file.read_text())  # written atomically: never a torn file
            time.sleep(0.1)
        assert doc.get("ready") is True, doc
        assert doc["pid"] == proc.pid and doc["models"] == ["tiny"] and doc["unavailable"] == {}
        url = str(doc["url"])
        assert url.startswith("http://127.0.0.1:")
        with httpx.Client(base_url=url, trust_env=False, timeout=10) as c:
            meta = c.get("/v2/models/tiny").json()
            assert meta["inputs"][0]["shape"] == [-1, 1, 8, 8]
            assert meta["parameters"]["labels"] == list(LABELS)
            assert c.get("/v2/health/ready").status_code == 200
        assert list(port_file.parent.glob(".*tmp")) == []
    finally:
        proc.send_signal(signal.SIGTERM)
        out, _ = proc.communicate(timeout=30)
    assert proc.returncode == STOPPED, out  # stopped by SIGTERM: 128 + 15, so a cancelled serve job is "cancelled"
    after = json.loads(port_file.read_text())
    assert after["ready"] is False and after["stopped"] is True and after["url"] == url
