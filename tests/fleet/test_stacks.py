"""Stacks at the fleet: publishing (parses, resolves against this box's package sources, versions, no-op for the
same contents, a rollback as a new version), pinning a job to a version, what members have, and how a smoke
job's end is read. The package sources are the box's own (pip's configuration: local indexes and find-links), so
these run offline; a rollout on real pods is in test_rollout.py."""

from __future__ import annotations

import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from deskpod.envs.cache import find_uv
from deskpod.envs.definition import EnvDefinition, content_hash, parse_environment
from deskpod.envs.index import package_sources
from deskpod.errors import ConfigError, NotFoundError
from deskpod.fleet.rollout import JobEnd, devices_of, judge
from deskpod.fleet.stacks import MemberBuild, StackStore, stack_definition
from deskpod.jobs.spec import parse_spec


@pytest.fixture(scope="module")
def uv_cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """uv's cache, shared by the module's resolutions (as a fleet's is by its publishes)."""
    return tmp_path_factory.mktemp("uv-cache")


@pytest.fixture
def store(tmp_path: Path) -> Iterator[StackStore]:
    s = StackStore(tmp_path / "stacks.db")
    yield s
    s.close()


def requirements(text: str, python: str | None = "3.11") -> EnvDefinition:
    return stack_definition({"requirements": {"file": "requirements.txt", "text": text}}, python)


def publish(store: StackStore, uv_cache: Path, name: str, text: str) -> tuple[int, bool]:
    version, new = store.publish(name, requirements(text), by="admin", cache_dir=uv_cache)
    return version.version, new


def test_publishing_adds_versions_the_same_contents_are_a_no_op_and_a_rollback_is_a_new_version(
    store: StackStore, uv_cache: Path
) -> None:
    assert publish(store, uv_cache, "tools", "six==1.17.0\n") == (1, True)
    assert publish(store, uv_cache, "tools", "six==1.17.0\n") == (1, False)  # nothing added
    assert publish(store, uv_cache, "tools", "six==1.16.0\n") == (2, True)
    assert publish(store, uv_cache, "tools", "six==1.17.0\n") == (3, True)  # back to v1's contents: the rollback
    v1, v2, v3 = store.versions("tools")
    assert v3.hash == v1.hash != v2.hash
    assert store.current("tools") == v3
    assert v1.resolved == ("six==1.17.0",) and v2.resolved == ("six==1.16.0",)
    assert v1.definition.python == "3.11" and v1.ref == "tools@v1"
    # the hash is what the environments cache keys on: the definition's contents, whatever the file was called
    renamed = stack_definition({"requirements": {"file": "other.txt", "text": "six==1.17.0\n"}}, "3.11")
    assert content_hash(renamed) != v1.hash  # the file's name is part of the definition as stored
    assert content_hash(requirements("six==1.17.0\n")) == v1.hash


def test_a_stack_that_does_not_resolve_is_one_line_and_nothing_is_stored(store: StackStore, uv_cache: Path) -> None:
    with pytest.raises(ConfigError) as e:
        publish(store, uv_cache, "bad", "nosuchpkg-deskpod==1.0\n")
    assert "does not resolve" in str(e.value) and "nosuchpkg-deskpod" in str(e.value) and "\n" not in str(e.value)
    with pytest.raises(NotFoundError, match="no stack 'bad' at this fleet"):
        store.versions("bad")
    publish(store, uv_cache, "tools", "six==1.17.0\n")
    with pytest.raises(ConfigError, match="does not resolve"):
        publish(store, uv_cache, "tools", "six==99.0\n")
    assert [v.version for v in store.versions("tools")] == [1]


def test_bad_input_is_refused_before_anything_is_stored(store: StackStore, uv_cache: Path) -> None:
    with pytest.raises(ConfigError, match=r"stack name 'no/slash' is not valid"):
        store.publish("no/slash", requirements("six\n"), by="admin", cache_dir=uv_cache)
    with pytest.raises(ConfigError, match=r"environment.lock 'uv.lock' does not parse"):
        stack_definition({"lock": {"file": "uv.lock", "text": "this is [not toml"},
                          "pyproject": {"file": "pyproject.toml", "text": "[project]\nname='x'\n"}}, "3.11")  # fmt: skip
    with pytest.raises(ConfigError, match="a image is not one"):
        stack_definition({"image": "docker.io/library/python:3.11"}, None)
    with pytest.raises(ConfigError, match=r"environment.python = '3' is not valid"):
        requirements("six\n", python="3")
    assert store.names() == []


