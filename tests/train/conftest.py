"""Helpers for the trainer's tests: run the real ``deskpod`` command in a subprocess."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

REPO = Path(__file__).resolve().parents[2]
FMNIST = Path(os.environ.get("DESKPOD_FASHION_MNIST", "/usr/share/datasets/fashion-mnist"))

needs_fashion_mnist = pytest.mark.skipif(
    not (FMNIST / "train-images-idx3-ubyte.gz").exists(),
    reason="Fashion-MNIST is not installed (make test installs Debian's dataset-fashion-mnist)",
)


@dataclass
class Result:
    code: int
    out: str
    err: str

    def summary(self, run_dir: Path) -> dict[str, Any]:
        return dict(json.loads((run_dir / "summary.json").read_text()))


def deskpod_env(**extra: str) -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(REPO), env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    env.pop("CUDA_VISIBLE_DEVICES", None)
    env.update(extra)
    return env


def deskpod_cmd(*args: str) -> list[str]:
    return [sys.executable, "-m", "deskpod", *args]


def run_deskpod(*args: str, timeout: float = 240, cwd: Path | None = None, progress: Path | None = None,
                **env: str) -> Result:  # fmt: skip
    """``deskpod ARGS`` in a subprocess. Its time limit is ``timeout`` seconds in all; with ``progress`` (a file the
    command appends to as it works, such as a run's metrics.jsonl) it is ``timeout`` seconds *without progress*,
    however long the whole takes: a loaded machine makes the command slower, not the test red, and a command that
    hangs is still stopped."""
    if progress is None:
        proc = subprocess.run(deskpod_cmd(*args), capture_output=True, text=True, timeout=timeout,
                              cwd=cwd or REPO, env=deskpod_env(**env))  # fmt: skip
        return Result(proc.returncode, proc.stdout, proc.stderr)
    with tempfile.TemporaryFile("w+") as out, tempfile.TemporaryFile("w+") as err:
        p = subprocess.Popen(deskpod_cmd(*args), stdout=out, stderr=err, text=True, cwd=cwd or REPO,
                             env=deskpod_env(**env), start_new_session=True)  # fmt: skip
        seen, last = None, time.monotonic()
        while p.poll() is None:
            now = time.monotonic()
            with contextlib.suppress(OSError):
                st = progress.stat()
                if (st.st_size, st.st_mtime_ns) != seen:
                    seen, last = (st.st_size, st.st_mtime_ns), now
            if now - last > timeout:
                os.killpg(p.pid, signal.SIGKILL)
                p.wait()
                raise subprocess.TimeoutExpired(deskpod_cmd(*args), timeout)
            time.sleep(0.5)
        out.seek(0)
        err.seek(0)
        return Result(p.returncode, out.read(), err.read())


def metrics(run_dir: Path, kind: str = "train") -> list[dict[str, Any]]:
    lines = (run_dir / "metrics.jsonl").read_text().splitlines()
    return [r for r in map(json.loads, lines) if r["kind"] == kind]


@contextlib.contextmanager
def spawn_deskpod(*args: str) -> Iterator[subprocess.Popen[str]]:
    """Start ``deskpod`` in its own process group; whatever happens, nothing of it outlives the test."""
    proc = subprocess.Popen(deskpod_cmd(*args), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env=deskpod_env(), cwd=REPO, start_new_session=True)  # fmt: skip
    try:
        yield proc
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.communicate()
