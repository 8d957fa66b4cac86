"""Dynamic batching: requests queue per model and merge into batches of up to ``max_batch_size`` rows.

Two parts. `BatchQueue` decides *which* requests form the next batch and *when*; it is pure — the time comes
in as an argument — so the delay bound is tested with an injected clock. `Batcher` drives it on the event
loop: one worker per model instance takes a batch whenever it is idle, runs it on that instance's own thread,
and hands every request exactly its own rows back. If a batch fails — the runtime raises, or returns a
different number of rows than went in — every request in it gets the error. Never a silent empty answer.

When does a batch go? As soon as an instance is idle and either the queue holds a full batch, the next request
cannot join the batch (a different shape), or the oldest request has waited ``max_queue_delay``. Under load
the queue fills while the instances compute, so batches form without any waiting.

Preferred batch sizes (Triton's ``preferred_batch_size``) follow Triton's dynamic batcher
(``DynamicBatchScheduler::GetDynamicBatch`` in triton-inference-server/core): requests are taken in order;
when they add up to a preferred size, the largest such batch goes at once instead of waiting out the delay,
and so does a batch that the next request would carry past the largest preferred size. Once the delay has
run out, everything that fits in ``max_batch_size`` goes. Without preferred sizes Triton uses
``max_batch_size`` as the one preferred size, which is the behaviour above. ``merge=False`` (Triton without
``dynamic_batching``) runs every request alone, with its own rows.

A lone request on a model with one instance runs on the event loop itself, not on the instance's thread, when
the model's last lone request took less than `INLINE_MAX_S` to execute (merge, run and split, wherever it ran)
and this one is no larger. Handing a request to a thread and its answer back — two wake-ups across threads —
cost 50–110 µs per request at 1 client here (`benchmarks/serve_ab.py`), as much as a small model's whole
execution (the MLP of the serving benchmarks runs in 60–130 µs). The loop then stalls for no longer than such
a run; a model that gets slower, or a larger request, goes back to the thread, and so does every batch of
several requests: while a batch computes on its thread, the loop goes on reading the next requests. What is
timed is the execution, not the round trip through the thread: on a busy box the hand-off alone can take
longer than `INLINE_MAX_S`, and a round trip's time would then keep a fast model's requests on the thread
for good.
"""

from __future__ import annotations

import asyncio
import contextlib
import queue
import threading
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from deskpod.errors import RunError
from deskpod.serve.metrics import ModelStats
from deskpod.serve.runtimes import Runtime

INLINE_MAX_S = 250e-6
"""A lone request runs on the loop when the model's last one took less than this (see the module docstring)."""
DRAIN_TIMEOUT_S = 30.0
"""How long a reload or unload lets the old copy answer its queued requests before failing the rest."""


class Overloaded(RunError):
    """The model's queue is full: answered at once with HTTP 503 instead of growing memory."""


class RequestTimeout(RunError):
    """The request's deadline passed before its answer was ready (HTTP 504)."""


class ModelUnavailable(RunError):
    """The model was unloaded while the request waited (HTTP 503)."""


class BatchFailed(RunError):
    """The batch holding the request failed; every request in it gets this (HTTP 500)."""


@dataclass(slots=True, eq=False)
class Pending:
    """One queued request: its inputs (with a leading batch dimension of ``rows``) and its answer."""

    inputs: dict[str, np.ndarray]
    rows: int
    signature: tuple[tuple[int, ...], ...]  # non-batch shape of each input: only equal ones merge
    arrived: float
    future: asyncio.Future[dict[str, np.ndarray]]
    timer: asyncio.TimerHandle | None = field(default=None, repr=False)


