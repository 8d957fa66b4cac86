"""The launcher of ``deskpod run``: a user's script, once per device, through PyTorch's elastic agent.

It is ``deskpod train``'s launcher with the user's script in place of deskpod's loop:

* **devices** as ``deskpod train`` lays them out (`deskpod.train.launcher.resolve_devices`): every GPU,
  or on a CPU box one worker per NUMA node with its cores as threads (``--devices N`` for N workers);
  each local rank gets its NIC and cores (`deskpod.hardware.affinity`), CPU workers their threads;
* **the environment a torchrun script expects**: the agent sets ``RANK``, ``LOCAL_RANK``,
  ``WORLD_SIZE``, ``LOCAL_WORLD_SIZE``, ``MASTER_ADDR``, ``MASTER_PORT`` (a free port it picks) and
  ``TORCHELASTIC_RESTART_COUNT``; the rendezvous is on 127.0.0.1 port 0, so two runs on one box
  never collide; ``DESKPOD_RUN_DIR`` names the run folder;
* **restarts**: a rank that fails stops the group, which is started again up to ``max_restarts``
  times (a script that saves and loads its own checkpoint resumes);
* **output**: each rank's stdout and stderr go to ``runs/<name>/logs/rank<R>.attempt<N>.stdout``
  and ``.stderr``; global rank 0's are copied to the console as they are written, the others'
  stay in their files, so a failing group does not print every rank's traceback at once. When
  restarts run out, one `WorkerError` names the rank that failed first, with its traceback;
* **stalls**: a rank whose output has not grown for ``stall_after_s`` is named on stderr, with how
  long it has been quiet and when the others last wrote (again each time that doubles).

A script reports metrics with `deskpod.train.log` (rank 0 appends to ``metrics.jsonl``), or with
TensorBoard's ``SummaryWriter`` writing under ``$DESKPOD_RUN_DIR``: the launcher copies those scalars
into ``metrics.jsonl`` as they are flushed (`TensorBoardScalars`), for the dashboard's charts.
"""

from __future__ import annotations

import contextlib
import importlib.util
import json
import math
import sys
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any, TextIO

from deskpod.environment import Environment
from deskpod.environment.files import Under, write_json
from deskpod.errors import ConfigError, UsageError, WorkerError
from deskpod.hardware.devices import Device, Inventory
from deskpod.train.launcher import (
    environment,
    failure_traceback,
    launch_config,
    rank_affinity_map,
    resolve_devices,
    worker_env,
)
from deskpod.train.runs import NAME_HELP, NAME_MAX, NAME_RE
from deskpod.train.world import NodeWorld, slurm_world

RUN_FILE = "run.json"


@dataclass(frozen=True, slots=True)
class ScriptRun:
    """Everything resolved before the script's ranks start."""

    target: tuple[str, ...]
    """The script (absolute path) and its arguments, or ``("-m", module, *args)``."""
    name: str
    run_dir: Path
    kind: str
    devices: tuple[Device, ...]
    cpu_pins: tuple[tuple[int, ...], ...]
    max_restarts: int
    stall_after_s: float
    world: NodeWorld | None = None

    @property
    def world_size(self) -> int:
        return len(self.devices) * (self.world.nodes if self.world else 1)

    logs = Under("logs", "run_dir")


def check_target(target: Sequence[str], cwd: Path | None = None) -> tuple[str, ...]:
    """The script and its arguments as the ranks will run them; `UsageError` for a missing script or module."""
    cwd = cwd or Path.cwd()
    if not target or not target[0]:
        raise UsageError("deskpod run: give a script to run (SCRIPT.py [ARGS...]) or a module (-m MODULE [ARGS...])")
    if target[0] == "-m":
        if len(target) < 2 or not target[1] or target[1].startswith("-"):
            raise UsageError("deskpod run -m: give the module to run, e.g. deskpod run -m mypkg.train --lr 0.1")
        module = target[1]
        sys.path.insert(0, str(cwd))  # the ranks run it as `python -m` does: the working folder first on the path
        try:
            found = importlib.util.find_spec(module)
        except (ImportError, ValueError):
            found = None
        finally:
            sys.path.remove(str(cwd))
        if found is None:
            raise UsageError(f"deskpod run -m {module}: no module {module!r} on this Python's path (nor in {cwd})")
        return tuple(target)
    script = Path(target[0])
    path = script if script.is_absolute() else cwd / script
    if not path.exists():
        raise UsageError(f"deskpod run: script {target[0]!r} not found (looked in {cwd})")
    if not path.is_file():
        raise UsageError(f"deskpod run: {target[0]!r} is not a file; give a Python script, or -m MODULE")
    return (str(path.resolve()), *target[1:])


