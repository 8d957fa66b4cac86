"""The trainer: launcher, DDP loop, data, models, checkpoints, metrics, progress — and ``deskpod run``'s
launcher for a script of your own (`deskpod.train.script`).

A script run by ``deskpod run`` reports its metrics in one line, which the dashboard charts as it does a
``deskpod train`` run's::

    import deskpod.train
    deskpod.train.log(step=step, loss=loss.item(), lr=lr)

Importing this package imports nothing heavy: a script may import it before torch.
"""

from __future__ import annotations

import json
import math
import os
import time
from pathlib import Path

__all__ = ["log", "run_dir"]


def run_dir() -> Path | None:
    """The run folder ``deskpod run`` gave this process (``$DESKPOD_RUN_DIR``); None outside ``deskpod run``."""
    value = os.environ.get("DESKPOD_RUN_DIR")
    return Path(value) if value else None


def log(step: int | None = None, **values: float) -> None:
    """Append one record to the run's ``metrics.jsonl`` (rank 0 only; other ranks and runs outside
    ``deskpod run`` write nothing). ``step`` is the optimizer step; every other value must be a number.

    Raises `TypeError` naming a value that is not a number (a tensor: pass ``loss.item()``).
    """
    for key, value in values.items():
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise TypeError(f"deskpod.train.log: {key}={value!r} is not a number; pass a float (a tensor: .item())")
    if step is not None and (isinstance(step, bool) or not isinstance(step, int)):
        raise TypeError(f"deskpod.train.log: step={step!r} is not a whole number")
    folder = run_dir()
    if folder is None or os.environ.get("RANK", "0") != "0":
        return
    record: dict[str, float | int | str | None] = {"kind": "train", "step": step, "time": round(time.time(), 3)}
    record.update({k: (v if math.isfinite(v) else None) for k, v in values.items()})
    with (folder / "metrics.jsonl").open("a", encoding="utf-8") as f:  # whole lines: the dashboard follows the file
        f.write(json.dumps(record) + "\n")
