"""Rank 0's record of a run: ``metrics.jsonl`` plus TensorBoard event files.

Each logged optimizer step appends ``{"kind": "train", "step", "epoch", "loss", "lr", "images_per_s",
"data_wait_fraction", "memory_bytes", "time"}``; each validation appends ``{"kind": "val", "step", "epoch",
"val_loss", "val_accuracy"}``. On resume, records past the checkpoint's step are dropped first, so the
file reads as one uninterrupted run.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

from deskpod.environment.files import write_text
from deskpod.train.runs import read_metrics


class MetricsLog:
    def __init__(self, path: Path, tensorboard_dir: Path | None, resume_step: int | None = None) -> None:
        self.path = path
        if resume_step is not None and path.exists():
            kept = [r for r in read_metrics(path.parent) if int(r.get("step", 0)) <= resume_step]
            write_text(path, "".join(json.dumps(r) + "\n" for r in kept))
        self._file = open(path, "a", buffering=1)  # noqa: SIM115 - closed in close()
        self._tb: Any = None
        if tensorboard_dir is not None:
            try:
                from torch.utils.tensorboard import SummaryWriter

                self._tb = SummaryWriter(str(tensorboard_dir), purge_step=resume_step)
            except ImportError:  # tensorboard not installed: metrics.jsonl still has everything
                self._tb = None

    def write(self, record: dict[str, Any]) -> None:
        record = {**record, "time": round(time.time(), 3)}
        self._file.write(json.dumps(record) + "\n")
        if self._tb is not None:
            step = int(record["step"])
            prefix = record.get("kind", "train")
            for k, v in record.items():
                if k not in ("kind", "step", "epoch", "time") and isinstance(v, int | float):
                    self._tb.add_scalar(f"{prefix}/{k}", v, step)

    def close(self) -> None:
        self._file.close()
        if self._tb is not None:
            self._tb.close()
