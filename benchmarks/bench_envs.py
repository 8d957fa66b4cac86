"""Per-job environments and sandboxes: a cached environment's start, the sandbox's cost, warm rebuilds.

    .venv/bin/python benchmarks/bench_envs.py               # 3 rounds; table + JSON, updates docs/benchmarks.md
    .venv/bin/python benchmarks/bench_envs.py --rounds 1 --no-docs
    .venv/bin/python benchmarks/bench_envs.py --only rebuild     # one target, JSON only, no docs

Runs as root (the pod then runs its jobs sandboxed as in production). Three targets, all in the same run:

1. **Start of a job whose environment is cached against a job in the daemon's own Python.** A real root
   pod (``deskpod up`` through `tests.jobs.pods.Pods` with ``sandbox=True``: every job in a bubblewrap
   sandbox) on 127.0.0.1, a temporary home, the admin's token. Job A is ``[sys.executable, "-c", "pass"]``
   (no environment); job B is ``["python", "-c", "pass"]`` with ``environment = {"packages":
   ["tabulate==0.8.10"]}``, whose environment is built by one untimed job B first (from the box's pip
   sources, as the pod builds any). Then, each round, ``--jobs`` (default 20) of each kind alternate (A B A B ... or
   B A B A ..., the first kind swapped every round), each waited to its end before the next is
   submitted. Time = submit -> running from the job's own history (``events`` of ``GET /v1/jobs/ID``:
   the ``at`` of the event that entered ``queued`` to the ``at`` of the one that entered ``running``);
   every timed B job must have gone ``starting -> running`` with a "cached" note (no ``building``).
   Target: median B / median A <= 1.2x (paired per round; the median of the rounds' ratios).
2. **Sandbox overhead on a training step.** ``deskpod train`` (ResNet-18 on synthetic 3x64x64 images,
   ``--steps`` steps (default 50), global batch 16 on 2 CPU workers, Gloo) run directly as root, and the same
   command inside ``sandbox_argv(Walls(writable=(out,)), argv, account=None, cwd=out)`` (bubblewrap:
   the system read-only, its own PID/IPC/UTS namespaces, private /tmp and /dev/shm), in turn, the
   order swapped every round. A run's throughput is the median of its per-step rates (``metrics.jsonl``
   with ``log_every_steps = 1``, steps after the first `WARM_STEPS`), robust to a moment of other work on
   the shared cores; ``summary.json``'s ``throughput_images_per_s`` is listed beside it. Both get the same environment (``MPLCONFIGDIR`` in the run folder: in
   the sandbox ``~`` is read-only). Target: sandboxed / direct >= 0.98 (paired per round).
3. **Second build of a 20-package environment on a warm cache against the first.** An `EnvCache` in a
   fresh temporary root per round (its own uv cache, so the first build is cold), a requirements file
   of 20 pinned pure-Python packages (`PACKAGES`), built with `EnvCache.ensure` from pip's sources on this
   box (`package_sources`: PyPI as the default index plus the local ones — what the pod's own builds use);
   then `EnvCache.remove` of that environment (uv's cache and the recorded resolution stay) and `ensure`
   again of the same definition (which installs the recorded resolution offline from uv's cache).
   Both ``BuiltEnv.seconds`` and the wall time around ``ensure``; the package count is freeze.txt's.
   Target: first / second >= 10x. Beside it, the same two builds from this box's local indexes alone
   (`LOCAL`: the cold build copies and unpacks wheels from the local disk and downloads nothing).

The machine has 2 cores and other work may share them: medians over ``--rounds`` (paired ratios per
round), with every run listed.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import psutil
from docs_section import cpu_model, publish

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from deskpod.envs.cache import BuiltEnv, EnvCache  # noqa: E402
from deskpod.envs.definition import EnvDefinition, parse_environment  # noqa: E402
from deskpod.envs.index import PackageSources, package_sources  # noqa: E402
from deskpod.envs.python import Interpreter, resolve_python  # noqa: E402
from deskpod.envs.sandbox import Walls, check_sandbox, sandbox_argv  # noqa: E402
from deskpod.errors import DeskpodError  # noqa: E402
from deskpod.jobs.client import PodClient  # noqa: E402
from deskpod.processes import start_time  # noqa: E402
from tests.jobs.pods import Pods  # noqa: E402

SECTION = "## Environments and sandboxes"
INTRO = (
    "Per-job software environments and walls (`deskpod/envs/`, `deskpod/jobs/isolation.py`): a cached\n"
    "environment's start, bubblewrap's cost on a training step, and a rebuild from uv's warm cache."
)
SUB = "### Cached environments, sandbox overhead, warm rebuilds (bench_envs.py)"
PY = sys.executable
FINAL = ("succeeded", "failed", "cancelled", "lost")
ENV_B = {"packages": ["tabulate==0.8.10"]}
PACKAGES = (
    "attrs==26.1.0",
    "certifi==2026.7.22",
    "click==8.5.0",
    "colorama==0.4.6",
    "decorator==5.3.1",
    "docutils==0.22.4",
    "idna==3.20",
    "iniconfig==2.3.0",
    "more-itertools==10.8.0",
    "packaging==26.3",
    "pluggy==1.6.0",
    "pyparsing==3.3.3",
    "python-dateutil==2.9.0.post0",
    "pytz==2026.4",
    "six==1.17.0",
    "tabulate==0.8.10",
    "toml==0.10.2",
    "typing-extensions==4.16.0",
    "urllib3==2.8.0",
    "zipp==3.23.0",
)
"""20 pinned pure-Python wheels of /opt/pypi/simple (python-dateutil needs six, which is in the list)."""
LOCAL_INDEXES = (Path("/opt/pypi/simple"), Path("/opt/pypi-more/simple"))
LOCAL = PackageSources(
    index_url=LOCAL_INDEXES[0].as_uri(),
    extra_index_urls=(LOCAL_INDEXES[1].as_uri(),),
    find_links=("/opt/wheels",),
)
"""This box's local package sources alone (pip's configuration here adds PyPI as the default index)."""
PYPI = PackageSources(index_url="https://pypi.org/simple")
"""PyPI alone, as on a box without a local mirror: the cold build downloads every wheel."""


def log(text: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {text}", file=sys.stderr, flush=True)


# ---------------------------------------------------------------- 1. a cached environment's start
def run_job(c: PodClient, spec: dict[str, Any], timeout: float = 120) -> dict[str, Any]:
    """Submit ``spec`` and wait for the job's end; the job as GET /v1/jobs/ID answers it then."""
    job_id = c.submit(spec)["id"]
    deadline = time.monotonic() + timeout
    while True:
        job = c.job(job_id)
        if job["state"] in FINAL:
            break
        if time.monotonic() > deadline:
            raise SystemExit(f"job {job_id} ({spec.get('name')}) did not end in {timeout:.0f} s: {job['state']}")
        time.sleep(0.01)
    if job["state"] != "succeeded":
        text = c.log(job_id)[0].decode(errors="replace")[-2000:]
        raise SystemExit(f"job {job_id} ({spec.get('name')}) ended {job['state']}: {job.get('reason')}\n{text}")
    return job