class BatchQueue:
    """A bounded FIFO that releases batches; pure — ``now`` is passed in."""

    def __init__(
        self,
        max_batch_size: int,
        max_delay_s: float,
        max_size: int,
        preferred: Sequence[int] = (),
        merge: bool = True,
    ) -> None:
        self.max_batch_size = max_batch_size  # 0: no batching, one request per execution
        self.max_delay_s = max_delay_s
        self.max_size = max_size
        self.preferred = frozenset(preferred)
        self.largest_preferred = max(self.preferred, default=0)
        self.merge = merge  # False: one request per execution, even when the model takes batches
        self.items: deque[Pending] = deque()

    def put(self, p: Pending) -> None:
        if len(self.items) >= self.max_size:
            raise Overloaded(f"queue full ({self.max_size} requests waiting); retry later")
        self.items.append(p)

    def ready_at(self) -> float | None:
        """When the oldest live request's delay runs out (None when nothing waits)."""
        while self.items and self.items[0].future.done():
            self.items.popleft()
        return self.items[0].arrived + self.max_delay_s if self.items else None

    def take(self, now: float) -> list[Pending] | None:
        """The next batch if one should go now, else None. Requests already answered (timed out) are dropped."""
        if self.ready_at() is None:
            return None
        if self.max_batch_size == 0 or not self.merge:
            return [self.items.popleft()]
        batch: list[Pending] = []
        head, rows, used, full = self.items[0], 0, 0, False
        cap = self.largest_preferred or self.max_batch_size
        mark = (0, 0)  # (requests, queue entries used) of the batch that may go before the delay runs out
        for i, p in enumerate(self.items):
            if not p.future.done():
                if p.signature != head.signature or rows + p.rows > self.max_batch_size:
                    full = True
                    break
                if batch and rows + p.rows > cap and not mark[0]:
                    mark = (len(batch), used)  # past every preferred size: the batch so far will not grow into one
                batch.append(p)
                rows += p.rows
            used = i + 1
            if rows in self.preferred:
                mark = (len(batch), used)
        delay_over = now >= head.arrived + self.max_delay_s
        if mark[0] and not delay_over:
            batch, used = batch[: mark[0]], mark[1]
        elif not (full or rows >= cap or delay_over):
            return None
        for _ in range(used):
            self.items.popleft()
        return batch


def run_batch(
    runtime: Runtime, batch: Sequence[Pending], batched: bool, stats: ModelStats
) -> tuple[list[dict[str, np.ndarray]], float]:
    """Merge, execute and split one batch (on the instance's thread, or the loop: `Batcher._inline`): each
    request's output rows, and the seconds that took. Raises if the runtime misbehaves."""
    t0 = time.perf_counter_ns()
    if len(batch) == 1:
        inputs = batch[0].inputs
    else:
        inputs = {n: np.concatenate([p.inputs[n] for p in batch]) for n in batch[0].inputs}
    t1 = time.perf_counter_ns()
    outputs = runtime.run(inputs)
    t2 = time.perf_counter_ns()
    if not batched:
        results = [outputs]
    else:
        total = sum(p.rows for p in batch)
        for name, out in outputs.items():
            if out.ndim == 0 or out.shape[0] != total:
                raise BatchFailed(
                    f"output {name!r} has {out.shape[0] if out.ndim else 0} rows for a batch of {total} rows "
                    f"({len(batch)} requests)"
                )
        results, start = [], 0
        for p in batch:
            results.append({n: o[start : start + p.rows] for n, o in outputs.items()})
            start += p.rows
    t3 = time.perf_counter_ns()
    stats.record_execution(sum(p.rows for p in batch), t1 - t0, t2 - t1, t3 - t2)
    return results, (t3 - t0) / 1e9


class InstanceThread:
    """A model instance's own thread: runs one call at a time and resolves its asyncio future on the loop."""

    def __init__(self, name: str) -> None:
        self._jobs: queue.SimpleQueue[Any] = queue.SimpleQueue()
        self._thread = threading.Thread(target=self._main, name=name, daemon=True)
        self._thread.start()

    def run(self, fn: Callable[..., Any], *args: Any) -> asyncio.Future[Any]:
        loop = asyncio.get_running_loop()
        fut: asyncio.Future[Any] = loop.create_future()
        self._jobs.put((loop, fut, fn, args))
        return fut

    def _main(self) -> None:
        while (job := self._jobs.get()) is not None:
            loop, fut, fn, args = job
            try:
                result, exc = fn(*args), None
            except BaseException as e:  # handed to the awaiting coroutine, as run_in_executor does
                result, exc = None, e
            with contextlib.suppress(RuntimeError):  # the loop is closed: nobody waits any more
                loop.call_soon_threadsafe(_resolve, fut, result, exc)

    def shutdown(self) -> None:
        self._jobs.put(None)


def _resolve(fut: asyncio.Future[Any], result: Any, exc: BaseException | None) -> None:
    if not fut.done():
        if exc is None:
            fut.set_result(result)
        else:
            fut.set_exception(exc)


def _nbytes(p: Pending) -> int:
    return sum(a.nbytes for a in p.inputs.values())


def _wake(w: asyncio.Future[None]) -> None:
    if not w.done():
        w.set_result(None)


