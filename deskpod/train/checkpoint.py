"""Checkpoints: written atomically, kept K at a time, checked when loaded.

A checkpoint is one file ``checkpoints/step-00001234.pt`` holding the model, optimizer, LR
schedule and gradient-scaler states, the position in the data (epoch and micro-step), every rank's
RNG states, and what it was trained on. It is written to a temporary file in the same folder,
flushed and fsync'ed, then renamed over its final name and the folder fsync'ed: a crash at any
instant leaves either the new file or none, and the previous checkpoints stay loadable.

Loading uses ``torch.load(weights_only=True)``: a checkpoint can hold only tensors and plain data,
never code to run.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from deskpod.environment import files
from deskpod.errors import CheckpointError, UsageError
from deskpod.train.runs import checkpoint_dir, has_checkpoint, list_checkpoints

FORMAT = 1
# Where checkpoints lie and how they are named belongs to the run folder (torch-free, for the pod service).
__all__ = ["checkpoint_dir", "has_checkpoint", "list_checkpoints", "path_for"]


def path_for(run_dir: Path, step: int) -> Path:
    return checkpoint_dir(run_dir) / f"step-{step:08d}.pt"


def save_atomic(state: dict[str, Any], path: Path, *, before_rename: Callable[[], None] | None = None) -> None:
    """Write ``state`` to ``path`` so that a crash leaves the old file (or none), never a torn one.

    ``before_rename`` is a test seam: it runs after the data is written but before the rename.
    """
    path.parent.mkdir(parents=True, exist_ok=True)
    with files.replacing(path) as f:
        torch.save(state, f)
        if before_rename is not None:
            before_rename()


def prune(run_dir: Path, keep: int) -> None:
    """Delete all but the ``keep`` latest checkpoints, and temporary files a crash left behind."""
    for p in list_checkpoints(run_dir)[:-keep]:
        p.unlink(missing_ok=True)
    d = checkpoint_dir(run_dir)
    if d.is_dir():
        for p in files.leftovers(d, "step-*"):
            p.unlink(missing_ok=True)


def load(path: Path) -> dict[str, Any]:
    """Load one checkpoint, or raise `CheckpointError` saying why it is unusable."""
    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as e:  # a torn or foreign file fails in many ways (zip, pickle, EOF)
        raise CheckpointError(f"checkpoint {path} is corrupt and was not loaded: {type(e).__name__}: {e}") from None
    if not isinstance(state, dict) or state.get("format") != FORMAT or "model" not in state:
        raise CheckpointError(f"checkpoint {path} is not a deskpod checkpoint (format {FORMAT}); it was not loaded")
    return state


def load_latest(run_dir: Path, warn: Callable[[str], None] | None = None) -> tuple[Path, dict[str, Any]]:
    """The newest loadable checkpoint of a run; corrupt ones are reported and skipped."""
    warn = warn or (lambda msg: print(f"deskpod: {msg}", file=sys.stderr))
    candidates = list_checkpoints(run_dir)
    if not candidates:
        raise CheckpointError(
            f"--resume: no checkpoint in {checkpoint_dir(run_dir)}; train without --resume first", usage=True
        )
    errors = []
    for p in reversed(candidates):
        try:
            return p, load(p)
        except CheckpointError as e:
            errors.append(str(e))
            warn(f"{e}; trying an older one")
    raise CheckpointError(f"no loadable checkpoint in {checkpoint_dir(run_dir)}: {'; '.join(errors)}")


def check_compatible(state: dict[str, Any], model_name: str, model: torch.nn.Module, path: Path) -> None:
    """Refuse a checkpoint of another model (by name, then by parameter names and shapes)."""
    saved = state.get("model_name")
    if saved != model_name:
        raise CheckpointError(
            f"checkpoint {path} is from model {saved!r}, not {model_name!r}; it was not loaded", usage=True
        )
    mine = {k: tuple(v.shape) for k, v in model.state_dict().items()}
    theirs = {k: tuple(v.shape) for k, v in state["model"].items()}
    if mine != theirs:
        diff = sorted(set(mine.items()) ^ set(theirs.items()))[:3]
        raise CheckpointError(
            f"checkpoint {path} does not fit model {model_name!r} (differs in {', '.join(f'{k} {s}' for k, s in diff)}); "
            "it was not loaded",
            usage=True,
        )


@dataclass(frozen=True, slots=True)
class LoadedModel:
    """A trained model ready for inference, with what its inputs must look like."""

    model: Any  # torch.nn.Module
    model_name: str
    input_shape: tuple[int, int, int]
    class_names: list[str]
    mean: tuple[float, ...]
    std: tuple[float, ...]
    step: int
    checkpoint: Path


def load_model(run_dir: Path) -> LoadedModel:
    """The model of a run from its latest loadable checkpoint: eval mode, CPU, fp32."""
    from deskpod.train.models import ModelSpec, build_model

    run_dir = Path(run_dir)
    if not run_dir.is_dir():
        raise UsageError(f"run folder {str(run_dir)!r} does not exist")
    try:
        path, state = load_latest(run_dir, warn=lambda _m: None)
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
