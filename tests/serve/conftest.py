"""A real server process on 127.0.0.1 over a small model repository, shared by the tests of this folder."""

from __future__ import annotations

import re
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, replace
from pathlib import Path

import pytest

from tests.popen import stop_popen

torch = pytest.importorskip("torch")
pytest.importorskip("onnxruntime")


@dataclass
class Server:
    port: int
    repo: Path
    proc: subprocess.Popen[str]
    model: object  # the torch model exported as "mlp"

    @property
    def url(self) -> str:
        return f"127.0.0.1:{self.port}"


def make_mlp() -> object:
    torch.manual_seed(0)
    return torch.nn.Sequential(
        torch.nn.Flatten(), torch.nn.Linear(2 * 4 * 4, 16), torch.nn.ReLU(), torch.nn.Linear(16, 3)
    ).eval()


def build_repo(repo: Path) -> object:
    from deskpod.serve.export import ExportOptions, export_model
    from deskpod.serve.repository import read_config, write_config

    mlp = make_mlp()
    labels = ("a", "b", "c")
    opts = ExportOptions(repo=repo, name="mlp", max_queue_delay_us=0)
    export_model(mlp, (2, 4, 4), opts, class_names=labels, mean=(0.5, 0.4), std=(0.2, 0.3))
    export_model(mlp, (2, 4, 4), opts, class_names=labels, mean=(0.5, 0.4), std=(0.2, 0.3))  # version 2
    export_model(mlp, (2, 4, 4), replace(opts, name="mlp_torch", format="torch"), mean=(0.5, 0.4), std=(0.2, 0.3))
    # Batches form while a request waits 300 ms; the queue holds one request, so a second one is refused.
    export_model(mlp, (2, 4, 4), replace(opts, name="slow", max_queue_delay_us=300_000))
    cfg = read_config(repo / "slow")
    write_config(repo / "slow", replace(cfg, max_queue_size=1))
    export_model(
        mlp, (2, 4, 4), replace(opts, name="merge", max_queue_delay_us=400_000), mean=(0.5, 0.4), std=(0.2, 0.3)
    )
    cfg = read_config(repo / "mlp")
    write_config(repo / "mlp", replace(cfg, versions="all"))
    broken = repo / "broken"
    (broken / "1").mkdir(parents=True)
    write_config(broken, replace(cfg, name="broken"))
    (broken / "1" / "model.onnx").write_bytes(b"this is not an onnx file")
    return mlp


def start_server(repo: Path, *extra: str) -> tuple[subprocess.Popen[str], int]:
    code = (
        "import asyncio, sys; from pathlib import Path; from deskpod.serve.server import ServeConfig, serve; "
        "asyncio.run(serve(ServeConfig(repo=Path(sys.argv[1]), port=0, max_body_bytes=int(sys.argv[2]))))"
    )
    proc = subprocess.Popen(
        [sys.executable, "-c", code, str(repo), str(1 << 20), *extra],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    port = 0
    deadline = time.monotonic() + 120
    assert proc.stdout is not None
    for line in proc.stdout:
        m = re.search(r"listening on http://127.0.0.1:(\d+)", line)
        if m:
            port = int(m.group(1))
        if "deskpod serve: ready" in line:
            break
        if time.monotonic() > deadline:
            break
    if not port or proc.poll() is not None:
        proc.kill()
        raise RuntimeError(f"server did not start (exit {proc.poll()})")
    return proc, port


@pytest.fixture(scope="session")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    repo = tmp_path_factory.mktemp("repo")
    mlp = build_repo(repo)
    proc, port = start_server(repo)
    try:
        yield Server(port, repo, proc, mlp)
    finally:
        stop_server(proc)


def stop_server(proc: subprocess.Popen[str], drain: threading.Thread | None = None) -> None:
    """SIGTERM, 20 s, then SIGKILL; the thread reading its log (``drain``) joined, its log pipe closed."""
    stop_popen(proc, 20)
    if drain is not None:
        drain.join(timeout=20)
    if proc.stdout is not None:
        proc.stdout.close()
