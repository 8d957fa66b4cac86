"""`deskpod.processes`: a process known by pid and start time (a reused pid is another process), its children, and
how deskpod's workers end (``exit_without_finalizing`` does what the end of a script does, then skips the rest)."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest

from deskpod.processes import alive, child_pids, start_time
from deskpod.train.script_worker import _exit_status

SCRIPT = """
import atexit, sys, threading, time
from deskpod.processes import exit_without_finalizing

class Noisy:
    def __del__(self):
        print("finalized", flush=True)

keep = Noisy()
atexit.register(lambda: print("atexit", flush=True))
threading.Thread(target=lambda: (time.sleep(0.3), print("thread done", flush=True))).start()
sys.stdout.write("buffered, no newline")  # to a pipe: block-buffered, lost unless flushed
{ending}
"""


def run(ending: str) -> subprocess.CompletedProcess[str]:
    code = textwrap.dedent(SCRIPT).format(ending=ending)
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)


def test_it_waits_for_threads_runs_atexit_flushes_and_skips_the_finalization() -> None:
    ours = run("exit_without_finalizing(3)")
    assert ours.returncode == 3, ours.stderr
    assert ours.stdout.splitlines() == ["buffered, no newlinethread done", "atexit"], ours.stdout
    # The same script ended by the interpreter does reach the finalization (so the check above can fail).
    python = run("sys.exit(3)")
    assert python.returncode == 3 and python.stdout.splitlines()[-1] == "finalized", python.stdout


@pytest.mark.parametrize(
    ("code", "status"), [(None, 0), (0, 0), (4, 4), (True, 1), (-1, 255), ("stopped: bad input", 1)]
)
def test_a_scripts_sys_exit_gives_the_status_python_would(
    code: object, status: int, capsys: pytest.CaptureFixture[str]
) -> None:
    assert _exit_status(code) == status
    assert capsys.readouterr().err == ("stopped: bad input\n" if isinstance(code, str) else "")


def test_the_start_time_is_the_kernels_clock_ticks_since_boot() -> None:
    """What pods started by earlier versions stored for their jobs (``/proc/<pid>/stat``, field 22): a daemon that
    re-adopts them after an upgrade compares the same numbers."""
    for pid in (os.getpid(), 1):
        with open(f"/proc/{pid}/stat") as f:
            text = f.read()
        assert start_time(pid) == int(text[text.rindex(")") + 2 :].split()[19])


def test_a_process_is_alive_only_with_its_own_start_time() -> None:
    child = subprocess.Popen([sys.executable, "-c", "import sys; sys.stdin.read()"], stdin=subprocess.PIPE)
    started = start_time(child.pid)
    assert started is not None
    assert alive(child.pid, started) and alive(child.pid, None)
    assert not alive(child.pid, started - 1), "another process given this pid is not the one started"
    assert child.pid in child_pids(os.getpid())
    assert child.stdin is not None
    child.stdin.close()
    os.waitid(os.P_PID, child.pid, os.WEXITED | os.WNOWAIT)  # until it has exited, leaving it unreaped (a zombie)
    assert not alive(child.pid, started), "an exited, unreaped child has finished"
    assert start_time(child.pid, zombies=True) == started
    child.wait()
    assert not alive(child.pid, started) and start_time(child.pid, zombies=True) is None
    assert child.pid not in child_pids(os.getpid())


@pytest.mark.parametrize("pid", [0, -1, 2**22 + 1, 2**40])
def test_what_is_no_process_has_no_start_time(pid: int) -> None:
    assert start_time(pid) is None and not alive(pid, None) and child_pids(pid) == []
