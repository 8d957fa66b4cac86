"""Training tasks: what a run's model computes its loss on, beside the classification the trainer knows.

``task = "classify"`` (the default) is image classification: the model registry, the datasets of `data.py`,
cross-entropy and validation accuracy, all built into `trainer.py`. Any other task is named
``package.module:factory`` (config key ``task``); the factory is called with the run's ``task_options``
string (``key=value,key=value``; the task checks its keys and names the valid ones) and returns a `Task`.
Everything else about a run — devices, DDP, AMP, the sampler, checkpoints, resume, metrics, the run
folder, the pod service — is the trainer's and works the same for every task.

A task's model is one ``nn.Module`` whose ``forward(batch.images, batch.targets)`` returns the training
loss in train mode, so DDP wraps it like any network (the lung detector of `deskpod.lung.detect` is one).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol

import torch
from torch import nn

from deskpod.errors import ConfigError
from deskpod.train.data import Batch, DataRequest, DataSpec, Source

CLASSIFY = "classify"


class Task(Protocol):
    """A training task other than classification (see the module docstring)."""

    name: str
    """Short name for messages, e.g. ``lung-detection``."""
    val_keys: Sequence[str]
    """The validation figures `val_metrics` returns, ``val_loss`` first."""
    val_sums_size: int
    """The length of the vector `val_sums` returns."""

    def describe(self, req: DataRequest) -> DataSpec:
        """Check the data exists and describe it, without loading it (runs in the launcher)."""
        ...

    def build_model(self, model: str, spec: DataSpec) -> nn.Module:
        """The model named by the config key ``model``; an unknown name is a `ConfigError` naming the valid ones."""
        ...

    def check_model(self, model: nn.Module, spec: DataSpec) -> None:
        """Run the model once on the CPU so a bad shape fails before any worker starts."""
        ...

    def open_sources(self, req: DataRequest, spec: DataSpec, device: torch.device) -> tuple[Source, Source]:
        """The train and validation splits, opened in a worker."""
        ...

    def loss(self, model: nn.Module, batch: Batch, device: torch.device) -> torch.Tensor:
        """The training loss of one batch: ``model`` is the DDP-wrapped module, in train mode."""
        ...

    def val_sums(self, model: nn.Module, batch: Batch, device: torch.device) -> torch.Tensor:
        """Sums over one validation batch (a float64 vector), added up over batches and ranks."""
        ...

    def val_metrics(self, sums: torch.Tensor) -> dict[str, float]:
        """The validation figures (`val_keys`) from the summed `val_sums`."""
        ...


def parse_options(text: str, valid: dict[str, str], task: str) -> dict[str, str]:
    """``key=value,key=value`` into a dict; unknown keys are a `ConfigError` listing ``valid`` (key: meaning)."""
    out: dict[str, str] = {}
    for part in (p.strip() for p in text.split(",")):
        if not part:
            continue
        key, eq, value = part.partition("=")
        key = key.strip().replace("-", "_")
        if not eq or not value.strip():
            raise ConfigError(f"task_options {part!r} of task {task}: write key=value, e.g. fold=0")
        if key not in valid:
            listed = "; ".join(f"{k} ({v})" for k, v in valid.items())
            raise ConfigError(f"task_options: {key!r} is not an option of task {task}; valid: {listed}")
        out[key] = value.strip()
    return out


def load_task(name: str, options: str) -> Task | None:
    """The `Task` named by the config (``None`` for ``classify``); a bad name is a `ConfigError`."""
    if name == CLASSIFY:
        if options.strip():
            raise ConfigError(f"task_options {options!r}: the classify task takes none (they are for other tasks)")
        return None
    if ":" not in name:
        raise ConfigError(f"task {name!r} is not valid: use classify, or a factory as package.module:function")
    from deskpod.train.models import import_factory

    factory = import_factory(name, "task")
    task: Any = factory(options)
    for attr in ("describe", "build_model", "open_sources", "loss", "val_sums", "val_metrics"):
        if not callable(getattr(task, attr, None)):
            raise ConfigError(f"task {name!r}: the factory returned {type(task).__name__}, which has no {attr}()")
    return task  # type: ignore[no-any-return]
