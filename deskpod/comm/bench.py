"""``deskpod bench comm``: an nccl-tests-style sweep of collectives through ``torch.distributed``.

One worker process per device (``spawn``), NCCL on GPUs, Gloo on CPU workers, rendezvous on
``127.0.0.1`` at a free port. For every collective and message size, each worker:

1. fills its buffers with a known pattern, runs the collective once and counts the elements that
   differ from the exact expected result (``#wrong``, summed over ranks) — outside the timed loop;
2. runs ``warmup`` untimed iterations, a barrier, then ``iters`` timed iterations (the same fixed
   count on every rank, so no rank waits on a collective the others never issue);
3. reports the slowest rank's time per iteration (a collective is done when its last rank is).

time, algbw and busbw follow nccl-tests (see `deskpod.comm.collectives`). Any wrong element makes
the whole run fail (`RunError`, exit 1) after the table is printed: a fast wrong answer is not a result.

Examples::

    deskpod bench comm                                   # 2 CPU workers (or every GPU), 8 B .. 4 MiB
    deskpod bench comm --collectives all_reduce --max-bytes 1G --devices 8
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Literal

from deskpod.comm.collectives import COLLECTIVES, CollectiveName, bus_factor, element_count
from deskpod.errors import RunError, UsageError
from deskpod.hardware.doctor import join_group, spawn_workers, worker_device

Backend = Literal["auto", "gloo", "nccl"]
DTYPES = ("float32", "bfloat16", "float16")
MAX_BYTES_LIMIT = 1 << 30
"""1 GiB: the top of nccl-tests' usual sweep and of ours."""


def format_size(n: int) -> str:
    for shift, unit in ((30, "G"), (20, "M"), (10, "K")):
        if n >= 1 << shift and n % (1 << shift) == 0:
            return f"{n >> shift}{unit}"
    return str(n)


@dataclass(frozen=True, slots=True)
class CommBenchConfig:
    """What to sweep. Validated here, where flags enter."""

    collectives: tuple[CollectiveName, ...] = COLLECTIVES
    min_bytes: int = 8
    max_bytes: int = 4 << 20
    """Default 4 MiB keeps a 2-worker Gloo sweep of all five collectives to seconds; up to 1 GiB."""
    step_factor: int = 2
    iters: int = 20
    warmup: int = 5
    devices: int = 0
    """Ranks; 0 means every GPU, or 2 CPU workers on a box without one."""
    backend: Backend = "auto"
    dtype: str = "float32"
    threads: int = 0
    """Intra-op threads per CPU worker; 0 = this process's cores divided among the workers."""
    timeout_s: float = 300.0
    sizes: tuple[int, ...] = field(default=(), init=False)

    def __post_init__(self) -> None:
        if not self.collectives:
            raise UsageError(f"no collectives chosen; valid: {', '.join(COLLECTIVES)}")
        if self.min_bytes < 1:
            raise UsageError(f"--min-bytes must be at least 1, got {self.min_bytes}")
        if self.max_bytes < self.min_bytes:
            raise UsageError(f"--max-bytes {self.max_bytes} is below --min-bytes {self.min_bytes}")
        if self.max_bytes > MAX_BYTES_LIMIT:
            raise UsageError(f"--max-bytes {self.max_bytes} is above the 1G limit")
        if self.step_factor < 2:
            raise UsageError(f"--step-factor must be at least 2, got {self.step_factor}")
        if self.iters < 1 or self.warmup < 0:
            raise UsageError(f"--iters must be >= 1 and --warmup >= 0, got {self.iters} and {self.warmup}")
        if self.devices < 0 or self.devices == 1:
            raise UsageError(f"--devices must be 2 or more (0 = default), got {self.devices}")
        if self.backend not in ("auto", "gloo", "nccl"):
            raise UsageError(f"--backend {self.backend!r}; valid: auto, gloo, nccl")
        if self.dtype not in DTYPES:
            raise UsageError(f"--dtype {self.dtype!r}; valid: {', '.join(DTYPES)}")
        if self.timeout_s <= 0:
            raise UsageError(f"timeout must be positive, got {self.timeout_s}")
        sizes = []
        s = self.min_bytes
        while s <= self.max_bytes:
            sizes.append(s)
            s *= self.step_factor
        object.__setattr__(self, "sizes", tuple(sizes))


