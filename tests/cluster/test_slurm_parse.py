"""Slurm's answers as deskpod reads them: recorded outputs of 22.05 to 25.05 (tests/cluster/data/README.md)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from deskpod.cluster import slurm
from deskpod.cluster.slurm import STATES, SlurmError, Version
from deskpod.jobs.states import JobState

DATA = Path(__file__).with_name("data")
JSON_FIXTURES = sorted(p.name for p in DATA.glob("*.json") if "unreachable" not in p.name)

# (Slurm state, deskpod state, exit code, signal, restarts) per job, as `scontrol show job` reported them.
RUN_22_05 = {
    "1": ("COMPLETED", JobState.SUCCEEDED, 0, None, 0),
    "2": ("FAILED", JobState.FAILED, 3, None, 0),
    "3": ("FAILED", JobState.FAILED, 0, 9, 0),
    "4": ("COMPLETED", JobState.SUCCEEDED, 0, None, 0),
    "5": ("TIMEOUT", JobState.FAILED, 0, 15, 0),
    "6": ("CANCELLED", JobState.CANCELLED, 0, 15, 0),
    "7": ("CANCELLED", JobState.CANCELLED, 0, None, 0),
    "8": ("PENDING", JobState.QUEUED, 0, None, 0),
    "9": ("RUNNING", JobState.RUNNING, 0, None, 1),
    "10": ("NODE_FAIL", JobState.LOST, 0, 15, 0),
    "18": ("FAILED", JobState.FAILED, 0, 10, 0),
    "19": ("PENDING", JobState.QUEUED, 0, None, 0),
}


def read(name: str) -> str:
    return (DATA / name).read_text()


@pytest.mark.parametrize("name", JSON_FIXTURES)
def test_every_json_fixture_parses_and_every_state_maps(name: str) -> None:
    raw = json.loads(read(name))["jobs"]
    jobs = slurm.parse_squeue_json(read(name))
    assert [j.job_id for j in jobs] == [str(r["job_id"]) for r in raw]
    for job, record in zip(jobs, raw, strict=True):
        states = record["job_state"] if isinstance(record["job_state"], list) else [record["job_state"]]
        assert job.state == states[0] and job.state in STATES
        assert job.deskpod_state == STATES[job.state][0]
        assert job.describe().startswith(f"Slurm {job.state}")
        assert job.restarts == record["restart_cnt"] >= 0
        assert job.user == record["user_name"] and job.name == record["name"]
        assert job.exit_code is None or 0 <= job.exit_code <= 255
        assert job.signal is None or 0 < job.signal < 65
        if job.state == "COMPLETED":
            assert (job.exit_code, job.signal) == (0, None)
        if job.state == "TIMEOUT":  # killed by SIGTERM at its time limit, on every version
            assert job.signal == 15
        if job.state == "PENDING":
            assert job.start_time is None or job.start_time > 1e9  # 0 means "not yet"; newer versions give an estimate
        assert job.stdout == "" or job.stdout.startswith("/")
        assert "%" not in job.stdout
        json.dumps(job.to_json())


def test_22_05_run_states_exit_codes_and_restarts() -> None:
    jobs = {j.job_id: j for j in slurm.parse_squeue_json(read("squeue-22.05.8.json"))}
    got = {i: (j.state, j.deskpod_state, j.exit_code, j.signal, j.restarts) for i, j in jobs.items()}
    assert got == RUN_22_05
    assert jobs["2"].reason == "NonZeroExitCode" and jobs["8"].reason == "JobHeldUser"
    assert jobs["19"].reason == "Resources" and jobs["10"].reason == "NodeDown"
    assert jobs["1"].nodes == "node[1-2]" and jobs["8"].nodes == ""
    assert jobs["8"].start_time is None and jobs["1"].start_time == 1796121116
    assert jobs["8"].describe() == "Slurm PENDING (JobHeldUser): waiting in Slurm's queue"


def test_22_05_json_and_text_of_the_same_jobs_agree() -> None:
    """The JSON reader gives what the text reader (deskpod's source of truth) gives, field by field."""
    from_json = {j.job_id: j.to_json() for j in slurm.parse_squeue_json(read("squeue-22.05.8.json"))}
    from_text = {j.job_id: j.to_json() for j in slurm.parse_scontrol_jobs(read("scontrol-show-job-22.05.8.txt"))}
    assert from_json.keys() == from_text.keys() == RUN_22_05.keys()
    for job_id, text in from_text.items():
        untimed = {k: v for k, v in from_json[job_id].items() if not k.endswith("_time")}
        assert untimed == {k: v for k, v in text.items() if not k.endswith("_time")}, job_id
    # 22.05's JSON holds the output pattern as submitted; the reader expands it as scontrol does
    assert json.loads(read("squeue-22.05.8.json"))["jobs"][0]["standard_output"] == "/tmp/h5/out/ok-%j.out"
    assert from_json["1"]["stdout"] == from_text["1"]["stdout"] == "/tmp/h5/out/ok-1.out"


def test_22_05_text_restarts_and_exit_codes() -> None:
    jobs = {j.job_id: j for j in slurm.parse_scontrol_jobs(read("scontrol-show-job-22.05.8.txt"))}
    got = {i: (j.state, j.deskpod_state, j.exit_code, j.signal, j.restarts) for i, j in jobs.items()}
    assert got == RUN_22_05
    assert jobs["9"].user == "root" and jobs["9"].name == "requeue" and jobs["10"].nodes == "node2"


def test_22_05_srun_allocations_never_started_have_no_exit_code() -> None:
    jobs = {j.job_id: j for j in slurm.parse_squeue_json(read("squeue-22.05.8-srun.json"))}
    raw = {str(r["job_id"]): r for r in json.loads(read("squeue-22.05.8-srun.json"))["jobs"]}
    assert raw["6"]["exit_code"] == 4294967295  # Slurm's INFINITE: not a wait status
    assert (jobs["6"].state, jobs["6"].exit_code, jobs["6"].signal) == ("CANCELLED", None, None)
    assert jobs["6"].reason == "PartitionNodeLimit" and jobs["6"].start_time is None
    assert (jobs["7"].state, jobs["7"].exit_code, jobs["7"].signal) == ("FAILED", 0, 1)  # scontrol: ExitCode=0:1
    assert jobs["1"].stdout == ""  # an interactive allocation has no output file
    assert jobs["12"].stdout == "/tmp/mn/out.log"


def test_23_02_wrapped_raw_exit_status() -> None:
    """23.02 wraps 22.05's raw status as {"set", "infinite", "number"}: still an exit code, not None."""
    raw = json.loads(read("slurmrestd-jobs-23.02.8.json"))["jobs"]
    assert raw[0]["exit_code"] == {"set": True, "infinite": False, "number": 0}
    jobs = slurm.parse_squeue_json(read("slurmrestd-jobs-23.02.8.json"))
    assert [(j.job_id, j.state, j.exit_code, j.signal) for j in jobs] == [
        ("307", "COMPLETED", 0, None),
        ("310", "RUNNING", 0, None),
        ("326", "PENDING", 0, None),
    ]
    assert jobs[0].nodes == "cn[001-050,052-065]" and jobs[2].reason == "Resources"


@pytest.mark.parametrize(
    ("name", "expected"),
    [
        (
            "slurmrestd-jobs-23.11.10.json",
            {"776": ("TIMEOUT", None, 15), "777": ("COMPLETED", 0, None), "778": ("FAILED", 1, None),
             "779": ("RUNNING", 0, None), "787": ("PENDING", 0, None)},
        ),
        (
            "slurmrestd-jobs-24.05.3.json",
            {"649717": ("TIMEOUT", None, 15), "649718": ("COMPLETED", 0, None), "649719": ("FAILED", 1, None),
             "649722": ("RUNNING", 0, None), "649730": ("PENDING", 0, None)},
        ),
        (
            "slurmrestd-jobs-24.11.5.json",
            {"6355": ("CANCELLED", None, 15), "6357": ("TIMEOUT", None, 15), "6358": ("COMPLETED", 0, None),
             "6359": ("FAILED", 1, None), "6360": ("RUNNING", 0, None), "6369": ("PENDING", 0, None)},
        ),
        (
            "slurmrestd-jobs-25.05.4.json",
            {"2195": ("CANCELLED", 0, None), "4728": ("CANCELLED", None, 15), "4730": ("TIMEOUT", None, 15),
             "4731": ("COMPLETED", 0, None), "4732": ("FAILED", 1, None), "4734": ("RUNNING", 0, None),
             "4741": ("PENDING", 0, None)},
        ),
    ],
)  # fmt: skip
def test_process_exit_code_objects(name: str, expected: dict[str, tuple[str, int | None, int | None]]) -> None:
    """23.11+: {"status": [...], "return_code": {...}, "signal": {"id": {...}}}; a signalled job has no return code."""
    jobs = slurm.parse_squeue_json(read(name))
    assert {j.job_id: (j.state, j.exit_code, j.signal) for j in jobs} == expected


def test_output_file_follows_scontrol() -> None:
    """25.05 gives the expanded path, or '' for sbatch's default (slurm-%j.out in the working directory)."""
    jobs = {j.job_id: j for j in slurm.parse_squeue_json(read("slurmrestd-jobs-25.05.4.json"))}
    raw = {str(r["job_id"]): r for r in json.loads(read("slurmrestd-jobs-25.05.4.json"))["jobs"]}
    assert raw["2195"]["stdout_expanded"] == "/dev/null" and jobs["2195"].stdout == "/dev/null"
    assert raw["4731"]["standard_output"] == "" and raw["4731"]["batch_flag"] is True
    assert jobs["4731"].stdout == "/home/progers/slurm-4731.out"
    older = slurm.parse_squeue_json(read("slurmrestd-jobs-24.05.3.json"))
    assert older[0].stdout == "/home/ksoto/slurm-649717.out"


def test_an_unreachable_controller_is_an_error_not_an_empty_queue() -> None:
    text = read("squeue-22.05.8-unreachable.json")
    assert json.loads(text)["jobs"] == []
    with pytest.raises(SlurmError, match=r"slurm_load_jobs; Failed while looking for jobs; Unspecified error"):
        slurm.parse_squeue_json(text)
    with pytest.raises(SlurmError, match="gave no JSON"):
        slurm.parse_squeue_json("squeue: error: Invalid job id specified\n")


def test_config_and_partitions() -> None:
    config = slurm.parse_config(read("scontrol-show-config-22.05.8.txt"))
    assert config["MinJobAge"] == "3600 sec" and config["AuthType"] == "auth/munge"
    assert config["AccountingStorageType"] == "accounting_storage/none" and config["PrologFlags"] == "(null)"
    assert config["SLURM_VERSION"] == "22.05.8" and config["SlurmctldHost[0]"].endswith("(localhost)")
    assert not any(k.startswith("Configuration") for k in config)
    [debug] = slurm.parse_partitions(read("sinfo-22.05.8.txt"))
    assert debug == slurm.Partition("debug", 2, True, 2, ("gpu",), "up")


def test_versions_and_gpu_options() -> None:
    assert slurm.parse_version("slurm-wlm 22.05.8\n") == Version(22, 5, 8)
    assert slurm.parse_version("slurm 23.11.4") == Version(23, 11, 4) > Version(22, 5, 9)
    assert str(Version(22, 5, 8)) == "22.05.8"
    with pytest.raises(SlurmError, match="cannot read a Slurm version"):
        slurm.parse_version("sbatch: command not found")
    assert slurm.gpu_options(Version(22, 5, 8), 2) == ["--gpus-per-task=2"]
    assert slurm.gpu_options(Version(22, 5, 4), 2) == ["--ntasks-per-node=1", "--gpus-per-node=2"]
    assert slurm.gpu_options(Version(22, 5, 9), 2) == ["--ntasks-per-node=1", "--gpus-per-node=2"]
    assert slurm.gpu_options(Version(18, 8), 4) == ["--ntasks-per-node=1", "--gres=gpu:4"]
    assert slurm.gpu_options(Version(24, 5, 3), 0) == ["--ntasks-per-node=1"]


# Every name Slurm's job_state_string() returns (src/common/slurm_protocol_defs.c, 22.05.8 and 24.11.5 alike):
# what `scontrol show job` prints as JobState=, and the first entry of 23.11+'s job_state list.
SLURM_STATE_NAMES = [
    "COMPLETING",
    "STAGE_OUT",
    "CONFIGURING",
    "RESIZING",
    "REQUEUED",
    "REQUEUE_FED",
    "REQUEUE_HOLD",
    "SPECIAL_EXIT",
    "STOPPED",
    "REVOKED",
    "RESV_DEL_HOLD",
    "SIGNALING",
    "PENDING",
    "RUNNING",
    "SUSPENDED",
    "COMPLETED",
    "CANCELLED",
    "FAILED",
    "TIMEOUT",
    "NODE_FAIL",
    "PREEMPTED",
    "BOOT_FAIL",
    "DEADLINE",
    "OUT_OF_MEMORY",
]


def test_states_cover_every_name_slurm_prints() -> None:
    assert set(SLURM_STATE_NAMES) <= STATES.keys()
    assert slurm.deskpod_state("SPECIAL_EXIT")[0] == JobState.QUEUED
    assert slurm.deskpod_state("CANCELLED by 0")[0] == JobState.CANCELLED
    assert slurm.deskpod_state("COMPLETING+")[0] == JobState.RUNNING
    with pytest.raises(SlurmError, match="unknown Slurm job state 'NO_SUCH_STATE'"):
        slurm.deskpod_state("NO_SUCH_STATE")
