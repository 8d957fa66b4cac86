"""The scheduling policy, pure: order, backfill, reservations, preemption and wait reasons."""

from __future__ import annotations

from collections.abc import Sequence

import pytest

from deskpod.hardware.placement import Placement, Unplaceable
from deskpod.jobs.scheduler import Running, Waiting, schedule

NOW = 1000.0


def lowest(free: Sequence[int], k: int, policy: str) -> Placement | Unplaceable:
    """A placement that takes the lowest free devices (topology-blind), counting its calls."""
    lowest.calls += 1  # type: ignore[attr-defined]
    if len(free) < k:
        return Unplaceable(f"needs {k} devices; only {len(free)} free", ever=True)
    return Placement(tuple(sorted(free)[:k]), 1.0, f"lowest {k}")


lowest.calls = 0  # type: ignore[attr-defined]


def test_priority_then_submission_order() -> None:
    waiting = [Waiting(1, 0, 1), Waiting(2, 5, 1), Waiting(3, 5, 1), Waiting(4, 0, 1)]
    plan = schedule(waiting, [], 2, lowest, NOW)
    assert [s.job for s in plan.starts] == [2, 3]
    assert [s.devices for s in plan.starts] == [(0,), (1,)]
    assert set(plan.waits) == {1, 4}


def test_blocked_head_gets_a_reason_and_a_reservation() -> None:
    running = [Running(9, 0, (0, 1), NOW - 10, max_runtime=100)]
    plan = schedule([Waiting(1, 0, 4)], running, 4, lowest, NOW, preemption=False)
    assert plan.starts == []
    assert plan.reserved == 1
    assert plan.waits[1] == "needs 4 devices; only 2 free"


def test_backfill_short_job_that_ends_before_the_reservation() -> None:
    # Job 9 holds 2 of 4 devices until NOW+90; job 1 needs 4 and waits for it.
    running = [Running(9, 0, (0, 1), NOW - 10, max_runtime=100)]
    waiting = [Waiting(1, 0, 4), Waiting(2, 0, 1, max_runtime=50), Waiting(3, 0, 1, max_runtime=500), Waiting(4, 0, 1)]
    plan = schedule(waiting, running, 4, lowest, NOW, preemption=False)
    # 2 ends before the reservation; 3 and 4 would run past it and there are no extra devices.
    assert [s.job for s in plan.starts] == [2]
    assert "job 1" in plan.waits[3] and "job 1" in plan.waits[4]


def test_backfill_into_extra_devices_never_delays_the_head() -> None:
    # 8 devices; 6 busy until NOW+90; head needs 4 -> at the shadow time 8 free, 4 extra, 2 free now.
    running = [Running(9, 0, (0, 1, 2, 3, 4, 5), NOW - 10, max_runtime=100)]
    waiting = [Waiting(1, 0, 4), Waiting(2, 0, 1), Waiting(3, 0, 1), Waiting(4, 0, 1)]
    plan = schedule(waiting, running, 8, lowest, NOW, preemption=False)
    assert [s.job for s in plan.starts] == [2, 3]
    assert 4 in plan.waits


def test_no_backfill_past_a_reservation_without_runtimes() -> None:
    running = [Running(9, 0, (0,), NOW - 10)]  # no max_runtime: ends "never"
    plan = schedule([Waiting(1, 0, 2), Waiting(2, 0, 1)], running, 2, lowest, NOW, preemption=False)
    assert plan.starts == []
    assert plan.waits[2].startswith("waiting behind job 1")


def test_a_job_holding_no_devices_starts_on_a_full_box_behind_a_blocked_head() -> None:
    """TensorBoard (0 devices) takes nothing from the head's reservation: it starts, the head still waits."""
    running = [Running(9, 0, (0, 1), NOW - 10)]
    plan = schedule([Waiting(1, 5, 2), Waiting(2, 0, 0), Waiting(3, 0, 1)], running, 2, lowest, NOW, preemption=False)
    assert [(s.job, s.devices) for s in plan.starts] == [(2, ())]
    assert plan.reserved == 1 and 3 in plan.waits


