"""Prometheus text exposition for ``GET /metrics``: queue, running jobs, devices, job durations.

Written by hand (the text format is a few lines per family, see
https://prometheus.io/docs/instrumenting/exposition_formats/) so the pod adds no client library;
every value is read from the store at scrape time, so a restarted daemon reports the same numbers.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from deskpod.jobs.states import JobState

DURATION_BUCKETS = (1.0, 10.0, 60.0, 300.0, 1800.0, 3600.0, 6 * 3600.0, 24 * 3600.0)
"""Seconds: from a smoke test to a day-long training run."""


def render(status: dict[str, Any], counts: dict[str, int], durations: Sequence[float]) -> str:
    """The metrics page from `Pod.status`, the job counts per state and the run times of ended jobs."""
    out: list[str] = []

    def family(name: str, kind: str, text: str) -> None:
        out.append(f"# HELP {name} {text}")
        out.append(f"# TYPE {name} {kind}")

    def gauge(name: str, text: str, value: object) -> None:
        family(name, "gauge", text)
        out.append(f"{name} {value}")

    gauge("deskpod_queue_length", "Jobs waiting for devices.", status["queued"])
    gauge("deskpod_jobs_running", "Jobs starting, building their environment, or running.", status["running"])
    family("deskpod_jobs", "gauge", "Jobs by state.")
    for state in JobState:
        out.append(f'deskpod_jobs{{state="{state.value}"}} {counts.get(state.value, 0)}')
    devices = status["devices"]
    gauge("deskpod_devices", "Devices (GPUs, or CPU worker slots) of this box.", len(devices))
    gauge("deskpod_devices_allocated", "Devices held by a job.", sum(1 for d in devices if d["job"] is not None))
    family("deskpod_device_allocated", "gauge", "1 when the device is held by a job.")
    for d in devices:
        held = 0 if d["job"] is None else 1
        out.append(f'deskpod_device_allocated{{device="{d["index"]}",kind="{d["kind"]}"}} {held}')
    family("deskpod_job_duration_seconds", "histogram", "Run time of jobs that ended (last attempt).")
    for le in DURATION_BUCKETS:
        out.append(f'deskpod_job_duration_seconds_bucket{{le="{le:g}"}} {sum(1 for x in durations if x <= le)}')
    out.append(f'deskpod_job_duration_seconds_bucket{{le="+Inf"}} {len(durations)}')
    out.append(f"deskpod_job_duration_seconds_sum {sum(durations):.6f}")
    out.append(f"deskpod_job_duration_seconds_count {len(durations)}")
    return "\n".join(out) + "\n"
