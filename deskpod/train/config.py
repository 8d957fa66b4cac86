"""The trainer's configuration: one typed dataclass, filled from defaults, a TOML file, then CLI flags.

Every field below has a docstring; `deskpod train --help` and the error for an unknown key list them.
Values are checked in `TrainConfig.validate`, and each error names the value and what is valid.

A config file is flat TOML with these keys (a ``[train]`` table is accepted too)::

    model = "resnet18"
    data = "synthetic:3x224x224"
    epochs = 3
    batch_size = 64
    precision = "auto"
"""

from __future__ import annotations

import dataclasses
import difflib
import math
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any, Literal, get_args

from deskpod.errors import ConfigError
from deskpod.train.runs import NAME_HELP, NAME_RE

Precision = Literal["auto", "fp32", "bf16", "fp16"]
OptimizerName = Literal["sgd", "adamw"]
Schedule = Literal["cosine", "step", "constant"]

PRECISIONS: tuple[str, ...] = get_args(Precision)
OPTIMIZERS: tuple[str, ...] = get_args(OptimizerName)
SCHEDULES: tuple[str, ...] = get_args(Schedule)


@dataclass(kw_only=True, slots=True)
class TrainConfig:
    """Everything one training run needs; written resolved to ``runs/<name>/config.toml``."""

    # --- what to train
    task: str = "classify"
    """``classify`` (image classification), or a task factory ``package.module:factory`` such as
    ``deskpod.lung.detect:luna16`` (3D lung-nodule detection); see `deskpod.train.tasks`."""
    task_options: str = ""
    """Options of a task other than classify, ``key=value,key=value`` (the task lists its keys)."""
    model: str = "convnet"
    """``convnet`` (small, for 28×28), ``mlp``, ``alexnet``, ``resnet18``, ``resnet50``, or ``package.module:factory``."""
    data: str = "fashion-mnist"
    """``fashion-mnist``, ``synthetic[:CxHxW]``, or ``imagefolder:PATH`` (class folders of JPEG/PNG)."""
    num_classes: int = 1000
    """Classes of ``synthetic`` data (other datasets know their own)."""
    synthetic_samples: int = 50_000
    """Training samples of ``synthetic`` data per epoch."""
    image_size: int = 224
    """Side of the square crop fed to the network from ``imagefolder`` data."""
    val_fraction: float = 0.1
    """Fraction of an ``imagefolder`` held out for validation when it has no ``val/`` folder."""

    # --- where it runs
    devices: str = "all"
    """``all``, a count ``N``, or indices ``0,2,3`` among this machine's GPUs (or CPU worker slots)."""
    cpu_workers: int = 0
    """CPU worker processes on a machine without GPUs; 0 means deskpod's layout for ``devices: all``
    (one worker per NUMA node, its cores as threads) and ``devices`` workers for a count or list."""

    # --- how long
    epochs: int = 4
    """Passes over the training data (ignored when ``steps`` is set). The default is the demo's: the convnet
    reaches 91.5% on Fashion-MNIST in 4 (docs/benchmarks.md)."""
    steps: int = 0
    """Optimizer steps to run instead of whole epochs; 0 means train for ``epochs``."""

    # --- the optimisation
    batch_size: int = 128
    """Samples per device per micro-step; the global batch is batch_size × devices × grad_accum."""
    global_batch_size: int = 0
    """Samples per optimizer step over all devices; when set (≠ 0) it must divide by devices × grad_accum and
    overrides ``batch_size``."""
    grad_accum: int = 1
    """Micro-steps whose gradients are summed before each optimizer step."""
    optimizer: OptimizerName = "sgd"
    """``sgd`` (momentum, Nesterov off) or ``adamw``."""
    lr: float = 0.0
    """Peak learning rate; 0 applies the linear scaling rule: base_lr × global_batch / 256 (Goyal et al., 2017)."""
    base_lr: float = 0.1
    """Learning rate per 256 samples of global batch, for the linear scaling rule (SGD: 0.1; AdamW: 0.001 is typical)."""
    momentum: float = 0.9
    weight_decay: float = 5e-4
    warmup_epochs: float = 1.0
    """Linear warm-up from lr/10 to lr over this many epochs (Goyal et al. use 5 of 90); at most a quarter of the run."""
    schedule: Schedule = "cosine"
    """Decay after warm-up: ``cosine`` to 0, ``step`` (×0.1 at 50% and 75%), or ``constant``."""
    label_smoothing: float = 0.1
    """Cross-entropy against targets of 1 - ε on the true class and ε spread over all (Szegedy et al., 2016; the
    0.1 of torchvision's and timm's ImageNet recipes); 0 turns it off. Validation loss is reported with it."""
    grad_clip: float = 0.0
    """Clip the global gradient norm to this value; 0 turns clipping off."""

    # --- speed
    precision: Precision = "auto"
    """``auto`` (bf16 where the GPU supports it, else fp16 on GPU; fp32 on CPU), ``fp32``, ``bf16``, ``fp16``."""
    channels_last: bool = True
    """Use channels_last memory format for convnets: faster Tensor Core convolutions on GPUs, and oneDNN's
    convolutions on CPUs (the demo's convnet: 1.5x the images per second of NCHW on 2 cores)."""
    compile: bool = False
    """Compile the model with ``torch.compile``."""
    sync_batchnorm: bool = False
    """Convert BatchNorm layers to SyncBatchNorm (statistics over the global batch)."""
    loader_workers: int = -1
    """DataLoader worker processes per device; -1 picks (0 for in-memory data, else up to 4)."""

    # --- reproducibility and robustness
    seed: int = 0
    """Seed for weights, sampling and augmentation; the same seed gives the same loss curve on the CPU."""
    max_restarts: int = 3
    """Times the launcher restarts all workers from the last checkpoint after a worker dies."""
    collective_timeout_s: float = 300.0
    """A collective that stalls longer than this fails the run instead of hanging it."""
    max_bad_fraction: float = 0.01
    """Stop when more than this fraction of images seen is corrupt (they are skipped and counted)."""

    # --- checkpoints and output
    checkpoint_every_steps: int = 0
    """Write a checkpoint every N optimizer steps (0: only by time, at epoch ends and at the end)."""
    checkpoint_every_minutes: float = 10.0
    """Write a checkpoint when this much time has passed since the last one (0 turns it off)."""
    keep_checkpoints: int = 3
    """How many of the latest checkpoints to keep."""
    log_every_steps: int = 20
    """Append a line to metrics.jsonl every N optimizer steps."""
    out: str = "runs"
    """Folder that holds run folders."""
    name: str = ""
    """Run name (the folder ``<out>/<name>``); empty picks ``<model>-<data>-<date>-<time>``."""

    # ------------------------------------------------------------------ validation
    def validate(self) -> TrainConfig:
        """Check every value; raise `ConfigError` naming the first bad one and what is valid."""

        def need(cond: bool, key: str, value: object, valid: str) -> None:
            if not cond:
                raise ConfigError(f"{key} = {value!r} is not valid: {valid}")

        need(self.precision in PRECISIONS, "precision", self.precision, f"use one of {', '.join(PRECISIONS)}")
        need(self.optimizer in OPTIMIZERS, "optimizer", self.optimizer, f"use one of {', '.join(OPTIMIZERS)}")
        need(self.schedule in SCHEDULES, "schedule", self.schedule, f"use one of {', '.join(SCHEDULES)}")
        need(self.batch_size >= 1, "batch_size", self.batch_size, "a whole number ≥ 1, e.g. 128")
        need(self.global_batch_size >= 0, "global_batch_size", self.global_batch_size, "0 (use batch_size) or ≥ 1")
        need(16 <= self.image_size <= 4096, "image_size", self.image_size, "a side in pixels from 16 to 4096, e.g. 224")
        need(self.grad_accum >= 1, "grad_accum", self.grad_accum, "a whole number ≥ 1")
        need(self.epochs >= 1, "epochs", self.epochs, "a whole number ≥ 1")
        need(self.steps >= 0, "steps", self.steps, "0 (train for epochs) or a whole number ≥ 1")
        need(self.lr >= 0 and math.isfinite(self.lr), "lr", self.lr, "0 (linear scaling rule) or a positive number")
        need(self.base_lr > 0 and math.isfinite(self.base_lr), "base_lr", self.base_lr, "a positive number, e.g. 0.1")
        need(0 <= self.momentum < 1, "momentum", self.momentum, "a number in [0, 1)")
        need(self.weight_decay >= 0, "weight_decay", self.weight_decay, "a number ≥ 0")
        need(self.warmup_epochs >= 0, "warmup_epochs", self.warmup_epochs, "a number ≥ 0")
        need(0 <= self.label_smoothing < 1, "label_smoothing", self.label_smoothing, "a number in [0, 1)")
        need(self.grad_clip >= 0, "grad_clip", self.grad_clip, "0 (off) or a positive number")
        need(self.cpu_workers >= 0, "cpu_workers", self.cpu_workers, "0 (one per NUMA node) or a count ≥ 1")
        need(self.num_classes >= 2, "num_classes", self.num_classes, "a whole number ≥ 2")
        need(self.synthetic_samples >= 1, "synthetic_samples", self.synthetic_samples, "a whole number ≥ 1")
        need(0 < self.val_fraction < 1, "val_fraction", self.val_fraction, "a number in (0, 1)")
        need(self.loader_workers >= -1, "loader_workers", self.loader_workers, "-1 (auto), 0, or a count")
        need(0 <= self.max_restarts <= 100, "max_restarts", self.max_restarts, "a whole number from 0 to 100")
        need(self.collective_timeout_s > 0, "collective_timeout_s", self.collective_timeout_s, "seconds > 0")
        need(0 <= self.max_bad_fraction <= 1, "max_bad_fraction", self.max_bad_fraction, "a number in [0, 1]")
        need(self.checkpoint_every_steps >= 0, "checkpoint_every_steps", self.checkpoint_every_steps, "0 or ≥ 1")
        need(self.checkpoint_every_minutes >= 0, "checkpoint_every_minutes", self.checkpoint_every_minutes, "≥ 0")
        need(self.keep_checkpoints >= 1, "keep_checkpoints", self.keep_checkpoints, "a whole number ≥ 1")
        need(self.log_every_steps >= 1, "log_every_steps", self.log_every_steps, "a whole number ≥ 1")
        need(
            self.name == "" or bool(NAME_RE.match(self.name)),
            "name",
            self.name,
            f"{NAME_HELP} (no spaces or slashes), e.g. 'resnet50-try2'",
        )
        need(bool(self.task.strip()), "task", self.task, "classify, or a task factory as package.module:function")
        need(bool(self.model.strip()), "model", self.model, "a model name such as convnet or resnet18")
        need(bool(self.data.strip()), "data", self.data, "a dataset such as fashion-mnist or synthetic")
        return self

    # ------------------------------------------------------------------ I/O
    def to_dict(self) -> dict[str, Any]:
        return {f.name: getattr(self, f.name) for f in fields(self)}


