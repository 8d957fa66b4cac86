"""The run folder, and the one place that reads it (serve, plan and the dashboard come through here;
the model in its checkpoints is loaded by `deskpod.train.checkpoint.load_model`).

::

    runs/<name>/
        config.toml        the resolved configuration
        launch.json        how the launcher started the workers (devices, backend, output mode, total_steps)
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
import re
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

from deskpod.environment.files import Under
from deskpod.errors import UsageError

NAME_MAX = 64
"""The longest name of a run, and of a job: a pod's train job names its run folder after itself
(`deskpod.jobs.spec`), so the two limits are one."""
NAME_RE = re.compile(rf"^[A-Za-z0-9][A-Za-z0-9._-]{{0,{NAME_MAX - 1}}}$")
"""A run's or job's name: a folder name and a shell word as it is (no spaces, shell characters or '/')."""
NAME_HELP = f"1-{NAME_MAX} letters, digits, '.', '_' or '-' starting with a letter or digit"


@dataclass(frozen=True, slots=True)
class RunPaths:
    root: Path

    config = Under("config.toml")
    launch = Under("launch.json")
    metrics = Under("metrics.jsonl")
    summary = Under("summary.json")
    tensorboard = Under("tb")
    logs = Under("logs")
    workers = Under("workers")
    plots = Under("plots")

    @property
    def checkpoints(self) -> Path:
        return checkpoint_dir(self.root)


CHECKPOINT_NAME = re.compile(r"^step-(\d{8,})\.pt$")


def checkpoint_dir(run_dir: Path) -> Path:
    return run_dir / "checkpoints"


def checkpoint_step(path: Path) -> int | None:
    """The optimizer step a checkpoint file holds, from its name (None: not a checkpoint file)."""
    m = CHECKPOINT_NAME.match(path.name)
    return int(m.group(1)) if m else None


def list_checkpoints(run_dir: Path) -> list[Path]:
    """Checkpoint files of a run, oldest first (by step)."""
    d = checkpoint_dir(run_dir)
    if not d.is_dir():
        return []
    found = [(step, p) for p in d.iterdir() if (step := checkpoint_step(p)) is not None]
    return [p for _, p in sorted(found)]


def has_checkpoint(run_dir: Path) -> bool:
    return bool(list_checkpoints(run_dir))


def default_run_name(model: str, data: str, now: datetime | None = None) -> str:
    now = now or datetime.now()

    def safe(s: str) -> str:  # two parts and the time (15 characters) fit in NAME_MAX
        return "".join(c if c.isalnum() or c in "-_." else "-" for c in s).strip("-")[: (NAME_MAX - 17) // 2]

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
