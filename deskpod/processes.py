"""Stopping child processes the way every part of deskpod does: wait, then SIGTERM, then SIGKILL."""

from __future__ import annotations

import os
import signal
import sys
import time
from collections.abc import Iterable
from multiprocessing.process import BaseProcess


def stop_processes(procs: Iterable[BaseProcess], deadline: float, *, min_wait: float = 0.1, max_wait: float = 10.0,
                   grace: float = 5.0) -> None:  # fmt: skip
    """Join each process until ``deadline`` (``time.monotonic()``), clamped to [min_wait, max_wait] seconds;
    one still alive gets SIGTERM and ``grace`` seconds, then SIGKILL. Nothing outlives the call."""
    for p in procs:
        p.join(timeout=max(min_wait, min(max_wait, deadline - time.monotonic())))
        if p.is_alive():
            p.terminate()
            p.join(timeout=grace)
            if p.is_alive():
                p.kill()
                p.join()


def child_pids(pid: int) -> list[int]:
    """The live direct children of ``pid`` (Linux: from ``/proc/<pid>/task/*/children``)."""
    out: list[int] = []
    try:
        tasks = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return out
    for task in tasks:
        try:
            with open(f"/proc/{pid}/task/{task}/children") as f:
                out += [int(p) for p in f.read().split()]
        except OSError:
            continue
    return sorted(set(out))


def die_with_parent() -> None:
    """This process never outlives its parent: if the parent is SIGKILLed (a lost node, an OOM kill), the
    kernel kills this one too (``PR_SET_PDEATHSIG``), instead of leaving it running alone, as an orphan.
    Training workers call it first thing."""
    if sys.platform != "linux":
        return
    import ctypes

    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(1, signal.SIGKILL, 0, 0, 0)  # PR_SET_PDEATHSIG = 1
    if os.getppid() == 1:  # the parent died before the call took effect
        os.kill(os.getpid(), signal.SIGKILL)
