"""Sessions' time and idleness, watched from the pod: the warning before a session's time runs out, and idle
notebooks giving their devices back to the queue.

One thread of the pod (`Culler.run`) looks at every running session once a `PERIOD_S`:

- **Time.** A session with ``max_runtime`` is warned `warn_before` its end (5 minutes, or a fifth of a short
  session's time): a job event saying when it stops and how to extend it. A notebook's open notebooks (those with a
  kernel, jupyter-server's ``GET /api/sessions``) get a checkpoint of what is saved on disk (``POST
  /api/contents/<path>/checkpoints``); the notebooks themselves are written by their server as they change
  (jupyter-collaboration: `deskpod.jobs.kinds.notebook`). At the end the local executor stops it (``max_runtime``,
  `deskpod.jobs.local`).
- **Work.** On GPUs, NVML's per-process utilization (``nvmlDeviceGetProcessUtilization``) of the session's
  processes on its GPUs; on CPU slots, the CPU time of the session's processes (psutil over its process tree). The
  device-seconds it was seen busy add up in ``busy_s``; ``JobRecord.held_s`` gives what it held.
- **Idle release** (``idle_timeout``, notebooks: a kind with ``KERNELS = True``). A notebook whose devices show no
  work and whose kernels are idle (``GET /api/kernels``: ``execution_state`` and ``last_activity``) is warned
  `warn_before` the timeout, then released: its kernels are shut down (``DELETE /api/kernels/<id>``), every
  process left under its JupyterLab server is killed, and only then are its devices taken off the job
  (``assigned`` empty, ``released`` names them) so the next queued job starts on them. The server and the files
  stay. A kernel starting through the pod (`deskpod.web.sessions`) asks for the same devices again
  (`deskpod.jobs.pod.Pod.want_devices`); the executor gives them back once free, before any queued job. A kernel
  started past the pod (the owner can reach the socket in their own folder) while released is killed at the next
  look: a released session runs no process but its server.

All calls to a session go to its Unix socket, checked to be served by the job folder's owner (``SO_PEERCRED``), as
the proxy's are.
"""

from __future__ import annotations

import contextlib
import http.client
import json
import os
import signal
import socket
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any, Protocol
from urllib.parse import quote

import psutil

from deskpod.environment.sizes import duration_text
from deskpod.jobs.kinds import KINDS
from deskpod.jobs.kinds.session import base_path, listener_uid, socket_path
from deskpod.jobs.states import JobState
from deskpod.jobs.store import JobRecord, Store

PERIOD_S = 1.0
"""How often the sessions are looked at."""
WARN_S = 300.0
"""Warn this long before a session's time (or an idle notebook's timeout) runs out ..."""
WARN_SHARE = 0.2
"""... or this share of it, for short ones."""
BUSY_CPU = 0.05
"""A CPU slot is at work when the session's processes used more than this many CPU-seconds per second per slot (an
idle JupyterLab with an idle kernel uses about 0.01)."""
FLUSH_S = 10.0
"""Busy device-seconds are written to the store at most this often (and at a release)."""
CALL_S = 5.0
"""Seconds a call to a session's socket may take."""


def warn_before(total: float) -> float:
    """How long before the end of ``total`` seconds the warning comes."""
    return min(WARN_S, WARN_SHARE * total)


class PodSide(Protocol):
    @property
    def store(self) -> Store: ...

    def job_folder(self, job: JobRecord) -> Path: ...

    def wake(self) -> None: ...


class GpuWork(Protocol):
    """Which of a session's GPUs its processes are using (`NvmlWork`; a recorded fake in tests)."""

    def busy(self, devices: Iterable[int], pids: set[int]) -> set[int]: ...


