"""Job cgroups on this machine's real cgroups, as root: limits that hold, kill that reaches everything, clean removal.

Every test process that joins a group does what the job's shim does: it writes its own pid into each of the
group's ``cgroup.procs`` files before it does anything else. Every cgroup a test makes is removed at teardown.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import secrets
import signal
import subprocess
import sys
import textwrap
from collections.abc import Callable, Iterator
from dataclasses import replace
from pathlib import Path

import pytest

from deskpod.envs.cgroups import DAEMON_LEAF, JobGroup, PodCgroups, detect, find_hierarchies
from deskpod.envs.limits import Limits
from deskpod.errors import ConfigError, ConflictError

JOIN = """\
import os, sys
for _path in sys.argv[1:]:
    with open(_path, "w") as _f:
        _f.write(str(os.getpid()))
"""
"""What the shim does first: join every hierarchy's group (the paths are the child's arguments)."""


def run_in(group: JobGroup, code: str, *, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """Run Python ``code`` in a child that joins ``group`` first; its output and return code."""
    argv = [sys.executable, "-c", JOIN + textwrap.dedent(code), *map(str, group.procs_files)]
    return subprocess.run(argv, capture_output=True, text=True, timeout=600, env=env)


@pytest.fixture(scope="module")
def pod() -> Iterator[PodCgroups]:
    found = detect(f"test-{os.getpid()}-{secrets.token_hex(3)}")
    if found.cgroups is None:
        pytest.skip(f"no usable cgroups here: {found.reason}")
    cgroups = found.cgroups
    try:
        yield cgroups
    finally:
        for job in cgroups.job_ids():
            group = cgroups.group(job)
            group.kill()
            group.remove()
        cgroups.remove()
        assert not any(cgroups.folder(h).exists() for h in cgroups.hierarchies)


@pytest.fixture
def new_group(pod: PodCgroups) -> Iterator[Callable[[Limits], JobGroup]]:
    """Make groups with fresh job ids; each is killed and removed at teardown, whatever happened."""
    made: list[JobGroup] = []

    def make(limits: Limits) -> JobGroup:
        group = pod.create(1000 + len(made) + 100 * secrets.randbelow(1000), limits)
        made.append(group)
        return group

    yield make
    for group in made:
        group.kill()
        group.remove()


@contextlib.contextmanager
def sleeper_in(group: JobGroup) -> Iterator[subprocess.Popen[bytes]]:
    """A ``sleep`` joined to ``group``; afterwards it is killed, and the group killed and removed, whatever happened."""
    sleeper = subprocess.Popen(["sleep", "1000"])
    try:
        group.join(sleeper.pid)
        yield sleeper
    finally:
        if sleeper.poll() is None:
            sleeper.kill()
            sleeper.wait()
        if group.exists():
            group.kill()
            group.remove()


def gone(pid: int) -> bool:
    """True when ``pid`` no longer runs (never existed again, or a zombie waiting for its parent)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] == "Z"
    except FileNotFoundError:
        return True


def test_detect_creates_the_pods_tree_under_the_daemons_own_cgroup(pod: PodCgroups) -> None:
    own = Path("/proc/self/cgroup").read_text()
    for h in pod.hierarchies:
        assert pod.folder(h).is_dir() and pod.folder(h).parent == h.base
        if h.version == 1:  # under this process's own cgroup in that hierarchy, not the host's root
            lines = [line.split(":", 2) for line in own.splitlines()]
            mine = next(path for _, cs, path in lines if h.controllers[0] in cs.split(","))
            assert str(h.base).endswith(mine.rstrip("/"))
    assert {c for h in pod.hierarchies for c in h.controllers} == {"cpuset", "memory", "pids"}
    assert pod.describe().startswith("cgroup v")


