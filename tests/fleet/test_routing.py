"""Routing over member snapshots, without servers: fit (count, NVLink clique, nodes), soonest start by the members'
own forecasts, the reasons it gives, and what a job sent to a member takes from it."""

from __future__ import annotations

from dataclasses import replace

from deskpod.fleet.executor import staged_data, wanted
from deskpod.fleet.routing import Wanted, about, after, route
from deskpod.fleet.snapshot import Holder, MemberSnapshot, from_status
from deskpod.hardware.placement import machine
from deskpod.hardware.topo_matrix import format_topo_matrix
from deskpod.jobs.spec import parse_spec

NOW = 1_000_000.0


def box(name: str, catalog: str, held: dict[int, str] | None = None, *, queued: int = 0,
        free: tuple[tuple[float, int], ...] | None = None, **kw: object) -> MemberSnapshot:  # fmt: skip
    """A member as its status would show a catalog machine, with ``held`` devices taken by jobs."""
    topo = machine(catalog)
    held = held or {}
    n = topo.device_count
    devices = tuple(Holder(i, held.get(i), "ann" if i in held else None) for i in range(n))
    profile = free if free is not None else ((0.0, n - len(held)),)
    return MemberSnapshot(name=name, url=f"http://{name}", asked_at=NOW, reachable=True, kind="cuda",
                          devices=devices, topology=topo, free=profile, queued=queued, **kw)  # type: ignore[arg-type]  # fmt: skip


def test_the_member_that_can_start_it_now_wins_and_each_member_says_why() -> None:
    a = box("box-a", "dgx1-v100", {i: "1" for i in range(8)}, free=((0.0, 0), (7200.0, 8)))  # busy for 2 h
    b = box("box-b", "dgx-station")  # 4 GPUs, all free
    c = box("box-c", "digits-devbox", {0: "3", 1: "3"})  # 4 GPUs, 2 free
    r = route(Wanted(4), [a, b, c], NOW)
    assert r.member == "box-b"
    assert list(r.reasons) == ["box-b", "box-a", "box-c"]  # the chosen one first
    assert r.reasons["box-b"] == "4 GPUs free now"
    assert r.reasons["box-a"] == "about 2.0 h in queue (none queued there)"
    assert r.text().startswith("box-b: 4 GPUs free now; box-a: about 2.0 h in queue")


def test_a_member_with_too_few_devices_or_no_nvlink_clique_does_not_fit() -> None:
    small = box("small", "digits-devbox")  # 4 GPUs on PCIe
    pcie = box("pcie", "pcie-8gpu")
    r = route(Wanted(8), [small, pcie], NOW)
    assert r.member == "pcie"
    assert r.reasons["small"] == "has 4 GPUs, the job needs 8"
    # A DGX-1 with 4 GPUs free, but not an NVLink-connected set: 'best' waits for one rather than take them.
    split = box("dgx", "dgx1-v100", {1: "1", 2: "1", 4: "2", 7: "2"}, free=((0.0, 4), (600.0, 8)))
    r = route(Wanted(4), [split], NOW)
    assert r.member == "dgx" and r.reasons["dgx"] == "about 10 min in queue (none queued there)"
    assert route(Wanted(4, placement="pack"), [split], NOW).reasons["dgx"] == "4 GPUs free now"


def test_the_soonest_promised_start_wins_and_an_unknown_start_comes_last() -> None:
    late = box("late", "dgx-station", {i: "1" for i in range(4)}, free=((0.0, 0), (3600.0, 4)))
    soon = box("soon", "dgx-station", {i: "2" for i in range(4)}, free=((0.0, 0), (60.0, 4)), queued=3)
    never = box("never", "dgx-station", {i: "3" for i in range(4)}, free=((0.0, 0),))
    r = route(Wanted(2, max_runtime=600), [never, late, soon], NOW)
    assert r.member == "soon"
    assert r.reasons["soon"] == "about 60 s in queue (3 queued there)"
    assert r.reasons["never"].startswith("start unknown (its devices are held by jobs without a max_runtime")
    only = route(Wanted(2), [never], NOW)
    assert only.member == "never"  # unknown, but it fits: better than refusing the job