class NvmlWork:
    """`GpuWork` over NVML: a GPU is busy when one of ``pids`` had a nonzero SM share in a sample since the last
    look (``nvmlDeviceGetProcessUtilization``). Written against nvidia-ml-py; this box has no GPU to run it on."""

    def __init__(self, visible: list[str] | None) -> None:
        import pynvml

        pynvml.nvmlInit()
        self._nvml = pynvml
        count = pynvml.nvmlDeviceGetCount()
        handles = [pynvml.nvmlDeviceGetHandleByIndex(i) for i in range(count)]
        if visible:  # the pod's device d is CUDA_VISIBLE_DEVICES' d-th entry (an index or a UUID)
            by_uuid = {str(pynvml.nvmlDeviceGetUUID(h)): h for h in handles}
            handles = [by_uuid.get(v) or handles[int(v)] for v in visible]
        self._handles = handles
        self._seen: dict[int, int] = {}

    def busy(self, devices: Iterable[int], pids: set[int]) -> set[int]:
        out: set[int] = set()
        for d in devices:
            if d >= len(self._handles):
                continue
            try:
                samples = self._nvml.nvmlDeviceGetProcessUtilization(self._handles[d], self._seen.get(d, 0))
            except self._nvml.NVMLError:  # NOT_FOUND: no sample since the last look, so no work
                continue
            for s in samples:
                self._seen[d] = max(self._seen.get(d, 0), int(s.timeStamp))
                if int(s.pid) in pids and int(s.smUtil) > 0:
                    out.add(d)
        return out


@dataclass(slots=True)
class Watched:
    """What the culler remembers of one session between looks (lost with the daemon: a restart warns again)."""

    cpu: float | None = None
    at: float = 0.0
    idle_since: float = 0.0
    busy: float = 0.0
    """Device-seconds seen busy and not written to the store yet."""
    flushed: float = 0.0
    warned_time: float | None = None
    """The ``max_runtime`` it was warned for (an extension warns again)."""
    warned_idle: bool = False
    kernels: list[dict[str, Any]] = field(default_factory=list)