def test_a_uv_lock_resolves_only_while_it_is_current_for_its_pyproject(
    store: StackStore, uv_cache: Path, tmp_path: Path
) -> None:
    project = tmp_path / "project"
    project.mkdir()
    (project / "pyproject.toml").write_text(
        '[project]\nname = "stk"\nversion = "0"\nrequires-python = ">=3.11"\ndependencies = ["six==1.17.0"]\n'
    )
    env = {**os.environ, **package_sources().uv_environment(), "UV_CACHE_DIR": str(uv_cache)}
    uv = find_uv()
    assert uv is not None
    subprocess.run([uv, "lock", "-q", "--project", str(project)], env=env, check=True, timeout=120)
    table = {"lock": "uv.lock"}
    defn = stack_definition(parse_environment(table, base_dir=project).to_json(), "3.11")
    version, new = store.publish("locked", defn, by="admin", cache_dir=uv_cache)
    assert new and version.resolved == ("six==1.17.0",)  # the lock's own project is not a package of it
    (project / "pyproject.toml").write_text((project / "pyproject.toml").read_text().replace("1.17.0", "1.16.0"))
    stale = stack_definition(parse_environment(table, base_dir=project).to_json(), "3.11")
    with pytest.raises(ConfigError, match="is not current for its pyproject"):
        store.publish("locked", stale, by="admin", cache_dir=uv_cache)
    assert len(store.versions("locked")) == 1


def test_a_job_naming_a_stack_is_pinned_to_the_current_version_and_keeps_it(store: StackStore, uv_cache: Path) -> None:
    publish(store, uv_cache, "tools", "six==1.17.0\n")
    spec = parse_spec({"command": ["python", "-c", "import six"], "stack": "tools"})
    pinned = store.resolve(spec)
    assert pinned.stack == "tools@v1" and pinned.environment == store.version("tools", 1).definition
    publish(store, uv_cache, "tools", "six==1.16.0\n")
    again = parse_spec(pinned.to_json())  # as the store keeps it, read back: still v1, whatever is current
    assert store.resolve(again).stack == "tools@v1"
    assert store.resolve(spec).stack == "tools@v2"
    with pytest.raises(ConfigError, match=r"stack = 'tools@v1' comes with an \[environment\] that is not tools@v1's"):
        store.resolve(parse_spec({**pinned.to_json(), "environment": {"packages": ["six"]}}))
    with pytest.raises(ConfigError, match=r"stack = 'nope': no stack 'nope' at this fleet; its stacks: tools"):
        store.resolve(parse_spec({"command": ["true"], "stack": "nope"}))
    with pytest.raises(ConfigError, match=r"stack = 'tools@v9': stack 'tools' has no version v9; it has v1, v2"):
        store.resolve(parse_spec({"command": ["true"], "stack": "tools@v9"}))


def test_the_spec_takes_a_stack_only_where_it_means_something() -> None:
    with pytest.raises(ConfigError, match=r"give stack = 'tools' or an \[environment\], not both"):
        parse_spec({"command": ["true"], "stack": "tools", "environment": {"packages": ["six"]}})
    with pytest.raises(ConfigError, match="stack applies to command, notebook and shell jobs"):
        parse_spec({"train": {"epochs": 1}, "stack": "tools"})
    with pytest.raises(ConfigError, match=r"stack = 'a b' is not valid"):
        parse_spec({"command": ["true"], "stack": "a b"})