def entered(job: dict[str, Any], state: str) -> float:
    """When the job (its first attempt) entered ``state``, from its history."""
    return float(next(e["at"] for e in job["events"] if e["to"] == state and e["from"] != state))


def start_parts(job: dict[str, Any]) -> dict[str, float]:
    """submit -> running, and its two halves (queued -> starting: the scheduler; starting -> running: prepare
    and spawn), in ms."""
    queued, starting, running = (entered(job, s) for s in ("queued", "starting", "running"))
    return {
        "start_ms": (running - queued) * 1000,
        "schedule_ms": (starting - queued) * 1000,
        "spawn_ms": (running - starting) * 1000,
    }


def notes(job: dict[str, Any]) -> str:
    return " | ".join(str(e["note"]) for e in job["events"])


def cached_start(args: argparse.Namespace, work: Path) -> dict[str, Any]:
    (work / "pods").mkdir()
    pods = Pods(work / "pods")
    try:
        pod = pods(sandbox=True)
        c = pod.client()
        a_spec: dict[str, Any] = {"name": "a", "command": [PY, "-c", "pass"]}
        b_spec: dict[str, Any] = {"name": "b", "command": ["python", "-c", "pass"], "environment": ENV_B}
        t0 = time.monotonic()
        build = run_job(c, {**b_spec, "name": "b-build"}, timeout=600)
        if not any(e["to"] == "building" for e in build["events"]):
            raise SystemExit(f"the first job B did not build its environment: {notes(build)}")
        log(f"start: environment of job B built by job {build['id']} in {time.monotonic() - t0:.1f} s")
        warm = run_job(c, {**a_spec, "name": "a-warmup"})
        for job in (build, warm):
            if "sandboxed (bubblewrap)" not in notes(job):
                raise SystemExit(f"job {job['id']} was not sandboxed: {notes(job)}")
        rounds: list[dict[str, Any]] = []
        last_b = build
        for r in range(1, args.rounds + 1):
            runs: dict[str, list[dict[str, float]]] = {"a": [], "b": []}
            order = ("a", "b") if r % 2 else ("b", "a")
            for i in range(args.jobs):
                for kind in order:
                    spec = a_spec if kind == "a" else b_spec
                    job = run_job(c, {**spec, "name": f"{kind}-r{r}-{i}"})
                    if kind == "b" and (
                        any(e["to"] == "building" for e in job["events"]) or "cached" not in notes(job)
                    ):
                        raise SystemExit(f"job {job['id']} did not start in its cached environment: {notes(job)}")
                    runs[kind].append(start_parts(job))
                    if kind == "b":
                        last_b = job
            a = statistics.median(x["start_ms"] for x in runs["a"])
            b = statistics.median(x["start_ms"] for x in runs["b"])
            rounds.append({"order": "".join(order).upper(), "a_ms": a, "b_ms": b, "ratio": b / a, "runs": runs})
            log(f"start round {r}: A {a:.1f} ms, B {b:.1f} ms ({b / a:.2f}x)")
        ratio = statistics.median(x["ratio"] for x in rounds)

        def overall(kind: str, part: str) -> float:
            return float(statistics.median(x[part] for rd in rounds for x in rd["runs"][kind]))

        return {
            "rounds": rounds,
            "ratio": ratio,
            "met": ratio <= 1.2,
            "jobs_per_kind_per_round": args.jobs,
            "a": {p: overall("a", p) for p in ("start_ms", "schedule_ms", "spawn_ms")},
            "b": {p: overall("b", p) for p in ("start_ms", "schedule_ms", "spawn_ms")},
            "build_job": {"id": build["id"], "notes": notes(build)},
            "b_notes": notes(last_b),
        }
    finally:
        pods.stop_all()


