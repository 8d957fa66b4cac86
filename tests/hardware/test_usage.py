"""Live usage: /proc arithmetic on canned text, the sampler's shared sample, this machine's real /proc, NVML."""

from __future__ import annotations

import os
import time
from typing import Any

import pynvml
import pytest

from deskpod.hardware.usage import (
    CpuTimes,
    GpuUse,
    NvmlUsage,
    UsageSampler,
    busy_percent,
    open_nvml,
    parse_loadavg,
    parse_meminfo,
    parse_proc_stat,
)

# /proc/stat as this machine printed it (2 cores), and the same counters some ticks later.
STAT_1 = """cpu  44206 1 7698 156816 776 0 266 123 0 0
cpu0 18353 0 3402 82466 530 0 124 62 0 0
cpu1 25852 0 4296 74350 246 0 141 60 0 0
intr 481089 0 0 0
ctxt 671445
"""
# cpu0: +60 user, +10 system, +130 idle -> 70 busy of 200 ticks = 35 %.
# cpu1: +190 user, +0 system, +10 idle, iowait 246 -> 240 (a counter that stepped back) -> busy 190 of 194 ticks.
STAT_2 = """cpu  44456 1 7708 156956 770 0 266 123 0 0
cpu0 18413 0 3412 82596 530 0 124 62 0 0
cpu1 26042 0 4296 74360 240 0 141 60 0 0
intr 481189 0 0 0
ctxt 672445
"""
MEMINFO = """MemTotal:       24684092 kB
MemFree:        12956016 kB
MemAvailable:   24133448 kB
Buffers:          123456 kB
"""
LOADAVG = "0.31 0.32 0.41 2/90 10470\n"


def test_proc_stat_lines_become_busy_and_total_ticks() -> None:
    stat = parse_proc_stat(STAT_1)
    assert set(stat) == {"cpu", "cpu0", "cpu1"}
    # busy = user + nice + system + irq + softirq + steal; total adds idle and iowait.
    assert stat["cpu0"] == CpuTimes(18353 + 3402 + 124 + 62, 18353 + 3402 + 124 + 62 + 82466 + 530)
    assert stat["cpu"] == CpuTimes(44206 + 1 + 7698 + 266 + 123, 44206 + 1 + 7698 + 266 + 123 + 156816 + 776)
    assert parse_proc_stat("cpu0 1 2 x\ncpu1 1 0 0 9\n") == {"cpu1": CpuTimes(1, 10)}  # a garbled line is skipped


def test_busy_percent_is_the_busy_share_of_the_ticks_between_two_samples() -> None:
    a, b = parse_proc_stat(STAT_1), parse_proc_stat(STAT_2)
    assert busy_percent(a["cpu0"], b["cpu0"]) == 35.0
    assert busy_percent(a["cpu1"], b["cpu1"]) == round(100 * 190 / 194, 1)
    assert busy_percent(a["cpu0"], a["cpu0"]) is None  # no tick passed: no figure, not 0 %
    assert busy_percent(CpuTimes(10, 20), CpuTimes(5, 30)) == 0.0  # busy counter stepped back: clamped


def test_meminfo_and_loadavg() -> None:
    used, total = parse_meminfo(MEMINFO) or (0, 0)
    assert total == 24684092 * 1024 and used == (24684092 - 24133448) * 1024
    # Without MemAvailable (kernels before 3.14): free + buffers + cached counts as available.
    old = parse_meminfo("MemTotal: 1000 kB\nMemFree: 100 kB\nBuffers: 50 kB\nCached: 250 kB\n")
    assert old == ((1000 - 400) * 1024, 1000 * 1024)
    assert parse_meminfo("nothing here") is None
    assert parse_loadavg(LOADAVG) == (0.31, 0.32, 0.41)
    assert parse_loadavg("") is None


class FakeProc:
    """/proc files from a dict; counts the reads of each."""

    def __init__(self, files: dict[str, str]) -> None:
        self.files = files
        self.reads: dict[str, int] = {}

    def __call__(self, path: str) -> str:
        self.reads[path] = self.reads.get(path, 0) + 1
        if path not in self.files:
            raise FileNotFoundError(path)
        return self.files[path]


