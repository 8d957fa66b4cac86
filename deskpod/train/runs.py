"""The run folder, and the one place that reads it (serve, plan and the dashboard come through here).

::

    runs/<name>/
        config.toml        the resolved configuration
        launch.json        how the launcher started the workers (devices, backend, output mode)
        metrics.jsonl      one JSON object per logged step, and one per validation ("kind": "val")
        tb/                TensorBoard event files
        checkpoints/       step-00001234.pt, the latest K kept
        summary.json       written at the end: accuracy, throughput, wall time, state
        plots/*.png        loss, accuracy and throughput curves
        logs/              each worker's stderr (rank<R>.attempt<N>.stderr) and the agent's error files
        workers/           each worker's pid (rank<N>.pid), for tools that watch or signal them
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

from deskpod.errors import CheckpointError, UsageError


@dataclass(frozen=True, slots=True)
class RunPaths:
    root: Path

    @property
    def config(self) -> Path:
        return self.root / "config.toml"

    @property
    def launch(self) -> Path:
        return self.root / "launch.json"

    @property
    def metrics(self) -> Path:
        return self.root / "metrics.jsonl"

    @property
    def summary(self) -> Path:
        return self.root / "summary.json"

    @property
    def tensorboard(self) -> Path:
        return self.root / "tb"

    @property
    def checkpoints(self) -> Path:
        return self.root / "checkpoints"

    @property
    def plots(self) -> Path:
        return self.root / "plots"


def default_run_name(model: str, data: str, now: datetime | None = None) -> str:
    now = now or datetime.now()

    def safe(s: str) -> str:
        return "".join(c if c.isalnum() or c in "-_." else "-" for c in s).strip("-")[:40]

    return f"{safe(model.split(':')[-1])}-{safe(data.split(':')[0])}-{now:%Y%m%d-%H%M%S}"


def read_json(path: Path) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text())
    except FileNotFoundError:
        raise UsageError(f"{path} does not exist") from None
    except json.JSONDecodeError as e:
        raise UsageError(f"{path} is not valid JSON: {e}") from None
    if not isinstance(data, dict):
        raise UsageError(f"{path} does not hold a JSON object")
    return data


def read_summary(run_dir: Path) -> dict[str, Any]:
    return read_json(RunPaths(run_dir).summary)


def read_metrics(run_dir: Path) -> list[dict[str, Any]]:
    """Every record of ``metrics.jsonl`` (a torn last line, from a crash, is skipped)."""
    path = RunPaths(run_dir).metrics
    if not path.exists():
        return []
    out = []
    for line in path.read_text().splitlines():
        try:
            rec = json.loads(line)
        except json.JSONDecodeError:
            continue
        if isinstance(rec, dict):
            out.append(rec)
    return out


@dataclass(frozen=True, slots=True)
class LoadedModel:
    """A trained model ready for inference, with what its inputs must look like."""

    model: Any  # torch.nn.Module (typed Any so this module imports without torch)
    model_name: str
    input_shape: tuple[int, int, int]
    class_names: list[str]
    mean: tuple[float, ...]
    std: tuple[float, ...]
    step: int
    checkpoint: Path


def load_model(run_dir: Path) -> LoadedModel:
    """The model of a run from its latest loadable checkpoint: eval mode, CPU, fp32."""
    from deskpod.train import checkpoint as ckpt
    from deskpod.train.models import ModelSpec, build_model

    run_dir = Path(run_dir)
    if not run_dir.is_dir():
        raise UsageError(f"run folder {str(run_dir)!r} does not exist")
    try:
        path, state = ckpt.load_latest(run_dir, warn=lambda _m: None)
    except CheckpointError as e:
        raise CheckpointError(f"run {run_dir}: {e}", usage=True) from None
    spec = state["data_spec"]
    c, h, w = (int(v) for v in spec["input_shape"])
    model = build_model(state["model_name"], ModelSpec(int(spec["num_classes"]), c, (h, w)))
    model.load_state_dict(state["model"])
    model.eval()
    return LoadedModel(
        model=model,
        model_name=str(state["model_name"]),
        input_shape=(c, h, w),
        class_names=[str(x) for x in spec["class_names"]],
        mean=tuple(float(x) for x in spec["mean"]),
        std=tuple(float(x) for x in spec["std"]),
        step=int(state["step"]),
        checkpoint=path,
    )
