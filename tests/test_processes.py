"""How deskpod's workers end: ``exit_without_finalizing`` does what the end of a script does, then skips the rest."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

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
