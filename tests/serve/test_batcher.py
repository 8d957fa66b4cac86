"""Batcher semantics: exact rows per request, the delay bound (injected clock), failed batches fail everyone."""

from __future__ import annotations

import asyncio
from typing import Any

import numpy as np
import pytest

from deskpod.serve.batcher import Batcher, BatchFailed, BatchQueue, Overloaded, Pending
from deskpod.serve.metrics import ModelStats


def pending(loop: asyncio.AbstractEventLoop, rows: int, arrived: float, width: int = 2) -> Pending:
    x = np.full((rows, width), arrived, np.float32)
    return Pending({"x": x}, rows, ((width,),), arrived, loop.create_future())


@pytest.fixture
def loop() -> asyncio.AbstractEventLoop:
    loop = asyncio.new_event_loop()
    yield loop
    loop.close()


def test_delay_bound_with_injected_clock(loop: asyncio.AbstractEventLoop) -> None:
    q = BatchQueue(max_batch_size=8, max_delay_s=0.010, max_size=100)
    q.put(pending(loop, 1, arrived=100.000))
    q.put(pending(loop, 2, arrived=100.004))
    assert q.take(now=100.005) is None  # oldest waited 5 ms of 10: hold for more
    assert q.ready_at() == pytest.approx(100.010)
    batch = q.take(now=100.010)  # the delay is up: everything waiting goes
    assert batch is not None and [p.rows for p in batch] == [1, 2]
    assert q.take(now=200.0) is None


def test_full_batch_goes_at_once_and_never_exceeds_max(loop: asyncio.AbstractEventLoop) -> None:
    q = BatchQueue(max_batch_size=4, max_delay_s=10.0, max_size=100)
    for rows in (2, 1, 2, 1):
        q.put(pending(loop, rows, arrived=0.0))
    first = q.take(now=0.0)
    assert first is not None and sum(p.rows for p in first) == 3  # 2+1; the next 2 would overflow 4
    assert q.take(now=0.0) is None  # 2+1 left: not full, so it waits for the delay
    rest = q.take(now=10.0)
    assert rest is not None and [p.rows for p in rest] == [2, 1] and not q.items


def test_different_shapes_do_not_merge(loop: asyncio.AbstractEventLoop) -> None:
    q = BatchQueue(max_batch_size=8, max_delay_s=1.0, max_size=100)
    q.put(pending(loop, 1, 0.0, width=2))
    q.put(pending(loop, 1, 0.0, width=3))
    batch = q.take(now=0.0)  # the head cannot grow: go now
    assert batch is not None and len(batch) == 1


def test_bounded_queue_refuses(loop: asyncio.AbstractEventLoop) -> None:
    q = BatchQueue(max_batch_size=8, max_delay_s=1.0, max_size=2)
    q.put(pending(loop, 1, 0.0))
    q.put(pending(loop, 1, 0.0))
    with pytest.raises(Overloaded):
        q.put(pending(loop, 1, 0.0))


def test_answered_requests_are_dropped(loop: asyncio.AbstractEventLoop) -> None:
    q = BatchQueue(max_batch_size=8, max_delay_s=0.0, max_size=10)
    a, b = pending(loop, 1, 0.0), pending(loop, 1, 0.0)
    q.put(a)
    q.put(b)
    a.future.set_exception(TimeoutError())
    a.future.exception()
    assert q.take(now=0.0) == [b]


