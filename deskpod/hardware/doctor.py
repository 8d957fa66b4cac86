"""``deskpod doctor``: a quick health check of this box, in the spirit of DCGM's level-1 diagnostics.

Per device: matmul throughput per precision (fp32, and bf16 where it applies) checked for correct
results, and memory copy bandwidth; each figure is judged against the device's catalog spec when the
catalog has one (pass >= 50 % of spec, warn >= 25 %, fail below or on a wrong result). Across
devices: an all-reduce through real ``torch.distributed`` worker processes (Gloo on CPU, NCCL on
GPUs, rendezvous on 127.0.0.1), checked element by element. Between GPU pairs: peer copy bandwidth
against the topology's link bandwidth.

On a CPU-only box a device is a CPU worker slot. The catalog has no spec for an arbitrary CPU, so a
slot is judged against the median of all slots (a straggler warns below half of it) and on the
correctness of its results; peer bandwidth is skipped, and the report says so.

Each device is measured inside its own worker process, all at the same time, as training would use
them. The timed loops run after an untimed warm-up; correctness is checked outside the timed part.
"""

from __future__ import annotations

import contextlib
import datetime
import json
import multiprocessing as mp
import os
import queue
import statistics
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any, Literal

from deskpod.environment.network import free_port
from deskpod.errors import RunError
from deskpod.processes import stop_processes

Status = Literal["pass", "warn", "fail", "skip"]
PASS_FRACTION = 0.5
WARN_FRACTION = 0.25
"""Fractions of the catalog spec that pass / warn (below: fail). Dense matmul reaches ~80 % of peak and
a copy ~90 % of memory bandwidth on a healthy H200 (published: about 790 TFLOP/s dense bf16 and 4.3 TB/s,
against 989.4 and 4,800 GB/s of spec; docs/benchmarks.md#deskpod-doctor), so half of spec is a broken device."""
STRAGGLER_FRACTION = 0.5
"""A CPU slot slower than this fraction of the median slot warns."""
ALLREDUCE_ELEMENTS = 1 << 18
ALLREDUCE_REPS = 5


@dataclass(frozen=True, slots=True)
class Check:
    """One line of the report."""

    device: str
    """``cpu:0``, ``cuda:1``, ``all`` or ``cuda:0-cuda:1``."""
    name: str
    status: Status
    measured: float | None = None
    unit: str = ""
    spec: float | None = None
    spec_source: str = ""
    note: str = ""


@dataclass(slots=True)
class DoctorReport:
    kind: str
    devices: int
    checks: list[Check] = field(default_factory=list)
    elapsed_s: float = 0.0

    @property
    def failed(self) -> bool:
        return any(c.status == "fail" for c in self.checks)

    def to_json(self) -> str:
        return json.dumps(
            {
                "schema": "deskpod.doctor/1",
                "kind": self.kind,
                "devices": self.devices,
                "ok": not self.failed,
                "elapsed_s": round(self.elapsed_s, 3),
                "checks": [asdict(c) for c in self.checks],
            },
            indent=2,
        )

    def to_table(self) -> str:
        rows = [("device", "check", "status", "measured", "spec", "note")]
        for c in self.checks:
            measured = f"{c.measured:.4g} {c.unit}" if c.measured is not None else "-"
            spec = f"{c.spec:.4g} {c.unit}" if c.spec is not None else "-"
            rows.append((c.device, c.name, c.status.upper(), measured, spec, c.note))
        widths = [max(len(r[i]) for r in rows) for i in range(5)]
        lines = ["  ".join(r[i].ljust(widths[i]) for i in range(5)) + "  " + r[5] for r in rows]
        verdict = "FAIL" if self.failed else "OK"
        lines.append(
            f"{verdict}: {len(self.checks)} checks on {self.devices} {self.kind} devices in {self.elapsed_s:.1f} s"
        )
        return "\n".join(lines)


def judge(measured: float, spec: float | None, *, correct: bool = True) -> Status:
    """pass / warn / fail of one figure against its spec (no spec: pass if correct)."""
    if not correct or not measured > 0:
        return "fail"
    if spec is None:
        return "pass"
    if measured >= PASS_FRACTION * spec:
        return "pass"
    return "warn" if measured >= WARN_FRACTION * spec else "fail"


