"""The model's terms: a software stack's factors, a machine's facts, and the compute time of one step.

Apart from `deskpod.plan.predict` (which puts them together into a plan) so that this box's own
calibration (`deskpod.plan.local`) can use them without importing the planner that reads it. The
factors belong to a software stack (`deskpod.plan.stacks`): each named stack owns one set, fitted
to one table of its own era; the machine's facts (peak per precision and unit, memory bandwidth,
links, cores) come from the catalog.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from deskpod.hardware.topology import Topology
from deskpod.plan.workload import BYTES_PER_ELEMENT, Precision, Workload

TENSOR_CORE_PEAKS = frozenset({"tf32", "fp16_tensor", "bf16"})
"""Catalog peaks that are Tensor Core peaks (`deskpod.plan.predict.PEAK_FALLBACK` picks one per precision)."""
TRANSPOSE_MOVES = 6.0
"""Element moves per convolution input-plus-output element and training step when Tensor Core convolutions
run on NCHW tensors. Tensor Core kernels work in NHWC, and cuDNN transposes an NCHW operand into NHWC before
the call and its NCHW result back after it, each transpose a read and a write (the layout method card of
MosaicML Composer: "the NCHW tensor must be transposed to NHWC before the convolution and transposed back
to NCHW after"). A training step makes three calls per convolution — forward (input in, output out),
backward-data (output gradient in, input gradient out), backward-filter (input and output gradient in) —
so each input element and each output element is transposed three times: 3 x 2 moves. Weights (once per
step, not per sample) are left out. Derived, not fitted; NHWC runs (channels_last) and CUDA-core kernels,
which take NCHW as it is, pay none."""


@dataclass(frozen=True, slots=True)
class Factors:
    """A software stack's efficiency factors (defaults: stack ``tf1-2017``, `deskpod.plan.calibration.fit`
    on the DGX-1 P100 TensorFlow figures; ``deskpod.plan.stacks`` holds every stack's)."""

    compute_efficiency: float = 1.822607
    """e_c: achieved FLOP rate / peak, counting direct-convolution FLOPs (above 1: cuDNN's FFT and
    Winograd kernels do fewer FLOPs than the direct count)."""
    memory_passes: float = 18.518
    """k_m: times each activation element crosses device memory per training step."""
    comm_efficiency: float = 0.41
    """e_n: achieved / modelled all-reduce bandwidth in the fitted framework (TensorFlow, May 2017)."""
    overlap: float = 0.0
    """Fraction of the backward pass that hides communication."""
    input_images_per_core: float = 769.0
    """r: images/s one CPU core decodes and augments (real data)."""
    cpu_compute_efficiency: float = 0.360457
    """e_cpu: achieved FLOP rate / peak when the devices are CPUs (direct-convolution FLOPs)."""
    gradient_bytes: int = 0
    """Bytes per gradient element all-reduced; 0: the precision's own (FP16 training all-reduces FP16).
    Mixed precision that keeps FP32 parameters (PyTorch native AMP) all-reduces 4."""
    input_overlap: bool = False
    """False: decoding adds to the step (``1/real = 1/synthetic + 1/input``, the tf1-2017 fit's shape);
    True: the pipeline runs ahead of the step (DataLoader workers prefetching) and only what exceeds it shows."""
    sync_s: float = 0.0
    """Seconds per step that training on more than one device costs beyond the modelled all-reduce: what a
    step waits for each time all ranks meet (DDP finishing its gradient buckets, the slowest rank), the
    same on any hardware. 0 for tf1-2017, whose fitted ``e_n`` and ``overlap`` carry its losses."""
    channels_last: tuple[Precision, ...] = ()
    """Precisions the stack trains in NHWC (channels_last); the others run NCHW, and on Tensor Cores pay
    `TRANSPOSE_MOVES` per convolution element."""


@dataclass(frozen=True, slots=True)
class MachineFacts:
    """What the planner needs from a catalog machine."""

    name: str
    title: str
    kind: str
    devices: int
    peak_tflops: float
    peak_key: str
    memory_bandwidth_gbs: float
    power_w: float
    price_usd: float | None
    cpu_cores: int
    topology: Topology = field(repr=False)


@dataclass(frozen=True, slots=True)
class SampleTerms:
    """One sample's forward and backward on one GPU, as the model's three terms (seconds)."""

    flops_s: float
    """The FLOPs at the device's peak for the precision (divide by ``e_c``)."""
    pass_s: float
    """One pass of every activation element through device memory (multiply by ``k_m``)."""
    layout_s: float
    """Layout changes: NCHW convolutions on Tensor Cores (`layout_bytes`), whatever the factors."""


def sample_terms(w: Workload, f: MachineFacts, channels_last: tuple[Precision, ...]) -> SampleTerms:
    """The terms of `compute_time` for one sample on a GPU, before the stack's ``e_c`` and ``k_m`` (the fits solve
    for those two from them)."""
    bandwidth = f.memory_bandwidth_gbs * 1e9
    return SampleTerms(
        flops_s=w.model.train_flops / (f.peak_tflops * 1e12),
        pass_s=w.model.activations_m * 1e6 * BYTES_PER_ELEMENT[w.precision] / bandwidth,
        layout_s=layout_bytes(w, f, channels_last) / bandwidth,
    )


def compute_time(w: Workload, f: MachineFacts, factors: Factors) -> float:
    """Seconds for one device to run forward and backward over ``w.batch`` samples."""
    if f.kind == "cpu":
        return w.batch * w.model.train_flops / (factors.cpu_compute_efficiency * f.peak_tflops * 1e12)
    t = sample_terms(w, f, factors.channels_last)
    return w.batch * (t.flops_s / factors.compute_efficiency + factors.memory_passes * t.pass_s + t.layout_s)


def layout_bytes(w: Workload, f: MachineFacts, channels_last: tuple[Precision, ...]) -> float:
    """Bytes per sample that layout changes move: NCHW convolutions on Tensor Cores (`TRANSPOSE_MOVES`), else 0."""
    if f.peak_key not in TENSOR_CORE_PEAKS or w.precision in channels_last:
        return 0.0
    return TRANSPOSE_MOVES * w.model.conv_io_m * 1e6 * BYTES_PER_ELEMENT[w.precision]
