"""Per-model counters and histograms, shown two ways: Triton's ``/stats`` JSON and Prometheus ``/metrics``.

Counters are plain integers updated from the event loop and the instance threads; a lost increment under a
race would only blur a statistic, and CPython's GIL makes ``+=`` on an attribute practically atomic here.
"""

from __future__ import annotations

import bisect
import time
from dataclasses import dataclass, field
from typing import Any

# Latency buckets in seconds (100 µs .. 10 s) and batch-size buckets: the usual Prometheus shapes.
LATENCY_BUCKETS = (
    0.0001,
    0.00025,
    0.0005,
    0.001,
    0.0025,
    0.005,
    0.01,
    0.025,
    0.05,
    0.1,
    0.25,
    0.5,
    1.0,
    2.5,
    5.0,
    10.0,
)
BATCH_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256)


@dataclass(slots=True)
class Histogram:
    buckets: tuple[float, ...]
    counts: list[int] = field(default_factory=list)
    total: float = 0.0
    count: int = 0

    def __post_init__(self) -> None:
        self.counts = [0] * (len(self.buckets) + 1)

    def observe(self, value: float) -> None:
        self.counts[bisect.bisect_left(self.buckets, value)] += 1
        self.total += value
        self.count += 1

    def prometheus(self, name: str, labels: str) -> list[str]:
        lines, running = [], 0
        for bound, n in zip(self.buckets, self.counts, strict=False):
            running += n
            lines.append(f'{name}_bucket{{{labels},le="{bound:g}"}} {running}')
        lines.append(f'{name}_bucket{{{labels},le="+Inf"}} {self.count}')
        lines.append(f"{name}_sum{{{labels}}} {self.total:.9g}")
        lines.append(f"{name}_count{{{labels}}} {self.count}")
        return lines


class ModelStats:
    """Everything counted for one model version."""

    def __init__(self, name: str, version: str) -> None:
        self.name, self.version = name, version
        self.success = [0, 0]  # count, ns (request arrival to answer)
        self.fail = [0, 0]
        self.queue = [0, 0]
        self.compute_input = [0, 0]
        self.compute_infer = [0, 0]
        self.compute_output = [0, 0]
        self.inference_count = 0  # rows
        self.execution_count = 0  # batches
        self.rejected = 0  # refused: queue full
        self.timeouts = 0
        self.last_inference_ms = 0
        self.batch_stats: dict[int, list[int]] = {}  # size -> [count, input ns, infer ns, output ns]
        self.request_latency = Histogram(LATENCY_BUCKETS)
        self.queue_latency = Histogram(LATENCY_BUCKETS)
        self.compute_latency = Histogram(LATENCY_BUCKETS)
        self.batch_size = Histogram(BATCH_BUCKETS)

    def record_queue(self, seconds: float) -> None:
        self.queue[0] += 1
        self.queue[1] += int(seconds * 1e9)
        self.queue_latency.observe(seconds)

    def record_execution(self, rows: int, input_ns: int, infer_ns: int, output_ns: int) -> None:
        self.execution_count += 1
        self.inference_count += rows
        self.last_inference_ms = int(time.time() * 1000)
        for acc, ns in (
            (self.compute_input, input_ns),
            (self.compute_infer, infer_ns),
            (self.compute_output, output_ns),
        ):
            acc[0] += rows
            acc[1] += ns
        b = self.batch_stats.setdefault(rows, [0, 0, 0, 0])
        b[0] += 1
        b[1] += input_ns
        b[2] += infer_ns
        b[3] += output_ns
        self.compute_latency.observe((input_ns + infer_ns + output_ns) / 1e9)
        self.batch_size.observe(rows)

    def record_request(self, seconds: float, ok: bool) -> None:
        acc = self.success if ok else self.fail
        acc[0] += 1
        acc[1] += int(seconds * 1e9)
        if ok:
            self.request_latency.observe(seconds)

    def triton_json(self) -> dict[str, Any]:
        """One entry of Triton's ``model_stats`` list."""

        def d(acc: list[int]) -> dict[str, int]:
            return {"count": acc[0], "ns": acc[1]}

        return {
            "name": self.name,
            "version": self.version,
            "last_inference": self.last_inference_ms,
            "inference_count": self.inference_count,
            "execution_count": self.execution_count,
            "inference_stats": {
                "success": d(self.success),
                "fail": d(self.fail),
                "queue": d(self.queue),
                "compute_input": d(self.compute_input),
                "compute_infer": d(self.compute_infer),
                "compute_output": d(self.compute_output),
                "cache_hit": {"count": 0, "ns": 0},
                "cache_miss": {"count": 0, "ns": 0},
            },
            "batch_stats": [
                {
                    "batch_size": size,
                    "compute_input": {"count": b[0], "ns": b[1]},
                    "compute_infer": {"count": b[0], "ns": b[2]},
                    "compute_output": {"count": b[0], "ns": b[3]},
                }
                for size, b in sorted(self.batch_stats.items())
            ],
        }

    def prometheus(self) -> list[str]:
        labels = f'model="{self.name}",version="{self.version}"'
        return [
            f'deskpod_requests_total{{{labels},outcome="success"}} {self.success[0]}',
            f'deskpod_requests_total{{{labels},outcome="failure"}} {self.fail[0]}',
            f"deskpod_requests_rejected_total{{{labels}}} {self.rejected}",
            f"deskpod_requests_timed_out_total{{{labels}}} {self.timeouts}",
            f"deskpod_inferences_total{{{labels}}} {self.inference_count}",
            f"deskpod_executions_total{{{labels}}} {self.execution_count}",
            *self.request_latency.prometheus("deskpod_request_duration_seconds", labels),
            *self.queue_latency.prometheus("deskpod_queue_duration_seconds", labels),
            *self.compute_latency.prometheus("deskpod_compute_duration_seconds", labels),
            *self.batch_size.prometheus("deskpod_batch_size", labels),
        ]


HELP = """# HELP deskpod_requests_total Infer requests answered, by outcome.
# TYPE deskpod_requests_total counter
# HELP deskpod_requests_rejected_total Infer requests refused at once because the model's queue was full.
# TYPE deskpod_requests_rejected_total counter
# HELP deskpod_requests_timed_out_total Infer requests whose deadline passed.
# TYPE deskpod_requests_timed_out_total counter
# HELP deskpod_inferences_total Rows inferred (a request may carry several); rate() of it is throughput.
# TYPE deskpod_inferences_total counter
# HELP deskpod_executions_total Batches executed; inferences/executions is the mean batch size.
# TYPE deskpod_executions_total counter
# HELP deskpod_request_duration_seconds Time from a request's arrival to its answer, successful requests.
# TYPE deskpod_request_duration_seconds histogram
# HELP deskpod_queue_duration_seconds Time a request waited in the batcher's queue.
# TYPE deskpod_queue_duration_seconds histogram
# HELP deskpod_compute_duration_seconds Time to merge, run and split one batch.
# TYPE deskpod_compute_duration_seconds histogram
# HELP deskpod_batch_size Rows per executed batch.
# TYPE deskpod_batch_size histogram
"""


def prometheus_text(stats: list[ModelStats], open_connections: int) -> str:
    lines = [HELP.rstrip("\n")]
    for s in stats:
        lines.extend(s.prometheus())
    lines.append("# HELP deskpod_open_connections HTTP connections open now.")
    lines.append("# TYPE deskpod_open_connections gauge")
    lines.append(f"deskpod_open_connections {open_connections}")
    return "\n".join(lines) + "\n"
