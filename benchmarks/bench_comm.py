"""``deskpod bench comm`` against a bare ``torch.distributed`` timing loop, in the same run.

    .venv/bin/python benchmarks/bench_comm.py            # table + JSON, updates docs/benchmarks.md
    .venv/bin/python benchmarks/bench_comm.py --no-docs  # print only

Both sides run 2 Gloo workers on 127.0.0.1 (or NCCL over every GPU when there are two or more),
the same sizes, warm-up and iteration counts. The reference is the loop anyone would write: a
tensor, warm-up calls, a barrier, ``iters`` timed calls, the slowest rank's time. deskpod's harness
adds its correctness check (outside its timed loop), buffers for five collectives and the result
plumbing. Both run in the same worker processes: per size and round, deskpod's `measure_size`
(check, warm-up, timed loop) and the bare loop take turns (order swapped every round), so load from
other work on the box hits both alike; per size, each side's median busbw over the rounds is compared. Target: deskpod's busbw >= 0.9x the reference's. Timings on the shared 2-core
box are noisy, hence the alternation, the medians and the ratio.
"""

from __future__ import annotations

import argparse
import datetime
import json
import math
import os
import statistics
import sys
import time
from typing import Any

from docs_section import replace_subsection

from deskpod.comm.bench import CommBenchConfig, measure_size, resolve, spawn_workers
from deskpod.comm.collectives import CollectiveName

SECTION = "## Collectives and the performance model"
SUBSECTION = "### bench comm vs a bare torch.distributed loop (bench_comm.py)"


def bare_loop(torch: Any, dist: Any, size: int, world: int, device: Any, iters: int, warmup: int) -> float:
    """The plain loop anyone would write: all-reduce busbw (GB/s) of a float32 tensor of ``size`` bytes."""
    cuda = device.type == "cuda"
    t = torch.zeros(max(1, size // 4), device=device)
    for _ in range(warmup):
        dist.all_reduce(t)
    if cuda:
        torch.cuda.synchronize()
    dist.barrier()
    start = time.perf_counter()
    for _ in range(iters):
        dist.all_reduce(t)
    if cuda:
        torch.cuda.synchronize()
    el = torch.tensor([(time.perf_counter() - start) / iters], dtype=torch.float64, device=device)
    dist.all_reduce(el, op=dist.ReduceOp.MAX)
    return float(t.numel() * 4 / float(el.item()) / 1e9 * 2 * (world - 1) / world)


def _worker(rank: int, world: int, port: int, backend: str, kind: str, threads: int, config: CommBenchConfig,
            rounds: int, out: Any) -> None:  # fmt: skip
    """Same processes, same moment: per size and round, deskpod's `measure_size` and the bare loop, in turn."""
    os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
    import torch
    import torch.distributed as dist

    try:
        device = torch.device(f"cuda:{rank}" if kind == "cuda" else "cpu")
        if kind == "cuda":
            torch.cuda.set_device(device)
        else:
            torch.set_num_threads(threads)
        dist.init_process_group(backend, init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world,
                                timeout=datetime.timedelta(seconds=300))  # fmt: skip
        ours: list[list[float]] = [[] for _ in config.sizes]
        refs: list[list[float]] = [[] for _ in config.sizes]
        wrong = 0
        for r in range(rounds):
            for j, size in enumerate(config.sizes):
                for side in ("ours", "ref") if r % 2 == 0 else ("ref", "ours"):
                    if side == "ours":
                        row = measure_size(torch, dist, "all_reduce", size, world, rank, device, config)
                        ours[j].append(row["busbw"])
                        wrong += row["wrong"]
                    else:
                        refs[j].append(bare_loop(torch, dist, size, world, device, config.iters, config.warmup))
        dist.destroy_process_group()
        out.put({"rank": rank, "ours": ours, "refs": refs, "wrong": wrong})
    except BaseException as e:
        out.put({"rank": rank, "error": f"{type(e).__name__}: {e}"})


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rounds", type=int, default=9)
    ap.add_argument("--max-bytes", type=int, default=4 << 20)
    ap.add_argument("--iters", type=int, default=50)
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--no-docs", action="store_true")
    args = ap.parse_args()
    collective: CollectiveName = "all_reduce"
    config = CommBenchConfig(collectives=(collective,), min_bytes=8, max_bytes=args.max_bytes, step_factor=4,
                             iters=args.iters, warmup=args.warmup)  # fmt: skip
    backend, kind, world, threads = resolve(config)
    sizes = list(config.sizes)
    reports = spawn_workers(_worker, world, (backend, kind, threads, config, args.rounds), 600)
    bad = [r["error"] for r in reports if "error" in r]
    if bad:
        print("failed: " + "; ".join(bad), file=sys.stderr)
        return 1
    rep = reports[0]
    wrong = int(rep["wrong"])
    rows = []
    for j, size in enumerate(sizes):
        a = statistics.median(rep["ours"][j])
        b = statistics.median(rep["refs"][j])
        rows.append({"size": size, "deskpod_busbw": a, "reference_busbw": b, "ratio": a / b if b else float("nan")})
    big = [r["ratio"] for r in rows if r["size"] >= 64 << 10]
    summary = {
        "backend": backend, "device_kind": kind, "ranks": world, "threads_per_rank": threads, "rounds": args.rounds,
        "iters": args.iters, "warmup": args.warmup, "collective": collective, "wrong": wrong,
        "geomean_ratio_all_sizes": math.exp(statistics.fmean(math.log(r["ratio"]) for r in rows)),
        "geomean_ratio_64k_up": math.exp(statistics.fmean(math.log(x) for x in big)) if big else None,
    }  # fmt: skip
    lines = ["| size (B) | deskpod busbw GB/s | reference busbw GB/s | ratio |", "|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r['size']} | {r['deskpod_busbw']:.4f} | {r['reference_busbw']:.4f} | {r['ratio']:.3f} |")
    table = "\n".join(lines)
    print(table)
    print(json.dumps({"summary": summary, "rows": rows}))
    if not args.no_docs:
        cmd = " ".join([".venv/bin/python benchmarks/bench_comm.py", *sys.argv[1:]])
        _write_docs(cmd, summary, table)
    ok = wrong == 0 and summary["geomean_ratio_all_sizes"] >= 0.9
    return 0 if ok else 1


def _write_docs(command: str, s: dict[str, Any], table: str) -> None:
    body = "\n".join([
        SUBSECTION,
        "",
        f"Command: `{command}` ({time.strftime('%Y-%m-%d', time.gmtime())}, shared 2-core box, other tests running).",
        f"{s['ranks']} ranks, {s['backend']} on {s['device_kind']} ({s['threads_per_rank']} thread per rank), "
        f"{s['collective']} float32, {s['warmup']} warm-up + {s['iters']} timed iterations per size, "
        f"{s['rounds']} rounds in the same 2 worker processes, deskpod's `measure_size` and the bare loop in turn "
        f"(order swapped every round), median busbw per side. #wrong over all deskpod rounds: {s['wrong']}.",
        "",
        table,
        "",
        f"Geometric mean of the ratio: {s['geomean_ratio_all_sizes']:.3f} over all sizes, "
        f"{s['geomean_ratio_64k_up']:.3f} from 64 KiB up; target >= 0.9.",
        "",
    ])  # fmt: skip
    replace_subsection(SECTION, SUBSECTION, body)


if __name__ == "__main__":
    sys.exit(main())