def gpu_spec(name: str) -> tuple[str, dict[str, float], str] | None:
    """Catalog spec for a GPU name: (machine, {fp32, bf16, copy in TFLOP/s or GB/s}, sources)."""
    from deskpod.hardware.catalog import machines

    upper = name.upper()
    for m in machines():
        if m.kind != "cuda" or not m.gpu or m.gpu not in upper:
            continue
        out: dict[str, float] = {}
        sources = []
        for key, spec in (
            ("fp32", m.peak_tflops("fp32")),
            ("bf16", m.peak_tflops("bf16") or m.peak_tflops("fp16_tensor")),
            ("copy", m.spec("device", "memory_bandwidth_gbs")),
        ):
            if spec is not None:
                out[key] = spec.value
                sources.append(f"{key}: {spec.source}")
        return m.name, out, "; ".join(sources)
    return None


# ---------------------------------------------------------------- measurements (run in the workers)


def _measure_matmul(torch: Any, device: str, dtype: Any, n: int, seconds: float) -> tuple[float, bool]:
    """TFLOP/s of an n x n matmul, and whether a small product matches float64."""
    a = torch.randn(64, 64, dtype=torch.float64, device=device)
    b = torch.randn(64, 64, dtype=torch.float64, device=device)
    ref = a @ b
    got = (a.to(dtype) @ b.to(dtype)).to(torch.float64)
    tol = 1e-3 if dtype == torch.float32 else 0.1
    correct = bool(((got - ref).abs().max() / ref.abs().max()).item() < tol)
    x = torch.randn(n, n, device=device).to(dtype)
    y = torch.randn(n, n, device=device).to(dtype)
    _sync(torch, device)
    reps, elapsed = _timed(torch, device, lambda: x @ y, seconds)
    return 2 * n**3 * reps / elapsed / 1e12, correct


