"""One scheduling pass of the pod service with 10,000 queued jobs (target: <= 10 ms).

    .venv/bin/python benchmarks/bench_scheduler.py            # table + JSON, updates docs/benchmarks.md
    .venv/bin/python benchmarks/bench_scheduler.py --no-docs

The pass is `deskpod.jobs.scheduler.schedule` with the hardware model's real placement on a DGX-1
(V100) from the catalog: priorities 0-4, 1-8 GPUs each, a third with a max_runtime, and running jobs
that hold 6 of the 8 GPUs — so it exercises order, the reservation, backfill and preemption.

References, timed in the same run (the shared CI box is noisy; the ratios are what count):
- *naive*: the same order but placement asked for every job (no refusal cache, no reservation) —
  what a straightforward scheduler pays;
- *sort floor*: only sorting the 10,000 jobs by (priority, id), which any pass must do.

Checked outside the timed part: starts use free, distinct devices; every job starts or has a reason.
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from docs_section import replace_subsection

from deskpod.hardware.placement import Placement, Unplaceable, machine, place
from deskpod.jobs.scheduler import Plan, Running, Waiting, WaitingCache, schedule
from deskpod.jobs.spec import parse_spec
from deskpod.jobs.states import JobState
from deskpod.jobs.store import Store

INTRO = "The pod service (`deskpod/jobs/`): scheduler and submission figures."
SECTION = "## Pod service"
SUB = "### One scheduling pass (bench_scheduler.py)"
NOW = 1_000_000.0


def workload(n: int, seed: int = 0) -> tuple[list[Waiting], list[Running]]:
    rng = random.Random(seed)
    waiting = [
        Waiting(i, rng.randrange(5), rng.choice((1, 1, 1, 2, 2, 4, 8)), "best",
                rng.choice((None, None, 600.0)))
        for i in range(1, n + 1)
    ]  # fmt: skip
    running = [
        Running(n + 1, 6, (0, 1), NOW - 100, 3600.0),
        Running(n + 2, 0, (2, 3), NOW - 50, None),
        Running(n + 3, 6, (4, 5), NOW - 10, 7200.0),
    ]
    return waiting, running


def naive(waiting: Sequence[Waiting], running: Sequence[Running], n: int, place_fn: Callable[..., object]) -> int:
    """The reference: priority order, placement asked for every job."""
    busy = {d for r in running for d in r.devices}
    free = [d for d in range(n) if d not in busy]
    started = 0
    for j in sorted(waiting, key=lambda j: (-j.priority, j.id)):
        got = place_fn(free, j.devices, j.policy)
        if isinstance(got, Placement):
            taken = set(got.devices)
            free = [d for d in free if d not in taken]
            started += 1
    return started


def timed(fn: Callable[[], object], repeat: int) -> list[float]:
    for _ in range(3):
        fn()
    out = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        out.append((time.perf_counter() - t0) * 1000)
    return out


def daemon_pass(
    waiting: Sequence[Waiting], running: Sequence[Running], place_fn: Callable[..., Any], repeat: int
) -> tuple[float, float]:
    """The daemon's whole pass minus starting processes: read the queue (the store's view, kept in step with its
    writes), decide, write the changed reasons; median over passes that each follow a submission, and the first."""
    with tempfile.TemporaryDirectory() as tmp:
        store = Store(Path(tmp) / "pod.db")
        for j in waiting:
            spec = parse_spec({"command": ["true"], "priority": j.priority, "devices": j.devices, "max_runtime": j.max_runtime}
                              if j.max_runtime else {"command": ["true"], "priority": j.priority, "devices": j.devices})  # fmt: skip
            store.submit("bench", spec, j.devices, NOW)

        cache = WaitingCache()

        def one() -> None:  # as `Pod._schedule` does it
            queued, changed = store.queue_delta()
            ws = cache.apply(queued, changed)
            plan = schedule(ws, running, 8, place_fn, NOW, ordered=True)
            store.set_reasons({i: r for i, r in plan.waits.items() if (q := queued.get(i)) is None or q[5] != r})

        t0 = time.perf_counter()
        one()  # the first pass reads the whole queue and writes every wait reason
        first = (time.perf_counter() - t0) * 1000
        times = []
        spec = parse_spec({"command": ["true"], "priority": 2, "devices": 1})
        for _ in range(repeat):
            # As in the daemon, a pass follows a change: here a submission (not timed: it is the submit's cost),
            # and the queued job of the pass before is cancelled, so the queue stays at its size.
            new = store.submit("bench", spec, 1, NOW)
            t0 = time.perf_counter()
            one()
            times.append((time.perf_counter() - t0) * 1000)
            store.transition(new.id, JobState.CANCELLED, "bench", expect=[JobState.QUEUED])
        store.close()
    return statistics.median(times), first


def check(plan: Plan, waiting: Sequence[Waiting], running: Sequence[Running]) -> None:
    busy = {d for r in running for d in r.devices}
    used: set[int] = set()
    for s in plan.starts:
        assert not set(s.devices) & busy, f"start on a busy device: {s}"
        assert not set(s.devices) & used, f"device given twice: {s}"
        used |= set(s.devices)
    decided = {s.job for s in plan.starts} | set(plan.waits)
    missing = {j.id for j in waiting} - decided
    assert not missing, f"{len(missing)} jobs neither started nor given a reason"


def write_docs(rows: list[dict[str, object]], command: str) -> None:
    lines = [
        SUB,
        "",
        f"Command: `{command}` (the shared 2-core box, other work running; compare the ratios).",
        "Real placement on a DGX-1 (V100) topology; running jobs hold 6 of 8 GPUs; medians of repeated passes.",
        "The target holds for the pass itself and for the daemon's whole pass (read the queue, decide, write the changed",
        "wait reasons), timed after a submission each. The daemon runs a pass on each submission, exit or cancel, and once a second.",
        "",
        "| queued jobs | pass median ms | pass p90 ms | naive median ms | sort floor ms | naive / pass | pass / sort | starts | daemon pass with SQLite ms | its first pass ms | target |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        met = r["met"] and r["met_with_store"]
        lines.append(
            f"| {r['queued']} | {r['pass_ms']:.2f} | {r['pass_p90_ms']:.2f} | {r['naive_ms']:.2f} | {r['sort_ms']:.2f} |"
            f" {r['naive_over_pass']:.1f}x | {r['pass_over_sort']:.1f}x | {r['starts']} | {r['with_store_ms']:.1f} |"
            f" {r['first_with_store_ms']:.1f} | {'met' if met else 'MISSED'} (both <= 10 ms at 10,000) |"
        )
    lines += [
        "",
        "The daemon's pass reads the queue from the store's in-memory view (`Store.queue`: read from SQLite once, then",
        "kept in step with the store's own writes; a commit by another connection makes it read again), so a pass that",
        "follows a submission reads one row, not 10,000; the scheduler's view of the queue, in order, is kept between",
        "passes too (`WaitingCache`: the changed job is taken out and put back by bisection, nothing sorted again).",
        "Its first pass reads the whole queue, sorts it and writes every reason.",
    ]
    replace_subsection(SECTION, SUB, "\n".join(lines) + "\n", intro=INTRO)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=30)
    parser.add_argument("--no-docs", action="store_true")
    args = parser.parse_args()
    topo = machine("dgx1-v100")

    def place_fn(free: Sequence[int], k: int, policy: str) -> Placement | Unplaceable:
        return place(topo, free, k, policy=policy)

    rows = []
    for n in (1_000, 10_000):
        waiting, running = workload(n)
        plan = schedule(waiting, running, 8, place_fn, NOW)
        check(plan, waiting, running)
        passes = timed(lambda w=waiting, r=running: schedule(w, r, 8, place_fn, NOW), args.repeat)
        naives = timed(lambda w=waiting, r=running: naive(w, r, 8, place_fn), max(5, args.repeat // 5))
        sorts = timed(lambda w=waiting: sorted(w, key=lambda j: (-j.priority, j.id)), args.repeat)
        med = statistics.median(passes)
        store_ms, first_ms = daemon_pass(waiting, running, place_fn, max(5, args.repeat // 3))
        rows.append({
            "queued": n, "pass_ms": med, "pass_p90_ms": sorted(passes)[int(0.9 * len(passes))],
            "naive_ms": statistics.median(naives), "sort_ms": statistics.median(sorts),
            "naive_over_pass": statistics.median(naives) / med, "pass_over_sort": med / statistics.median(sorts),
            "starts": len(plan.starts), "preempt": len(plan.preempt), "met": n != 10_000 or med <= 10.0,
            "with_store_ms": store_ms, "first_with_store_ms": first_ms,
            "met_with_store": n != 10_000 or store_ms <= 10.0,
        })  # fmt: skip
    print(f"{'queued':>7} {'pass ms':>8} {'p90 ms':>7} {'naive ms':>9} {'sort ms':>8} {'naive/pass':>10} {'starts':>6}")
    for r in rows:
        print(f"{r['queued']:>7} {r['pass_ms']:>8.2f} {r['pass_p90_ms']:>7.2f} {r['naive_ms']:>9.2f} {r['sort_ms']:>8.2f}"
              f" {r['naive_over_pass']:>9.1f}x {r['starts']:>6}")  # fmt: skip
    print(json.dumps({"benchmark": "scheduler", "rows": rows}))
    if not args.no_docs:
        write_docs(rows, ".venv/bin/python benchmarks/bench_scheduler.py")
    return 0 if all(r["met"] and r["met_with_store"] for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