def test_members_that_cannot_take_jobs_are_skipped_with_their_reason() -> None:
    gone = MemberSnapshot(name="gone", url="http://gone", asked_at=NOW, reachable=False, error="connection refused")
    leaving = box("leaving", "dgx-station", draining=True)
    r = route(Wanted(1), [gone, leaving], NOW)
    assert r.member is None
    assert r.reasons == {"gone": "unreachable (connection refused)", "leaving": "draining (being removed): no new jobs"}
    cluster = MemberSnapshot(name="hpc", url="http://hpc", asked_at=NOW, reachable=True, backend="slurm",
                             partitions=(("gpu", 2, 4),))  # fmt: skip
    assert route(Wanted(4, nodes=2), [cluster, box("one", "dgx-station")], NOW).member == "hpc"
    assert route(Wanted(8, nodes=1), [cluster], NOW).reasons["hpc"].startswith("no partition has 1 node(s) of 8 GPUs")


def test_jobs_routed_in_one_pass_do_not_count_on_the_same_devices() -> None:
    a, b = box("a", "dgx-station"), box("b", "dgx-station")
    first = route(Wanted(4, max_runtime=100), [a, b], NOW)
    assert first.member == "a"
    a2 = after(Wanted(4, max_runtime=100), a, NOW)
    assert a2.free_now == [] and a2.free == ((0.0, 0), (100.0, 4))
    second = route(Wanted(4, max_runtime=100), [a2, b], NOW)
    assert second.member == "b" and second.reasons["a"] == "about 2 min in queue (none queued there)"
    a3 = after(Wanted(4, max_runtime=50), a2, NOW)  # queued behind the first: it takes [100, 150)
    assert a3.queued == 1 and a3.free == ((0.0, 0), (100.0, 0), (150.0, 4))


def test_a_snapshot_is_read_from_a_members_status() -> None:
    topo = machine("dgx1-v100")
    status = {
        "devices": [
            {"index": i, "kind": "cuda", "job": "7" if i < 2 else None, "user": "ann" if i < 2 else None, "name": None}
            for i in range(8)
        ],
        "queued": 1,
        "running": 1,
        "free": [[0.0, 6], [30.0, 8]],
        "topology": {
            "name": topo.name,
            "devices": 8,
            "matrix": format_topo_matrix(topo, legend=False),
            "partitions": [],
        },
        "software": {"deskpod": "0.1.0", "torch": "2.5.0", "cuda": "12.4", "driver": "550.54"},
    }
    s = from_status("box-a", "http://a", status, NOW, False)
    assert s.free_now == [2, 3, 4, 5, 6, 7] and s.queued == 1 and s.free == ((0.0, 6), (30.0, 8))
    assert s.topology is not None and s.topology.device_count == 8
    assert [[lk.kind for lk in row] for row in s.topology.links] == [[lk.kind for lk in row] for row in topo.links]
    assert s.to_json()["software"]["driver"] == "550.54"


def test_waits_read_as_words() -> None:
    assert [about(s) for s in (0.2, 45, 600, 5400, 7200, 36000)] == [
        "about 1 s", "about 45 s", "about 10 min", "about 1.5 h", "about 2.0 h", "about 10 h"]  # fmt: skip


def test_a_member_whose_health_check_failed_gets_no_job_until_one_passes() -> None:
    from dataclasses import replace

    from deskpod.fleet.health import HealthCheck

    sick = HealthCheck(state="failed", at=NOW, failing=("all all-reduce: RuntimeError: no address for nosuch0",))
    big = replace(box("big", "dgx1-v100"), health=sick)  # 8 GPUs free: it would win
    small = box("small", "dgx-station", {0: "1", 1: "1"})
    r = route(Wanted(2), [big, small], NOW)
    assert r.member == "small"
    assert r.reasons["big"] == (
        "failed its health check (all all-reduce: RuntimeError: no address for nosuch0): no new jobs"
    )
    assert route(Wanted(2), [big], NOW).member is None
    unknown = HealthCheck(state="unknown", at=NOW, error="doctor: timed out")  # not asked: not taken off
    assert route(Wanted(2), [replace(big, health=unknown), small], NOW).member == "big"
    healed = replace(sick, state="passed", failing=(), at=NOW + 60)
    assert route(Wanted(2), [replace(big, health=healed), small], NOW).member == "big"