def test_preemption_stops_the_lowest_priority_newest_job_first() -> None:
    running = [
        Running(7, 1, (0,), NOW - 50),
        Running(8, 0, (1,), NOW - 40),
        Running(9, 0, (2,), NOW - 5),
        Running(10, 5, (3,), NOW - 5),
    ]
    plan = schedule([Waiting(1, 3, 1)], running, 4, lowest, NOW)
    assert plan.preempt == [9]
    assert plan.waits[1] == "preempting job 9"
    # two devices: the two priority-0 jobs, never the priority-5 one
    plan = schedule([Waiting(1, 3, 2)], running, 4, lowest, NOW)
    assert sorted(plan.preempt) == [8, 9]


def test_no_preemption_of_equal_priority_or_when_disabled_or_while_victims_stop() -> None:
    running = [Running(8, 3, (0, 1), NOW - 40)]
    assert schedule([Waiting(1, 3, 2)], running, 2, lowest, NOW).preempt == []
    running = [Running(8, 0, (0, 1), NOW - 40)]
    assert schedule([Waiting(1, 3, 2)], running, 2, lowest, NOW, preemption=False).preempt == []
    stopping = [Running(8, 0, (0, 1), NOW - 40, stop_deadline=NOW + 5)]
    plan = schedule([Waiting(1, 3, 2)], stopping, 2, lowest, NOW)
    assert plan.preempt == []
    assert plan.waits[1] == "waiting for preempted jobs to stop"


def test_a_pass_over_many_queued_jobs_asks_placement_rarely() -> None:
    lowest.calls = 0  # type: ignore[attr-defined]
    waiting = [Waiting(i, i % 3, 1 + i % 4) for i in range(1, 5001)]
    running = [Running(99999, 10, (0, 1, 2, 3, 4, 5), NOW)]
    plan = schedule(waiting, running, 8, lowest, NOW)
    assert len(plan.starts) + len(plan.waits) == 5000
    assert lowest.calls < 20  # type: ignore[attr-defined]


def test_real_placement_reason_on_a_dgx1() -> None:
    """With the hardware model's placement on a DGX-1 (V100): the why-not of a topology-bound job."""
    placement = pytest.importorskip("deskpod.hardware.placement")
    machine = getattr(placement, "machine", None)
    if machine is None:
        pytest.skip("the hardware catalog is not there yet")
    topo = machine("dgx1-v100")

    def place(free: Sequence[int], k: int, policy: str) -> Placement | Unplaceable:
        return placement.place(topo, free, k, policy=policy)  # type: ignore[no-any-return]

    plan = schedule([Waiting(1, 0, 4)], [], 8, place, NOW)
    assert len(plan.starts) == 1 and len(plan.starts[0].devices) == 4
    # Holding 0, 2, 5, 7 leaves 1, 3, 4, 6: no NVLink ring through 4 of them, and the reason says so.
    running = [Running(9, 0, (0, 2, 5, 7), NOW)]
    plan = schedule([Waiting(1, 0, 4)], running, 8, place, NOW, preemption=False)
    assert plan.starts == []
    assert "NVLink" in plan.waits[1], plan.waits[1]
    # With pack (links be damned) it starts on the four free GPUs.
    plan = schedule([Waiting(1, 0, 4, policy="pack")], running, 8, place, NOW, preemption=False)
    assert [s.devices for s in plan.starts] == [(1, 3, 4, 6)]


def test_the_waiting_cache_keeps_the_queue_order_through_changes() -> None:
    import random

    from deskpod.jobs.scheduler import WaitingCache, order_key

    rng = random.Random(3)
    rows = {i: (i, rng.randrange(5), rng.choice((1, 2, 4)), "best", None, "") for i in range(1, 2001)}
    cache = WaitingCache()
    order = cache.apply(rows, None)
    next_id = 2001
    for step in range(60):
        changed: set[int] = set()
        for _ in range(rng.randrange(0, 4)):  # submissions
            rows[next_id] = (next_id, rng.randrange(5), 1, "best", None, "")
            changed.add(next_id)
            next_id += 1
        for victim in rng.sample(sorted(rows), rng.randrange(0, 3)):  # starts and cancels
            del rows[victim]
            changed.add(victim)
        other = rng.choice(sorted(rows))  # a field the scheduler reads
        rows[other] = (other, (rows[other][1] + 1) % 5, *rows[other][2:])
        changed.add(other)
        order = cache.apply(rows, changed)
        expect = sorted(((q[1], q[0]) for q in rows.values()), key=lambda t: (-t[0], t[1]))
        assert [(w.priority, w.id) for w in order] == expect, step
        assert order == sorted(order, key=order_key)
    assert [w.id for w in cache.apply(rows, None)] == [w.id for w in order]  # starting again gives the same