# ---------------------------------------------------------------- 2. the sandbox's cost on a training step
def train_run(args: argparse.Namespace, out: Path, name: str, sandboxed: bool) -> dict[str, Any]:
    argv = [PY, "-m", "deskpod", "train", "--config", str(out / "train.toml"), "--model", args.model,
            "--data", f"synthetic:{args.shape}", "--steps", str(args.steps), "--devices", str(args.devices),
            "--batch-size", str(args.global_batch // args.devices), "--out", str(out / "runs"), "--name", name,
            "--quiet"]  # fmt: skip
    if sandboxed:
        argv = sandbox_argv(Walls(writable=(out,)), argv, account=None, cwd=out)
    env = dict(os.environ, MPLCONFIGDIR=str(out / "mpl"))
    busy0, t0 = busy_cpu_s(), time.perf_counter()
    own: dict[tuple[int, int], float] = {}  # (pid, start time) -> CPU seconds, of the run's process tree
    with open(out / f"{name}.out", "w+") as output:
        proc = subprocess.Popen(argv, cwd=out, env=env, stdout=output, stderr=subprocess.STDOUT)
        while proc.poll() is None and time.perf_counter() - t0 < 900:
            own.update(tree_cpu_s(proc.pid))
            time.sleep(0.2)
        if proc.poll() is None:
            proc.kill()
        proc.wait()
        wall = time.perf_counter() - t0
        others = max(0.0, busy_cpu_s() - busy0 - sum(own.values())) / wall
        output.seek(0)
        text = output.read()
    if proc.returncode != 0:
        raise SystemExit(f"deskpod train ({name}) failed ({proc.returncode}): {text[-4000:]}")
    s = json.loads((out / "runs" / name / "summary.json").read_text())
    if (s["world_size"], s["global_batch"], s["steps"]) != (args.devices, args.global_batch, args.steps):
        raise SystemExit(f"{name}: expected {args.devices} workers, global batch {args.global_batch}, "
                         f"{args.steps} steps: {s}")  # fmt: skip
    rows = [json.loads(line) for line in (out / "runs" / name / "metrics.jsonl").read_text().splitlines() if line]
    steps = [float(r["images_per_s"]) for r in rows if r.get("kind") == "train" and r.get("step", 0) > WARM_STEPS]
    if not steps:
        raise SystemExit(f"{name}: no per-step rates after step {WARM_STEPS} in metrics.jsonl")
    return {"images_per_s": statistics.median(steps), "summary_images_per_s": float(s["throughput_images_per_s"]),
            "train_time_s": float(s["train_time_s"]), "wall_s": wall, "other_cores": others}  # fmt: skip


WARM_STEPS = 5
"""Steps left out of a run's per-step median (the first ones warm up allocators and caches)."""


def busy_cpu_s() -> float:
    """CPU seconds the whole machine has spent busy since boot (all but idle and iowait)."""
    t = psutil.cpu_times()
    return t.user + t.nice + t.system + t.irq + t.softirq + t.steal


def tree_cpu_s(root: int) -> dict[tuple[int, int], float]:
    """CPU seconds so far of ``root`` and every descendant, by (pid, start time)."""
    out: dict[tuple[int, int], float] = {}
    with contextlib.suppress(psutil.Error):
        top = psutil.Process(root)
        for p in [top, *top.children(recursive=True)]:
            with contextlib.suppress(psutil.Error):
                t = p.cpu_times()
                out[(p.pid, start_time(p.pid) or 0)] = t.user + t.system
    return out


def sandbox_overhead(args: argparse.Namespace, work: Path) -> dict[str, Any]:
    why = check_sandbox()
    if why:
        raise SystemExit(f"bench_envs needs bubblewrap: {why}")
    out = work / "train"
    (out / "mpl").mkdir(parents=True)
    samples = args.steps * args.global_batch
    (out / "train.toml").write_text(f"synthetic_samples = {samples}\nlog_every_steps = 1\n")
    probe = sandbox_argv(Walls(writable=(out,)), [PY, "-c", "import os; print(os.getpid())"], account=None, cwd=out)
    pid = int(subprocess.run(probe, capture_output=True, text=True, check=True, timeout=60).stdout)
    if pid > 10:
        raise SystemExit(f"the sandbox has no PID namespace of its own (pid {pid} inside)")
    direct: list[dict[str, Any]] = []
    boxed: list[dict[str, Any]] = []
    for r in range(1, args.rounds + 1):
        order = [(direct, "direct", False), (boxed, "sandboxed", True)]
        for runs, label, sandboxed in order if r % 2 else order[::-1]:
            runs.append(train_run(args, out, f"{label}-r{r}", sandboxed))
            log(f"sandbox round {r}: {label} {runs[-1]['images_per_s']} img/s ({runs[-1]['wall_s']:.1f} s wall, "
                f"other work {runs[-1]['other_cores']:.2f} cores)")  # fmt: skip
    ratios = [b["images_per_s"] / d["images_per_s"] for d, b in zip(direct, boxed, strict=True)]
    ratio = statistics.median(ratios)
    return {
        "direct": direct,
        "sandboxed": boxed,
        "ratios": ratios,
        "ratio": ratio,
        "met": ratio >= 0.98,
        "pid_inside": pid,
        "orders": ["direct first" if r % 2 else "sandboxed first" for r in range(1, args.rounds + 1)],
    }


# ---------------------------------------------------------------- 3. a rebuild from a warm uv cache
def check_local_packages() -> None:
    """Every pin of `PACKAGES` has a wheel in the local indexes (else the benchmark would not be offline)."""
    for pin in PACKAGES:
        name, version = pin.split("==")
        norm = re.sub(r"[-_.]+", "-", name).lower()
        pages = [d / norm / "index.html" for d in LOCAL_INDEXES if (d / norm / "index.html").is_file()]
        wheel = re.compile(rf"{re.sub('-', '[-_.]', norm)}-{re.escape(version)}-", re.IGNORECASE)
        if not any(wheel.search(p.read_text()) for p in pages):
            raise SystemExit(f"{pin} has no wheel in {', '.join(map(str, LOCAL_INDEXES))}; pick another version")


def freeze_count(path: Path) -> int:
    return sum(1 for line in path.read_text().splitlines() if "==" in line and not line.startswith("#"))


UV_STEP = re.compile(r"^(Resolved|Prepared|Installed) \d+ packages? in ([\d.]+)(ms|s)$", re.M)


def uv_steps(build_log: Path) -> dict[str, float]:
    """uv's own timings of one build, from its log: seconds to resolve, prepare (download, unpack) and install."""
    return {m[1].lower(): float(m[2]) / (1000 if m[3] == "ms" else 1) for m in UV_STEP.finditer(build_log.read_text())}


def build_twice(cache: EnvCache, defn: EnvDefinition, interp: Interpreter, logs: Path) -> dict[str, Any]:
    """A cold build in ``cache`` (empty), `EnvCache.remove` of it, and the same build again on uv's warm cache."""
    if cache.uv_cache.exists():
        raise SystemExit(f"{cache.uv_cache} exists: the first build would not be cold")
    got: list[tuple[BuiltEnv, float, int, dict[str, float]]] = []
    for n, which in enumerate(("first", "second")):
        if n:
            cache.remove(got[0][0].key)
        with open(logs.with_name(f"{logs.name}-{which}.log"), "wb") as build_log:
            t0 = time.perf_counter()
            built = cache.ensure(defn, log=build_log, interp=interp)
            wall = time.perf_counter() - t0
        got.append((built, wall, freeze_count(built.freeze), uv_steps(logs.with_name(f"{logs.name}-{which}.log"))))
    (first, wall1, count1, steps1), (second, wall2, count2, steps2) = got
    uv_bytes = cache.uv_cache_bytes()
    if not (first.built and second.built) or uv_bytes == 0:
        raise SystemExit(f"expected two builds on one uv cache ({first}, {second}, {uv_bytes} B)")
    return {"first_s": first.seconds, "second_s": second.seconds, "first_wall_s": wall1, "second_wall_s": wall2,
            "ratio": first.seconds / second.seconds, "wall_ratio": wall1 / wall2, "packages_first": count1,
            "packages_second": count2, "uv_first": steps1, "uv_second": steps2, "uv_cache_bytes": uv_bytes,
            "installer": str(json.loads((second.folder / "meta.json").read_text())["installer"])}  # fmt: skip


def warm_rebuild(args: argparse.Namespace, work: Path) -> dict[str, Any]:
    check_local_packages()
    interp = resolve_python(None)  # found once here: neither build pays for probing the interpreters
    text = "".join(p + "\n" for p in PACKAGES)
    defn = parse_environment({"requirements": {"file": "requirements.txt", "text": text}})
    rounds: list[dict[str, Any]] = []
    online: list[dict[str, Any]] = []
    pypi: list[dict[str, Any]] = []
    for r in range(1, args.rounds + 1):
        row = build_twice(EnvCache(work / f"envs-r{r}"), defn, interp, work / f"build-r{r}")  # pip's sources
        rounds.append(row)
        log(f"rebuild round {r}: first {row['first_s']:.2f} s, second {row['second_s']:.2f} s ({row['ratio']:.1f}x), "
            f"{row['packages_first']} packages")  # fmt: skip
        # Beside it: the local indexes alone (nothing downloaded by the cold build), PyPI alone (every wheel is).
        for runs, name, label, sources in (
            (online, "local", "local indexes", LOCAL),
            (pypi, "pypi", "PyPI alone", PYPI),
        ):
            try:
                got = build_twice(EnvCache(work / f"envs-{name}-r{r}", sources=sources), defn, interp,
                                  work / f"build-{name}-r{r}")  # fmt: skip
            except DeskpodError as e:
                got = {"error": str(e)}
            runs.append(got)
            if "error" not in got:
                log(f"rebuild round {r}, {label}: first {got['first_s']:.2f} s, second {got['second_s']:.2f} s "
                    f"({got['ratio']:.1f}x)")  # fmt: skip
    ratio = statistics.median(x["ratio"] for x in rounds)
    ok = [x for x in online if "error" not in x]
    ok_pypi = [x for x in pypi if "error" not in x]
    return {
        "rounds": rounds,
        "ratio": ratio,
        "wall_ratio": statistics.median(x["wall_ratio"] for x in rounds),
        "met": ratio >= 10,
        "first_s": statistics.median(x["first_s"] for x in rounds),
        "second_s": statistics.median(x["second_s"] for x in rounds),
        "python": f"{interp.implementation} {interp.version} ({interp.path})",
        "installer": rounds[0]["installer"],
        "requested": len(PACKAGES),
        "local": online,
        "local_ratio": statistics.median(x["ratio"] for x in ok) if ok else None,
        "pypi": pypi,
        "pypi_ratio": statistics.median(x["ratio"] for x in ok_pypi) if ok_pypi else None,
        "pip_sources_files": list(package_sources().files),
    }


# ---------------------------------------------------------------- report
def runs_of(xs: list[float], fmt: str = "{:.1f}") -> str:
    return ", ".join(fmt.format(x) for x in xs)


def met(ok: bool) -> str:
    return "**met**" if ok else "**missed**"


def report(res: dict[str, Any], command: str) -> str:
    a = res["args"]
    st, sb, rb = res["start"], res["sandbox"], res["rebuild"]
    start_rows = "\n".join(
        f"| {i} | {rd['order']} | {rd['a_ms']:.1f} | {rd['b_ms']:.1f} | {rd['ratio']:.2f}x |"
        for i, rd in enumerate(st["rounds"], 1)
    )
    start_runs = "\n".join(
        f"- round {i}: A {runs_of([x['start_ms'] for x in rd['runs']['a']])}; "
        f"B {runs_of([x['start_ms'] for x in rd['runs']['b']])}"
        for i, rd in enumerate(st["rounds"], 1)
    )
    train_rows = "\n".join(
        f"| {i} | {o} | {d['images_per_s']:.1f} ({d['summary_images_per_s']:.1f}) | {b['images_per_s']:.1f} "
        f"({b['summary_images_per_s']:.1f}) | {q:.3f} | {d['wall_s']:.1f} / "
        f"{b['wall_s']:.1f} | {d['other_cores']:.2f} / {b['other_cores']:.2f} |"
        for i, (o, d, b, q) in enumerate(zip(sb["orders"], sb["direct"], sb["sandboxed"], sb["ratios"], strict=True), 1)
    )

    def uv_ms(steps: dict[str, float]) -> str:
        return " / ".join(
            f"{steps[k] * 1000:.0f}" if k in steps else "-" for k in ("resolved", "prepared", "installed")
        )

    def build_row(label: str, x: dict[str, Any]) -> str:
        if "error" in x:
            return f"| {label} | not measured: {x['error']} | | | | | |"
        return (
            f"| {label} | {x['first_s']:.2f} ({x['first_wall_s']:.2f}) | {x['second_s']:.2f} ({x['second_wall_s']:.2f}) | "
            f"**{x['ratio']:.1f}x** ({x['wall_ratio']:.1f}x) | {uv_ms(x['uv_first'])} -> {uv_ms(x['uv_second'])} | "
            f"{x['packages_first']} / {x['packages_second']} | {x['uv_cache_bytes'] / 2**20:.1f} |"
        )

    build_rows = "\n".join(build_row(f"{i}, pip's sources", x) for i, x in enumerate(rb["rounds"], 1))
    local_rows = "\n".join(build_row(f"{i}, local indexes", x) for i, x in enumerate(rb["local"], 1))
    pypi_rows = "\n".join(build_row(f"{i}, PyPI alone", x) for i, x in enumerate(rb["pypi"], 1))
    local_ratio, pypi_ratio = rb["local_ratio"], rb["pypi_ratio"]
    local_note = f"the median of its rounds is {local_ratio:.1f}x" if local_ratio is not None else "not measured"
    pypi_note = f"the median of its rounds is {pypi_ratio:.1f}x" if pypi_ratio is not None else "not measured"
    pypi_ratio_text = f"{pypi_ratio:.1f}x" if pypi_ratio is not None else "not measured"
    inst1 = statistics.median(x["uv_first"].get("installed", 0) for x in rb["rounds"])
    inst2 = statistics.median(x["uv_second"].get("installed", 0) for x in rb["rounds"])
    res1 = statistics.median(x["uv_first"].get("resolved", 0) for x in rb["rounds"])
    dmed = statistics.median(x["images_per_s"] for x in sb["direct"])
    bmed = statistics.median(x["images_per_s"] for x in sb["sandboxed"])
    direct = [x["images_per_s"] for x in sb["direct"]]
    spread = (max(direct) - min(direct)) / dmed
    spread_note = (
        f"The direct runs alone spread by {spread:.1%} of their median (max - min): the noise of this shared box,\n"
        "against which a 2% target is read."
        if len(direct) > 1
        else "One round: no spread of the direct runs to read the 2% target against."
    )
    packages = " ".join(f"`{p}`" for p in PACKAGES)
    return f"""{SUB}

Command: `{command}` ({res["date"]}, {res["minutes"]:.1f} min, as root; this 2-core VM with no GPU, {res["cpu"]};
load average {res["load_before"]:.1f} before and {res["load_after"]:.1f} after — other engineers' work shares the cores).
Medians over {a["rounds"]} round{"s" if a["rounds"] != 1 else ""}, ratios paired per round (the median of the rounds' ratios); every run is listed.

Targets: a cached environment's start <= 1.2x a job in the daemon's own Python — {met(st["met"])} ({st["ratio"]:.2f}x);
sandbox overhead on a training step <= 2% (sandboxed >= 0.98x) — {met(sb["met"])} ({sb["ratio"]:.3f}x); second build of a
20-package environment on a warm cache >= 10x faster — {met(rb["met"])} ({rb["ratio"]:.1f}x with this box's pip sources,
whose wheels lie on a local mirror; {pypi_ratio_text} from PyPI alone, where the first build downloads them).

**Start of a job whose environment is cached, against a job in the daemon's own Python.** A real root pod (`deskpod up`
via `tests.jobs.pods.Pods(...)(sandbox=True)`: every job in a bubblewrap sandbox, as in production), the admin's token
over HTTP on 127.0.0.1. Job A: `[sys.executable, "-c", "pass"]`; job B: `["python", "-c", "pass"]` with `environment =
{{packages = ["tabulate==0.8.10"]}}`, its environment built once by an untimed first job B. {a["jobs"]} jobs of each kind
per round, alternating (the first kind swapped each round), each waited to its end before the next submission. Time =
submit -> running from each job's history (`events` of `GET /v1/jobs/ID`: `at` of entering `queued` to `at` of entering
`running`); every timed job B went `starting -> running` with the note "cached" (nothing built or installed).

| round | order | A: daemon's Python, median ms | B: cached environment, median ms | B / A |
|---|---|---|---|---|
{start_rows}
| all | | {st["a"]["start_ms"]:.1f} | {st["b"]["start_ms"]:.1f} | **{st["ratio"]:.2f}x** (target <= 1.2x: {met(st["met"])}) |

Split (medians of all timed jobs): queued -> starting (the scheduler) A {st["a"]["schedule_ms"]:.1f} ms, B
{st["b"]["schedule_ms"]:.1f} ms; starting -> running (`Isolation.prepare`: account, environment lookup, sandbox argv;
then the shim spawned) A {st["a"]["spawn_ms"]:.1f} ms, B {st["b"]["spawn_ms"]:.1f} ms. Every job's submit -> running, ms:

{start_runs}

**Sandbox overhead on a training step.** `deskpod train --model {a["model"]} --data synthetic:{a["shape"]} --steps
{a["steps"]} --devices {a["devices"]} --batch-size {a["global_batch"] // a["devices"]}` (global batch {a["global_batch"]}, fp32, {a["devices"]}
CPU workers, Gloo over loopback; `synthetic_samples = {a["steps"] * a["global_batch"]}` in its config) run directly as root, and
the same argv inside `sandbox_argv(Walls(writable=(out,)), argv, account=None, cwd=out)` (bubblewrap: the system
read-only, only the run folder writable, its own PID namespace — the probe's pid inside was {sb["pid_inside"]} — IPC and UTS
namespaces, private /tmp and /dev/shm). A run's throughput is the median of its per-step rates (`metrics.jsonl`,
`log_every_steps = 1`, steps after the first {WARM_STEPS}); `summary.json`'s `throughput_images_per_s` in brackets;
both runs get `MPLCONFIGDIR` in the run folder. {spread_note}

| round | order | direct img/s | sandboxed img/s | sandboxed / direct | wall s (direct / sandboxed) | other work, cores (direct / sandboxed) |
|---|---|---|---|---|---|---|
{train_rows}
| all | | {dmed:.1f} | {bmed:.1f} | **{sb["ratio"]:.3f}x** (target >= 0.98x: {met(sb["met"])}) | | |

"Other work" is what the rest of the machine kept busy during each run, in cores of the 2: `/proc/stat`'s busy time
over the run minus the run's own CPU time (its process tree's, sampled every 0.2 s), divided by
its wall time.

**Second build of a 20-package environment on a warm cache.** `EnvCache(<fresh temp root>).ensure` of a requirements
file of 20 pinned pure-Python packages ({packages}), with {rb["installer"]} on {rb["python"]}; then
`EnvCache.remove` of that environment (uv's cache and the recorded resolution kept) and `ensure` of the same definition
again. A new root per round, so each first build is cold (an empty uv cache). The target's figure uses pip's sources on
this box (`deskpod.envs.index.package_sources()`, what the pod's own builds use: PyPI as the default index plus the
local ones, uv's `unsafe-best-match`): the cold build resolves against them and fetches what it picks. The second build
installs the first one's recorded resolution (`<root>/.resolved/<key>.txt`) with `uv pip sync --offline`: no index is
asked. Beside it, in the same rounds, the same two builds from this box's local indexes alone (`file:///opt/pypi/simple`,
`file:///opt/pypi-more/simple`, find-links `/opt/wheels`: the cold build copies and unpacks wheels from the local disk,
nothing is downloaded); {local_note}. And from PyPI alone (`https://pypi.org/simple`, as on a box without a local
mirror: the cold build downloads every wheel); {pypi_note}. Times are `BuiltEnv.seconds` (venv, install, and for the cold build `uv pip freeze`), wall time around
`ensure` in brackets; the uv column is uv's own "Resolved / Prepared / Installed ... in" from each build's log, first
build -> second.

| round, sources | first build s (wall) | second build s (wall) | first / second | uv resolve / prepare / install ms | packages in freeze.txt | uv cache MiB |
|---|---|---|---|---|---|---|
{build_rows}
{local_rows}
{pypi_rows}
| all, pip's sources | {rb["first_s"]:.2f} | {rb["second_s"]:.2f} | **{rb["ratio"]:.1f}x** ({rb["wall_ratio"]:.1f}x wall; target >= 10x: {met(rb["met"])}) | | | |

With pip's sources the cold build's resolve took a median {res1 * 1000:.0f} ms and its install {inst1 * 1000:.0f} ms; the
warm one, with no resolving (the recorded set, offline), installs in {inst2 * 1000:.0f} ms. What is left of a warm build — creating the venv, starting the installer's
processes, sizing the folder and writing the ready marker — both builds pay; from the local disk alone the cold build is so
quick that this fixed part bounds the ratio.
"""


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rounds", type=int, default=3, help="rounds of every target (default 3)")
    p.add_argument("--jobs", type=int, default=20, help="jobs of each kind per round for the start target (default 20)")
    p.add_argument("--model", default="resnet18")
    p.add_argument("--shape", default="3x64x64", help="synthetic input CxHxW")
    p.add_argument("--global-batch", type=int, default=16)
    p.add_argument("--devices", type=int, default=2, help="CPU workers of each training run")
    p.add_argument("--steps", type=int, default=50, help="steps of each training run (default 50)")
    p.add_argument("--only", choices=["start", "sandbox", "rebuild"], help="run one target (JSON only, no docs)")
    p.add_argument("--keep", type=Path, help="work in this folder and keep it (pods, runs, environments, logs)")
    p.add_argument("--no-docs", action="store_true")
    args = p.parse_args()
    if os.geteuid() != 0:
        raise SystemExit("bench_envs runs as root: the pod sandboxes its jobs (and runs them as their users) only then")
    if args.rounds < 1 or args.jobs < 1 or args.steps < 2:
        raise SystemExit("--rounds and --jobs must be at least 1, --steps at least 2")
    if args.global_batch % args.devices:
        raise SystemExit(f"--global-batch {args.global_batch} is not a multiple of --devices {args.devices}")
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # stop the pod (the finally blocks) on SIGTERM too
    started = time.time()
    res: dict[str, Any] = {"benchmark": "envs", "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
                           "cpu": cpu_model(), "load_before": os.getloadavg()[0]}  # fmt: skip
    with contextlib.ExitStack() as stack:
        if args.keep:
            args.keep.mkdir(parents=True, exist_ok=True)
            work = Path(tempfile.mkdtemp(prefix="bench-envs-", dir=args.keep))
        else:
            work = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="deskpod-bench-envs-")))
        if args.only in (None, "start"):
            res["start"] = cached_start(args, work)
        if args.only in (None, "sandbox"):
            res["sandbox"] = sandbox_overhead(args, work)
        if args.only in (None, "rebuild"):
            res["rebuild"] = warm_rebuild(args, work)
    res.update(load_after=os.getloadavg()[0], minutes=(time.time() - started) / 60, args=vars(args))
    res["args"]["keep"] = str(args.keep) if args.keep else None
    ok = all(res[k]["met"] for k in ("start", "sandbox", "rebuild") if k in res)
    return publish(res, ok, only=bool(args.only), docs=not args.no_docs, report=report,
                   section=SECTION, subsection=SUB, intro=INTRO)  # fmt: skip


if __name__ == "__main__":
    sys.exit(main())
