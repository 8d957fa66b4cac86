"""Stopping a process a test started with `subprocess.Popen` (a server, a relay, an encoder): SIGTERM, then SIGKILL
after a grace period; it is waited for either way, so it leaves no zombie behind."""

from __future__ import annotations

import subprocess
from typing import Any


def stop_popen(proc: subprocess.Popen[Any], grace: float) -> None:
    """SIGTERM, ``grace`` seconds to exit, then SIGKILL."""
    proc.terminate()
    try:
        proc.wait(timeout=grace)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