def test_status_says_which_version_each_member_has(store: StackStore, uv_cache: Path) -> None:
    publish(store, uv_cache, "tools", "six==1.17.0\n")
    publish(store, uv_cache, "tools", "six==1.16.0\n")

    def build(version: object, member: str, outcome: str) -> MemberBuild:
        v = store.version("tools", version)
        return MemberBuild(name="tools", version=v.version, hash=v.hash, member=member, outcome=outcome,
                           step="" if outcome == "passed" else "import", reason="r", log_tail="", job="1",
                           seconds=1.0, at=float(v.version))  # fmt: skip

    store.record(build(1, "box-a", "passed"))
    store.record(build(1, "box-b", "passed"))
    store.record(build(2, "box-a", "passed"))
    store.record(build(2, "box-b", "failed"))
    [tools] = store.status(["box-a", "box-b", "box-c"])
    rows = {r["member"]: r for r in tools["members"]}
    assert tools["current"]["version"] == 2
    assert (rows["box-a"]["has"], rows["box-a"]["current"], rows["box-a"]["passed"]) == (2, True, [1, 2])
    assert (rows["box-b"]["has"], rows["box-b"]["current"], rows["box-b"]["failed"]) == (1, False, [2])
    assert (rows["box-c"]["has"], rows["box-c"]["last"]) == (None, None)
    assert store.built() == {"box-a": ["tools@v2"], "box-b": ["tools@v1"]}  # the members view's "stacks"
    publish(store, uv_cache, "tools", "six==1.17.0\n")  # a rollback to v1's contents: box-b has it without a rollout
    rows = {r["member"]: r for r in store.status(["box-a", "box-b"])[0]["members"]}
    assert (rows["box-b"]["has"], rows["box-b"]["current"]) == (3, True)
    assert (rows["box-a"]["has"], rows["box-a"]["current"]) == (3, True)
    assert store.built() == {"box-a": ["tools@v3"], "box-b": ["tools@v3"]}


SMOKE_OK = """--- deskpod: job 4 attempt 1 on devices 0,1 at 2025-01-01 00:00:00 ---
SMOKE start 3.11.7
SMOKE ok import torch 2.13.0+cpu
SMOKE ok matmul 256x256 float32 on cpu (relative error 1.2e-07)
SMOKE ok allreduce over 2 CPU slots (gloo)
"""


def test_a_smoke_jobs_end_is_read_into_its_outcome_and_the_first_failing_step(
    store: StackStore, uv_cache: Path
) -> None:
    publish(store, uv_cache, "tools", "six==1.17.0\n")
    v = store.current("tools")
    assert v is not None

    def read(state: str, reason: str, log: str, notes: tuple[str, ...] = ()) -> MemberBuild:
        return judge(v, "box-a", JobEnd(job="4", state=state, reason=reason, log=log, notes=notes), 3.0, 1.0)

    ok = read("succeeded", "", SMOKE_OK, ("building environment 1234 (six)", "environment ready after 2.0 s; running"))
    assert (ok.outcome, ok.step) == ("passed", "")
    assert ok.reason == "torch 2.13.0+cpu; all-reduce over 2 CPU slots (gloo); environment built"
    no_torch = read("failed", "exit code 3", "SMOKE start 3.11.7\nSMOKE FAIL import: ModuleNotFoundError: No module"
                    " named 'torch'\n")  # fmt: skip
    assert (no_torch.outcome, no_torch.step, no_torch.reason) == (
        "failed", "import", "ModuleNotFoundError: No module named 'torch'")  # fmt: skip
    build = read("failed", "environment build failed: No solution found: nosuchpkg", "deskpod: building ...\n")
    assert (build.step, build.reason) == ("build", "environment build failed: No solution found: nosuchpkg")
    reduce = read("failed", "exit code 1", SMOKE_OK.rsplit("SMOKE ok allreduce", 1)[0] + "Traceback ...\n")
    assert (reduce.step, reduce.reason) == ("allreduce", "failed (exit code 1) before step allreduce said ok")
    late = read("timeout", "", "SMOKE start 3.11.7\nSMOKE ok import torch 2.13.0\n")
    assert late.step == "wait" and "cancelled at step matmul" in late.reason
    assert read("failed", "cannot start: no such account", "").step == "start"


def test_a_smoke_job_asks_for_a_members_own_devices_or_a_node_of_its_clusters_default_partition() -> None:
    box = {"devices": [{"index": i} for i in range(8)], "backend": {"name": "local"}}
    parts = [{"name": "short", "nodes": 1, "gpus_per_node": 8, "default": False},
             {"name": "debug", "nodes": 2, "gpus_per_node": 4, "default": True}]  # fmt: skip
    cluster = {"devices": [], "backend": {"name": "slurm", "partitions": parts}}
    assert (devices_of(box), devices_of(cluster)) == (8, 4)
    assert devices_of({"devices": [], "backend": {"name": "slurm", "partitions": parts[:1]}}) == 8  # no default
    assert devices_of({"devices": [], "backend": {"name": "slurm", "partitions": []}}) == 0
