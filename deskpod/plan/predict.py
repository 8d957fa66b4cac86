"""Predict a training run on a catalog machine x N nodes under a software stack, from first principles.

A prediction is (workload, machine, stack). The machine gives the first principles — the peak FLOPS
for the precision on the unit that runs it (Tensor Cores where the device has them for the
precision, CUDA cores or FP32 otherwise: `PEAK_FALLBACK`), memory bandwidth, links and NICs, CPU
cores; the stack (`deskpod.plan.stacks`) gives the few factors fitted to one table of its era.
Per device and step (``b`` samples of a model with forward FLOPs ``F``, ``A`` activation elements):

* **compute** on a GPU ``= b x (3F / (e_c x peak) + k_m x A x bytes / memory_bandwidth)``: a FLOP
  term at the device's peak for the precision and a memory-traffic term (each activation element
  moved ``k_m`` times per step), added because layers alternate between the two limits; on a CPU
  ``= b x 3F / (e_cpu x peak)``: FLOPs at the CPU's own fitted efficiency. Neither GPU factor
  carries over (``e_c`` above 1 counts cuDNN's FFT/Winograd savings, ``k_m`` HBM traffic between
  GPU kernels), and the one CPU training figure there is can fit one factor: the FLOP term, the one
  that follows a CPU's cores x clock x vector width from one generation to the next;
* **communication**: an all-reduce of the gradients (parameters x the stack's gradient bytes, or
  the precision's) over the node's devices and the nodes, timed by `deskpod.comm.cost` (rings on the
  machine's topology, the NICs nearest the GPUs across nodes) at the stack's efficiency ``e_n``; the
  backward pass hides up to ``overlap`` of its time, the rest is **exposed**, and so is the stack's
  per-step synchronization cost ``sync_s`` (only where more than one device trains);
* **input pipeline** (``data = real``): decoding ``b x devices`` images on the node's CPU cores at
  ``r`` images/s per core; in series with the step (``1/real = 1/synthetic + 1/input``, stack
  tf1-2017) or running ahead of it, showing only where it is the slower (stack pytorch-2021, DataLoader workers).

``step = compute + exposed communication + exposed input``; images/s = ``b x devices x nodes / step``;
scaling efficiency against one device x the device count; time to train = dataset x epochs /
images/s; energy at the catalog's system power (or device power x count); cost at its list price.

Every factor is fitted to its stack's table only (`deskpod.plan.calibration`); a test checks that
each stack's factors are its fit's output. Nothing else is fitted; no published result is looked
up. Machine ``local`` is this box as ``deskpod plan calibrate`` measured and fitted it, under its
own stack ``local`` (`deskpod.plan.local`); it runs every precision at its measured FP32 matmul rate.
"""

from __future__ import annotations

import functools
import re
from dataclasses import dataclass, replace
from pathlib import Path

from deskpod.comm.cost import MAX_NODES, Network, predict
from deskpod.errors import UsageError
from deskpod.hardware.catalog import Machine, find_machine
from deskpod.plan.factors import Factors, MachineFacts, compute_time, sample_terms
from deskpod.plan.stacks import DEFAULT_STACK, LOCAL_STACK, find_stack
from deskpod.plan.workload import BYTES_PER_ELEMENT, Precision, Workload

__all__ = ["Factors", "MachineFacts", "Plan", "compute_time", "machine_facts", "match_nodes", "predict_plan",
           "resolve_stack"]  # fmt: skip

PEAK_FALLBACK: dict[Precision, tuple[str, ...]] = {
    "fp32": ("fp32",),
    "tf32": ("tf32", "fp32"),
    "fp16": ("fp16_tensor", "fp16", "fp32"),
    "bf16": ("bf16", "fp16_tensor", "fp32"),
}
"""Which catalog peak a precision runs at: Tensor Cores where the device has them, else FP16, else FP32."""


_CORES = re.compile(r"(\d+)\s*cores")


def machine_facts(name: str, precision: Precision, *, home: Path | None = None) -> MachineFacts:
    """The catalog machine's facts for ``precision``; `UsageError` when the catalog lacks one the model needs.

    Machine ``local`` is read from the calibration under ``home`` (default: ``DESKPOD_HOME``).
    """
    if precision not in PEAK_FALLBACK:
        raise UsageError(f"unknown precision {precision!r}; valid: {', '.join(PEAK_FALLBACK)}")
    if name == "local":
        from deskpod.hardware.placement import local_topology
        from deskpod.plan.local import facts, load

        return facts(load(home).measurements, local_topology())
    return _facts(find_machine(name).name, precision)


