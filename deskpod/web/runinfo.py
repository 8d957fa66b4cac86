"""What the Job page shows of a run folder besides its charts: checkpoints, the resolved config, the summary.

Read fresh each time (they are small), as `deskpod.envs.userfiles.open_path` reads a job's folder (no link the
job's user planted followed, no FIFO waited on); the live stream (`deskpod.web.stream`) sends them again, as
HTML rendered here, when the files change (`signature`), so a page that was open when the run began
shows its checkpoints and final result without a reload.
"""

from __future__ import annotations

import json
import math
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from deskpod.envs.userfiles import read_path, scandir_path, stat_path
from deskpod.jobs.api import MAX_DEPTH, nesting
from deskpod.jobs.store import JobRecord
from deskpod.train.runs import RunPaths, checkpoint_step
from deskpod.web import render
from deskpod.web.app import Web
from deskpod.web.series import Series

MAX_BYTES = 1 << 20
"""A config or summary is read up to this size (a bigger one is no run's own: it reads as damaged)."""


def display(value: Any) -> str:
    """A config value as text: JSON, so ``"1"`` and ``1`` look different."""
    return json.dumps(value, ensure_ascii=False, default=str)


def flatten(table: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    """``{"a": {"b": 1}}`` -> ``{"a.b": 1}``: every leaf of a TOML table under its dotted key."""
    out: dict[str, Any] = {}
    for k, v in table.items():
        key = f"{prefix}{k}"
        if isinstance(v, Mapping) and v:
            out.update(flatten(v, f"{key}."))
        else:
            out[key] = v
    return out


@dataclass
class RunConfig:
    """A train job's configuration as the pages show it."""

    source: str
    """``config.toml``, or the submitted spec before the run resolved it."""
    values: dict[str, Any]
    """By dotted key (`flatten`)."""
    items: list[list[str]]
    """``[key, value as text]``, sorted by key."""
    error: str | None = render.unless_none()
    """Why ``config.toml`` could not be read."""


def resolved_config(web: Web, job: JobRecord) -> RunConfig | None:
    """A train job's configuration: the run's resolved ``config.toml``, or what was submitted before the run
    resolved it."""
    if job.spec.train is None:
        return None
    run = web.run_dir(job)
    path = None if run is None else RunPaths(run).config
    if path is not None and stat_path(path) is not None:
        try:
            return _config("config.toml", flatten(tomllib.loads(read_path(path, limit=MAX_BYTES).decode())))
        except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError, RecursionError) as e:
            return RunConfig("config.toml", {}, [], error=f"cannot read config.toml: {e}")
    return _config("the submitted spec (the run has not resolved it yet)", flatten(job.spec.train))


def _config(source: str, values: dict[str, Any]) -> RunConfig:
    return RunConfig(source, values, [[k, display(values[k])] for k in sorted(values)])


SUMMARY_NUMBERS = frozenset({"test_accuracy", "test_loss", "throughput_images_per_s", "throughput_per_device",
                             "train_time_s", "wall_time_s", "data_wait_fraction", "steps", "total_steps", "restarts"})  # fmt: skip
"""Keys of ``summary.json`` that the pages compute with: anything but a number there is shown as none."""


def read_summary(run: Path | None) -> dict[str, Any] | None:
    """``summary.json`` of a run that finished (None before). The job writes it, so it may hold anything: a
    non-finite number, a `SUMMARY_NUMBERS` key that is no number, a ``state`` that is no text, or a value nested
    deeper than the pages render is None."""
    if run is None:
        return None
    try:
        data = json.loads(read_path(run / "summary.json", limit=MAX_BYTES))
    except (OSError, ValueError, RecursionError):
        return None
    if not isinstance(data, dict):
        return None
    return {k: _summary_value(k, v) for k, v in data.items()}


def _summary_value(key: str, v: Any) -> Any:
    if isinstance(v, float) and not math.isfinite(v):
        return None
    if key == "state":
        return v if isinstance(v, str) else None
    if key in SUMMARY_NUMBERS:
        return v if isinstance(v, int | float) and not isinstance(v, bool) else None
    return v if nesting(v) <= MAX_DEPTH else None


def checkpoint_files(run: Path) -> list[tuple[int, str]]:
    """(step, file name) of the run's checkpoints, oldest first: the files ``checkpoints/`` lists, reached without
    following a link (`deskpod.train.runs.list_checkpoints` is the trainer's, in a folder of its own)."""
    return sorted((step, e.name) for e in scandir_path(RunPaths(run).checkpoints)
                  if (step := checkpoint_step(Path(e.name))) is not None and e.is_file(follow_symlinks=False))  # fmt: skip


def has_checkpoint(run: Path) -> bool:
    return bool(checkpoint_files(run))


@dataclass
class Checkpoint:
    """A checkpoint of a run, with the train loss at its step and the latest validation at or before it."""

    file: str
    step: int
    size: int
    time: float
    loss: float | None
    loss_step: int | None
    """The step of ``loss`` (the last logged at or before ``step``)."""
    val_accuracy: float | None
    val_loss: float | None
    val_step: int | None


def checkpoints(run: Path, s: Series) -> list[Checkpoint]:
    """The run's checkpoints, each with the train loss at its step and the latest validation at or before it."""
    out = []
    folder = RunPaths(run).checkpoints
    for step, name in checkpoint_files(run):
        st = stat_path(folder / name)
        if st is None:  # deleted meanwhile (the trainer keeps the latest few), or not a file
            continue
        loss = s.at("train", "loss", step)
        acc = s.at("val", "val_accuracy", step)
        vloss = s.at("val", "val_loss", step)
        out.append(
            Checkpoint(
                name,
                step,
                st.st_size,
                st.st_mtime,
                loss=None if loss is None else loss[1],
                loss_step=None if loss is None else int(loss[0]),
                val_accuracy=None if acc is None else acc[1],
                val_loss=None if vloss is None else vloss[1],
                val_step=None if acc is None and vloss is None else int((acc or vloss or (0, 0))[0]),
            )
        )
    return out


def signature(run: Path) -> tuple[int, ...]:
    """Changes when a checkpoint is written or removed, or the config or summary is written."""
    paths = RunPaths(run)
    out = []
    for p, folder in ((paths.checkpoints, True), (paths.config, False), (paths.summary, False)):
        st = stat_path(p, directory=folder)
        out.append(0 if st is None else st.st_mtime_ns)
    return tuple(out)


def parts(web: Web, job: JobRecord, run: Path, s: Series) -> dict[str, str]:
    """The run's sections of the Job page as HTML (escaped by the templates), by container id."""
    macros: Any = render.TEMPLATES.get_template("job_run.html").make_module()  # its attributes are the macros
    return {
        "run-summary": str(macros.summary(read_summary(run))),
        "run-checkpoints": str(macros.checkpoint_table(checkpoints(run, s))),
        "run-config": str(macros.config_table(resolved_config(web, job))),
    }