def test_a_job_naming_a_device_kind_goes_only_to_members_of_that_kind() -> None:
    gpus = box("gpus", "dgx-station", {i: "1" for i in range(4)}, free=((0.0, 0), (600.0, 4)))  # busy 10 min
    cpus = MemberSnapshot(name="cpus", url="http://cpus", asked_at=NOW, reachable=True, kind="cpu",
                          devices=tuple(Holder(i, None, None) for i in range(4)),
                          topology=from_status("x", "", {"devices": [{"index": 0, "kind": "cpu"}],
                                                         "topology": {"name": "cpu", "devices": 4}}, NOW,
                                               False).topology, free=((0.0, 4),))  # fmt: skip
    assert route(Wanted(2, max_runtime=60), [gpus, cpus], NOW).member == "cpus"  # free now beats 10 min
    r = route(Wanted(2, max_runtime=60, kind="cuda"), [gpus, cpus], NOW)
    assert r.member == "gpus"
    assert r.reasons["cpus"] == "has CPU slots, the job wants GPUs (device_kind = 'cuda')"
    assert route(Wanted(2, kind="cpu"), [gpus], NOW).reasons["gpus"] == (
        "has GPUs, the job wants CPU slots (device_kind = 'cpu')"
    )
    # a cluster: a partition with GPUs is cuda, one without is cpu
    hpc = MemberSnapshot(name="hpc", url="http://hpc", asked_at=NOW, reachable=True, backend="slurm",
                         partitions=(("gpu", 2, 4), ("cpu", 8, 0)))  # fmt: skip
    assert route(Wanted(2, nodes=4, kind="cpu"), [hpc], NOW).member == "hpc"
    assert route(Wanted(2, nodes=4, kind="cuda"), [hpc], NOW).reasons["hpc"] == (
        "no partition has 4 node(s) of 2 GPUs (gpu: 2 nodes x 4 GPUs, cpu: 8 nodes x 0 GPUs)"
    )
    only_gpus = replace(hpc, partitions=(("gpu", 2, 4),))
    assert (
        route(Wanted(1, kind="cpu"), [only_gpus], NOW)
        .reasons["hpc"]
        .startswith("no partition has 1 node(s) of CPUs (no GPUs)")
    )


def test_among_equal_starts_the_member_with_the_jobs_stack_built_wins_and_says_so() -> None:
    a, b = box("a", "dgx-station"), box("b", "dgx-station", stacks=("pytorch@v2",))
    r = route(Wanted(2, stack="pytorch@v2"), [a, b], NOW)
    assert r.member == "b"  # "a" would win by name
    assert r.reasons == {
        "b": "2 GPUs free now; pytorch@v2 built there",
        "a": "2 GPUs free now; pytorch@v2 not built there yet",
    }
    assert route(Wanted(2, stack="pytorch@v3"), [a, b], NOW).member == "a"  # an older version does not count
    assert route(Wanted(2), [a, b], NOW).reasons["b"] == "2 GPUs free now"  # a job without a stack: no word of it
    # the stack is a tie-breaker only: a sooner start wins over a built stack
    busy = box("b", "dgx-station", {i: "1" for i in range(4)}, free=((0.0, 0), (600.0, 4)), stacks=("pytorch@v2",))
    assert route(Wanted(2, max_runtime=60, stack="pytorch@v2"), [a, busy], NOW).member == "a"