def default_name(target: Sequence[str], now: datetime | None = None) -> str:
    """``<script or module>-<date>-<time>``, like ``deskpod train``'s run names."""
    stem = target[1].rsplit(".", 1)[-1] if target[0] == "-m" else Path(target[0]).stem
    safe = "".join(c if c.isalnum() or c in "-_." else "-" for c in stem).strip("-.")[: NAME_MAX - 16] or "run"
    return f"{safe}-{(now or datetime.now()):%Y%m%d-%H%M%S}"


def prepare_script(
    target: Sequence[str],
    *,
    devices: str = "all",
    nodes: int = 1,
    max_restarts: int = 0,
    name: str | None = None,
    out: str | Path = "runs",
    stall_after_s: float = 300.0,
    inventory: Inventory | None = None,
    env: Environment | None = None,
) -> ScriptRun:
    """Check the request and lay out its ranks; every bad input is a one-line `UsageError` here."""
    resolved = check_target(target)
    if nodes < 1:
        raise ConfigError(f"--nodes {nodes}: expected 1 or more")
    if not 0 <= max_restarts <= 100:
        raise ConfigError(f"--max-restarts {max_restarts}: expected a whole number from 0 to 100")
    if not stall_after_s > 0:
        raise ConfigError(f"--stall-after {stall_after_s}: expected seconds > 0")
    if name is not None and not NAME_RE.match(name):
        raise ConfigError(f"--name {name!r}: use {NAME_HELP}")
    world = slurm_world(nodes) if nodes > 1 else None
    kind, chosen, pins = resolve_devices(str(devices), inventory=inventory, env=env)
    if name is None:
        name, run_dir = _claim_folder(Path(out), default_name(target))
    else:
        run_dir = (Path(out) / name).resolve()
    return ScriptRun(resolved, name, run_dir, kind, chosen, pins, max_restarts, stall_after_s, world)


def _claim_folder(out: Path, base: str) -> tuple[str, Path]:
    """A run folder of its own for a run without ``--name``: two started in the same second (one name) get
    ``base`` and ``base-2``; the folder is made here, so two launchers never pick the same one."""
    out.mkdir(parents=True, exist_ok=True)
    for k in range(1, 1000):
        name = base if k == 1 else f"{base}-{k}"
        try:
            (out / name).mkdir()
        except FileExistsError:
            continue
        return name, (out / name).resolve()
    raise ConfigError(f"--out {str(out)!r}: 999 runs named {base}-N already; give one with --name")


def _write_run_file(run: ScriptRun) -> None:
    if run.logs.is_dir() and any(run.logs.iterdir()):
        # A named run started again: the last launch's logs move aside whole (logs-<when>/), so this
        # launch's attempts start from 0 in a clean folder and nothing of the earlier one is lost.
        when = datetime.fromtimestamp(run.logs.stat().st_mtime).strftime("%Y%m%d-%H%M%S")
        aside = run.run_dir / f"logs-{when}"
        k = 2
        while aside.exists():
            aside, k = run.run_dir / f"logs-{when}-{k}", k + 1
        run.logs.rename(aside)
    run.logs.mkdir(parents=True, exist_ok=True)
    doc = {
        "target": list(run.target),
        "kind": run.kind,
        "backend": "nccl" if run.kind == "cuda" else "gloo",
        "devices": [d.label for d in run.devices],
        "threads": run.devices[0].threads if run.kind == "cpu" else 0,
        "world_size": run.world_size,
        "nodes": run.world.nodes if run.world else 1,
        "max_restarts": run.max_restarts,
        "affinity": rank_affinity_map(run.kind, run.devices, run.cpu_pins),
        "cwd": str(Path.cwd()),
    }
    write_json(run.run_dir / RUN_FILE, doc, indent=2)