def test_a_group_with_20_tasks_refuses_the_30th_fork(new_group: Callable[[Limits], JobGroup]) -> None:
    group = new_group(Limits(tasks=20))
    out = run_in(
        group,
        """
        import json
        r, w = os.pipe()
        made, refused = [], []
        for _ in range(50):
            try:
                pid = os.fork()
            except OSError as e:
                refused.append(e.errno)
                continue
            if pid == 0:
                os.close(w)
                os.read(r, 1)  # wait until the parent has tried all 50
                os._exit(0)
            made.append(pid)
        os.close(w)
        for pid in made:
            os.waitpid(pid, 0)
        print(json.dumps({"made": len(made), "refused": refused}))
    """,
    )
    assert out.returncode == 0, out.stderr
    report = json.loads(out.stdout)
    assert report["made"] <= 19, report  # the child itself is the 20th task
    assert len(report["refused"]) >= 31 and set(report["refused"]) == {errno.EAGAIN}, report
    usage = group.usage()
    assert usage.tasks_refused >= len(report["refused"])
    assert usage.limits.tasks == 20
    assert any("task limit reached" in line and "limit 20" in line for line in usage.problems()), usage.problems()


def test_a_group_with_64_mib_oom_kills_a_256_mib_child_and_says_so(new_group: Callable[[Limits], JobGroup]) -> None:
    group = new_group(Limits(memory_bytes=64 * 2**20))
    out = run_in(
        group,
        """
        block = bytearray(256 * 2**20)
        for i in range(0, len(block), 4096):
            block[i] = 1  # touch every page: calloc'd pages cost nothing until written
        print("survived")
    """,
    )
    assert out.returncode == -signal.SIGKILL, (out.returncode, out.stdout, out.stderr)
    assert "survived" not in out.stdout
    usage = group.usage()
    assert usage.oom_kills >= 1, usage
    assert usage.memory_peak is not None and usage.memory_peak <= 64 * 2**20, usage
    assert usage.problems() == ("killed: out of memory (limit 64.0 MiB)",)


@pytest.mark.parametrize("which", ["first", "last"])
def test_a_group_pinned_to_one_core_runs_only_there(new_group: Callable[[Limits], JobGroup], which: str) -> None:
    cores = sorted(os.sched_getaffinity(0))
    core = cores[0] if which == "first" else cores[-1]
    group = new_group(Limits(cpus=(core,)))
    out = run_in(group, "print(sorted(os.sched_getaffinity(0)))")
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout) == [core]
    assert group.limits().cpus == (core,)


def test_kill_ends_a_grandchild_that_left_with_setsid(new_group: Callable[[Limits], JobGroup]) -> None:
    group = new_group(Limits(tasks=64))
    with subprocess.Popen(
        [sys.executable, "-c", JOIN + textwrap.dedent("""
            import subprocess, time
            escaped = subprocess.Popen(["sleep", "1000"], start_new_session=True)
            print(escaped.pid, flush=True)
            time.sleep(1000)
        """), *map(str, group.procs_files)],
        stdout=subprocess.PIPE, text=True,
    ) as child:  # fmt: skip
        assert child.stdout is not None
        grandchild = int(child.stdout.readline())
        assert os.getsid(grandchild) == grandchild != os.getsid(child.pid), "the grandchild has a session of its own"
        assert {child.pid, grandchild} <= group.pids()
        group.kill()  # the new_group teardown kills anything left if an assertion fails
        assert group.pids() == set()
        assert child.wait(timeout=60) == -signal.SIGKILL
        assert gone(grandchild)


def test_remove_leaves_nothing_and_refuses_while_a_process_lives(pod: PodCgroups) -> None:
    group = pod.create(424242, Limits(cpus=(sorted(os.sched_getaffinity(0))[0],), memory_bytes=2**30, tasks=100))
    with sleeper_in(group) as sleeper:
        with pytest.raises(ConflictError, match=f"job 424242's cgroup still holds processes {sleeper.pid}"):
            group.remove()
        with pytest.raises(ConflictError, match=str(sleeper.pid)):
            pod.create(424242, Limits())  # an earlier attempt's group with a live process is not taken over
        group.kill()
        sleeper.wait(timeout=60)
        group.remove()
        assert not any(folder.exists() for _, folder in group.folders)
        assert 424242 not in pod.job_ids() and pod.find(424242) is None
        group.remove()  # already gone: nothing to do


