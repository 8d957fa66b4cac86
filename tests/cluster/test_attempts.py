"""The attempts of a cluster job and the budget of each cause (no Slurm needed: no job id, no requeue)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from deskpod.cluster.attempts import BudgetSpent, begin, cause_of, end
from deskpod.cluster.batch import JobFiles
from deskpod.jobs.spec import parse_spec


def job(tmp_path: Path, **spec: object) -> Path:
    folder = tmp_path / "job"
    (folder / "logs").mkdir(parents=True)
    JobFiles(folder).spec.write_text(json.dumps(parse_spec({"command": ["true"], **spec}).to_json()))
    return folder


@pytest.mark.parametrize(
    ("code", "checkpointed", "cause"),
    [(0, False, None), (140, False, "warning"), (143, True, "warning"), (137, False, "node"), (143, False, "node"),
     (-9, False, "node"), (1, False, "failure"), (2, False, "failure")],
)  # fmt: skip
def test_cause_of_an_exit(code: int, checkpointed: bool, cause: str | None) -> None:
    assert cause_of(code, checkpointed=checkpointed) == cause


def test_attempts_are_numbered_and_logged(tmp_path: Path) -> None:
    folder = job(tmp_path)
    env = {"SLURM_JOB_ID": "7", "SLURM_RESTART_COUNT": "0", "SLURM_JOB_NODELIST": "node[1-2]"}
    assert begin(folder, env) == 1
    assert end(folder, 1, 0, {}) == 0
    assert begin(folder, {**env, "SLURM_RESTART_COUNT": "1"}) == 2
    rows = json.loads(JobFiles(folder).attempts.read_text())
    assert [r["attempt"] for r in rows] == [1, 2] and rows[0]["cause"] is None and rows[1]["restart_count"] == 1
    assert "attempt 2 (Slurm job 7, restart 1) on node[1-2]" in JobFiles(folder).log(2).read_text()


def test_an_attempt_that_never_ended_counts_against_the_requeues(tmp_path: Path) -> None:
    folder = job(tmp_path, slurm={"max_requeues": 1})
    begin(folder, {})
    begin(folder, {})  # the first never reached its end: Slurm requeued it (1 of 1 allowed)
    rows = json.loads(JobFiles(folder).attempts.read_text())
    assert rows[0]["cause"] == "interrupted"
    with pytest.raises(BudgetSpent, match=r"slurm\.max_requeues is 1"):
        begin(folder, {})


def test_a_spent_budget_fails_the_job_with_the_steps_code(tmp_path: Path) -> None:
    folder = job(tmp_path, retries=0)
    begin(folder, {})
    assert end(folder, 1, 3, {}) == 3  # no retries: the job fails with the step's exit code
    row = json.loads(JobFiles(folder).attempts.read_text())[0]
    assert row["cause"] == "failure" and "budget is spent" in row["note"]
    assert "no failure requeue left" in JobFiles(folder).log(1).read_text()
    begin(folder, {})
    assert end(folder, 2, 137, {}) == 137  # node budget left, but outside Slurm (no job id) nothing is requeued
    assert json.loads(JobFiles(folder).attempts.read_text())[1]["cause"] == "node"


def test_not_a_job_folder(tmp_path: Path) -> None:
    from deskpod.errors import ConfigError

    with pytest.raises(ConfigError, match="not a deskpod cluster job folder"):
        begin(tmp_path, {})