def test_among_clusters_the_one_with_the_jobs_data_staged_wins_and_says_so() -> None:
    hpc = MemberSnapshot(name="a-hpc", url="http://a", asked_at=NOW, reachable=True, backend="slurm",
                         partitions=(("gpu", 2, 4),), scratch="/tmp/deskpod-scratch")  # fmt: skip
    staged = replace(hpc, name="b-hpc", queued=2, staged=("/shared/other", "/shared/imagenet"))
    job = Wanted(4, data="/shared/imagenet", scratch="/tmp/deskpod-scratch")
    r = route(job, [hpc, staged], NOW)
    assert r.member == "b-hpc"  # before the shorter queue and the name
    assert r.reasons == {
        "b-hpc": "a Slurm cluster, which decides when (2 queued there); imagenet staged there",
        "a-hpc": "a Slurm cluster, which decides when (0 queued there); imagenet not staged there yet",
    }
    assert route(replace(job, data="/shared/./imagenet/"), [hpc, staged], NOW).member == "b-hpc"  # same path
    assert route(replace(job, data="/shared/imagenet-2"), [hpc, staged], NOW).member == "a-hpc"  # another dataset
    # a copy in another scratch folder than the one the job stages into does not count
    other = replace(job, scratch="/local/scratch")
    assert route(other, [hpc, staged], NOW).reasons["b-hpc"].endswith("imagenet not staged there yet")
    assert route(replace(job, scratch=None), [hpc, staged], NOW).member == "b-hpc"
    # a job that stages nothing: no word of data, the shorter queue wins
    plain = route(Wanted(4), [hpc, staged], NOW)
    assert (plain.member, plain.reasons["b-hpc"]) == ("a-hpc", "a Slurm cluster, which decides when (2 queued there)")
    # a built stack ranks before staged data
    built = replace(hpc, stacks=("pytorch@v2",))
    r = route(replace(job, stack="pytorch@v2"), [built, staged], NOW)
    assert r.member == "a-hpc"
    assert r.reasons["a-hpc"].endswith("pytorch@v2 built there; imagenet not staged there yet")
    # staged data only breaks ties: a box that can start now wins, and a box (it stages nothing) gets no word of it
    now_box = box("box", "dgx-station")
    assert route(job, [staged, now_box], NOW).reasons == {
        "box": "4 GPUs free now",
        "b-hpc": "a Slurm cluster, which decides when (2 queued there); imagenet staged there",
    }


def test_a_clusters_staged_datasets_are_read_from_its_status() -> None:
    status = {"devices": [], "backend": {"name": "slurm", "partitions": [],
                                         "scratch": "/raid/scratch", "staged": ["/shared/imagenet"]}}  # fmt: skip
    snap = from_status("hpc", "http://hpc", status, NOW, False)
    assert (snap.scratch, snap.staged) == ("/raid/scratch", ("/shared/imagenet",))
    assert snap.to_json()["staged"] == ["/shared/imagenet"]
    old = from_status("hpc", "http://hpc", {"devices": [], "backend": {"name": "slurm"}}, NOW, False)
    assert (old.scratch, old.staged) == ("", ())  # a member from before: nothing staged


def test_a_train_job_that_stages_its_data_names_its_source_and_scratch() -> None:
    train = {"config": "x.toml", "data": "imagefolder:/shared/imagenet"}
    spec = parse_spec({"train": train, "slurm": {"stage_data": True}})
    assert staged_data(spec) == ("/shared/imagenet", "/tmp/deskpod-scratch")
    assert wanted(spec).data == "/shared/imagenet"
    spec = parse_spec({"train": train, "slurm": {"stage_data": True, "scratch": "/raid/s"}})
    assert staged_data(spec) == ("/shared/imagenet", "/raid/s")
    fmnist = parse_spec({"train": {"config": "x.toml"}, "env": {"DESKPOD_FASHION_MNIST": "/d/fm"},
                         "slurm": {"stage_data": True}})  # fmt: skip
    assert staged_data(fmnist)[0] == "/d/fm"
    assert staged_data(parse_spec({"train": train})) == (None, None)  # no stage_data
    synthetic = {"config": "x.toml", "data": "synthetic"}
    assert staged_data(parse_spec({"train": synthetic, "slurm": {"stage_data": True}})) == (None, None)
    assert staged_data(parse_spec({"command": ["true"], "slurm": {"stage_data": True}})) == (None, None)