def resolve(config: CommBenchConfig) -> tuple[str, str, int, int]:
    """(backend, device kind, ranks, threads per rank) for this box."""
    import torch

    gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
    backend = config.backend
    if backend == "auto":
        backend = "nccl" if gpus >= 2 else "gloo"
    if backend == "nccl":
        if gpus < 2:
            raise UsageError(f"--backend nccl needs at least 2 GPUs; this box has {gpus}")
        world = config.devices or gpus
        if world > gpus:
            raise UsageError(f"--devices {world}: this box has {gpus} GPUs")
        return "nccl", "cuda", world, 1
    world = config.devices or 2
    from deskpod.environment import Environment

    cores = Environment.read().cpu_count
    threads = config.threads or max(1, cores // world)
    return "gloo", "cpu", world, threads


def worker_sweep(
    rank: int, world: int, port: int, backend: str, kind: str, threads: int, config: CommBenchConfig
) -> list[dict[str, Any]]:
    """One rank's whole sweep (runs in a worker process); every rank returns the same rows."""
    import torch
    import torch.distributed as dist

    device = torch.device(worker_device(torch, kind, rank, threads))
    join_group(backend, port, rank, world, config.timeout_s)
    rows: list[dict[str, Any]] = []
    try:
        for name in config.collectives:
            for size in config.sizes:
                rows.append(measure_size(torch, dist, name, size, world, rank, device, config))
        dist.barrier()
    finally:
        dist.destroy_process_group()
    return rows


def measure_size(
    torch: Any, dist: Any, name: CollectiveName, size: int, world: int, rank: int, device: Any, config: CommBenchConfig
) -> dict[str, Any]:
    """One row: check once (untimed), warm up, time ``iters`` calls; the slowest rank's time, the summed ``#wrong``.

    Every rank must call this with the same arguments, in the same order (each call issues collectives).
    """
    from deskpod.comm.collectives import make_buffers, run_once

    cuda = device.type == "cuda"
    dtype = getattr(torch, config.dtype)
    itemsize = torch.empty((), dtype=dtype).element_size()
    count = element_count(name, size, itemsize, world)
    b = make_buffers(torch, name, count, rank, world, dtype, device)
    run_once(dist, name, b)
    if cuda:
        torch.cuda.synchronize(device)
    wrong = int((b.output != b.expected).sum().item())
    del b.expected
    if name == "all_reduce":
        b.output.zero_()  # zeros stay zeros: the timed loop cannot overflow or go denormal
    for _ in range(config.warmup):
        run_once(dist, name, b)
    if cuda:
        torch.cuda.synchronize(device)
    dist.barrier()
    start = time.perf_counter()
    for _ in range(config.iters):
        run_once(dist, name, b)
    if cuda:
        torch.cuda.synchronize(device)
    elapsed = (time.perf_counter() - start) / config.iters
    slowest = torch.tensor([elapsed], dtype=torch.float64, device=device)
    wrongs = torch.tensor([wrong], dtype=torch.int64, device=device)
    dist.all_reduce(slowest, op=dist.ReduceOp.MAX)
    dist.all_reduce(wrongs, op=dist.ReduceOp.SUM)
    t = float(slowest.item())
    nbytes = count * itemsize
    alg = nbytes / t / 1e9
    return {
        "collective": name,
        "size": nbytes,
        "count": count,
        "type": config.dtype,
        "time_us": t * 1e6,
        "algbw": alg,
        "busbw": alg * bus_factor(name, world),
        "wrong": int(wrongs.item()),
    }


def _worker_main(
    rank: int, world: int, port: int, backend: str, kind: str, threads: int, config: Any, out: Any
) -> None:
    try:
        rows = worker_sweep(rank, world, port, backend, kind, threads, config)
        out.put({"rank": rank, "rows": rows})
    except BaseException as e:  # reported to the parent, which names the failing rank
        out.put({"rank": rank, "error": f"{type(e).__name__}: {e}"})


def run_comm_bench(config: CommBenchConfig, log: Callable[[str], None] | None = None) -> dict[str, Any]:
    """Run the sweep on this box and return the result (``rows``, ``wrong``, …) as plain JSON-able data."""
    backend, kind, world, threads = resolve(config)
    if kind == "cpu":
        total = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
        # input, output, expected and the pattern temporaries: about 4 S per rank.
        if config.max_bytes * 4 * world > total:
            raise UsageError(
                f"--max-bytes {format_size(config.max_bytes)} x {world} ranks needs about "
                f"{config.max_bytes * 4 * world >> 20} MiB; this box has {total >> 20} MiB"
            )
    if log:
        log(f"# deskpod bench comm: {world} ranks, {backend} on {kind}, {config.dtype}, "
            f"{format_size(config.min_bytes)}..{format_size(config.max_bytes)} x{config.step_factor}, "
            f"{config.warmup} warm-up + {config.iters} timed iterations")  # fmt: skip
    started = time.perf_counter()
    reports = spawn_workers(_worker_main, world, (backend, kind, threads, config), config.timeout_s)
    errors = [f"rank {r['rank']}: {r['error']}" for r in reports if "error" in r]
    if errors:
        raise RunError("bench comm failed: " + "; ".join(errors))
    rows = reports[0]["rows"]
    wrong = sum(int(r["wrong"]) for r in rows)
    summary = {}
    for name in config.collectives:
        sel = [r["busbw"] for r in rows if r["collective"] == name]
        summary[name] = {"avg_busbw": sum(sel) / len(sel), "max_busbw": max(sel)}
    return {
        "backend": backend,
        "device_kind": kind,
        "ranks": world,
        "threads_per_rank": threads,
        "dtype": config.dtype,
        "iters": config.iters,
        "warmup": config.warmup,
        "rows": rows,
        "summary": summary,
        "wrong": wrong,
        "seconds": round(time.perf_counter() - started, 3),
    }


def format_table(result: dict[str, Any]) -> str:
    """nccl-tests' columns, one block per collective, then the average bus bandwidth of each."""
    lines = [
        f"# {result['ranks']} ranks, {result['backend']} on {result['device_kind']}; "
        "busbw = algbw x factor (nccl-tests doc/PERFORMANCE.md)",
        f"# {'collective':<15}{'size(B)':>12}{'count':>12}{'type':>9}{'time(us)':>11}"
        f"{'algbw(GB/s)':>13}{'busbw(GB/s)':>13}{'#wrong':>8}",
    ]
    for r in result["rows"]:
        lines.append(
            f"  {r['collective']:<15}{r['size']:>12}{r['count']:>12}{r['type']:>9}{r['time_us']:>11.1f}"
            f"{r['algbw']:>13.3f}{r['busbw']:>13.3f}{r['wrong']:>8}"
        )
    for name, s in result["summary"].items():
        lines.append(f"# {name}: avg busbw {s['avg_busbw']:.3f} GB/s, max {s['max_busbw']:.3f} GB/s")
    lines.append(f"# out of bounds values: {result['wrong']} {'OK' if result['wrong'] == 0 else 'WRONG'}")
    return "\n".join(lines)