def test_a_restarted_daemon_finds_the_group_again_by_job_id(pod: PodCgroups) -> None:
    limits = Limits(cpus=(sorted(os.sched_getaffinity(0))[-1],), memory_bytes=512 * 2**20, tasks=300)
    group = pod.create(31337, limits)
    with sleeper_in(group) as sleeper:
        again = detect(pod.pod)  # a new daemon: a new detection, a new object
        assert again.cgroups is not None
        found = again.cgroups.find(31337)
        assert found is not None and found is not group
        assert found.procs_files == group.procs_files
        assert found.pids() == {sleeper.pid}
        assert found.limits() == limits
        assert 31337 in again.cgroups.job_ids()
        assert again.cgroups.find(31338) is None
        found.kill()
        assert sleeper.wait(timeout=60) == -signal.SIGKILL
        found.remove()
        assert group.exists() is False


def test_the_shim_gets_one_cgroup_argument_per_hierarchy(new_group: Callable[[Limits], JobGroup]) -> None:
    group = new_group(Limits())
    args = group.shim_args()
    assert args[::2] == ["--cgroup"] * len(group.procs_files)
    assert [Path(a) for a in args[1::2]] == list(group.procs_files)
    assert all(p.name == "cgroup.procs" and p.is_file() for p in group.procs_files)


def test_a_group_refuses_cores_the_pod_does_not_have(pod: PodCgroups) -> None:
    with pytest.raises(ConfigError, match=r"cores 4095 are not among the pod's cores"):
        pod.create(777, Limits(cpus=(4095,)))
    assert pod.find(777) is None, "a refused group leaves nothing behind"
    with pytest.raises(ConfigError, match="job id -1"):
        pod.group(-1)


def test_detect_as_an_ordinary_user_says_why_not() -> None:
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: become nobody, ask, report; never return into pytest
        try:
            os.setgroups([])
            os.setgid(65534)
            os.setuid(65534)
            found = detect(f"nobody-{os.getpid()}")
            os.write(w, json.dumps([found.cgroups is None, found.reason]).encode())
        finally:
            os._exit(0)
    os.close(w)
    with os.fdopen(r) as f:
        none, reason = json.loads(f.read())
    os.waitpid(pid, 0)
    assert none, reason
    assert "Permission denied" in reason and "only as root" in reason


def test_find_hierarchies_reads_a_hybrid_box_and_says_what_is_missing(tmp_path: Path) -> None:
    mountinfo = textwrap.dedent(r"""
        31 23 0:28 / /sys/fs/cgroup rw - tmpfs tmpfs rw
        34 31 0:31 / /sys/fs/cgroup/cpuset rw - cgroup cgroup rw,cpuset
        35 31 0:32 / /sys/fs/cgroup/memory rw - cgroup cgroup rw,memory
        39 31 0:36 / /sys/fs/cgroup/pi\040ds rw - cgroup cgroup rw,pids
        41 31 0:38 / /sys/fs/cgroup/unified rw - cgroup2 cgroup2 rw
    """)
    own = "8:pids:/\n4:memory:/process_api/abc\n3:cpuset:/\n0::/\n"
    found = {h.controllers: h for h in find_hierarchies(mountinfo, own)}
    assert found[("memory",)].base == Path("/sys/fs/cgroup/memory/process_api/abc")
    assert found[("pids",)].base == Path("/sys/fs/cgroup/pi ds")  # mountinfo's octal escape read back
    assert all(h.version == 1 for h in found.values())
    from deskpod.envs import cgroups

    with pytest.raises(cgroups._Unusable, match="no cgroup hierarchy here has the rdma controller"):
        find_hierarchies(mountinfo, own, ("rdma",))
    inside = "34 31 0:31 /docker/x /sys/fs/cgroup/cpuset rw - cgroup cgroup rw,cpuset\n"
    assert find_hierarchies(inside, "3:cpuset:/docker/x/y\n", ("cpuset",))[0].base == Path("/sys/fs/cgroup/cpuset/y")
    with pytest.raises(cgroups._Unusable, match="outside what is mounted"):
        find_hierarchies(inside, "3:cpuset:/elsewhere\n", ("cpuset",))


# cgroup v2, on this box's unified hierarchy ------------------------------------------------------------------
# This box's cpuset, memory and pids are cgroup v1; its cgroup v2 hierarchy offers only hugetlb. That is enough
# to replay v2's own rules for real: enabling a controller for children, "no internal processes", the daemon
# moving itself into a leaf, systemd's delegation mark, and cgroup.kill.