class Doubler:
    def __init__(self) -> None:
        self.batches: list[int] = []

    def run(self, inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        self.batches.append(inputs["x"].shape[0])
        return {"y": inputs["x"] * 2}

    def close(self) -> None:
        pass


class Broken(Doubler):
    def __init__(self, mode: str) -> None:
        super().__init__()
        self.mode = mode

    def run(self, inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        if self.mode == "raise":
            raise ValueError("kernel exploded")
        return {"y": inputs["x"][:-1]}  # one row short


async def _burst(batcher: Batcher, sizes: list[int]) -> list[object]:
    futs = [batcher.submit({"x": np.full((n, 2), i, np.float32)}, None) for i, n in enumerate(sizes)]
    return await asyncio.gather(*futs, return_exceptions=True)


def test_each_request_gets_exactly_its_rows() -> None:
    async def main() -> None:
        rt = Doubler()
        b = Batcher([rt], max_batch_size=16, max_queue_delay_s=0.05, max_queue_size=64, stats=ModelStats("m", "1"))
        b.start()
        sizes = [1, 3, 2, 5, 1]
        results = await _burst(b, sizes)
        await b.stop()
        assert rt.batches == [sum(sizes)]  # merged into one batch
        for i, (n, r) in enumerate(zip(sizes, results, strict=True)):
            assert isinstance(r, dict)
            np.testing.assert_array_equal(r["y"], np.full((n, 2), 2 * i, np.float32))

    asyncio.run(main())


@pytest.mark.parametrize(("mode", "message"), [("raise", "kernel exploded"), ("short", "has 3 rows for a batch of 4")])
def test_a_failed_batch_fails_every_request(mode: str, message: str) -> None:
    async def main() -> None:
        b = Batcher(
            [Broken(mode)], max_batch_size=8, max_queue_delay_s=0.05, max_queue_size=8, stats=ModelStats("m", "1")
        )
        b.start()
        results = await _burst(b, [1, 1, 2])
        await b.stop()
        for r in results:
            assert isinstance(r, BatchFailed) and message in str(r)

    asyncio.run(main())


def test_unload_fails_queued_requests() -> None:
    async def main() -> None:
        b = Batcher([Doubler()], max_batch_size=8, max_queue_delay_s=10.0, max_queue_size=8, stats=ModelStats("m", "1"))
        b.start()
        fut = b.submit({"x": np.zeros((1, 2), np.float32)}, None)
        await asyncio.sleep(0.01)
        await b.stop()
        with pytest.raises(Exception, match="unloaded"):
            await fut

    asyncio.run(main())


def test_drain_answers_queued_requests_then_refuses() -> None:
    async def main() -> None:
        rt = Doubler()
        b = Batcher([rt], max_batch_size=8, max_queue_delay_s=10.0, max_queue_size=8, stats=ModelStats("m", "1"))
        b.start()
        futs = [b.submit({"x": np.full((1, 2), i, np.float32)}, None) for i in range(3)]
        await asyncio.sleep(0.01)
        assert not any(f.done() for f in futs)  # held for the 10 s batching delay
        await asyncio.wait_for(b.drain(), 5.0)  # a reload or unload: no waiting out the delay, nothing failed
        for i, f in enumerate(futs):
            np.testing.assert_array_equal(f.result()["y"], np.full((1, 2), 2 * i, np.float32))
        assert rt.batches == [3]
        with pytest.raises(Exception, match="being unloaded"):
            b.submit({"x": np.zeros((1, 2), np.float32)}, None)

    asyncio.run(main())


def test_drain_gives_up_after_its_timeout() -> None:
    import threading

    release = threading.Event()

    class Stuck(Doubler):
        def run(self, inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
            release.wait(10)
            return super().run(inputs)

    async def main() -> None:
        b = Batcher([Stuck()], max_batch_size=1, max_queue_delay_s=0.0, max_queue_size=8, stats=ModelStats("m", "1"))
        b.start()
        running = b.submit({"x": np.zeros((1, 2), np.float32)}, None)
        await asyncio.sleep(0.05)  # the first request is on the (stuck) instance, the second waits behind it
        queued = b.submit({"x": np.ones((1, 2), np.float32)}, None)
        drain = asyncio.ensure_future(b.drain(timeout_s=0.1))
        await asyncio.sleep(0.3)
        with pytest.raises(Exception, match="unloaded before the request ran"):
            await queued  # still queued after the timeout: failed, as on stop
        release.set()
        await asyncio.wait_for(drain, 5.0)
        assert running.result()["y"].shape == (1, 2)  # the running batch finishes

    asyncio.run(main())


def test_instances_run_batches_concurrently() -> None:
    """Two instances: two batches in flight at once (each waits for the other at a barrier, or times out)."""
    import threading

    barrier = threading.Barrier(2, timeout=10)

    class Meeting(Doubler):
        def run(self, inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
            barrier.wait()
            return super().run(inputs)

    async def main() -> None:
        b = Batcher(
            [Meeting(), Meeting()],
            max_batch_size=1,
            max_queue_delay_s=0.0,
            max_queue_size=8,
            stats=ModelStats("m", "1"),
        )
        b.start()
        results = await _burst(b, [1, 1])
        await b.stop()
        assert all(isinstance(r, dict) for r in results)

    asyncio.run(main())


def test_an_instance_thread_runs_calls_in_order_and_hands_back_their_errors() -> None:
    """One thread per instance: calls run one at a time, in order, off the loop; an error reaches the awaiter."""
    import threading

    from deskpod.serve.batcher import InstanceThread

    seen: list[tuple[int, str]] = []

    def call(i: int) -> int:
        seen.append((i, threading.current_thread().name))
        if i == 2:
            raise KeyError("row 2")
        return i * 10

    async def main() -> None:
        t = InstanceThread("deskpod-instance-test")
        futs = [t.run(call, i) for i in range(4)]
        results = await asyncio.gather(*futs, return_exceptions=True)
        t.shutdown()
        assert results[:2] == [0, 10] and results[3] == 30
        assert isinstance(results[2], KeyError) and "row 2" in str(results[2])
        assert seen == [(i, "deskpod-instance-test") for i in range(4)]

    asyncio.run(main())


class Where(Doubler):
    """Records the thread each execution ran on; sleeps ``delay_s`` per execution."""

    def __init__(self) -> None:
        super().__init__()
        self.threads: list[str] = []
        self.delay_s = 0.0

    def run(self, inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        import threading
        import time

        self.threads.append(threading.current_thread().name)
        time.sleep(self.delay_s)
        return super().run(inputs)


def test_a_fast_lone_request_runs_on_the_loop_and_a_slow_or_larger_one_on_the_instance_thread(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import threading

    monkeypatch.setattr("deskpod.serve.batcher.INLINE_MAX_S", 0.05)  # a hand-off on a loaded CI box stays far below
    rt = Where()

    async def one(rows: int = 1) -> None:
        out = await b.submit({"x": np.ones((rows, 2), np.float32)}, None)
        np.testing.assert_array_equal(out["y"], np.full((rows, 2), 2, np.float32))

    async def main() -> None:
        for _ in range(3):
            await one()  # the first has no timing yet: the thread; the next two on the loop
        rt.delay_s = 0.1
        await one()  # on the loop, slower than INLINE_MAX_S ...
        rt.delay_s = 0.0
        await one()  # ... so the next goes back to the thread, where it is timed fast again ...
        await one()  # ... and the one after that runs on the loop once more
        await one(rows=2)  # larger than the last lone request: the thread
        await asyncio.gather(one(), one(), one())  # queued together: one batch of 3, on the thread
        await b.stop()

    b = Batcher([rt], max_batch_size=8, max_queue_delay_s=0.01, max_queue_size=8, stats=ModelStats("m", "1"))
    loop = asyncio.new_event_loop()
    try:
        loop.run_until_complete(_started(b))
        loop.run_until_complete(main())
    finally:
        loop.close()
    me, inst = threading.current_thread().name, "deskpod-instance_0"
    assert rt.threads == [inst, me, me, me, inst, me, inst, inst]
    assert rt.batches[-1] == 3


def test_a_slow_hand_off_does_not_keep_a_fast_model_on_its_thread(monkeypatch: pytest.MonkeyPatch) -> None:
    """What decides is the execution's own time: a hand-off back to the loop slower than INLINE_MAX_S (a busy
    box) must not count against the model, or its lone requests would never leave the thread."""
    import threading
    import time

    from deskpod.serve import batcher

    monkeypatch.setattr(batcher, "INLINE_MAX_S", 0.05)
    resolve = batcher._resolve

    def slow_resolve(fut: asyncio.Future[Any], result: Any, exc: BaseException | None) -> None:
        time.sleep(0.1)  # the answer reaches the loop 0.1 s after the execution ended
        resolve(fut, result, exc)

    monkeypatch.setattr(batcher, "_resolve", slow_resolve)
    rt = Where()

    async def main() -> None:
        b = Batcher([rt], max_batch_size=8, max_queue_delay_s=0.0, max_queue_size=8, stats=ModelStats("m", "1"))
        b.start()
        for _ in range(3):
            out = await b.submit({"x": np.ones((1, 2), np.float32)}, None)
            np.testing.assert_array_equal(out["y"], np.full((1, 2), 2, np.float32))
        await b.stop()

    asyncio.run(main())
    me = threading.current_thread().name
    assert rt.threads == ["deskpod-instance_0", me, me]


def test_a_model_with_several_instances_never_runs_on_the_loop(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("deskpod.serve.batcher.INLINE_MAX_S", 10.0)
    rts = [Where(), Where()]

    async def main() -> None:
        b = Batcher(rts, max_batch_size=8, max_queue_delay_s=0.0, max_queue_size=8, stats=ModelStats("m", "1"))
        b.start()
        for _ in range(4):
            await b.submit({"x": np.ones((1, 2), np.float32)}, None)
        await b.stop()

    asyncio.run(main())
    ran = rts[0].threads + rts[1].threads
    assert len(ran) == 4 and all(t.startswith("deskpod-instance_") for t in ran)


async def _started(b: Batcher) -> None:
    b.start()