class Clock:
    def __init__(self) -> None:
        self.t = 100.0

    def __call__(self) -> float:
        return self.t


def test_the_sampler_reports_deltas_between_samples_and_shares_each_one() -> None:
    proc, clock = FakeProc({"/proc/stat": STAT_1, "/proc/meminfo": MEMINFO, "/proc/loadavg": LOADAVG}), Clock()
    sampler = UsageSampler(gpus=lambda: None, read=proc, clock=clock, max_age_s=1.0)  # baseline: STAT_1
    proc.files["/proc/stat"] = STAT_2
    clock.t += 2.0
    first = sampler.latest()
    assert first.source == "proc" and first.gpus == ()
    assert first.cores == (35.0, round(100 * 190 / 194, 1)) and first.interval_s == 2.0
    assert first.cpu == busy_percent(parse_proc_stat(STAT_1)["cpu"], parse_proc_stat(STAT_2)["cpu"])
    assert (first.memory_used, first.memory_total) == parse_meminfo(MEMINFO)
    assert first.load == (0.31, 0.32, 0.41)
    # Fifty readers within max_age_s: one read of /proc between them.
    reads = dict(proc.reads)
    clock.t += 0.5
    assert all(sampler.latest() is first for _ in range(50))
    assert proc.reads == reads and sampler.samples == 1
    # Later, the next sample is the delta since the last one: no tick passed -> averages since boot, said so.
    clock.t += 1.0
    again = sampler.latest()
    assert again is not first and sampler.samples == 2 and proc.reads["/proc/stat"] == reads["/proc/stat"] + 1
    assert again.interval_s is None
    assert again.cores[0] == busy_percent(CpuTimes(0, 0), parse_proc_stat(STAT_2)["cpu0"])
    json = again.to_json()
    assert set(json) == {"source", "gpus", "cpu", "memory", "load"} and json["cpu"]["interval_s"] is None


def test_without_proc_the_sampler_answers_with_no_figures_not_an_error() -> None:
    sampler = UsageSampler(gpus=lambda: None, read=FakeProc({}), clock=Clock())
    got = sampler.latest()
    assert got.cpu is None and got.cores == () and got.memory_total is None


def test_this_machines_proc_gives_sane_figures() -> None:
    """The real /proc of the machine the tests run on, two samples apart."""
    sampler = UsageSampler(gpus=lambda: None, max_age_s=0.0)
    deadline = time.monotonic() + 0.3
    while time.monotonic() < deadline:  # keep a core busy so some ticks pass
        sum(i * i for i in range(1000))
    got = sampler.latest()
    with open("/proc/stat") as f:
        cores = [line.split()[0] for line in f if line.startswith("cpu") and line[3].isdigit()]
    assert len(got.cores) == len(cores) >= 1
    figures = [x for x in (got.cpu, *got.cores) if x is not None]
    assert figures and all(0.0 <= x <= 100.0 for x in figures)
    assert got.interval_s is None or got.interval_s > 0
    with open("/proc/meminfo") as f:
        total_kb = int(next(line for line in f if line.startswith("MemTotal:")).split()[1])
    assert got.memory_total == total_kb * 1024
    assert got.memory_used is not None and 0 < got.memory_used < got.memory_total
    assert got.load is not None and all(x >= 0 for x in got.load)
    assert got.load == pytest.approx(os.getloadavg(), abs=5.0)


# No NVML output was recorded on a GPU box for this module, so the GPU path is tested against a fake
# structured like pynvml's answers: the module's own ctypes structures (c_nvmlUtilization_t,
# c_nvmlMemory_t) and its NVMLError. The memory total is an H200's as nvidia-smi prints it, 143771 MiB
# (docs/reference/hardware.md#gpus); the used and utilization figures are made up.
H200_TOTAL = 143771 * 2**20