class Batcher:
    """The dynamic batcher of one model version: a `BatchQueue` and one worker per instance."""

    def __init__(
        self,
        instances: Sequence[Runtime],
        *,
        max_batch_size: int,
        max_queue_delay_s: float,
        max_queue_size: int,
        stats: ModelStats,
        preferred_batch_sizes: Sequence[int] = (),
        merge: bool = True,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.queue = BatchQueue(max_batch_size, max_queue_delay_s, max_queue_size, preferred_batch_sizes, merge)
        self.instances = list(instances)
        self.stats = stats
        self.clock = clock
        self._threads = [InstanceThread(f"deskpod-instance_{i}") for i in range(len(self.instances))]
        self._waiters: deque[asyncio.Future[None]] = deque()
        self._workers: list[asyncio.Task[None]] = []
        self._closed = False
        self._draining = False
        self._emptied = asyncio.Event()
        self._lone: tuple[int, float] | None = None
        """(input bytes, seconds of execution) of the last lone request: may the next run on the loop?"""

    def _inline(self, batch: list[Pending]) -> bool:
        """Run this batch on the loop (see the module docstring)?"""
        if len(batch) != 1 or len(self.instances) != 1 or self._lone is None:
            return False
        size, seconds = self._lone
        return seconds < INLINE_MAX_S and _nbytes(batch[0]) <= size

    def start(self) -> None:
        self._workers = [asyncio.ensure_future(self._work(i)) for i in range(len(self.instances))]

    def submit(self, inputs: dict[str, np.ndarray], timeout_s: float | None) -> asyncio.Future[dict[str, np.ndarray]]:
        """Queue one request; its future resolves to exactly its own output rows. Raises `Overloaded`."""
        if self._closed or self._draining:
            raise ModelUnavailable("model is being unloaded")
        loop = asyncio.get_running_loop()
        batched = self.queue.max_batch_size > 0
        first = next(iter(inputs.values()))
        p = Pending(
            inputs=inputs,
            rows=first.shape[0] if batched else 1,
            signature=tuple(a.shape[1:] for a in inputs.values()) if batched else (),
            arrived=self.clock(),
            future=loop.create_future(),
        )
        self.queue.put(p)
        if timeout_s is not None:
            p.timer = loop.call_later(timeout_s, self._expire, p, timeout_s)
        while self._waiters:
            w = self._waiters.popleft()
            if not w.done():
                w.set_result(None)
                break
        return p.future

    def full(self) -> bool:
        return len(self.queue.items) >= self.queue.max_size

    def _expire(self, p: Pending, timeout_s: float) -> None:
        if not p.future.done():
            self.stats.timeouts += 1
            p.future.set_exception(RequestTimeout(f"request timed out after {timeout_s * 1000:.0f} ms"))

    async def _wait(self, timeout: float | None) -> None:
        loop = asyncio.get_running_loop()
        w: asyncio.Future[None] = loop.create_future()
        self._waiters.append(w)
        timer = None if timeout is None else loop.call_later(timeout, _wake, w)
        try:
            await w
        finally:
            if timer is not None:
                timer.cancel()

    async def _work(self, index: int) -> None:
        runtime, thread = self.instances[index], self._threads[index]
        batched = self.queue.max_batch_size > 0
        while not self._closed:
            batch = self.queue.take(self.clock())
            if self._draining and self.queue.ready_at() is None:
                self._emptied.set()
            if not batch:
                at = self.queue.ready_at()
                await self._wait(None if at is None else max(0.0, at - self.clock()))
                continue
            now = self.clock()
            for p in batch:
                self.stats.record_queue(now - p.arrived)
            try:
                if self._inline(batch):
                    results, seconds = run_batch(runtime, batch, batched, self.stats)
                else:
                    results, seconds = await thread.run(run_batch, runtime, batch, batched, self.stats)
                if len(batch) == 1:
                    self._lone = (_nbytes(batch[0]), seconds)
            except Exception as e:
                err = e if isinstance(e, BatchFailed) else BatchFailed(f"batch of {len(batch)} requests failed: {e}")
                for p in batch:
                    if not p.future.done():
                        p.future.set_exception(err)
                continue
            for p, r in zip(batch, results, strict=True):
                if p.timer is not None:
                    p.timer.cancel()
                if not p.future.done():
                    p.future.set_result(r)

    async def drain(self, timeout_s: float = DRAIN_TIMEOUT_S) -> None:
        """Refuse new requests, answer every queued one (at once: no more batching delay), then `stop`.

        For a reload or an unload: requests that reached this copy before it was swapped out finish
        here instead of failing. Whatever is still queued after ``timeout_s`` fails as in `stop`.
        """
        self._draining = True
        self.queue.max_delay_s = 0.0
        for w in self._waiters:
            _wake(w)
        if self._workers and self.queue.ready_at() is not None:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._emptied.wait(), timeout_s)
        await self.stop()

    async def stop(self) -> None:
        """Refuse new requests, fail the queued ones, let running batches finish, free the instances."""
        self._closed = True
        for p in self.queue.items:
            if not p.future.done():
                p.future.set_exception(ModelUnavailable("model was unloaded before the request ran"))
        self.queue.items.clear()
        for w in self._waiters:
            _wake(w)
        if self._workers:
            await asyncio.gather(*self._workers, return_exceptions=True)
        for thread in self._threads:
            thread.shutdown()
        for rt in self.instances:
            rt.close()