@functools.cache
def _facts(name: str, precision: Precision) -> MachineFacts:
    m: Machine = find_machine(name)
    peak = None
    for key in PEAK_FALLBACK[precision]:
        spec = m.peak_tflops(key)
        if spec:
            peak = (spec.value, key)
            break
    if peak is None:
        raise UsageError(f"machine {m.name!r} has no peak FLOPS for {precision} in the catalog; pick another machine")
    bw = m.spec("device", "memory_bandwidth_gbs")
    if bw is None:
        raise UsageError(f"machine {m.name!r} has no memory bandwidth in the catalog")
    system_power = m.spec("system", "power_w")
    device_power = m.spec("device", "power_w")
    if system_power:
        power = system_power.value
    elif device_power:
        power = device_power.value * m.device_count  # no system figure: the devices' together
    else:
        power = 0.0  # unknown
    price = m.spec("system", "list_price_usd")
    cores = 0
    for text in (m.texts.get("cpus.model", ""), m.texts.get("device.model", "")):
        found = _CORES.search(text)
        if found:
            count = m.spec("cpus", "count")
            cores = int(found.group(1)) * int(count.value if count else 1)
            break
    return MachineFacts(
        name=m.name, title=m.title, kind=m.kind, devices=m.device_count, peak_tflops=peak[0], peak_key=peak[1],
        memory_bandwidth_gbs=bw.value, power_w=power, price_usd=price.value if price else None,
        cpu_cores=cores, topology=m.topology(),
    )  # fmt: skip


@dataclass(frozen=True, slots=True)
class Plan:
    """One prediction, with its breakdown (seconds per step unless named otherwise)."""

    machine: str
    stack: str
    """The software stack whose factors predicted it (`deskpod.plan.stacks`)."""
    nodes: int
    devices_per_node: int
    precision: Precision
    peak_key: str
    compute_s: float
    layout_s: float
    """Of ``compute_s``: the layout changes of NCHW convolutions on Tensor Cores (`deskpod.plan.factors.layout_bytes`)."""
    comm_s: float
    exposed_comm_s: float
    """The all-reduce the backward pass does not hide, plus ``sync_s``."""
    sync_s: float
    """Of ``exposed_comm_s``: the stack's per-step synchronization cost (`deskpod.plan.factors.Factors.sync_s`)."""
    input_s: float
    """What the input pipeline adds to the step: all of it in series, what exceeds the step when it runs ahead."""
    step_s: float
    images_per_s: float
    single_device_images_per_s: float
    scaling_efficiency: float
    time_to_train_s: float
    energy_kwh: float
    power_kw: float
    price_usd: float | None
    comm_algorithm: str

    def as_dict(self) -> dict[str, object]:
        return {k: getattr(self, k) for k in self.__slots__}


def resolve_stack(machine: str, stack: str | None, factors: Factors | None, home: Path | None) -> tuple[str, Factors]:
    """The stack's name and the factors a prediction uses: the calibration's for machine ``local`` (stack
    ``local``), else the named stack's (default `DEFAULT_STACK`); explicit ``factors`` replace them."""
    if machine == "local":
        if stack not in (None, LOCAL_STACK):
            raise UsageError(f"machine 'local' is predicted with its own calibration (stack '{LOCAL_STACK}'), not "
                             f"{stack!r}; drop --stack, or pick a catalog machine for stack {stack!r}")  # fmt: skip
        if factors is None:
            from deskpod.plan.local import load

            factors = load(home).factors
        return LOCAL_STACK, factors
    s = find_stack(stack or DEFAULT_STACK)
    if factors is None:
        return s.name, s.factors
    return (s.name if stack else "custom"), factors