class TensorBoardScalars:
    """Copies the scalars a script writes with TensorBoard's ``SummaryWriter`` under its run folder into
    ``metrics.jsonl`` (one line per step of each event file, ``{"kind": "train", "step": …, tag: value}``),
    so the dashboard charts them as it charts `deskpod.train.log`'s. Each event file is read on from where
    the last poll stopped."""

    def __init__(self, run_dir: Path) -> None:
        self.run_dir = run_dir
        self._loaders: dict[Path, Any] = {}

    def poll(self) -> int:
        """Read what was appended to the event files; returns how many lines it wrote."""
        try:
            from tensorboard.backend.event_processing.event_file_loader import EventFileLoader
            from tensorboard.util.tensor_util import make_ndarray
        except ImportError:  # tensorboard is a dependency; without it there is nothing to copy
            return 0
        for path in self.run_dir.rglob("*tfevents*"):
            if path.is_file() and path not in self._loaders:
                self._loaders[path] = EventFileLoader(str(path))
        lines: list[str] = []
        for loader in self._loaders.values():
            steps: dict[int, dict[str, Any]] = {}
            for event in loader.Load():
                for value in event.summary.value:
                    if value.HasField("tensor"):
                        number = make_ndarray(value.tensor)
                        if number.size != 1:
                            continue  # an image, histogram or text: not a curve
                        scalar = float(number.reshape(()))
                    elif value.HasField("simple_value"):
                        scalar = float(value.simple_value)
                    else:
                        continue
                    rec = steps.setdefault(int(event.step), {"kind": "train", "step": int(event.step),
                                                             "time": round(float(event.wall_time), 3)})  # fmt: skip
                    rec[value.tag] = scalar if math.isfinite(scalar) else None
            lines += [json.dumps(r) for r in steps.values()]
        if lines:
            with (self.run_dir / "metrics.jsonl").open("a", encoding="utf-8") as f:
                f.write("".join(line + "\n" for line in lines))
        return len(lines)


class OutputWatch:
    """Follows the ranks' log files of this node while the group runs: copies global rank 0's output to the
    console and names ranks whose output has stopped growing (`ScriptRun.stall_after_s`)."""

    def __init__(self, run: ScriptRun, out: TextIO, err: TextIO, clock: Callable[[], float] = time.monotonic) -> None:
        self.run, self.out, self.err, self.clock = run, out, err, clock
        first = run.world.node_rank * len(run.devices) if run.world else 0
        self.ranks = range(first, first + len(run.devices))
        self.attempt = 0
        self._offsets: dict[Path, int] = {}
        self._last: dict[int, tuple[int, float]] = {}
        self._warned: dict[int, float] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="deskpod-run-watch", daemon=True)
        # The first node's launcher speaks for the run: it also copies TensorBoard's scalars for the dashboard.
        self.scalars = TensorBoardScalars(run.run_dir) if run.world is None or run.world.node_rank == 0 else None
        self._next_scalars = 0.0

    def __enter__(self) -> OutputWatch:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=5)
        self.poll()  # what rank 0 wrote last

    def _loop(self) -> None:
        while not self._stop.wait(0.2):
            self.poll()

    def _files(self, rank: int, attempt: int) -> tuple[Path, Path]:
        base = f"rank{rank}.attempt{attempt}"
        return self.run.logs / f"{base}.stdout", self.run.logs / f"{base}.stderr"

    def poll(self) -> None:
        now = self.clock()
        while any(p.exists() for r in self.ranks for p in self._files(r, self.attempt + 1)):
            self.attempt += 1  # a restarted group writes new files
            self._last.clear()
            self._warned.clear()
        if 0 in self.ranks:
            for path, stream in zip(self._files(0, self.attempt), (self.out, self.err), strict=True):
                self._copy(path, stream)
        self._check_stalls(now)
        if self.scalars is not None and (now >= self._next_scalars or self._stop.is_set()):
            self._next_scalars = now + 2.0
            self.scalars.poll()

    def _copy(self, path: Path, stream: TextIO) -> None:
        offset = self._offsets.get(path, 0)
        try:
            with path.open("rb") as f:
                f.seek(offset)
                chunk = f.read()
        except FileNotFoundError:
            return
        if chunk:
            self._offsets[path] = offset + len(chunk)
            stream.write(chunk.decode("utf-8", "replace"))
            stream.flush()

    def _check_stalls(self, now: float) -> None:
        for rank in self.ranks:
            files = self._files(rank, self.attempt)
            size = sum(p.stat().st_size for p in files if p.exists())
            if not any(p.exists() for p in files):
                continue  # not started yet
            prev = self._last.get(rank)
            if prev is None or size != prev[0]:
                self._last[rank] = (size, now)
                self._warned.pop(rank, None)
        quiet = {r: now - t for r, (_, t) in self._last.items() if now - t >= self.run.stall_after_s}
        due = {r: s for r, s in quiet.items() if s >= 2 * self._warned.get(r, self.run.stall_after_s / 2)}
        if not due:
            return
        self._warned.update(due)
        talking = {r: now - t for r, (_, t) in self._last.items() if r not in quiet}
        names = ", ".join(f"rank {r}" for r in sorted(due))
        others = (
            "; " + ", ".join(f"rank {r} wrote {format_span(s)} ago" for r, s in sorted(talking.items()))
            if talking
            else "; no rank of this node is writing"
        )
        self.err.write(
            f"deskpod run: {names} {'has' if len(due) == 1 else 'have'} written nothing for "
            f"{format_span(max(due.values()))}{others} (stalled? logs in {self.run.logs})\n"
        )
        self.err.flush()