class Culler:
    """The pod's session watcher (see the module docstring); `tick` is one look, `run` looks until stopped."""

    def __init__(self, pod: PodSide, *, idle_timeout: float | None, device_kind: str,
                 clock: Callable[[], float] = time.time, gpus: GpuWork | None = None) -> None:  # fmt: skip
        self.pod, self.idle_timeout, self.device_kind, self.clock = pod, idle_timeout, device_kind, clock
        self.gpus = gpus
        self.watched: dict[int, Watched] = {}
        self._stop = threading.Event()

    def run(self) -> None:
        import sys
        import traceback

        while not self._stop.wait(PERIOD_S):
            try:
                self.tick()
            except Exception:  # one bad look must not end the watching; the traceback goes to the daemon log
                traceback.print_exc(file=sys.stderr)

    def stop(self) -> None:
        self._stop.set()

    def tick(self) -> None:
        store, now = self.pod.store, self.clock()
        sessions = [j for j in store.jobs(states=[JobState.RUNNING]) if KINDS[j.spec.kind].SESSION]
        for gone in set(self.watched) - {j.id for j in sessions}:
            del self.watched[gone]
        for job in sessions:
            w = self.watched.setdefault(job.id, Watched(at=now, idle_since=now))
            self._time(job, w, now)
            if job.released:
                self._police(job)
                w.idle_since, w.warned_idle, w.cpu = now, False, None
                continue
            self._work(job, w, now)

    # time --------------------------------------------------------------------------------------------------
    def _time(self, job: JobRecord, w: Watched, now: float) -> None:
        limit, start = job.max_runtime, job.started_at
        if limit is None or start is None or w.warned_time == limit or job.stop_reason is not None:
            return
        left = start + limit - now
        if left > warn_before(limit):
            return
        w.warned_time = limit
        saved = self._checkpoint(job) if getattr(KINDS[job.spec.kind], "KERNELS", False) else None
        what = "" if saved is None else (f"; checkpointed what is saved of {len(saved)} open notebook"
                                         f"{'s' if len(saved) != 1 else ''}" if saved else "; no open notebook")  # fmt: skip
        end = time.strftime("%H:%M:%S", time.localtime(start + limit))
        self.pod.store.note(job.id, f"time: the session stops in {duration_text(left)}, at {end}{what}; "
                                    f"`deskpod extend {job.id} --time 1h` gives it more")  # fmt: skip

    def _checkpoint(self, job: JobRecord) -> list[str]:
        """A checkpoint of each notebook with a kernel, as saved on disk; the paths checkpointed."""
        done = []
        with contextlib.suppress(OSError, ValueError, http.client.HTTPException):
            for s in self._call(job, "GET", "api/sessions") or []:
                path = s.get("path") or s.get("notebook", {}).get("path")
                if s.get("type", "notebook") == "notebook" and isinstance(path, str):
                    with contextlib.suppress(OSError, ValueError, http.client.HTTPException):
                        self._call(job, "POST", f"api/contents/{quote(path)}/checkpoints")
                        done.append(path)
        return done

    # work and idleness --------------------------------------------------------------------------------------
    def _work(self, job: JobRecord, w: Watched, now: float) -> None:
        procs = tree(job.pid)
        busy = self._busy_devices(job, procs, w, now)
        w.busy += len(busy) * max(0.0, now - w.at)
        w.at = now
        if now - w.flushed >= FLUSH_S:
            self._flush(job, w, now)
        if self.idle_timeout is None or not getattr(KINDS[job.spec.kind], "KERNELS", False):
            return
        try:
            kernels = self._call(job, "GET", "api/kernels") or []
        except (OSError, ValueError, http.client.HTTPException):
            return  # not answering: no judgement on its idleness
        w.kernels = kernels
        # "busy" is the one state of work: a kernel no browser is connected to stays "starting" in the server's eyes
        working = busy or any(k.get("execution_state") == "busy" for k in kernels)
        last = max((activity(k) for k in kernels), default=0.0)
        w.idle_since = now if working else max(w.idle_since, last)
        idle = now - w.idle_since
        timeout = self.idle_timeout
        if idle < timeout - warn_before(timeout):
            w.warned_idle = False
            return
        if not w.warned_idle:
            w.warned_idle = True
            at = time.strftime("%H:%M:%S", time.localtime(w.idle_since + timeout))
            self.pod.store.note(job.id, f"idle for {duration_text(idle)}: unless it works, its kernels stop and "
                                        f"devices {shown(job.assigned)} go back to the queue at {at}")  # fmt: skip
        if idle >= timeout:
            self._release(job, w, now, idle)

    def _busy_devices(self, job: JobRecord, procs: list[psutil.Process], w: Watched, now: float) -> set[int]:
        if self.device_kind == "cuda" and self.gpus is not None:
            return self.gpus.busy(job.assigned, {p.pid for p in procs})
        cpu = 0.0
        for p in procs:
            with contextlib.suppress(psutil.Error):
                t = p.cpu_times()
                cpu += t.user + t.system + t.children_user + t.children_system
        before, w.cpu = w.cpu, cpu
        span = now - w.at
        if before is None or span <= 0:
            return set()
        rate = max(0.0, cpu - before) / span
        return set(job.assigned) if rate > BUSY_CPU * max(1, len(job.assigned)) else set()

    def _flush(self, job: JobRecord, w: Watched, now: float) -> None:
        if w.busy:
            self.pod.store.update(job.id, expect=[JobState.RUNNING], busy_s=job.busy_s + w.busy)
        w.busy, w.flushed = 0.0, now

    def _release(self, job: JobRecord, w: Watched, now: float, idle: float) -> None:
        """Stop the kernels, kill what is left under the server, then take the devices off the job."""
        for k in w.kernels:
            with contextlib.suppress(OSError, ValueError, http.client.HTTPException):
                self._call(job, "DELETE", f"api/kernels/{quote(str(k.get('id', '')))}")
        killed = self._police(job)
        self._flush(job, w, now)
        fresh = self.pod.store.job(job.id)
        if fresh is None or fresh.state is not JobState.RUNNING or fresh.stop_reason is not None:
            return
        devices = shown(job.assigned)
        why = f"idle since {time.strftime('%H:%M:%S', time.localtime(now - idle))}: devices {devices} released"
        if self.pod.store.update(job.id, expect=[JobState.RUNNING], assigned="", released=devices, released_at=now,
                                 wanted_at=None, reason=f"{why}; starting a kernel asks for them again"):  # fmt: skip
            extra = f"; {killed} process{'es' if killed != 1 else ''} left under the server killed" if killed else ""
            self.pod.store.note(job.id, f"{why} to the queue after {len(w.kernels)} kernel"
                                        f"{'s' if len(w.kernels) != 1 else ''} stopped{extra}")  # fmt: skip
            self.pod.wake()

    def _police(self, job: JobRecord) -> int:
        """Kill every process under the session's server (kernels, terminals, what they left running): a released
        session may run its server only. Returns how many it killed."""
        server = self._server(job)
        if server is None:
            return 0
        with contextlib.suppress(psutil.Error):
            left = server.children(recursive=True)
            for p in left:
                with contextlib.suppress(psutil.Error):
                    p.send_signal(signal.SIGKILL)
            psutil.wait_procs(left, timeout=5)
            return len(left)
        return 0

    def _server(self, job: JobRecord) -> psutil.Process | None:
        """The session's own server process: the one in its tree serving its socket."""
        marker = f"={socket_path(self.pod.job_folder(job))}"
        for p in tree(job.pid):
            with contextlib.suppress(psutil.Error):
                if any(a.endswith(marker) for a in p.cmdline()):
                    return p
        return None

    # the session's socket ----------------------------------------------------------------------------------
    def _call(self, job: JobRecord, method: str, path: str) -> Any:
        """``method`` on the session's ``/sessions/<id>/<path>``; its JSON answer (None for an empty one)."""
        folder = self.pod.job_folder(job)
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.settimeout(CALL_S)
        try:
            sock.connect(str(socket_path(folder)))
            owner = os.lstat(folder).st_uid
            if listener_uid(sock) != owner:
                raise ConnectionRefusedError(f"{socket_path(folder)} is not served by the job's account")
            conn = http.client.HTTPConnection("localhost", timeout=CALL_S)
            conn.sock = sock
            xsrf = os.urandom(16).hex()  # jupyter-server's cross-site check: the same token as cookie and header
            conn.request(method, base_path(folder) + path,
                         headers={"Cookie": f"_xsrf={xsrf}", "X-XSRFToken": xsrf, "Content-Length": "0"})  # fmt: skip
            answer = conn.getresponse()
            body = answer.read()
            if answer.status >= 400:
                raise http.client.HTTPException(f"{method} {path}: {answer.status}")
            return json.loads(body) if body else None
        finally:
            sock.close()


def open_gpu_work() -> GpuWork | None:
    """NVML for the pod's GPUs (its ``CUDA_VISIBLE_DEVICES``), or None where it cannot be used: then a GPU session's
    work is judged by its processes' CPU time and its kernels alone."""
    from deskpod.environment import Environment

    visible = Environment.read().cuda_visible_devices
    try:
        return NvmlWork(None if visible is None else list(visible))
    except Exception:  # ImportError, NVMLError, no driver library
        return None


def tree(pid: int | None) -> list[psutil.Process]:
    """The process ``pid`` and every process under it."""
    if pid is None:
        return []
    try:
        top = psutil.Process(pid)
        return [top, *top.children(recursive=True)]
    except psutil.Error:
        return []


def activity(kernel: dict[str, Any]) -> float:
    """A kernel's ``last_activity`` (ISO 8601, UTC) as a Unix time; 0 when it has none."""
    text = kernel.get("last_activity")
    if not isinstance(text, str):
        return 0.0
    try:
        return datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()
    except ValueError:
        return 0.0


def shown(devices: Iterable[int]) -> str:
    return ",".join(map(str, devices))
