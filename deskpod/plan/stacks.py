"""Software stacks: who owns the efficiency factors, and which table of its own era each is fitted to.

A model of hardware alone cannot follow software: the efficiency of 2017 TensorFlow in FP32 is not
the efficiency of 2021 PyTorch with Tensor Cores, mixed precision, channels_last and a prefetching
data pipeline. So a prediction is (workload, machine, **stack**): the machine gives the first
principles — peak FLOPS per precision and per unit (Tensor Cores where the device has them for the
precision, CUDA cores otherwise; `deskpod.plan.predict.PEAK_FALLBACK`), memory bandwidth, links,
NICs and CPU cores — and the stack gives the few factors that turn them into a step time.

* ``tf1-2017`` — TensorFlow 1.x ``tf_cnn_benchmarks``, May 2017, CUDA 8 / cuDNN 5.1. Fitted to the
  DGX-1 (P100) table, ``docs/reference/calibration.md#tensorflow-2017`` (`deskpod.plan.calibration.fit`).
  NCHW throughout (``tf_cnn_benchmarks --data_format=NCHW``, as its README runs it on GPUs), so where
  it is asked for a Tensor Core precision its convolutions pay the layout changes the P100 never had.
* ``pytorch-2021`` — PyTorch in NGC's pytorch-21.03 container as NVIDIA's DeepLearningExamples
  ResNet-50 v1.5 benchmarks it: native AMP; AMP in channels_last, FP32 and TF32 in NCHW; torchvision's
  decoding and augmentation in PyTorch DataLoader workers that run ahead of the step; DDP over NCCL.
  The README's benchmark commands run ``launch.py``, whose ``configs.yml`` — read at 7bdfc81d, the
  commit that put the 21.03 figures into the README — sets ``data_backend: pytorch``, 8 workers per GPU
  on the DGX-1 and 16 on the DGX A100, and ``memory_format: nhwc`` for AMP only. Fitted to the DGX-1
  (V100) table, §4.1b (`deskpod.plan.calibration.fit_pytorch_2021`). The default.
* ``local`` — this box with its own software, as ``deskpod plan calibrate`` measured it
  (`deskpod.plan.local`): only with machine ``local``, whose factors are its calibration's.

The CPU efficiency (``cpu_compute_efficiency``) has one source in the reference, the 2016-17 CPU
baseline of §4.4 (711 h); both catalog stacks carry that one figure's fit for CPU machines.
``tests/plan/test_stacks.py`` checks that each stack's factors are its fit's output.
"""

from __future__ import annotations

from dataclasses import dataclass

from deskpod.errors import UsageError
from deskpod.plan.factors import Factors


@dataclass(frozen=True, slots=True)
class Stack:
    """A named software stack and the factors fitted to its one table."""

    name: str
    title: str
    """The software, as its table's source describes it."""
    fitted_to: str
    """The one table its factors are fitted to (its section of docs/reference/calibration.md and its source)."""
    factors: Factors
    not_fitted: str
    """Which factors that table cannot show, and what they are set to instead."""


TF1_2017 = Stack(
    name="tf1-2017",
    title="TensorFlow 1.x tf_cnn_benchmarks, May 2017, FP32, CUDA 8 / cuDNN 5.1",
    fitted_to="docs/reference/calibration.md#tensorflow-2017: DGX-1 (P100) ResNet-50 and AlexNet, 1-8 GPUs, synthetic and real "
    "(tensorflow/docs site/en/r1/guide/performance/benchmarks.md @62da04c0)",
    factors=Factors(),
    not_fitted="no GPU factor is left unfitted; by the fit's shape the input pipeline adds to the step and gradients "
    "are all-reduced in the precision's bytes; cpu_compute_efficiency is the CPU baseline's (docs/reference/calibration.md#cpu-baseline); "
    "NCHW throughout (tf_cnn_benchmarks --data_format=NCHW), so Tensor Core precisions pay the layout changes of "
    "deskpod.plan.factors.TRANSPOSE_MOVES (the P100 has no Tensor Cores: derived, not fitted)",
)

PYTORCH_2021 = Stack(
    name="pytorch-2021",
    title="PyTorch, NGC pytorch-21.03 (NVIDIA DeepLearningExamples ResNet-50 v1.5: native AMP, channels_last "
    "for AMP and NCHW otherwise, PyTorch DataLoader workers, DDP over NCCL; configs.yml @7bdfc81d)",
    fitted_to="docs/reference/calibration.md#pytorch-2021: DGX-1 32GB (V100) ResNet-50 v1.5, FP32 batch 112 and AMP batch 256, 1 and 8 "
    "GPUs (NVIDIA/DeepLearningExamples PyTorch/Classification/ConvNets/resnet50v1.5/README.md @291f0d02)",
    factors=Factors(
        compute_efficiency=1.084623,
        memory_passes=9.6078,
        comm_efficiency=1.0,
        overlap=1.0,
        input_images_per_core=201.0,
        gradient_bytes=4,
        input_overlap=True,
        sync_s=0.009327,
        channels_last=("fp16", "bf16"),
    ),
    not_fitted="overlap 1.0 (DDP all-reduces gradient buckets while the backward pass runs) and comm_efficiency "
    "1.0 (the cost model's link-rate bound): one DGX-1 hides its all-reduce behind the backward pass, so the "
    "table cannot show either (what its FP32 8-GPU row loses, 9.3 ms a step, is sync_s, fitted); cpu_compute_efficiency is the 2016-17 CPU baseline's (docs/reference/calibration.md#cpu-baseline); "
    "no TF32 figure (V100 has none): TF32 runs at the TF32 Tensor Core peak with the stack's one compute efficiency, "
    "in NCHW as configs.yml has it, so its convolutions pay the layout changes of deskpod.plan.factors.TRANSPOSE_MOVES "
    "(derived, not fitted: neither fitted row has them, FP32 running on CUDA cores and AMP in channels_last)",
)

STACKS: dict[str, Stack] = {s.name: s for s in (PYTORCH_2021, TF1_2017)}
DEFAULT_STACK = PYTORCH_2021.name
"""What a prediction uses when no stack is named: the software deskpod itself trains with (PyTorch)."""
LOCAL_STACK = "local"
"""Machine ``local``'s own stack: its calibration's factors, measured with this box's software."""


def find_stack(name: str) -> Stack:
    """The catalog stack called ``name``; `UsageError` listing the valid ones otherwise."""
    key = name.strip().lower()
    if key in STACKS:
        return STACKS[key]
    if key == LOCAL_STACK:
        raise UsageError("stack 'local' is machine 'local''s own calibration; use it with --machine local")
    raise UsageError(
        f"unknown stack {name!r}; valid: {', '.join(STACKS)} (default {DEFAULT_STACK}), or {LOCAL_STACK} "
        "with --machine local"
    )