def coerce(values: Mapping[str, Any]) -> dict[str, Any]:
    """Check keys against the known fields and coerce each value to its field's type."""
    types = {k: type(v) for k, v in TrainConfig().to_dict().items()}
    out: dict[str, Any] = {}
    for key, value in values.items():
        key = key.replace("-", "_")
        if key not in types:
            close = difflib.get_close_matches(key, types, n=1)
            hint = f" (did you mean {close[0]!r}?)" if close else ""
            raise ConfigError(f"unknown config key {key!r}{hint}; valid keys: {', '.join(types)}")
        want = types[key]
        if want is bool:
            if not isinstance(value, bool):
                raise ConfigError(f"{key} = {value!r} is not valid: use true or false")
        elif want is int:
            if isinstance(value, bool) or not isinstance(value, int):
                raise ConfigError(f"{key} = {value!r} is not valid: use a whole number")
        elif want is float:
            if isinstance(value, bool) or not isinstance(value, int | float):
                raise ConfigError(f"{key} = {value!r} is not valid: use a number")
            value = float(value)
        elif want is str and not isinstance(value, str):
            value = str(value) if isinstance(value, int) and key == "devices" else value
            if not isinstance(value, str):
                raise ConfigError(f"{key} = {value!r} is not valid: use a string")
        out[key] = value
    return out


