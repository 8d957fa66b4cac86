"""A train job: ``[train]``, a table of `deskpod train` settings, run by the trainer on the job's devices; a
requeued or retried attempt resumes from the run's latest checkpoint.

``deskpod train --submit``, the dashboard's New training page (which shows the same job as a
``deskpod train --submit`` line, `submit_argv`) and the API all queue the spec `spec` builds.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import tomli_w

from deskpod.envs.userfiles import scandir_path, write_no_follow
from deskpod.jobs.kinds.fields import bad

MAX_TRAIN_CHARS = 32768
FLAGS = {"batch_size": "--batch-size", "precision": "--precision", "optimizer": "--optimizer", "lr": "--lr"}
"""The `deskpod train` flags `submit_argv` writes for keys beside model, data and the length."""


def _toml_value(depth: int) -> dict[str, Any]:
    """A value the trainer's TOML file can hold (no nulls), nested at most ``depth`` tables or arrays deep."""
    if depth == 0:
        return {"type": ["string", "number", "boolean"]}
    inner = _toml_value(depth - 1)
    return {"type": ["string", "number", "boolean", "array", "object"], "items": inner, "additionalProperties": inner}


ENVIRONMENT = False
SESSION = False
EXTRA: str | None = None
SCHEMA: dict[str, Any] = {
    "type": "object",
    "additionalProperties": _toml_value(3),
    "description": "deskpod train settings (the fields of its config file), writable as TOML (no nulls),"
    f" under {MAX_TRAIN_CHARS} characters as JSON",
}


def parse(t: object) -> dict[str, Any]:
    if not isinstance(t, Mapping) or len(json.dumps(t, default=str)) > MAX_TRAIN_CHARS:
        raise bad("train", t, f"expected a table of deskpod train settings (under {MAX_TRAIN_CHARS} characters)")
    train = dict(t)
    try:
        tomli_w.dumps(train)  # the trainer gets it as a TOML file: null and mixed arrays cannot be written
    except (TypeError, ValueError) as e:
        raise bad("train", t, f"it must be writable as TOML (no nulls): {e}") from e
    return train


def default_name(train: Mapping[str, Any], fallback: str) -> str:
    return "train"


def check(train: Mapping[str, Any]) -> None:
    """Nothing more: the table was checked as TOML; the trainer checks its keys (the CLI does before it submits)."""


def argv(train: Mapping[str, Any], name: str, folder: Path) -> list[str]:
    """``deskpod train`` on the table, written to ``train.toml`` in the job's folder, with its run in the
    folder's ``runs/`` (`deskpod.jobs.pod.Pod.run_dir`), resumed when the run has a checkpoint."""
    folder.mkdir(parents=True, exist_ok=True)
    config = folder / "train.toml"
    write_no_follow(config, tomli_w.dumps(dict(train)).encode())  # the folder may be the job user's
    out = folder / "runs"
    line = [sys.executable, "-m", "deskpod", "train", "--config", str(config), "--out", str(out), "--name", name,
            "--devices", "all"]  # fmt: skip
    if any(e.name.endswith(".pt") for e in scandir_path(out / name / "checkpoints")):  # no link followed
        line.append("--resume")
    return line


def spec(train: Mapping[str, Any], *, devices: int | str, name: str | None = None) -> dict[str, Any]:
    """The job spec that trains with ``train`` on ``devices``: what ``deskpod train --submit`` and the dashboard
    queue."""
    out: dict[str, Any] = {"train": dict(train), "devices": devices}
    if name is not None:
        out["name"] = name
    return out


def float_text(x: float) -> str:
    """A float as `deskpod train`'s flag takes it back: ``0.1``, ``1e-05``, and ``1`` for ``1.0``."""
    return str(int(x)) if float(x).is_integer() else repr(x)


def submit_argv(job: Mapping[str, Any]) -> list[str]:
    """The ``deskpod train --submit ...`` command line that queues exactly ``job`` (a `spec` whose table holds
    model, data, steps or epochs and the keys of `FLAGS`)."""
    t = job["train"]
    line = ["deskpod", "train", "--submit", "--model", t["model"], "--data", t["data"]]
    line += ["--steps", str(t["steps"])] if "steps" in t else ["--epochs", str(t["epochs"])]
    for key, option in FLAGS.items():
        if key in t:
            line += [option, float_text(t[key]) if key == "lr" else str(t[key])]
    if job["devices"] != "all":
        line += ["--devices", str(job["devices"])]
    if "name" in job:
        line += ["--name", job["name"]]
    return line