def _v2_with(controller: str) -> Path | None:
    for line in Path("/proc/self/mountinfo").read_text().splitlines():
        left, _, right = line.partition(" - ")
        if right.split()[:1] == ["cgroup2"]:
            point = Path(left.split()[4])
            if controller in (point / "cgroup.controllers").read_text().split():
                return point
    return None


def _remove_tree(path: Path) -> None:
    """Kill what is in a test's v2 cgroup tree and remove it, deepest first."""
    if not path.exists():
        return
    for d, _, _ in sorted(os.walk(path), key=lambda w: -len(w[0])):
        for pid in Path(d, "cgroup.procs").read_text().split():
            os.kill(int(pid), signal.SIGKILL)
    for d, _, _ in sorted(os.walk(path), key=lambda w: -len(w[0])):
        for _ in range(1000):  # a killed process leaves its cgroup as it exits
            try:
                os.rmdir(d)
                break
            except OSError as e:
                if e.errno != errno.EBUSY:
                    raise
                os.sched_yield()


@pytest.fixture
def v2_root() -> Iterator[Path]:
    """A fresh cgroup under a cgroup v2 root where hugetlb is enabled for children; all removed afterwards."""
    mount = _v2_with("hugetlb")
    if mount is None:
        pytest.skip("no cgroup v2 hierarchy offers hugetlb here")
    control = mount / "cgroup.subtree_control"
    was = "hugetlb" in control.read_text().split()
    if not was:
        control.write_text("+hugetlb")
    root = mount / f"dpt-{secrets.token_hex(4)}"
    root.mkdir()
    try:
        yield root
    finally:
        _remove_tree(root)
        if not was:
            control.write_text("-hugetlb")


def _daemon_in(cgroup: Path, pod: str, *, systemd: bool, beside: bool = False) -> dict[str, object]:
    """A stand-in daemon started in ``cgroup`` (``beside``: with another process there) runs `detect` for v2's
    hugetlb; what it answered and where it ended up."""
    other = subprocess.Popen(["sleep", "1000"]) if beside else None
    try:
        if other is not None:
            (cgroup / "cgroup.procs").write_text(str(other.pid))
        code = f"""
            import json, os
            with open({str(cgroup / "cgroup.procs")!r}, "w") as f:
                f.write(str(os.getpid()))
            from deskpod.envs.cgroups import detect
            found = detect({pod!r}, controllers=("hugetlb",), systemd={systemd!r})
            own = [line for line in open("/proc/self/cgroup").read().splitlines() if line.startswith("0::")]
            print(json.dumps({{"ok": found.cgroups is not None, "reason": found.reason, "own": own[0][3:]}}))
        """
        out = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True,
                             timeout=300)  # fmt: skip
        assert out.returncode == 0, out.stderr
        report: dict[str, object] = json.loads(out.stdout)
        report["other"] = other.pid if other is not None else None
        return report
    finally:
        if other is not None:
            other.kill()
            other.wait()


def test_v2_the_daemon_moves_itself_into_a_leaf_to_enable_controllers(v2_root: Path) -> None:
    report = _daemon_in(v2_root, "p", systemd=False)
    assert report["ok"], report
    mount = _v2_with("hugetlb")
    assert mount is not None
    assert report["own"] == "/" + str((v2_root / DAEMON_LEAF).relative_to(mount))
    assert "hugetlb" in (v2_root / "cgroup.subtree_control").read_text().split()
    assert "hugetlb" in (v2_root / "deskpod-p" / "cgroup.subtree_control").read_text().split()


def test_v2_refuses_a_cgroup_that_holds_other_processes(v2_root: Path) -> None:
    report = _daemon_in(v2_root, "p", systemd=False, beside=True)
    assert not report["ok"]
    assert "holds other processes" in str(report["reason"]) and str(report["other"]) in str(report["reason"])
    assert "start the daemon in a cgroup of its own" in str(report["reason"])


def test_v2_under_systemd_only_a_delegated_cgroup_is_used(v2_root: Path) -> None:
    refused = _daemon_in(v2_root, "p", systemd=True)
    assert not refused["ok"] and "has not delegated it" in str(refused["reason"])
    assert "Delegate=yes" in str(refused["reason"])
    assert not (v2_root / "deskpod-p").exists(), "nothing was touched"
    os.setxattr(v2_root, "trusted.delegate", b"1")  # what systemd writes on a unit with Delegate=yes
    accepted = _daemon_in(v2_root, "p", systemd=True)
    assert accepted["ok"], accepted
    assert str(accepted["own"]).endswith(f"/{v2_root.name}/{DAEMON_LEAF}")


