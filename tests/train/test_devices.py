from __future__ import annotations

import os
from pathlib import Path

import pytest

from deskpod.environment import Environment
from deskpod.errors import DeviceError
from deskpod.hardware.affinity import numa_nodes
from deskpod.hardware.devices import cpu_layout, cpu_slots, discover, discover_gpus, parse_device_spec


def env(cores: int = 2, cvd: tuple[str, ...] | None = None) -> Environment:
    return Environment(home=Path("/tmp"), cuda_visible_devices=cvd, cpu_count=cores, fashion_mnist_dir=Path("/x"))


class RecordedH200x8:
    """NVML's answers on an 8× H200 HGX box, as nvidia-smi reports them (name, 143771 MiB; see
    docs/reference/hardware.md#gpus). UUIDs are shortened for the test."""

    def count(self) -> int:
        return 8

    def name(self, i: int) -> str:
        return "NVIDIA H200"

    def memory_bytes(self, i: int) -> int:
        return 143771 * 2**20

    def uuid(self, i: int) -> str:
        return f"GPU-{i}aaaaaaa-0000-0000-0000-000000000000"


@pytest.mark.parametrize(
    ("spec", "expected"),
    [("all", [0, 1, 2, 3]), ("2", [0, 1]), ("0,2,3", [0, 2, 3]), (3, [0, 1, 2]), ("1", [0])],
)
def test_device_spec(spec: str | int, expected: list[int]) -> None:
    assert parse_device_spec(spec, 4) == expected


@pytest.mark.parametrize(
    ("spec", "needle"),
    [("5", "asks for 5 devices but this machine has 4 GPUs"), ("0,7", "no device 7"), ("0", "asks for no device"),
     ("gpu0", "not a device list"), ("1,1", "named twice")],
)  # fmt: skip
def test_bad_device_spec(spec: str, needle: str) -> None:
    with pytest.raises(DeviceError) as e:
        parse_device_spec(spec, 4)
    assert needle in str(e.value)


def test_cpu_slots_share_the_cores() -> None:
    slots = cpu_slots(env(cores=8))
    assert len(slots) == 8 and all(s.threads == 1 for s in slots)
    one_core = cpu_slots(env(cores=1))
    assert len(one_core) == 2, "at least two workers so the distributed paths always run"
    inv = discover(env(cores=8), use_nvml=False)
    if inv.kind == "cpu":
        chosen = inv.select("2")
        assert [d.threads for d in chosen] == [4, 4], "2 of 8 slots get 4 threads each"


def test_gpus_from_nvml_respect_cuda_visible_devices() -> None:
    gpus = discover_gpus(RecordedH200x8(), env())
    assert len(gpus) == 8 and gpus[0].name == "NVIDIA H200" and gpus[0].memory_bytes == 143771 * 2**20
    picked = discover_gpus(RecordedH200x8(), env(cvd=("3", "5")))
    assert [g.uuid[4] for g in picked] == ["3", "5"] and [g.index for g in picked] == [0, 1]
    by_uuid = discover_gpus(RecordedH200x8(), env(cvd=("GPU-6aaa",)))
    assert [g.uuid[4] for g in by_uuid] == ["6"]
    stops = discover_gpus(RecordedH200x8(), env(cvd=("1", "9", "2")))
    assert [g.uuid[4] for g in stops] == ["1"], "like CUDA, the list ends at the first invalid entry"


def test_pod_cpu_slots_limit_the_inventory() -> None:
    from dataclasses import replace

    inv = discover(replace(env(cores=4), cpu_slots=(1, 3)), use_nvml=False)
    if inv.kind == "cpu":
        assert len(inv.devices) == 2 and inv.cores == 2 and [d.threads for d in inv.select("all")] == [1, 1]
        with pytest.raises(DeviceError, match="DESKPOD_CPU_SLOTS names slot 7"):
            discover(replace(env(cores=4), cpu_slots=(7,)), use_nvml=False)


def _sysfs(root: Path, nodes: dict[int, str]) -> Path:
    """A NUMA node folder as Linux writes it (``node<N>/cpulist``, beside files that are not nodes)."""
    for n, cpulist in nodes.items():
        (root / f"node{n}").mkdir(parents=True)
        (root / f"node{n}" / "cpulist").write_text(cpulist + "\n")
    (root / "online").write_text(",".join(str(n) for n in nodes) + "\n")
    return root


def test_numa_nodes_group_the_allowed_cores(tmp_path: Path) -> None:
    # The DGX-1's two sockets (its topo -m CPU Affinity column: 0-19,40-59 and 20-39,60-79).
    dgx = _sysfs(tmp_path / "dgx", {1: "20-39,60-79", 0: "0-19,40-59"})
    groups = numa_nodes(range(80), dgx)
    assert [len(g) for g in groups] == [40, 40] and groups[0][:2] == (0, 1) and 60 in groups[1]
    # A process allowed a few cores of each socket sees only those; a node with none of them is left out.
    assert numa_nodes({3, 22, 41}, dgx) == ((3, 41), (22,))
    assert numa_nodes({5, 6}, dgx) == ((5, 6),)
    # No nodes listed (a container without sysfs): every allowed core is one node; none is ever dropped.
    assert numa_nodes({0, 1}, tmp_path / "missing") == ((0, 1),)
    assert numa_nodes({0, 1, 90}, dgx) == ((0, 1, 90),)


