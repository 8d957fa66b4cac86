"""The limits policy: which cores, how much memory and how many tasks a job gets, and settings refused with a reason."""

from __future__ import annotations

from dataclasses import replace

import pytest

from deskpod.envs.limits import (
    Box,
    Limits,
    LimitSettings,
    gpu_cores,
    job_limits,
    kernel_tasks,
    parse_job_memory,
    parse_job_tasks,
    slot_cores,
    split_cores,
)
from deskpod.errors import ConfigError
from deskpod.hardware.affinity import format_cpu_list
from deskpod.hardware.catalog import machine

GiB = 2**30
DEFAULTS = LimitSettings()


def cpus(limits: Limits) -> str:
    assert limits.cpus is not None
    return format_cpu_list(limits.cpus)


def test_a_2_slot_box_gives_each_slot_its_core_half_the_memory_and_1024_tasks() -> None:
    box = Box(kind="cpu", devices=2, cores=(0, 1), memory_bytes=24 * GiB, kernel_tasks=32768)
    assert job_limits(DEFAULTS, box, [1]) == Limits(cpus=(1,), memory_bytes=12 * GiB, tasks=1024)
    assert job_limits(DEFAULTS, box, [0]).cpus == (0,)
    assert job_limits(DEFAULTS, box, [0, 1]) == Limits(cpus=(0, 1), memory_bytes=24 * GiB, tasks=1024)


def test_a_1_core_box_has_two_slots_sharing_its_core() -> None:
    box = Box(kind="cpu", devices=2, cores=(3,), memory_bytes=8 * GiB)
    assert job_limits(DEFAULTS, box, [0]).cpus == job_limits(DEFAULTS, box, [1]).cpus == (3,)


def test_a_16_core_8_slot_box_gives_each_slot_two_cores_of_the_daemons_affinity() -> None:
    box = Box(kind="cpu", devices=8, cores=tuple(range(16)), memory_bytes=64 * GiB, kernel_tasks=32768)
    assert [slot_cores(i, 8, box.cores) for i in range(8)] == [(2 * i, 2 * i + 1) for i in range(8)]
    limits = job_limits(DEFAULTS, box, [3, 5])
    assert cpus(limits) == "6-7,10-11"
    assert limits.memory_bytes == 16 * GiB and limits.tasks == 1024  # max(1024, 256 x 4 cores)
    everything = job_limits(DEFAULTS, box, range(8))
    assert cpus(everything) == "0-15" and everything.memory_bytes == 64 * GiB and everything.tasks == 4096
    moved = replace(box, cores=tuple(range(16, 32)))  # a daemon started with taskset -c 16-31
    assert cpus(job_limits(DEFAULTS, moved, [0])) == "16-17"


def test_a_dgx1_gives_each_gpu_a_quarter_of_its_sockets_cores_hyperthreads_together() -> None:
    topo = machine("dgx1-v100")  # CPU Affinity 0-19,40-59 for GPUs 0-3, 20-39,60-79 for GPUs 4-7 (recorded)
    box = Box(kind="cuda", devices=8, cores=tuple(range(80)), memory_bytes=512 * GiB, topology=topo,
              kernel_tasks=4194304)  # fmt: skip
    shares = [format_cpu_list(gpu_cores(topo, g, box.cores)) for g in range(8)]
    assert shares == ["0-4,40-44", "5-9,45-49", "10-14,50-54", "15-19,55-59",
                      "20-24,60-64", "25-29,65-69", "30-34,70-74", "35-39,75-79"]  # fmt: skip
    one = job_limits(DEFAULTS, box, [5])
    assert cpus(one) == "25-29,65-69" and one.memory_bytes == 64 * GiB and one.tasks == 2560
    two = job_limits(DEFAULTS, box, [0, 1])
    assert cpus(two) == "0-9,40-49" and two.memory_bytes == 128 * GiB and two.tasks == 5120
    assert job_limits(DEFAULTS, box, range(8)).tasks == 20480


def test_the_kernels_task_limit_caps_the_default_by_the_jobs_share() -> None:
    box = Box(kind="cuda", devices=8, cores=tuple(range(80)), memory_bytes=512 * GiB, topology=machine("dgx1"),
              kernel_tasks=8192)  # fmt: skip
    assert job_limits(DEFAULTS, box, [0]).tasks == 1024  # 2560 by cores, but an eighth of 8192 is 1024
    assert job_limits(LimitSettings(job_tasks=5000), box, [0]).tasks == 5000, "a number set by the pod is kept"


def test_a_gpu_whose_cores_are_unknown_or_not_the_daemons_gets_every_core() -> None:
    topo = machine("dgx1-v100")
    socket0 = tuple(range(20)) + tuple(range(40, 60))
    assert gpu_cores(topo, 4, socket0) == socket0  # the daemon runs on socket 0 only: GPU 4's cores are not its
    assert gpu_cores(None, 0, (0, 1, 2)) == (0, 1, 2)
    blind = replace(topo, devices=tuple(replace(d, cpu_affinity="") for d in topo.devices))
    box = Box(kind="cuda", devices=8, cores=(0, 1, 2, 3), memory_bytes=GiB, topology=blind)
    assert job_limits(DEFAULTS, box, [7]).cpus == (0, 1, 2, 3)
    with pytest.raises(ConfigError, match="GPU 8 is not on 'dgx1-v100': it has GPUs 0-7"):
        gpu_cores(topo, 8, socket0)


