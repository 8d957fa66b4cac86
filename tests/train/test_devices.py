from __future__ import annotations

import pytest

from deskpod.environment import Environment
from deskpod.errors import DeviceError
from deskpod.hardware.devices import cpu_slots, discover, discover_gpus, parse_device_spec


def env(cores: int = 2, cvd: tuple[str, ...] | None = None) -> Environment:
    from pathlib import Path

    return Environment(home=Path("/tmp"), cuda_visible_devices=cvd, cpu_count=cores, fashion_mnist_dir=Path("/x"))


class RecordedH200x8:
    """NVML's answers on an 8× H200 HGX box, as nvidia-smi reports them (name, 143771 MiB; see
    ../shared/reference/hardware.md). UUIDs are shortened for the test."""

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