def read_config_file(path: str | Path) -> dict[str, Any]:
    """Read a TOML config file into a dict of checked keys (not yet merged with defaults)."""
    p = Path(path)
    if not p.is_file():
        raise ConfigError(f"--config {str(path)!r}: no such file")
    try:
        data = tomllib.loads(p.read_text())
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as e:
        raise ConfigError(f"--config {str(path)!r}: not valid TOML: {e}") from None
    if set(data) == {"train"} and isinstance(data["train"], dict):
        data = data["train"]
    nested = [k for k, v in data.items() if isinstance(v, dict)]
    if nested:
        raise ConfigError(f"--config {str(path)!r}: unexpected table [{nested[0]}]; use flat keys or one [train] table")
    return coerce(data)


def build_config(file: str | Path | None = None, overrides: Mapping[str, Any] | None = None) -> TrainConfig:
    """Defaults, then the file, then flags (``None`` values in ``overrides`` are ignored)."""
    values: dict[str, Any] = {}
    if file is not None:
        values.update(read_config_file(file))
    if overrides:
        values.update(coerce({k: v for k, v in overrides.items() if v is not None}))
    return dataclasses.replace(TrainConfig(), **values).validate()


def dump_config(cfg: TrainConfig) -> str:
    """The config as TOML, as `load_config` reads it back."""
    import tomli_w

    return tomli_w.dumps(cfg.to_dict())


def load_config(path: Path) -> TrainConfig:
    return build_config(path)