def test_split_cores_keeps_runs_together_and_shares_when_there_are_too_few() -> None:
    assert split_cores(range(8), 2) == ((0, 1, 2, 3), (4, 5, 6, 7))
    assert split_cores([0, 1, 2, 3, 8, 9, 10, 11], 2) == ((0, 1, 8, 9), (2, 3, 10, 11))
    assert split_cores(range(6), 4) == ((0,), (1, 2), (3,), (4, 5))  # runs that do not split evenly: cut the list
    assert split_cores([5, 6], 4) == ((5,), (5,), (6,), (6,))  # fewer cores than GPUs: shared


def test_settings_other_than_the_defaults() -> None:
    box = Box(kind="cpu", devices=2, cores=(0, 1), memory_bytes=24 * GiB)
    free = LimitSettings(job_memory=None, job_tasks=None, pin_cpus=False)
    assert job_limits(free, box, [0]) == Limits()
    fixed = LimitSettings(job_memory=4 * GiB, job_tasks=300)
    assert job_limits(fixed, box, [0]) == Limits(cpus=(0,), memory_bytes=4 * GiB, tasks=300)
    assert job_limits(LimitSettings(pin_cpus=False), box, [0]).cpus is None
    assert Limits(cpus=(3, 1, 2), memory_bytes=2 * GiB, tasks=50).describe() == "cores 1-3, memory 2.0 GiB, 50 tasks"
    assert Limits().describe() == "no limits"


def test_flags_parse_into_settings() -> None:
    assert parse_job_memory("16G") == 16 * GiB and parse_job_memory("512MiB") == 512 * 2**20
    assert parse_job_memory(" share ") == "share" and parse_job_memory("NONE") is None
    assert parse_job_memory("1.5g") == 3 * GiB // 2
    assert (
        parse_job_tasks("4096") == 4096 and parse_job_tasks("default") == "default" and parse_job_tasks("none") is None
    )


@pytest.mark.parametrize(
    ("make", "message"),
    [
        (lambda: parse_job_memory("lots"), r"--job-memory 'lots': use 'share', 'none' or a size like 16G"),
        (lambda: parse_job_memory("1K"), r"job memory 1024: use 'share'.*at least 16.0 MiB"),
        (lambda: parse_job_tasks("-1"), r"--job-tasks '-1': use 'default', 'none' or a number like 4096"),
        (lambda: parse_job_tasks("１２"), r"--job-tasks '１２'"),
        (lambda: parse_job_tasks("4"), r"job tasks 4: .*at least 8"),
        (lambda: LimitSettings(job_memory="half"), r"job memory 'half'"),  # type: ignore[arg-type]
        (lambda: LimitSettings(job_tasks=True), r"job tasks True"),
        (lambda: LimitSettings(pin_cpus="yes"), r"pin_cpus 'yes': expected true or false"),  # type: ignore[arg-type]
        (lambda: Limits(cpus=()), r"cpus \(\): no core"),
        (lambda: Limits(cpus=(0, -1)), r"cpus \(0, -1\): core -1 is not a core number"),
        (lambda: Limits(cpus=(2, 2)), r"cpus \(2, 2\) names a core twice"),
        (lambda: Limits(memory_bytes=1000), r"memory_bytes 1000: .*at least 16777216"),
        (lambda: Limits(tasks=3), r"tasks 3: .*at least 8"),
        (lambda: Box(kind="cpu", devices=2, cores=(), memory_bytes=GiB), r"the daemon may run on no core"),
        (lambda: Box(kind="tpu", devices=2, cores=(0,), memory_bytes=GiB), r"box kind 'tpu'"),  # type: ignore[arg-type]
    ],
)
def test_bad_settings_are_refused_naming_the_value(make: object, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        make()  # type: ignore[operator]


def test_a_job_naming_devices_the_box_does_not_have_is_refused() -> None:
    box = Box(kind="cuda", devices=8, cores=(0, 1), memory_bytes=GiB, topology=machine("dgx1-v100"))
    with pytest.raises(ConfigError, match=r"job devices \[8\]: device 8 is not one; this box has devices 0-7"):
        job_limits(DEFAULTS, box, [8])
    with pytest.raises(ConfigError, match=r"job devices \[1, 1\]: a device named twice"):
        job_limits(DEFAULTS, box, [1, 1])


def test_a_job_holding_no_devices_gets_one_devices_share_unpinned() -> None:
    """TensorBoard holds no devices: its cgroup has one device's memory and tasks, on the pod's cores."""
    box = Box(kind="cpu", devices=4, cores=(0, 1, 2, 3), memory_bytes=8 * GiB, kernel_tasks=4000)
    one, none = job_limits(DEFAULTS, box, [2]), job_limits(DEFAULTS, box, [])
    assert one.cpus == (2,) and none.cpus is None
    assert none.memory_bytes == one.memory_bytes == 2 * GiB and none.tasks == one.tasks


def test_this_boxs_kernel_task_limit_is_read() -> None:
    limit = kernel_tasks()
    assert limit is not None and limit >= 1
    assert Box.read("cpu", 2).memory_bytes > 0
