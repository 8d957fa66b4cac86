"""What rank 0 shows while training: a live bar, plain lines, JSON lines, or nothing.

- ``bar``: one line redrawn in place on a terminal — epoch, step, loss, images/s, ETA.
- ``lines``: the same facts as a new line every log interval (stdout is a file or a pipe).
- ``json``: one JSON object per event, for scripts (``--json``).
- ``quiet``: nothing but errors (``--quiet``).
"""

from __future__ import annotations

import json
import shutil
import sys
import time
from typing import Any, Literal, TextIO

Mode = Literal["bar", "lines", "json", "quiet"]


def pick_mode(quiet: bool, as_json: bool, stream: TextIO | None = None) -> Mode:
    if as_json:
        return "json"
    if quiet:
        return "quiet"
    stream = stream or sys.stdout
    return "bar" if stream.isatty() else "lines"


def describe_validation(figures: dict[str, float]) -> str:
    """One line of validation figures: loss, accuracy as a percentage, other figures as they are."""
    parts = []
    for key, value in figures.items():
        label = key.removeprefix("val_").replace("_", " ")
        if key == "val_accuracy":
            parts.append(f"accuracy {100 * value:.2f}%")
        elif key == "val_loss":
            parts.append(f"validation loss {value:.4f}")
        else:
            parts.append(f"{label} {value:.4g}")
    return ", ".join(parts)


def format_rate(per_s: float) -> str:
    """A rate for people: whole numbers from 10 up, two significant digits below (0.48, not 0)."""
    return f"{per_s:,.0f}" if per_s >= 10 or per_s == 0 else f"{per_s:.2g}"


def format_duration(seconds: float) -> str:
    s = max(0, round(seconds))
    h, rem = divmod(s, 3600)
    m, s = divmod(rem, 60)
    return f"{h}:{m:02d}:{s:02d}" if h else f"{m}:{s:02d}"


class Progress:
    def __init__(self, mode: Mode, stream: TextIO | None = None, min_interval: float = 0.2) -> None:
        self.mode, self.stream = mode, stream or sys.stdout
        self.min_interval = min_interval
        self._last_draw = 0.0
        self._bar_open = False
        self._last_loss: float | None = None

    def event(self, kind: str, **fields: Any) -> None:
        """A discrete event (start, val, checkpoint, restart, done, stopped)."""
        if self.mode == "quiet":
            return
        if self.mode == "json":
            fields.pop("text", None)
            self._write(json.dumps({"event": kind, **fields}) + "\n")
            return
        self._close_bar()
        text = fields.pop("text", None)
        if text:
            self._write(text + "\n")

    def update(self, *, epoch: int, epochs: int, step: int, total: int, loss: float | None, images_per_s: float,
               eta_s: float, log: bool) -> None:  # fmt: skip
        """Progress after an optimizer step; ``log`` marks a log-interval step (lines/json modes print those)."""
        if self.mode == "quiet":
            return
        if self.mode == "json":
            if log:
                self._write(json.dumps({"event": "step", "epoch": epoch, "step": step, "total_steps": total,
                                        "loss": loss, "images_per_s": round(images_per_s, 1), "eta_s": round(eta_s, 1)}) + "\n")  # fmt: skip
            return
        if loss is not None:
            self._last_loss = loss
        loss = self._last_loss
        loss_txt = "  —  " if loss is None else f"{loss:.4f}"
        facts = f"loss {loss_txt} | {format_rate(images_per_s)} img/s | ETA {format_duration(eta_s)}"
        if self.mode == "lines":
            if log or step == total:
                self._write(f"epoch {epoch}/{epochs}  step {step}/{total}  {facts}\n")
            return
        now = time.monotonic()
        if now - self._last_draw < self.min_interval and step != total:
            return
        self._last_draw = now
        width = shutil.get_terminal_size((100, 20)).columns
        head = f"epoch {epoch}/{epochs} "
        tail = f" {step}/{total}  {facts}"
        bar_w = max(10, min(40, width - len(head) - len(tail) - 4))
        filled = int(bar_w * step / max(1, total))
        line = f"{head}[{'#' * filled}{'.' * (bar_w - filled)}]{tail}"
        self._write("\r" + line[: width - 1].ljust(min(width - 1, len(line))))
        self._bar_open = True

    def _close_bar(self) -> None:
        if self._bar_open:
            self._write("\n")
            self._bar_open = False

    def close(self) -> None:
        self._close_bar()

    def _write(self, text: str) -> None:
        self.stream.write(text)
        self.stream.flush()