def _measure_copy(torch: Any, device: str, nbytes: int, seconds: float) -> tuple[float, bool]:
    """Copy bandwidth in GB/s (bytes read + bytes written), and whether the copy is exact."""
    src = torch.arange(nbytes // 4, dtype=torch.float32, device=device)
    dst = torch.empty_like(src)
    reps, elapsed = _timed(torch, device, lambda: dst.copy_(src), seconds)
    correct = bool(torch.equal(dst, src))
    return 2 * nbytes * reps / elapsed / 1e9, correct


def _timed(torch: Any, device: str, step: Callable[[], object], seconds: float) -> tuple[int, float]:
    """Run ``step`` once untimed (warm-up), then until ``seconds`` have passed: (repetitions, seconds taken)."""
    step()
    _sync(torch, device)
    reps, start = 0, time.perf_counter()
    while True:
        step()
        reps += 1
        _sync(torch, device)
        elapsed = time.perf_counter() - start
        if elapsed >= seconds:
            return reps, elapsed


def _sync(torch: Any, device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize(device)


def _worker(rank: int, world: int, port: int, kind: str, threads: int, seconds: float, results: Any) -> None:
    """One device's worker: measure it, then join the all-reduce. Sends one dict to ``results``."""
    import torch
    import torch.distributed as dist

    out: dict[str, Any] = {"rank": rank}
    try:
        device = worker_device(torch, kind, rank, threads)
        size = 8192 if kind == "cuda" else 384
        out["fp32"] = _measure_matmul(torch, device, torch.float32, size, seconds)
        out["bf16"] = _measure_matmul(torch, device, torch.bfloat16, size, seconds)
        out["copy"] = _measure_copy(torch, device, (1 << 30) if kind == "cuda" else (32 << 20), seconds)
        join_group("nccl" if kind == "cuda" else "gloo", port, rank, world, 60)
        i = torch.arange(ALLREDUCE_ELEMENTS, dtype=torch.float32, device=device) % 1024
        t = i * (rank + 1)
        dist.all_reduce(t)  # warm-up and correctness: sum over ranks of (rank+1) * i, exact in fp32
        expected = i * (world * (world + 1) // 2)
        wrong = int((t != expected).sum().item())
        # Every rank must run the same number of collectives, so the count is fixed, not timed.
        dist.barrier()
        start = time.perf_counter()
        for _ in range(ALLREDUCE_REPS):
            dist.all_reduce(t)
        _sync(torch, device)
        elapsed = time.perf_counter() - start
        # nccl-tests bus bandwidth for all-reduce: algbw * 2 (n-1) / n.
        busbw = t.numel() * 4 * ALLREDUCE_REPS / elapsed / 1e9 * 2 * (world - 1) / world
        out["allreduce"] = (busbw, wrong)
        dist.barrier()
        dist.destroy_process_group()
    except Exception as e:  # reported as a failed check, never swallowed
        out["error"] = f"{type(e).__name__}: {e}"
    results.put(out)


def worker_device(torch: Any, kind: str, rank: int, threads: int) -> str:
    """A worker's device, made its own: GPU ``rank``, or the CPU with ``threads`` intra-op threads."""
    if kind == "cuda":
        torch.cuda.set_device(rank)
        return f"cuda:{rank}"
    torch.set_num_threads(max(1, threads))
    return "cpu"


def join_group(backend: str, port: int, rank: int, world: int, timeout_s: float) -> None:
    """Join the workers' process group through a TCP rendezvous on 127.0.0.1 (Gloo's traffic on loopback too)."""
    import torch.distributed as dist

    os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
    timeout = datetime.timedelta(seconds=timeout_s)
    dist.init_process_group(
        backend, init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world, timeout=timeout
    )


def spawn_workers(
    target: Callable[..., None], world: int, args: tuple[Any, ...], timeout_s: float
) -> list[dict[str, Any]]:
    """Start ``world`` spawned processes running ``target(rank, world, port, *args, queue)``; collect one dict each.

    Workers that die or overrun the timeout are terminated by pid and reported; nothing outlives the call.
    """
    ctx = mp.get_context("spawn")
    results = ctx.Queue()
    port = free_port()
    procs = [ctx.Process(target=target, args=(r, world, port, *args, results), daemon=True) for r in range(world)]
    for p in procs:
        p.start()
    got: dict[int, dict[str, Any]] = {}
    deadline = time.monotonic() + timeout_s
    try:
        while len(got) < world and time.monotonic() < deadline:
            try:
                item = results.get(timeout=0.2)
                got[item["rank"]] = item
            except queue.Empty:  # check whether a worker died without reporting
                dead = [p for p in procs if p.exitcode not in (None, 0)]
                if dead and len(got) + len(dead) >= world:
                    break
    finally:
        stop_processes(procs, deadline, max_wait=float("inf"))
    for r in range(world):
        if r not in got:
            code = procs[r].exitcode
            got[r] = {"rank": r, "error": f"worker {r} did not report (exit code {code}, timeout {timeout_s:.0f} s)"}
    return [got[r] for r in range(world)]


# ---------------------------------------------------------------- the check


def run_doctor(*, seconds: float = 0.2, timeout: float = 120.0) -> DoctorReport:
    """Check this box; ``seconds`` is the time per timed measurement."""
    if seconds <= 0:
        raise RunError(f"doctor: seconds per measurement must be positive, got {seconds}")
    from deskpod.hardware.devices import discover

    start = time.perf_counter()
    inventory = discover()
    world = len(inventory.devices)
    kind = inventory.kind
    report = DoctorReport(kind=kind, devices=world)
    threads = max(1, inventory.cores // world) if kind == "cpu" else 0
    results = spawn_workers(_worker, world, (kind, threads, seconds), timeout)
    labels = [d.label for d in inventory.devices]
    spec_of: dict[str, float] = {}
    spec_source = ""
    if kind == "cuda":
        found = gpu_spec(inventory.devices[0].name)
        if found:
            spec_machine, spec_of, spec_source = found
            spec_note = f"spec from catalog {spec_machine}"
        else:
            spec_note = f"no catalog spec for {inventory.devices[0].name}"
    else:
        spec_note = f"no catalog spec for this CPU ({_cpu_model()}); judged against the median slot"

    for metric, unit in (("fp32", "TFLOP/s"), ("bf16", "TFLOP/s"), ("copy", "GB/s")):
        name = {"fp32": "matmul fp32", "bf16": "matmul bf16", "copy": "memory copy"}[metric]
        values = [r[metric][0] for r in results if metric in r]
        median = statistics.median(values) if values else 0.0
        for label, r in zip(labels, results, strict=True):
            if "error" in r and metric not in r:
                report.checks.append(Check(label, name, "fail", note=r["error"]))
                continue
            value, correct = r[metric]
            spec = spec_of.get(metric)
            status = judge(value, spec, correct=correct)
            note = spec_note
            if kind == "cpu":
                if status == "pass" and value < STRAGGLER_FRACTION * median:
                    status = "warn"
                    note = f"below half the median slot ({median:.3g} {unit})"
                if metric == "bf16":
                    note += "; " + _bf16_note()
            if not correct:
                note = "WRONG RESULT against a float64 reference" if metric != "copy" else "copy not exact"
            report.checks.append(Check(label, name, status, value, unit, spec, spec_source if spec else "", note))

    errors = [r["error"] for r in results if "error" in r]
    wrong = [r["allreduce"][1] for r in results if "allreduce" in r]
    if errors or len(wrong) != world:
        report.checks.append(
            Check("all", "all-reduce", "fail", note=errors[0] if errors else "a worker did not finish")
        )
    else:
        busbw = min(r["allreduce"][0] for r in results)
        backend = "NCCL" if kind == "cuda" else "Gloo on 127.0.0.1"
        bad = sum(wrong)
        note = f"{world} workers, {backend}, {ALLREDUCE_ELEMENTS} floats; {bad} wrong elements; bus bandwidth"
        report.checks.append(Check("all", "all-reduce", "fail" if bad else "pass", busbw, "GB/s", note=note))
    report.checks.extend(_peer_checks(kind, world))
    report.elapsed_s = time.perf_counter() - start
    return report


def _peer_checks(kind: str, world: int) -> list[Check]:
    """GPU peer copy bandwidth for every pair, against the link bandwidth the topology gives."""
    if kind != "cuda" or world < 2:
        why = (
            "one GPU: no pairs" if kind == "cuda" else "no GPUs: CPU slots share one memory (peer copies do not apply)"
        )
        return [Check("all", "peer bandwidth", "skip", note=why)]
    import torch

    from deskpod.hardware.nvml_topology import local_topology

    topo = local_topology()
    out = []
    nbytes = 256 << 20
    for a in range(world):
        for b in range(a + 1, world):
            src = torch.ones(nbytes // 4, device=f"cuda:{a}")
            dst = torch.empty(nbytes // 4, device=f"cuda:{b}")
            dst.copy_(src)
            torch.cuda.synchronize(b)
            reps, start = 5, time.perf_counter()
            for _ in range(reps):
                dst.copy_(src)
            torch.cuda.synchronize(b)
            gbs = nbytes * reps / (time.perf_counter() - start) / 1e9
            link = topo.link_bandwidth(a, b) if a < topo.device_count and b < topo.device_count else None
            correct = bool(torch.equal(dst.cpu(), src.cpu()))
            out.append(
                Check(
                    f"cuda:{a}-cuda:{b}",
                    "peer bandwidth",
                    judge(gbs, link, correct=correct),
                    gbs,
                    "GB/s",
                    link,
                    "topology link bandwidth per direction",
                    topo.links[a][b].token,
                )
            )
    return out


def _cpuinfo(field: str) -> str:
    """The first ``field`` line's value in ``/proc/cpuinfo``; empty when there is none."""
    with contextlib.suppress(OSError), open("/proc/cpuinfo") as f:
        return next((line.split(":", 1)[1].strip() for line in f if line.startswith(field)), "")
    return ""


def _cpu_model() -> str:
    return _cpuinfo("model name") or "unknown CPU"


def _bf16_note() -> str:
    native = [x for x in ("amx_bf16", "avx512_bf16") if x in _cpuinfo("flags").split()]
    return f"native bf16 ({', '.join(native)})" if native else "no native bf16 on this CPU (emulated)"