class FakePynvml:
    """The few pynvml functions `NvmlUsage` calls, answering like pynvml does (bytes names on old versions)."""

    NVMLError = pynvml.NVMLError

    def __init__(self, gpus: list[dict[str, Any]]) -> None:
        self.gpus = gpus
        self.inits = 0

    def nvmlInit(self) -> None:
        self.inits += 1

    def nvmlDeviceGetCount(self) -> int:
        return len(self.gpus)

    def nvmlDeviceGetHandleByIndex(self, i: int) -> int:
        return i

    def nvmlDeviceGetUUID(self, h: int) -> str:
        return str(self.gpus[h]["uuid"])

    def nvmlDeviceGetName(self, h: int) -> bytes:
        return str(self.gpus[h]["name"]).encode()

    def nvmlDeviceGetUtilizationRates(self, h: int) -> Any:
        if self.gpus[h].get("util") is None:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_SUPPORTED)
        u = pynvml.c_nvmlUtilization_t()
        u.gpu, u.memory = self.gpus[h]["util"], 0
        return u

    def nvmlDeviceGetMemoryInfo(self, h: int) -> Any:
        m = pynvml.c_nvmlMemory_t()
        m.total, m.used = H200_TOTAL, self.gpus[h]["used"]
        m.free = m.total - m.used
        return m


def fake_box() -> FakePynvml:
    return FakePynvml(
        [
            {"uuid": "GPU-aaaa-0", "name": "NVIDIA H200", "util": 87, "used": 70 * 2**30},
            {"uuid": "GPU-bbbb-1", "name": "NVIDIA H200", "util": None, "used": 0},
            {"uuid": "GPU-cccc-2", "name": "NVIDIA H200", "util": 3, "used": 2**30},
        ]
    )


def test_nvml_figures_per_gpu_with_unsupported_ones_left_empty() -> None:
    nvml = fake_box()
    gpus = NvmlUsage(nvml).gpus()
    assert nvml.inits == 1
    assert [g.index for g in gpus] == [0, 1, 2] and {g.name for g in gpus} == {"NVIDIA H200"}
    assert gpus[0] == GpuUse(0, "NVIDIA H200", 87.0, 70 * 2**30, H200_TOTAL)
    assert gpus[1].utilization is None and gpus[1].memory_used == 0  # NOT_SUPPORTED: no figure, no crash
    assert gpus[0].to_json()["memory_total"] == H200_TOTAL


def test_nvml_follows_cuda_visible_devices_like_the_pods_device_indices() -> None:
    # CUDA_VISIBLE_DEVICES=2,GPU-aaaa: device 0 is physical GPU 2, device 1 is physical GPU 0.
    gpus = NvmlUsage(fake_box(), visible=["2", "GPU-aaaa"]).gpus()
    assert [(g.index, g.utilization) for g in gpus] == [(0, 3.0), (1, 87.0)]


def test_the_sampler_adds_nvml_figures_and_survives_a_driver_that_goes_away() -> None:
    nvml = fake_box()
    opened: list[NvmlUsage] = []

    def open_fake() -> NvmlUsage:
        opened.append(NvmlUsage(nvml))
        return opened[-1]

    clock = Clock()
    sampler = UsageSampler(gpus=open_fake, read=FakeProc({"/proc/stat": STAT_1}), clock=clock)
    got = sampler.latest()
    assert got.source == "nvml" and [g.utilization for g in got.gpus] == [87.0, None, 3.0]
    assert got.to_json()["gpus"][2]["memory_used"] == 2**30

    def gone(h: int) -> Any:
        raise RuntimeError("driver unloaded")

    nvml.nvmlDeviceGetMemoryInfo = gone  # type: ignore[method-assign]
    clock.t += 5
    after = sampler.latest()
    assert after.source == "proc" and after.gpus == () and len(opened) == 1  # opened once, CPU view carries on


def test_open_nvml_is_the_real_nvml_or_none() -> None:
    query = open_nvml()
    if query is None:  # this box: no driver (or no GPU) behind nvidia-ml-py
        with pytest.raises(pynvml.NVMLError):
            pynvml.nvmlInit()
        return
    gpus = query.gpus()
    assert gpus
    for g in gpus:
        assert g.utilization is None or 0 <= g.utilization <= 100
        assert g.memory_total and g.memory_used is not None and 0 <= g.memory_used <= g.memory_total