def test_v2_a_daemon_started_in_a_delegated_units_subgroup_stays_there(v2_root: Path) -> None:
    os.setxattr(v2_root, "trusted.delegate", b"1")
    (v2_root / "supervisor").mkdir()  # systemd's DelegateSubgroup=supervisor starts the daemon here
    report = _daemon_in(v2_root / "supervisor", "p", systemd=True)
    assert report["ok"], report
    assert str(report["own"]).endswith(f"/{v2_root.name}/supervisor")
    assert (v2_root / "deskpod-p").is_dir() and not (v2_root / DAEMON_LEAF).exists()


def test_v2_cgroup_kill_ends_a_setsid_grandchild_and_the_group_goes(v2_root: Path) -> None:
    os.setxattr(v2_root, "trusted.delegate", b"1")
    (v2_root / "supervisor").mkdir()
    (v2_root / "supervisor" / "cgroup.procs").write_text(str(os.getpid()))  # this test process is the daemon
    try:
        found = detect("p", controllers=("hugetlb",), systemd=True)
        assert found.cgroups is not None, found.reason
        group = found.cgroups.create(5, Limits())
        assert [h.version for h, _ in group.folders] == [2] and len(group.procs_files) == 1
        with subprocess.Popen(
            [sys.executable, "-c", JOIN + "import subprocess, time\n"
             "print(subprocess.Popen(['sleep', '1000'], start_new_session=True).pid, flush=True)\ntime.sleep(1000)\n",
             *map(str, group.procs_files)], stdout=subprocess.PIPE, text=True) as child:  # fmt: skip
            assert child.stdout is not None
            grandchild = int(child.stdout.readline())
            group.kill()
            assert child.wait(timeout=60) == -signal.SIGKILL and gone(grandchild) and group.pids() == set()
        group.remove()
        found.cgroups.remove()
        assert not (v2_root / "deskpod-p").exists()
    finally:
        mount = _v2_with("hugetlb")
        assert mount is not None
        (mount / "cgroup.procs").write_text(str(os.getpid()))  # back where it was, so the tree can go


# pinned CPU jobs: the trainer inside ----------------------------------------------------------------------


def test_a_pinned_one_slot_job_trains_with_one_worker_of_one_thread(new_group: Callable[[Limits], JobGroup]) -> None:
    """The pod pins a 1-slot job on slot 1 to that slot's core and numbers its slot 0 (as CUDA_VISIBLE_DEVICES
    is numbered inside the sandbox): the trainer lays out one worker with one thread."""
    cores = sorted(os.sched_getaffinity(0))
    group = new_group(Limits(cpus=(cores[-1],)))
    env = {**os.environ, "DESKPOD_CPU_SLOTS": "0", "CUDA_VISIBLE_DEVICES": ""}
    out = run_in(group, """
        import json
        from deskpod.train.launcher import resolve_devices
        kind, devices, pins = resolve_devices("all")
        print(json.dumps([kind, len(devices), [d.threads for d in devices], sorted(os.sched_getaffinity(0))]))
    """, env=env)  # fmt: skip
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout) == ["cpu", 1, [1], [cores[-1]]]


def test_inside_a_pinned_job_a_slot_numbered_as_on_the_box_is_refused_with_the_reason() -> None:
    """Why slots are renumbered: a job pinned to slot 5 of an 8-core box sees 1 core, so 2 slots."""
    from deskpod.environment import Environment
    from deskpod.errors import DeviceError
    from deskpod.hardware.devices import discover

    inside = replace(Environment.read({}), cpu_count=1, cuda_visible_devices=("",))
    with pytest.raises(DeviceError, match=r"names slot 5; this process may run on 1 core, slots 0-1 \(in a job "
                                          r"pinned to its cores the slots are numbered from 0\)"):  # fmt: skip
        discover(replace(inside, cpu_slots=(5,)), use_nvml=False)
    inv = discover(replace(inside, cpu_slots=(0,)), use_nvml=False)
    assert inv.kind == "cpu" and len(inv.devices) == 1 and inv.cores == 1
