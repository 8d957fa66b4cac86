"""Processes are known by pid *and* start time: a pid that names another process is never signalled."""

from __future__ import annotations

import json
import signal
import sys
import time
from pathlib import Path

from deskpod.jobs.supervisor import SHIM_ENV, Attempt, Supervisor, signal_group
from deskpod.processes import alive, start_time


def test_a_reused_pid_is_not_the_job(tmp_path: Path) -> None:
    sup = Supervisor()
    files = Attempt(tmp_path / "job")
    plan = {"env": {"PATH": "/usr/bin:/bin"}, "cwd": str(tmp_path)}
    pid, started = sup.spawn(["sleep", "30"], plan=plan, files=files, attempt=1)
    try:
        assert started is not None and alive(pid, started)
        assert not alive(pid, started + 1)  # the same pid with another start time: some other process
        assert not signal_group(pid, started + 1, signal.SIGKILL)
        assert alive(pid, started)
        assert signal_group(pid, started, signal.SIGTERM)
        for _ in range(200):
            done, code = sup.finished(pid, started, files.exit_file(1))
            if done:
                break
            time.sleep(0.02)
        assert done and code == 143  # sleep died of SIGTERM; the shim recorded 128 + 15
        assert start_time(pid) is None
    finally:
        signal_group(pid, started, signal.SIGKILL)


def test_the_shim_records_exit_codes(tmp_path: Path) -> None:
    sup = Supervisor()
    files = Attempt(tmp_path / "job")
    for attempt, argv, want in ((1, ["sh", "-c", "exit 7"], 7), (2, ["no-such-program-here"], 127)):
        plan = {"env": {"PATH": "/usr/bin:/bin"}, "cwd": str(tmp_path)}
        pid, started = sup.spawn(argv, plan=plan, files=files, attempt=attempt)
        for _ in range(300):
            done, code = sup.finished(pid, started, files.exit_file(attempt))
            if done:
                break
            time.sleep(0.02)
        assert done and code == want
    assert "cannot start 'no-such-program-here'" in files.log.read_text()


def test_the_plans_variables_reach_the_job_and_never_the_shim(tmp_path: Path) -> None:
    """The job's environment comes on the shim's stdin and is applied only by the job step: the shim (which runs as
    root on a root pod) keeps its fixed environment, and the job's stdin is /dev/null, not the plan."""
    sup = Supervisor()
    files = Attempt(tmp_path / "job")
    probe = (
        "import json, os, sys; ppid = os.getppid();"
        "shim = dict(x.split('=', 1) for x in open(f'/proc/{ppid}/environ').read().split('\\0') if '=' in x);"
        "print('PROBE', json.dumps({'mine': os.environ.get('MARK'), 'shim': shim,"
        " 'stdin': os.readlink('/proc/self/fd/0'), 'cwd': os.getcwd()}), flush=True)"
    )
    plan = {"env": {"PATH": "/usr/bin:/bin", "MARK": "secret-value"}, "cwd": str(tmp_path)}
    pid, started = sup.spawn([sys.executable, "-c", probe], plan=plan, files=files, attempt=1)
    for _ in range(500):
        done, code = sup.finished(pid, started, files.exit_file(1))
        if done:
            break
        time.sleep(0.02)
    assert done and code == 0, files.log.read_text()
    line = next(x for x in files.log.read_text().splitlines() if x.startswith("PROBE "))
    got = json.loads(line[len("PROBE ") :])
    assert got["mine"] == "secret-value"
    assert got["shim"] == SHIM_ENV  # not one variable of the plan, nor of the test's own environment
    assert got["stdin"] == "/dev/null" and got["cwd"] == str(tmp_path)
