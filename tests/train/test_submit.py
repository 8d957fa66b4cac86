"""``deskpod train --submit``: the run goes to a real pod service on 127.0.0.1 and trains there."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.jobs.pods import Pods, wait_for

from .conftest import needs_fashion_mnist


@needs_fashion_mnist
@pytest.mark.slow
def test_train_submit_queues_and_runs_a_train_job(tmp_path: Path) -> None:
    pods = Pods(tmp_path)
    try:
        pod = pods()
        r = pod.cli("train", "--submit", "--model", "mlp", "--steps", "5", "--batch-size", "16", "--devices", "1",
                    "--name", "queued-run")  # fmt: skip
        assert r.returncode == 0, r.stderr
        job_id = r.stdout.split()[2].rstrip(";")
        c = pod.client()
        job = wait_for(lambda: (j := c.job(job_id))["state"] in ("succeeded", "failed") and j, 180, "the job to end")
        assert isinstance(job, dict) and job["state"] == "succeeded", job
        assert job["kind"] == "train" and job["name"] == "queued-run"
        bad = pod.cli("train", "--submit", "--precision", "fp64")
        assert bad.returncode == 2 and "precision = 'fp64'" in bad.stderr
        assert len(c.jobs()) == 1, "nothing is queued from a bad config"
    finally:
        pods.stop_all()