def format_span(seconds: float) -> str:
    s = int(seconds)
    return f"{s // 60}m{s % 60:02d}s" if s >= 60 else f"{s}s"


def launch_script(run: ScriptRun, *, out: TextIO | None = None, err: TextIO | None = None) -> dict[str, Any]:
    """Run the script's ranks to the end; the summary (also ``summary.json``). `WorkerError` when restarts run
    out: the rank that failed first, its exit code and traceback."""
    from torch.distributed.elastic.multiprocessing import SignalException
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.launcher.api import elastic_launch

    out, err = out or sys.stdout, err or sys.stderr
    _write_run_file(run)
    config = launch_config(run.world, len(run.devices), run.max_restarts, run.logs / "agent", "deskpod-run")
    env = {**worker_env(run.kind, run.devices), "DESKPOD_RUN_DIR": str(run.run_dir)}
    start = time.monotonic()
    state, code = "completed", 0
    watch = OutputWatch(run, out, err)
    try:
        with environment(env), watch:
            elastic_launch(config, sys.executable)("-m", "deskpod.train.script_worker", str(run.run_dir))
    except ChildFailedError as e:
        rank, failure = e.get_first_failure()
        trace = failure_traceback(failure)
        how = f"exit code {failure.exitcode}" + (f", {failure.signal_name()}" if failure.exitcode < 0 else "")
        _write_summary(run, "failed", failure.exitcode, watch.attempt, time.monotonic() - start, rank)
        raise WorkerError(
            f"deskpod run: rank {rank} failed first ({how}) after {watch.attempt} restart"
            f"{'s' if watch.attempt != 1 else ''} (--max-restarts {run.max_restarts}); every rank's output is in "
            f"{run.logs}",
            root_cause=str(trace or _tail(run, rank, watch.attempt) or failure.message),
        ) from None
    except SignalException as e:
        state, code = "stopped", 128 + int(e.sigval)
    return _write_summary(run, state, code, watch.attempt, time.monotonic() - start, None)


def _tail(run: ScriptRun, rank: int, attempt: int, lines: int = 30) -> str:
    """The last lines a rank wrote to stderr, for a failure without a Python traceback (a signal, os._exit)."""
    with contextlib.suppress(OSError):
        text = (run.logs / f"rank{rank}.attempt{attempt}.stderr").read_text(errors="replace")
        return "\n".join(text.splitlines()[-lines:])
    return ""


def _write_summary(
    run: ScriptRun, state: str, code: int, restarts: int, wall_s: float, failed_rank: int | None
) -> dict[str, Any]:
    summary = {
        "run": run.name,
        "run_dir": str(run.run_dir),
        "target": list(run.target),
        "state": state,
        "exit_code": code,
        "world_size": run.world_size,
        "nodes": run.world.nodes if run.world else 1,
        "device_kind": run.kind,
        "devices": [d.label for d in run.devices],
        "restarts": restarts,
        "failed_rank": failed_rank,
        "wall_time_s": round(wall_s, 2),
    }
    if run.world is None or run.world.node_rank == 0:
        write_json(run.run_dir / "summary.json", summary, indent=2)
    return summary


def exit_code(summary: dict[str, Any]) -> int:
    """0 when the script's ranks all finished; 128 + the signal when the launcher was stopped by one."""
    return int(summary["exit_code"]) if summary["state"] == "stopped" else 0