def test_cpu_layout_is_one_worker_per_numa_node() -> None:
    inv = discover(env(cores=8), use_nvml=False)
    if inv.kind != "cpu":
        pytest.skip("a GPU is visible: the CPU layout is not what --devices all means here")
    one = cpu_layout(inv, [tuple(range(8))])
    assert [d.threads for d in one.devices] == [8] and one.cores == ()
    assert "1 worker of 8 threads" in one.reason
    two = cpu_layout(inv, [(0, 1, 2, 3), (4, 5, 6, 7)])
    assert [d.threads for d in two.devices] == [4, 4] and two.cores == ((0, 1, 2, 3), (4, 5, 6, 7))
    assert sum(d.memory_bytes for d in two.devices) <= sum(d.memory_bytes for d in inv.devices)
    # Cores the pod service shares out without naming them: the same workers, unpinned.
    assert cpu_layout(inv, [(0, 1, 2, 3), (4, 5, 6, 7)], pin=False).cores == ()
    # Never more workers than the job has slots.
    from dataclasses import replace

    single = discover(replace(env(cores=8), cpu_slots=(5,)), use_nvml=False)
    got = cpu_layout(single, [(0, 1, 2, 3), (4, 5, 6, 7)])
    assert [d.threads for d in got.devices] == [1] and got.cores == ()


def test_devices_all_on_cpus_trains_one_worker_per_numa_node(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import json

    from deskpod.hardware import affinity
    from deskpod.train import launcher

    cores = sorted(os.sched_getaffinity(0))
    inv = discover(env(cores=len(cores)), use_nvml=False)
    if inv.kind != "cpu":
        pytest.skip("a GPU is visible: the CPU layout is not what --devices all means here")
    base = {"model": "mlp", "data": "synthetic:1x8x8", "steps": 1, "out": str(tmp_path)}

    plan = launcher.prepare(None, {**base, "name": "one"}, resume=False, inventory=inv, env=env(len(cores)))
    assert len(plan.devices) == len(numa_nodes(cores)) and plan.cpu_pins == ()

    half = len(cores) // 2 or 1
    nodes = {0: ",".join(map(str, cores[:half])), 1: ",".join(map(str, cores[half:]))} if len(cores) > 1 else {0: "0"}
    monkeypatch.setattr(affinity, "NODE_DIR", _sysfs(tmp_path / "sys", nodes))
    plan = launcher.prepare(None, {**base, "name": "two"}, resume=False, inventory=inv, env=env(len(cores)))
    if len(cores) > 1:
        assert [d.threads for d in plan.devices] == [len(cores) // 2] * 2
        assert plan.cpu_pins == (tuple(cores[:half]), tuple(cores[half:]))
        launcher._write_run_folder(plan, "quiet", None)
        written = json.loads((plan.run_dir / "launch.json").read_text())["affinity"]
        assert [written[r]["cpus"] for r in ("0", "1")] == [cores[:half], cores[half:]]
    # Asked for explicitly, the count wins over the layout: the distributed paths on any box.
    plan = launcher.prepare(None, {**base, "name": "n", "devices": "2"}, resume=False, inventory=inv,
                            env=env(len(cores)))  # fmt: skip
    assert len(plan.devices) == 2 and plan.cpu_pins == ()


def test_the_run_folder_files_are_replaced_never_rewritten_in_place(tmp_path: Path) -> None:
    """Every node of a multi-node run rewrites config.toml and launch.json while the others may read them (a resumed
    attempt reads config.toml back): a file written in place is empty for a moment, and a reader then trains the
    default model. A hard link to the old file keeps the old text only when the new one was renamed over it."""
    from deskpod.train import launcher

    inv = discover(env(), use_nvml=False)
    base = {"model": "mlp", "data": "synthetic:1x8x8", "steps": 1, "out": str(tmp_path), "name": "r", "devices": "1"}
    plan = launcher.prepare(None, base, resume=False, inventory=inv, env=env())
    launcher._write_run_folder(plan, "quiet", None)
    olds = {}
    for name in ("config.toml", "launch.json"):
        path = plan.run_dir / name
        olds[name] = (path.read_text(), tmp_path / f"old-{name}")
        os.link(path, olds[name][1])
        path.write_text("")  # what a reader would see of a file being written in place
    launcher._write_run_folder(plan, "quiet", None)
    for name, (text, old) in olds.items():
        assert old.read_text() == "", name  # the old inode untouched: the new file came in by rename
        assert (plan.run_dir / name).read_text() == text, name
    assert 'model = "mlp"' in (plan.run_dir / "config.toml").read_text()
