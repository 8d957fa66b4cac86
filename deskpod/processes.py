"""Processes as every part of deskpod handles them: known by pid *and* start time, stopped by waiting, then SIGTERM,
then SIGKILL.

A pid alone does not name a process: once it ends, the kernel gives its pid to another. So a process deskpod
started is remembered as (pid, start time) and is alive only while a process with that pid *and* that start time
runs (`alive`). The start time is in clock ticks since boot (psutil's create time less the boot time): no change
to the wall clock moves it, and it is an integer that a database or a JSON file keeps exactly.
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import time
from collections.abc import Iterable
from multiprocessing.process import BaseProcess
from typing import NoReturn

import psutil

CLOCK_TICKS = os.sysconf("SC_CLK_TCK")


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


def start_time(pid: int, *, zombies: bool = False) -> int | None:
    """The process's start time in clock ticks since boot, or None if no such live process.

    A zombie has finished (only its exit status is left), so it counts as gone unless ``zombies``.
    """
    try:
        boot = psutil.boot_time()  # first: psutil 5.9 computes create_time with the boot time last read
        p = psutil.Process(pid)
        if not zombies and p.status() in (psutil.STATUS_ZOMBIE, psutil.STATUS_DEAD):
            return None
        return round((p.create_time() - boot) * CLOCK_TICKS)
    except (psutil.Error, ValueError):  # gone, or not a pid at all (0, negative)
        return None


def alive(pid: int, started: int | None) -> bool:
    """Whether the process started as ``pid`` at ``started`` (`start_time`) still runs, not another process that
    was given its pid since; with ``started`` None, whether any live process has the pid."""
    now = start_time(pid)
    return now is not None and (started is None or now == started)


def child_pids(pid: int) -> list[int]:
    """The live direct children of ``pid``."""
    try:
        return sorted(c.pid for c in psutil.Process(pid).children())
    except (psutil.Error, ValueError):
        return []


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


def exit_without_finalizing(code: int) -> NoReturn:
    """End this process as the interpreter ends a script — wait for its non-daemon threads, run the ``atexit``
    handlers, flush stdout and stderr — and then leave with ``os._exit``, skipping the finalization after them.

    A training worker ends this way because of what torch does during that finalization: a Gloo worker thread
    may still be destroying a finished collective's work, whose Python references need the GIL of an
    interpreter that is being torn down; the thread's forced unwind calls ``std::terminate`` and the process
    dies of SIGABRT ("terminate called without an active exception") after a script that succeeded. On this
    box, PyTorch 2.14, a plain two-rank Gloo DDP script with ``destroy_process_group()`` at its end, started
    without deskpod, died so in 3 runs of 80 (backtrace: ``ProcessGroupGloo::runLoop`` → ``~AsyncWork`` →
    ``gil_scoped_acquire`` → ``PyThread_exit_thread``)."""
    import atexit
    import threading

    threading._shutdown()  # type: ignore[attr-defined]  # what Py_FinalizeEx calls first
    atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(OSError, ValueError):  # closed by the script, or its reader is gone
            stream.flush()
    os._exit(code)
