"""A serve job: ``[serve]``, a training run's latest checkpoint exported into the job's own model repository (once
per checkpoint: `export_if_new`) and served by ``deskpod serve`` on a free loopback port until the job is stopped;
where it listens goes to the job folder's ``serve.json``::

    [serve]
    run = "/abs/path/runs/my-run"    # a run folder with checkpoints
    model = "my-run"                 # the model's name on the server (default: the run's name)
    format = "onnx"                  # onnx | torch
    max_batch_size = 32
    max_queue_delay_us = 2000
    instances = 1
    image_input = false              # true: the model takes JPEG/PNG (decoded with the run's own transform)
    grpc = false                     # true: also the v2 gRPC service, on a port of its own ("grpc" in serve.json)
"""

from __future__ import annotations

import json
import re
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from deskpod.environment.files import write_json
from deskpod.errors import ConflictError, UsageError
from deskpod.jobs.kinds.fields import absolute_path, bad, flag, integer, table
from deskpod.train.runs import NAME_HELP, NAME_MAX, NAME_RE

if TYPE_CHECKING:
    from deskpod.serve.export import ExportOptions

FORMATS = ("onnx", "torch")
"""The export formats; the first is the default."""
FIELDS = ("run", "model", "format", "max_batch_size", "max_queue_delay_us", "instances", "image_input", "grpc")
LIMITS = {"max_batch_size": (32, 1, 4096), "max_queue_delay_us": (2000, 0, 10_000_000), "instances": (1, 1, 64)}
"""The numbers of `FIELDS`: (default, lowest, highest); ``deskpod serve --export`` has the same defaults."""
OPTION_KEYS = ("format", "max_batch_size", "max_queue_delay_us", "instances", "threads", "image_input")
SOURCE_FILE = "source.json"
"""Beside each exported version: the checkpoint it came from and the options it was exported with."""

ENVIRONMENT = False
SESSION = False
EXTRA: str | None = "serve"
SCHEMA: dict[str, Any] = {
    "type": "object",
    "additionalProperties": False,
    "required": ["run"],
    "properties": {
        "run": {"type": "string", "pattern": "^/[^\\u0000]*$", "maxLength": 4096,
                "description": "absolute path of a run folder with checkpoints"},
        "model": {"type": "string", "pattern": NAME_RE.pattern},
        "format": {"type": "string", "enum": list(FORMATS)},
        **{k: {"type": "integer", "minimum": lo, "maximum": hi} for k, (_, lo, hi) in LIMITS.items()},
        "image_input": {
            "type": "boolean",
            "description": "the model takes encoded JPEG/PNG, decoded with the run's own transform",
        },
        "grpc": {"type": "boolean", "description": "also serve the v2 gRPC service (its address: serve.json)"},
    },
}  # fmt: skip


def model_name(run: Path | str) -> str:
    """A run's folder name as a model name (``my run`` -> ``my-run``); may be empty."""
    return re.sub(r"[^A-Za-z0-9._-]", "-", Path(run).name).strip(".-_")


def parse(t: object) -> dict[str, Any]:
    """The ``[serve]`` table, checked, with its defaults filled in."""
    t = table(t, "serve", FIELDS, 'expected a table with run = "/abs/path/runs/NAME"')
    run = t.get("run")
    if not absolute_path(run):
        raise bad("serve.run", run, 'expected the absolute path of a run folder, e.g. run = "/home/me/runs/my-run"')
    model = t.get("model", model_name(run) or "model")
    if not isinstance(model, str) or not NAME_RE.match(model):
        raise bad("serve.model", model, f"use {NAME_HELP}")
    fmt = t.get("format", FORMATS[0])
    if fmt not in FORMATS:
        raise bad("serve.format", fmt, f"use one of {', '.join(FORMATS)}")
    return {
        "run": run,
        "model": model,
        "format": fmt,
        **{k: integer(t, k, default, lo, hi, "serve.") for k, (default, lo, hi) in LIMITS.items()},
        "image_input": flag(t, "image_input", "serve."),
        "grpc": flag(t, "grpc", "serve."),
    }


def default_name(serve: Mapping[str, Any], fallback: str) -> str:
    return f"serve-{serve['model']}"[:NAME_MAX]


def check(serve: Mapping[str, Any]) -> None:
    """The run is a folder of this box with a checkpoint (a pod with isolation opens it as the user instead)."""
    from deskpod.train.runs import has_checkpoint

    run = Path(serve["run"])
    if not run.is_dir():
        raise ConflictError(f"job spec: serve.run {str(run)!r} is not a run folder on this box")
    if not has_checkpoint(run):
        raise ConflictError(f"job spec: serve.run {str(run)!r} has no checkpoint yet; train it first (or wait for one)")


def argv(serve: Mapping[str, Any], name: str, folder: Path) -> list[str]:
    """``deskpod serve`` for the job: export the run into the job's own repository (`export_if_new`), serve it on a
    free loopback port (and gRPC on another, with ``grpc``), and write where it listens to ``serve.json`` in the
    job's folder."""
    s = serve
    return [
        sys.executable, "-m", "deskpod", "serve", str(folder / "models"),
        "--export", str(s["run"]), "--name", str(s["model"]), "--format", str(s["format"]),
        "--max-batch-size", str(s["max_batch_size"]), "--max-queue-delay-us", str(s["max_queue_delay_us"]),
        "--instances", str(s["instances"]), "--port", "0", "--port-file", str(folder / "serve.json"),
        *(["--image-input"] if s.get("image_input") else []), *(["--grpc-port", "0"] if s.get("grpc") else []),
    ]  # fmt: skip


def export_if_new(run: Path, options: ExportOptions) -> tuple[Path, bool]:
    """Export ``run``'s latest checkpoint as a new version of ``options.name``, unless the model's latest version
    came from the same checkpoint file with the same options (what a restarted serve job finds); returns (the
    version folder, whether it exported)."""
    from deskpod.serve.export import export_run
    from deskpod.serve.repository import versions
    from deskpod.train.runs import checkpoint_step, list_checkpoints

    if not run.is_dir():
        raise UsageError(f"--export {run}: no such run folder")
    found = list_checkpoints(run)
    if not found:
        raise UsageError(f"--export {run}: the run has no checkpoint yet; train it first (or wait for one)")
    latest = found[-1].resolve()
    st = latest.stat()
    source = {
        "run": str(run.resolve()),
        "checkpoint": str(latest),
        "step": checkpoint_step(latest),
        "size": st.st_size,
        "mtime_ns": st.st_mtime_ns,
        "options": {k: getattr(options, k) for k in OPTION_KEYS},
    }
    model_dir = options.repo / options.name
    have = versions(model_dir) if model_dir.is_dir() else []
    if have:
        last = model_dir / str(have[-1])
        if _read_source(last) == source:
            return last, False
    version = export_run(run, options)
    write_json(version / SOURCE_FILE, source, indent=1)
    return version, True


def _read_source(version: Path) -> dict[str, Any] | None:
    try:
        doc = json.loads((version / SOURCE_FILE).read_text())
    except (OSError, ValueError):
        return None
    return doc if isinstance(doc, dict) else None
