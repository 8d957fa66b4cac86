"""What is being trained: a model's cost per sample, and the run around it.

A model is four numbers per 224x224 sample — forward FLOPs, parameters, activation elements,
convolution tensor elements — computed, not quoted: ``torch.utils.flop_counter.FlopCounterMode`` over
one forward pass of the torchvision model (2 FLOPs per multiply-add), ``sum(p.numel())`` for the
parameters, the sum of every leaf module's output elements for the activations (what a training step
writes and reads back, the memory-traffic term of the model), and the sum of every convolution's input
and output elements (what changes layout when a Tensor Core convolution runs on NCHW tensors:
`deskpod.plan.factors.TRANSPOSE_MOVES`). ``tests/plan/test_plan.py`` recomputes them.
A training step costs 3x the forward FLOPs (forward, then gradients of activations and of weights).
"""

from __future__ import annotations

import difflib
from dataclasses import dataclass
from typing import Literal

from deskpod.errors import UsageError

Precision = Literal["fp32", "tf32", "fp16", "bf16"]
PRECISIONS: tuple[Precision, ...] = ("fp32", "tf32", "fp16", "bf16")
BYTES_PER_ELEMENT: dict[Precision, int] = {"fp32": 4, "tf32": 4, "fp16": 2, "bf16": 2}
IMAGENET_TRAIN_IMAGES = 1_281_167
"""ILSVRC-2012 training set (Russakovsky et al., IJCV 2015, Table 2: 1,281,167 images)."""
TRAIN_FLOPS_PER_FORWARD = 3.0
"""Backward is about twice the forward (input gradients + weight gradients)."""


@dataclass(frozen=True, slots=True)
class ModelCost:
    """Cost of one sample through a model."""

    name: str
    forward_gflops: float
    params_m: float
    """Millions of parameters (the gradient all-reduced each step)."""
    activations_m: float
    """Millions of activation elements per sample."""
    source: str = ""
    conv_io_m: float = 0.0
    """Millions of convolution input plus output elements per sample (every convolution layer's)."""

    @property
    def train_flops(self) -> float:
        return TRAIN_FLOPS_PER_FORWARD * self.forward_gflops * 1e9


_COMPUTED = "computed: FlopCounterMode on torchvision.models.{}() at 1x3x224x224 (torch 2.14, torchvision 0.29)"
MODELS: dict[str, ModelCost] = {
    name: ModelCost(name, gflops, params_m, activations_m, _COMPUTED.format(name), conv_io_m=conv_io_m)
    for name, gflops, params_m, activations_m, conv_io_m in (
        ("alexnet", 1.42837696, 61.10084, 1.098216, 0.822784),
        ("resnet18", 3.628146688, 11.689512, 7.477736, 4.666368),
        ("resnet50", 8.178368512, 25.557032, 32.040424, 21.776384),
    )
}


def find_model(name: str) -> ModelCost:
    """A known model by name; `UsageError` suggesting the closest otherwise."""
    key = name.strip().lower().replace("-", "").replace("_", "")
    if key in MODELS:
        return MODELS[key]
    close = difflib.get_close_matches(key, list(MODELS), n=1, cutoff=0.5)
    hint = f"did you mean {close[0]!r}? " if close else ""
    raise UsageError(
        f"unknown model {name!r}; {hint}known: {', '.join(MODELS)} (or give --gflops and --params for any other)"
    )


@dataclass(frozen=True, slots=True)
class Workload:
    """A training run to predict. Validated where it enters."""

    model: ModelCost
    batch: int = 64
    """Samples per device per step."""
    precision: Precision = "fp32"
    dataset_images: int = IMAGENET_TRAIN_IMAGES
    epochs: float = 90.0
    data: Literal["synthetic", "real"] = "real"
    """``real`` decodes images on the node's CPUs (the input pipeline); ``synthetic`` skips it."""

    def __post_init__(self) -> None:
        if self.batch < 1:
            raise UsageError(f"batch must be at least 1 sample per device, got {self.batch}")
        if self.precision not in PRECISIONS:
            raise UsageError(f"unknown precision {self.precision!r}; valid: {', '.join(PRECISIONS)}")
        if self.dataset_images < 1:
            raise UsageError(f"dataset size must be at least 1 image, got {self.dataset_images}")
        if self.epochs <= 0:
            raise UsageError(f"epochs must be positive, got {self.epochs}")
        if self.data not in ("synthetic", "real"):
            raise UsageError(f"data must be synthetic or real, got {self.data!r}")
        m = self.model
        if m.forward_gflops <= 0 or m.params_m <= 0 or m.activations_m < 0 or m.conv_io_m < 0:
            raise UsageError(
                f"model {m.name}: FLOPs and parameters must be positive, got {m.forward_gflops} GFLOPs, {m.params_m} M"
            )


def custom_model(gflops: float, params_m: float, activations_m: float | None = None) -> ModelCost:
    """A model given by its numbers; without activations, ResNet-50's activations per GFLOP are assumed, and its
    convolution elements per activation element always (a convolutional network's share)."""
    if gflops <= 0 or params_m <= 0:
        raise UsageError(f"--gflops and --params must be positive, got {gflops} and {params_m}")
    r50 = MODELS["resnet50"]
    acts = activations_m if activations_m is not None else gflops * r50.activations_m / r50.forward_gflops
    conv_io = acts * r50.conv_io_m / r50.activations_m
    return ModelCost("custom", gflops, params_m, acts, "given on the command line", conv_io)