def predict_plan(
    workload: Workload,
    machine: str,
    nodes: int = 1,
    *,
    devices_per_node: int | None = None,
    network: Network | None = None,
    factors: Factors | None = None,
    stack: str | None = None,
    home: Path | None = None,
    threads: int | None = None,
) -> Plan:
    """Predict ``workload`` on ``nodes`` x ``machine`` (``devices_per_node`` of its devices each, default all)
    under ``stack`` (default `DEFAULT_STACK`; machine ``local``: its own calibration).

    ``factors`` replaces the stack's (the fits pass candidates; the plan then names ``stack`` or "custom").
    ``home`` is where machine ``local``'s calibration lies (default: ``DESKPOD_HOME``; a pod passes its own).
    ``threads``: on a CPU machine, the intra-op threads of each worker (a "device" here), when the run lays its
    workers out otherwise than the machine's slots (``deskpod train --devices all``: one worker per NUMA node,
    `deskpod.train.launcher.resolve_devices`); a worker's FLOP rate scales with its threads from the per-slot
    figure (the machine's cores / devices threads each).
    """
    stack_name, factors = resolve_stack(machine, stack, factors, home)
    f = machine_facts(machine, workload.precision, home=home)
    if threads is not None and f.kind == "cpu":
        if threads < 1:
            raise UsageError(f"threads per worker must be 1 or more, got {threads}")
        per_slot = max(1, f.cpu_cores // f.devices) if f.cpu_cores else 1
        f = replace(f, peak_tflops=f.peak_tflops * threads / per_slot)
    if not 1 <= nodes <= MAX_NODES:
        raise UsageError(f"nodes must be 1..{MAX_NODES}, got {nodes}")
    g = f.devices if devices_per_node is None else devices_per_node
    if not 1 <= g <= f.devices:
        raise UsageError(f"{f.name} has {f.devices} devices per node; asked for {g}")
    if nodes > 1 and network is None and not f.topology.nics:
        raise UsageError(f"{f.name} has no NICs in the catalog; give the network, e.g. --network 1x100 (NICs x Gb/s)")
    compute = compute_time(workload, f, factors)
    layout = 0.0 if f.kind == "cpu" else workload.batch * sample_terms(workload, f, factors.channels_last).layout_s
    comm = 0.0
    algorithm = "none"
    if g * nodes > 1:
        grad_bytes = int(
            workload.model.params_m * 1e6 * (factors.gradient_bytes or BYTES_PER_ELEMENT[workload.precision])
        )
        p = predict(f.topology, "all_reduce", grad_bytes, devices=range(g), nodes=nodes, network=network,
                    efficiency=factors.comm_efficiency)  # fmt: skip
        comm, algorithm = p.time_s, p.algorithm
    backward = compute * 2 / 3
    sync = factors.sync_s if g * nodes > 1 else 0.0
    exposed = max(0.0, comm - factors.overlap * backward) + sync
    per_image_input = 0.0
    if workload.data == "real":
        per_image_input = 1 / (factors.input_images_per_core * (f.cpu_cores or 32))

    def input_shown(busy: float, images: int) -> float:
        decode = images * per_image_input
        return max(0.0, decode - busy) if factors.input_overlap else decode

    input_s = input_shown(compute + exposed, workload.batch * g)
    step = compute + exposed + input_s
    rate = workload.batch * g * nodes / step
    single = workload.batch / (compute + input_shown(compute, workload.batch))
    ttt = workload.dataset_images * workload.epochs / rate
    power_kw = f.power_w * nodes / 1000
    return Plan(
        machine=f.name, stack=stack_name, nodes=nodes, devices_per_node=g, precision=workload.precision,
        peak_key=f.peak_key, compute_s=compute, layout_s=layout, comm_s=comm, exposed_comm_s=exposed, sync_s=sync, input_s=input_s, step_s=step,
        images_per_s=rate, single_device_images_per_s=single, scaling_efficiency=rate / (single * g * nodes),
        time_to_train_s=ttt, energy_kwh=power_kw * ttt / 3600, power_kw=power_kw,
        price_usd=f.price_usd * nodes if f.price_usd is not None else None, comm_algorithm=algorithm,
    )  # fmt: skip


def match_nodes(workload: Workload, machine: str, target_images_per_s: float, *, network: Network | None = None,
                factors: Factors | None = None, stack: str | None = None, limit: int = MAX_NODES) -> int | None:  # fmt: skip
    """Fewest nodes of ``machine`` reaching ``target_images_per_s`` (None if even ``limit`` nodes fall short)."""
    if target_images_per_s <= 0:
        raise UsageError(f"target must be positive, got {target_images_per_s}")

    def rate(n: int) -> float:
        return predict_plan(workload, machine, n, network=network, factors=factors, stack=stack).images_per_s

    if rate(limit) < target_images_per_s:
        return None
    lo, hi = 1, limit  # rate grows with nodes in this model (per-node NIC bandwidth is fixed)
    while lo < hi:
        mid = (lo + hi) // 2
        if rate(mid) >= target_images_per_s:
            hi = mid
        else:
            lo = mid + 1
    return lo
