"""The queue forecast: positions in the scheduler's order, and starts from the declared run times."""

from __future__ import annotations

import math

from deskpod.jobs.forecast import forecast, queue_order
from deskpod.jobs.scheduler import Running, Waiting

NOW = 1000.0


def test_positions_follow_priority_then_age() -> None:
    waiting = [Waiting(1, 0, 1), Waiting(2, 5, 1), Waiting(3, 0, 1), Waiting(4, 5, 1)]
    assert [w.id for w in queue_order(waiting)] == [2, 4, 1, 3]
    fc = forecast(waiting, [], 4, NOW)
    assert fc.position == {2: 1, 4: 2, 1: 3, 3: 4}


def test_starts_when_the_devices_its_needs_are_promised_free() -> None:
    # 4 devices: a job on 2 ends at 1100, one on 2 ends at 1300.
    running = [Running(10, 0, (0, 1), 900.0, 200.0), Running(11, 0, (2, 3), 1000.0, 300.0)]
    waiting = [Waiting(1, 0, 2, max_runtime=50.0), Waiting(2, 0, 4, max_runtime=10.0), Waiting(3, 0, 2)]
    fc = forecast(waiting, running, 4, NOW)
    assert fc.start[1] == 1100.0  # the first pair frees at 1100
    assert fc.start[2] == 1300.0  # all four are free once job 11 ends
    assert fc.start[3] == 1310.0  # after job 2, and it has no end of its own: it holds its pair forever


def test_a_short_job_fills_a_gap_before_a_big_one() -> None:
    running = [Running(10, 0, (0,), 900.0, 200.0)]  # device 0 frees at 1100; 1, 2, 3 are free now
    waiting = [
        Waiting(1, 0, 4, max_runtime=100.0),
        Waiting(2, 0, 3, max_runtime=50.0),
        Waiting(3, 0, 3, max_runtime=500.0),
    ]
    fc = forecast(waiting, running, 4, NOW)
    assert fc.start[1] == 1100.0
    assert fc.start[2] == NOW  # fits in [1000, 1050), before job 1 needs the devices
    assert fc.start[3] == 1200.0  # 500 s does not fit before 1100: after job 1


def test_unknown_when_the_devices_are_held_without_an_end() -> None:
    running = [Running(10, 0, (0, 1), 900.0, None)]  # no max_runtime: no promise
    waiting = [Waiting(1, 0, 1), Waiting(2, 0, 2, max_runtime=5.0), Waiting(3, 0, 1, max_runtime=5.0)]
    fc = forecast(waiting, running, 3, NOW)
    assert fc.start[1] == NOW  # device 2 is free
    assert fc.start[2] is None  # needs two; one is held forever by job 10 and one by job 1
    assert fc.start[3] is None


def test_a_stopping_job_frees_at_its_deadline_and_the_horizon_limits_the_work() -> None:
    running = [Running(10, 0, (0,), 900.0, None, stop_deadline=1005.0)]
    waiting = [Waiting(i, 0, 1, max_runtime=10.0) for i in range(1, 401)]
    fc = forecast(waiting, running, 1, NOW, horizon=300)
    assert fc.start[1] == 1005.0 and fc.start[2] == 1015.0
    assert fc.start[300] == 1005.0 + 299 * 10.0
    assert 301 not in fc.start and fc.position[400] == 400
    assert all(math.isfinite(t) for t in fc.start.values() if t is not None)
