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
from deskpod.plan.workload import BYTES_PER_ELEMENT, Workload


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
    True: the pipeline runs ahead of the step (DALI's prefetching) and only what exceeds it shows."""


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
    power_source: str
    price_usd: float | None
    cpu_cores: int
    topology: Topology = field(repr=False)


def compute_time(w: Workload, f: MachineFacts, factors: Factors) -> float:
    """Seconds for one device to run forward and backward over ``w.batch`` samples."""
    if f.kind == "cpu":
        return w.batch * w.model.train_flops / (factors.cpu_compute_efficiency * f.peak_tflops * 1e12)
    flops = w.model.train_flops / (factors.compute_efficiency * f.peak_tflops * 1e12)
    memory = factors.memory_passes * w.model.activations_m * 1e6 * BYTES_PER_ELEMENT[w.precision]
    return w.batch * (flops + memory / (f.memory_bandwidth_gbs * 1e9))
