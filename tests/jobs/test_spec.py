"""Job specs and job states: every bad input is refused with a message naming it."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from deskpod.errors import ConfigError
from deskpod.jobs.spec import SPEC_SCHEMA, load_spec_file, parse_spec
from deskpod.jobs.states import FINAL, REQUEUABLE, TRANSITIONS, JobState, TransitionError, check


def test_a_full_spec_parses_and_all_resolves() -> None:
    spec = parse_spec(
        {"name": "a.b-1", "command": ["python", "x.py"], "devices": "all", "placement": "partition:halves",
         "priority": -3, "max_runtime": 1.5, "retries": 2, "env": {"SEED": "1"}, "workdir": "/tmp"},
        device_count=8,
    )  # fmt: skip
    assert spec.devices == 8 and spec.kind == "command" and spec.env == {"SEED": "1"}
    assert parse_spec({"command": ["/bin/sleep", "1"]}).name == "sleep"
    assert parse_spec({"command": ["python", "train.py"]}).name == "train.py"
    assert parse_spec({"train": {"model": "mlp"}}).kind == "train"


def test_a_serve_spec_gets_its_defaults_and_round_trips() -> None:
    spec = parse_spec({"serve": {"run": "/srv/runs/my run"}})
    assert spec.kind == "serve" and spec.name == "serve-my-run"
    assert spec.serve == {"run": "/srv/runs/my run", "model": "my-run", "format": "onnx", "max_batch_size": 32,
                          "max_queue_delay_us": 2000, "instances": 1, "image_input": False,
                          "grpc": False}  # fmt: skip
    assert parse_spec(spec.to_json()) == spec


def test_a_serve_job_runs_deskpod_serve_with_its_settings(tmp_path: Path) -> None:
    plain = parse_spec({"serve": {"run": "/r/a"}}).argv(tmp_path)
    assert "--image-input" not in plain and "--grpc-port" not in plain
    assert plain[plain.index("--port-file") + 1] == str(tmp_path / "serve.json")
    both = parse_spec({"serve": {"run": "/r/a", "image_input": True, "grpc": True}}).argv(tmp_path)
    assert both[: len(plain)] == plain and both[len(plain) :] == ["--image-input", "--grpc-port", "0"]


BAD = [
    ([], "expected an object"),
    ({"command": ["x"], "gpus": 2}, "unknown field 'gpus'"),
    ({}, "exactly one of command"),
    ({"command": ["x"], "train": {}}, "exactly one of command"),
    ({"command": "python x.py"}, "command"),
    ({"command": []}, "command"),
    ({"command": ["x", 3]}, "command"),
    ({"command": ["x\0"]}, "command"),
    ({"command": ["x"], "name": "a;rm -rf"}, "name"),
    ({"command": ["x"], "name": "../etc"}, "name"),
    ({"command": ["x"], "name": "a/b"}, "name"),
    ({"command": ["x"], "name": "$(id)"}, "name"),
    ({"command": ["x"], "name": "x" * 65}, "name"),
    ({"command": ["x"], "devices": 0}, "devices"),
    ({"command": ["x"], "devices": -2}, "devices"),
    ({"command": ["x"], "devices": 10**9}, "devices"),
    ({"command": ["x"], "devices": True}, "devices"),
    ({"command": ["x"], "devices": "some"}, "devices"),
    ({"command": ["x"], "priority": 10**6}, "priority"),
    ({"command": ["x"], "priority": 1.5}, "priority"),
    ({"command": ["x"], "max_runtime": -1}, "max_runtime"),
    ({"command": ["x"], "max_runtime": 1e12}, "max_runtime"),
    ({"command": ["x"], "retries": -1}, "retries"),
    ({"command": ["x"], "retries": 1000}, "retries"),
    ({"command": ["x"], "placement": "fastest"}, "placement"),
    ({"command": ["x"], "device_kind": "gpu"}, 'device_kind = \'gpu\' is not valid; use "cuda" (GPUs) or "cpu"'),
    ({"command": ["x"], "env": {"A B": "1"}}, "env"),
    ({"command": ["x"], "env": {"A": 1}}, "env.A"),
    ({"command": ["x"], "env": {"CUDA_VISIBLE_DEVICES": "0"}}, "sets"),
    ({"command": ["x"], "env": ["A=1"]}, "env"),
    ({"command": ["x"], "env": {"LD_PRELOAD": "/home/a/evil.so"}}, "'LD_PRELOAD' is not valid; the C library loader"),
    ({"command": ["x"], "env": {"LD_LIBRARY_PATH": "/home/a"}}, 'command = ["env", "LD_LIBRARY_PATH=...", "python"'),
    ({"command": ["x"], "env": {"LD_AUDIT": "/a.so"}}, "loader"),
    ({"command": ["x"], "env": {"GLIBC_TUNABLES": "glibc.x=1"}}, "loader"),
    ({"command": ["x"], "env": {"GCONV_PATH": "/home/a"}}, "loader"),
    ({"command": ["x"], "workdir": "relative/dir"}, "workdir"),
    ({"train": "mlp"}, "train"),
    ({"train": {}, "serve": {"run": "/r"}}, "got train and serve"),
    ({"serve": "/r"}, "serve"),
    ({"serve": {}}, "serve.run"),
    ({"serve": {"run": "runs/x"}}, "serve.run"),
    ({"serve": {"run": "/r", "port": 80}}, "unknown field serve.port"),
    ({"serve": {"run": "/r", "model": "a b"}}, "serve.model"),
    ({"serve": {"run": "/r", "format": "tensorrt"}}, "serve.format"),
    ({"serve": {"run": "/r", "max_batch_size": 0}}, "serve.max_batch_size"),
    ({"serve": {"run": "/r", "instances": 1000}}, "serve.instances"),
    ({"serve": {"run": "/r", "grpc": "yes"}}, "serve.grpc = 'yes' is not valid; expected true or false"),
    ({"serve": {"run": "/r", "image_input": 1}}, "serve.image_input = 1 is not valid"),
]


@pytest.mark.parametrize(("data", "needle"), BAD)
def test_bad_specs_are_refused_naming_the_problem(data: object, needle: str) -> None:
    with pytest.raises(ConfigError, match=None) as e:
        parse_spec(data, device_count=2)
    assert needle in str(e.value)


def test_spec_files(tmp_path: Path) -> None:
    good = tmp_path / "job.toml"
    good.write_text('command = ["true"]\ndevices = 1\n[env]\nA = "1"\n')
    assert parse_spec(load_spec_file(good)).env == {"A": "1"}
    bad = tmp_path / "bad.toml"
    bad.write_text("command = [\n")
    with pytest.raises(ConfigError, match="not valid TOML"):
        load_spec_file(bad)
    with pytest.raises(ConfigError, match="cannot read"):
        load_spec_file(tmp_path / "missing.json")


def test_state_table() -> None:
    check(JobState.QUEUED, JobState.STARTING)
    check(JobState.RUNNING, JobState.PREEMPTED)
    check(JobState.PREEMPTED, JobState.QUEUED)
    assert TRANSITIONS[JobState.SUCCEEDED] == frozenset()
    for ended in REQUEUABLE:  # a user may send these back to the queue, and nowhere else
        assert TRANSITIONS[ended] == frozenset({JobState.QUEUED})
    with pytest.raises(TransitionError, match="queued -> running"):
        check(JobState.QUEUED, JobState.RUNNING)
    with pytest.raises(TransitionError):
        check(JobState.SUCCEEDED, JobState.QUEUED)
    # every state is reachable from queued, and every non-final state can move on
    seen, todo = {JobState.QUEUED}, [JobState.QUEUED]
    while todo:
        for nxt in TRANSITIONS[todo.pop()]:
            if nxt not in seen:
                seen.add(nxt)
                todo.append(nxt)
    assert seen == set(JobState)
    assert all(TRANSITIONS[s] for s in JobState if s not in FINAL)


def test_nodes_and_the_slurm_table() -> None:
    from deskpod.jobs.spec import SLURM_DEFAULTS

    s = parse_spec({"command": ["x"], "nodes": 4, "slurm": {"partition": "gpu", "max_requeues": 2}})
    assert s.nodes == 4 and s.slurm == {**SLURM_DEFAULTS, "partition": "gpu", "max_requeues": 2}
    assert parse_spec(s.to_json()) == s
    plain = parse_spec({"command": ["x"]})
    assert plain.nodes == 1 and plain.slurm == {} and "nodes" not in plain.to_json()


@pytest.mark.parametrize(
    ("data", "says"),
    [
        ({"nodes": 0}, "nodes"),
        ({"slurm": {"partiton": "gpu"}}, "unknown field slurm.partiton; valid: partition, account"),
        ({"slurm": {"partition": "a b"}}, "slurm.partition"),
        ({"slurm": {"scratch": "rel/path"}}, "slurm.scratch"),
        ({"slurm": {"stage_data": "yes"}}, "slurm.stage_data"),
        ({"slurm": {"signal_before_s": -1}}, "slurm.signal_before_s"),
        ({"slurm": {"scratch_limit_gb": 0}}, "slurm.scratch_limit_gb"),
        ({"slurm": "gpu"}, "slurm"),
    ],
)
def test_bad_cluster_fields_are_named(data: dict[str, object], says: str) -> None:
    with pytest.raises(ConfigError, match=re.escape(says)):
        parse_spec({"command": ["x"], **data})


def test_the_schema_refuses_the_loaders_variables_too() -> None:
    jsonschema_rs = pytest.importorskip("jsonschema_rs")  # what schemathesis validates with
    names = SPEC_SCHEMA["properties"]["env"]["propertyNames"]
    for bad in ("LD_PRELOAD", "LD_ANYTHING", "GLIBC_TUNABLES", "CUDA_VISIBLE_DEVICES"):
        assert not jsonschema_rs.is_valid(names, bad), bad
    for good in ("SEED", "PYTHONPATH", "OLD_PRELOAD", "ld_preload"):
        assert jsonschema_rs.is_valid(names, good), good
        parse_spec({"command": ["x"], "env": {good: "1"}})


@pytest.mark.parametrize(
    "data",
    [
        {"command": ["x"], "name": None},
        {"command": ["x"], "retries": None},
        {"command": ["x"], "slurm": {"env_cache": None}},
        {"command": ["x"], "slurm": {"partition": None}},
        {"serve": {"run": "/r", "model": None}},
        {"command": ["x"], "environment": {"packages": ["six"], "python": None}},
    ],
)
def test_a_field_given_as_null_is_refused_as_the_document_says(data: dict[str, object]) -> None:
    """The OpenAPI document gives every field a type, and null is none of them: the server agrees."""
    with pytest.raises(ConfigError, match=r"= null is not valid; leave .* out"):
        parse_spec(data)
    import jsonschema_rs  # schemathesis's validator, installed with it

    assert not jsonschema_rs.is_valid(SPEC_SCHEMA, data)


def test_a_device_kind_round_trips_and_the_schema_says_what_the_parser_takes() -> None:
    import jsonschema_rs  # schemathesis's validator, installed with it

    s = parse_spec({"command": ["x"], "device_kind": "cuda"})
    assert s.device_kind == "cuda" and s.to_json()["device_kind"] == "cuda" and parse_spec(s.to_json()) == s
    assert "device_kind" not in parse_spec({"command": ["x"]}).to_json()
    assert jsonschema_rs.is_valid(SPEC_SCHEMA, {"command": ["x"], "device_kind": "cpu"})
    assert not jsonschema_rs.is_valid(SPEC_SCHEMA, {"command": ["x"], "device_kind": "gpu"})
