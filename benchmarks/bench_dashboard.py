"""The dashboard's targets, each against a reference measured in the same run.

    .venv/bin/python benchmarks/bench_dashboard.py                 # all four; table + JSON; updates docs/benchmarks.md
    .venv/bin/python benchmarks/bench_dashboard.py --only jobs --no-docs

1. **jobs** — the Jobs page with 10,000 jobs in the store (9,000 ended, 1,000 queued behind a job that
   holds every device, three users): server time (the ``Server-Timing`` header the dashboard sets) p50 and
   p95 over repeated requests, for the first page, a user's page, the queue (positions and estimated starts),
   a name filter and a deep page; target p95 < 100 ms. Reference: the REST API's ``GET /v1/jobs`` for the
   same 50 jobs. Also the page right after a submission (the forecast is recomputed then).
2. **chart** — a Job page of a run with 100,000 metric rows in Chromium: from navigation start to the first
   chart drawn (``performance.mark("deskpod:first-chart")``), cold (the daemon has not read the file) and
   warm; target < 1 s. Reference: the same page asked for every point (``?points=100000``), no downsampling.
3. **live** — a row appended to ``metrics.jsonl`` while the Job page is open: the time until the page has
   it (the page records when each stream event arrived, on the same clock); target < 1 s; and the number
   of event-stream connections the tab opened (target: one).
4. **scheduling** — submit -> running median with no dashboard open and with 50 open dashboards (each one
   event stream on a Job page and a poll of the Pod page's live usage every 2 s, from a separate process);
   target: within 1.2x of no dashboards. The two conditions alternate in blocks so drift hits both alike.

A real daemon (``python -m deskpod up``) on 127.0.0.1 with a temporary home for each part.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import multiprocessing as mp
import os
import random
import re
import sqlite3
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import httpx
from bench_submit import start_daemon, stop_daemon
from docs_section import replace_subsection

from deskpod.jobs.client import PodClient

SECTION = "## Dashboard"
INTRO = "The web dashboard (`deskpod/web/`), served by the pod daemon: page times, chart drawing, live updates."
CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-background-networking", "--disable-component-update",
                 "--disable-sync", "--no-first-run"]  # fmt: skip


def percentile(xs: list[float], q: float) -> float:
    s = sorted(xs)
    return s[min(len(s) - 1, max(0, round(q / 100 * (len(s) - 1))))]


def sign_in(url: str, token: str) -> httpx.Client:
    c = httpx.Client(base_url=url, timeout=60, trust_env=False)
    form = c.get("/ui/login")
    csrf = re.search(r'name="csrf" value="([^"]+)"', form.text)
    assert csrf, form.text
    r = c.post("/ui/login", data={"csrf": csrf.group(1), "next": "/ui/", "token": token}, follow_redirects=False)
    assert r.status_code == 303, r.text
    return c


def server_ms(r: httpx.Response) -> float:
    m = re.search(r"app;dur=([\d.]+)", r.headers.get("server-timing", ""))
    assert m, f"no Server-Timing on {r.url}"
    return float(m.group(1))


# ---------------------------------------------------------------------------------------------- 1. jobs page
def fill_store(db: Path, n: int, queued: int, users: list[str]) -> None:
    """Insert ``n`` jobs straight into the store: ``queued`` of them waiting, the rest ended."""
    ended = ["succeeded"] * 7 + ["failed"] * 2 + ["cancelled"]
    con = sqlite3.connect(str(db), timeout=60)
    now = time.time()
    rows, events = [], []
    with con:
        start = int(con.execute("SELECT COALESCE(MAX(id), 0) FROM jobs").fetchone()[0]) + 1
        for i in range(n):
            job_id = start + i
            state = "queued" if i >= n - queued else ended[i % len(ended)]
            name = f"sweep-{i % 97}-{i}"
            spec = {"name": name, "devices": 1, "placement": "best", "priority": 0, "max_runtime": 600.0,
                    "retries": 0, "env": {}, "workdir": None, "command": ["python", "train.py", f"--seed={i}"]}  # fmt: skip
            t = now - (n - i) * 30.0
            done = None if state == "queued" else t + 20.0
            rows.append((job_id, users[i % len(users)], name, json.dumps(spec), 0, 1, "best", 600.0, 0, state,
                         "" if state != "failed" else "exit code 1", 0 if state == "queued" else 1, t,
                         None if state == "queued" else t + 1.0, done))  # fmt: skip
            events.append((job_id, t, None, "queued", "submitted"))
        con.executemany(
            "INSERT INTO jobs (id, user, name, spec, priority, devices, placement, max_runtime, retries, state, reason,"
            " attempt, submitted_at, started_at, finished_at) VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?,?,?)",
            rows,
        )
        con.executemany("INSERT INTO events VALUES (?, ?, ?, ?, ?)", events)
    con.close()


def time_requests(c: httpx.Client, path: str, params: dict[str, Any], repeats: int) -> dict[str, float]:
    for _ in range(5):  # warm-up: first reads of pages, the forecast, templates
        c.get(path, params=params).raise_for_status()
    server, total = [], []
    for _ in range(repeats):
        t0 = time.perf_counter()
        r = c.get(path, params=params)
        total.append((time.perf_counter() - t0) * 1000)
        r.raise_for_status()
        server.append(server_ms(r))
    return {"p50_ms": percentile(server, 50), "p95_ms": percentile(server, 95), "client_p95_ms": percentile(total, 95)}


def bench_jobs(tmp: Path, repeats: int) -> dict[str, Any]:
    home = tmp / "jobs-home"
    home.mkdir()
    proc, url, token = start_daemon(home, "--grace", "1", "--no-preemption")
    try:
        with PodClient(url, token) as api:
            n_dev = len(api.status()["devices"])
            blocker = api.submit({"name": "blocker", "command": ["sleep", "3600"], "devices": n_dev, "priority": 1000})
            while api.job(blocker["id"])["state"] != "running":
                time.sleep(0.05)
            for u in ("alice", "bob"):
                api.add_user(u)
            fill_store(home / "pod.db", 10_000, 1_000, ["admin", "alice", "bob"])
            total = api.request("GET", "/v1/jobs", params={"limit": 100000}).json()["jobs"]
            assert len(total) == 10_001, len(total)
            deep = int(total[8_000]["id"])
        web = sign_in(url, token)
        rest = httpx.Client(base_url=url, timeout=60, trust_env=False, headers={"Authorization": f"Bearer {token}"})
        cases = [
            ("first page (admin, every user)", {}),
            ("one user's jobs", {"user": "alice"}),
            ("the queue: positions and estimated starts", {"state": "queued"}),
            ("name contains", {"name": "sweep-42-"}),
            ("a deep page (keyset, 8,000 jobs in)", {"before": deep}),
        ]
        out: list[dict[str, Any]] = []
        for label, params in cases:
            page = time_requests(web, "/ui/jobs", params, repeats)
            ref = time_requests(rest, "/v1/jobs", {**params, "limit": 50}, repeats)
            out.append({"case": label, "params": params, "page": page, "rest_api": ref,
                        "ratio_p95": page["p95_ms"] / ref["p95_ms"]})  # fmt: skip
        # Right after a submission the queue changed: the forecast over 1,000 queued jobs is recomputed.
        with PodClient(url, token) as api:
            server = []
            for i in range(max(10, repeats // 5)):
                api.submit({"name": f"fresh-{i}", "command": ["true"], "max_runtime": 60})
                r = web.get("/ui/jobs", params={"state": "queued"})
                r.raise_for_status()
                server.append(server_ms(r))
        changed = {"p50_ms": percentile(server, 50), "p95_ms": percentile(server, 95), "samples": len(server)}
        web.close()
        rest.close()
    finally:
        stop_daemon(proc, url, token)
    worst = max(max(c["page"]["p95_ms"] for c in out), changed["p95_ms"])
    return {"jobs": 10_001, "repeats": repeats, "cases": out, "after_submit": changed, "worst_p95_ms": worst,
            "met": worst < 100.0}  # fmt: skip


# ------------------------------------------------------------------------------ shared: a train job's run folder
def metric_row(step: int, t: float) -> dict[str, Any]:
    return {"kind": "train", "step": step, "epoch": step // 1000, "loss": 2.3 / (1 + step / 5000.0),
            "lr": 0.1 * (1 - step / 200_000), "images_per_s": 1200.0 + (step % 17), "data_wait_fraction": 0.01,
            "memory_bytes": 123_456_789, "time": t}  # fmt: skip


def write_run(run: Path, rows: int) -> None:
    run.mkdir(parents=True, exist_ok=True)
    (run / "launch.json").write_text(json.dumps({"total_steps": rows * 2}))
    t0 = time.time() - rows
    with open(run / "metrics.jsonl", "w") as f:
        for step in range(1, rows + 1):
            f.write(json.dumps(metric_row(step, t0 + step)) + "\n")
            if step % 1000 == 0:
                f.write(json.dumps({"kind": "val", "step": step, "epoch": step // 1000, "val_loss": 0.4,
                                    "val_accuracy": min(0.95, 0.5 + step / 250_000), "time": t0 + step}) + "\n")  # fmt: skip


def full_pod(home: Path, *extra: str) -> tuple[Any, str, str, PodClient, str, Path]:
    """A pod whose every device is held, with a train job parked in the queue; returns its run folder."""
    proc, url, token = start_daemon(home, "--grace", "1", "--no-preemption", *extra)
    api = PodClient(url, token)
    n = len(api.status()["devices"])
    keep = n - 1 if extra else n  # with a catalog machine, leave one device for the submit probes
    blocker = api.submit({"name": "blocker", "command": ["sleep", "3600"], "devices": keep, "priority": 1000})
    while api.job(blocker["id"])["state"] != "running":
        time.sleep(0.05)
    # Below the probes' priority, so the scheduler's reservation for it never holds them back.
    job = api.submit({"name": "long-run", "devices": n, "priority": -10,
                      "train": {"model": "convnet", "data": "fashion-mnist"}})  # fmt: skip
    run = home / "jobs" / str(job["id"]) / "runs" / "long-run"
    return proc, url, token, api, str(job["id"]), run


# ------------------------------------------------------------------------------ 2. first chart, 3. live updates
def browser_page(url: str, token: str) -> tuple[Any, Any, Any]:
    from playwright.sync_api import sync_playwright

    pw = sync_playwright().start()
    browser = pw.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
    context = browser.new_context(bypass_csp=True)  # the page's CSP refuses the probes' evaluated scripts
    page = context.new_page()
    page.goto(f"{url}/ui/login")
    page.get_by_label("Token").fill(token)
    page.get_by_role("button", name="Sign in").click()
    page.wait_for_url(f"{url}/ui/")
    return pw, browser, page


def first_chart_ms(page: Any, url: str) -> float:
    page.goto(url)
    page.wait_for_function("performance.getEntriesByName('deskpod:first-chart').length > 0", timeout=60_000)
    return float(page.evaluate("performance.getEntriesByName('deskpod:first-chart')[0].startTime"))


def bench_chart_and_live(tmp: Path, rows: int, repeats: int, appends: int) -> dict[str, Any]:
    home = tmp / "chart-home"
    home.mkdir()
    proc, url, token, api, job_id, run = full_pod(home)
    write_run(run, rows)
    pw = browser = None
    try:
        pw, browser, page = browser_page(url, token)
        job_url = f"{url}/ui/jobs/{job_id}"
        cold = first_chart_ms(page, job_url)
        warm = [first_chart_ms(page, job_url) for _ in range(repeats)]
        full = [first_chart_ms(page, f"{job_url}?points={rows}") for _ in range(repeats)]
        # live: the page is open; append rows one at a time and see when each arrives
        requested: list[str] = []
        page.on("request", lambda r: requested.append(r.url))
        page.goto(job_url)
        page.wait_for_function("performance.getEntriesByName('deskpod:first-chart').length > 0", timeout=60_000)
        latencies = []
        with open(run / "metrics.jsonl", "a") as f:
            for i in range(appends):
                step = rows + 1 + i
                written = time.time()
                f.write(json.dumps(metric_row(step, written)) + "\n")
                f.flush()
                got = page.wait_for_function(
                    f"(window.deskpodLive || {{}})[{step}]", timeout=10_000
                ).json_value()  # the page's receive time (ms since the epoch) of the row for this step
                latencies.append(float(got) - written * 1000)
                time.sleep(0.3)
        streams = sum(1 for u in requested if f"/ui/jobs/{job_id}/events" in u)
        browser.close()
        pw.stop()
        pw = browser = None
    finally:
        if browser is not None:
            browser.close()
        if pw is not None:
            pw.stop()
        stop_daemon(proc, url, token)
        api.close()
    return {
        "rows": rows,
        "cold_ms": cold,
        "warm_ms": statistics.median(warm),
        "all_points_ms": statistics.median(full),
        "ratio_all_points_over_warm": statistics.median(full) / statistics.median(warm),
        "chart_met": max(cold, statistics.median(warm)) < 1000.0,
        "live_appends": appends,
        "live_p50_ms": percentile(latencies, 50),
        "live_max_ms": max(latencies),
        "event_streams": streams,
        "live_met": max(latencies) < 1000.0 and streams == 1,
    }


# ------------------------------------------------------------------------------------------- 4. scheduling
def _dashboards(url: str, token: str, job_id: str, n: int, ready: Any, stop: Any) -> None:
    """``n`` open dashboards, each as a browser tab has it: the Job page loaded (its JSON twin, for the
    stream's cursor), one event stream from that cursor, and the Pod page's usage poll every 2 s."""

    async def one(cookies: httpx.Cookies, connected: asyncio.Event) -> None:
        async with httpx.AsyncClient(base_url=url, cookies=cookies, timeout=None, trust_env=False) as c:
            cursor = (await c.get(f"/ui/jobs/{job_id}.json")).json()["cursor"]

            async def stream() -> None:
                path = f"/ui/jobs/{job_id}/events?cursor={cursor}"
                async with c.stream("GET", path, headers={"Accept": "text/event-stream"}) as r:
                    connected.set()
                    async for _ in r.aiter_lines():
                        if stop.is_set():
                            return

            async def poll() -> None:
                await asyncio.sleep(random.uniform(0, 2.0))  # tabs opened at different times poll out of step
                while not stop.is_set():
                    (await c.get("/ui/pod/usage.json")).raise_for_status()
                    await asyncio.sleep(2.0)

            task = asyncio.ensure_future(stream())
            await poll()
            task.cancel()
            with contextlib.suppress(BaseException):
                await task

    async def main() -> None:
        # The tabs' browsers would run on their users' machines: at the lowest CPU priority here, this
        # process stands in for them without taking CPU from the daemon and the jobs it measures.
        os.nice(19)
        sessions = [sign_in(url, token) for _ in range(n)]
        opened = [asyncio.Event() for _ in range(n)]
        tasks = [asyncio.ensure_future(one(s.cookies, e)) for s, e in zip(sessions, opened, strict=True)]
        await asyncio.wait_for(asyncio.gather(*(e.wait() for e in opened)), 120)
        await asyncio.sleep(1.0)  # every tab open and streaming: from here on they only watch
        ready.set()
        while not stop.is_set():
            await asyncio.sleep(0.2)
        for t in tasks:
            t.cancel()
        for s in sessions:
            s.close()

    asyncio.run(main())


def submit_to_running(api: PodClient) -> tuple[float, float]:
    """(client ms: before the POST -> the job seen running; service ms: the daemon's submitted -> started)."""
    t0 = time.time()
    job = api.submit({"name": "probe", "command": [sys.executable, "-c", "pass"]})
    seen = None
    while True:
        j = api.job(job["id"])
        if seen is None and j["state"] in ("running", "succeeded"):
            seen = time.time()
        if j["state"] in ("succeeded", "failed"):
            return ((seen or time.time()) - t0) * 1000, (j["started_at"] - j["submitted_at"]) * 1000
        time.sleep(0.005)


def cpu_seconds(pid: int) -> float:
    """User + system CPU time of a process so far (``/proc/<pid>/stat``)."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def bench_scheduling(tmp: Path, trials: int, dashboards: int, repeats: int, rows_per_s: float) -> dict[str, Any]:
    home = tmp / "sched-home"
    home.mkdir()
    proc, url, token, api, job_id, run = full_pod(home, "--machine", "dgx1-v100")
    write_run(run, 2_000)
    writing = threading.Event()

    def writer() -> None:  # the parked run keeps writing, like a live training
        step = 2_001
        with open(run / "metrics.jsonl", "a") as f:
            while not writing.is_set():
                f.write(json.dumps(metric_row(step, time.time())) + "\n")
                f.flush()
                step += 1
                time.sleep(1.0 / rows_per_s)

    def timed(samples: list[tuple[float, float]], n: int, cpu: list[float]) -> None:
        t0, c0 = time.monotonic(), cpu_seconds(proc.pid)
        samples += [submit_to_running(api) for _ in range(n)]
        cpu.append((cpu_seconds(proc.pid) - c0) / (time.monotonic() - t0))

    threading.Thread(target=writer, daemon=True).start()
    ctx = mp.get_context("spawn")
    rounds = []
    pooled: dict[str, list[tuple[float, float]]] = {"quiet": [], "busy": []}
    try:
        for _ in range(2):  # warm-up
            submit_to_running(api)
        block = max(1, min(10, trials // 3))  # alternating blocks of at most 10: drift hits both alike
        for _ in range(repeats):
            quiet: list[tuple[float, float]] = []
            busy: list[tuple[float, float]] = []
            cpu_quiet: list[float] = []
            cpu_busy: list[float] = []
            while len(quiet) < trials or len(busy) < trials:
                timed(quiet, min(block, trials - len(quiet)), cpu_quiet)
                ready, stop = ctx.Event(), ctx.Event()
                crowd = ctx.Process(target=_dashboards, args=(url, token, job_id, dashboards, ready, stop))
                crowd.start()
                if not ready.wait(120):
                    raise SystemExit("the dashboards did not open in 120 s")
                timed(busy, min(block, trials - len(busy)), cpu_busy)
                stop.set()
                crowd.join(30)
                if crowd.is_alive():
                    crowd.kill()
            pooled["quiet"] += quiet
            pooled["busy"] += busy
            rounds.append(_figures(quiet, busy) | {"daemon_cpu_quiet": statistics.mean(cpu_quiet),
                                                    "daemon_cpu_busy": statistics.mean(cpu_busy)})  # fmt: skip
    finally:
        writing.set()
        stop_daemon(proc, url, token)
        api.close()
    total = _figures(pooled["quiet"], pooled["busy"])
    met = total["client_ratio"] <= 1.2 and total["service_ratio"] <= 1.2
    return {"trials": trials, "dashboards": dashboards, "repeats": repeats, "rounds": rounds, "pooled": total,
            "rows_per_s": rows_per_s, "met": met}  # fmt: skip


def _figures(quiet: list[tuple[float, float]], busy: list[tuple[float, float]]) -> dict[str, float]:
    q = [statistics.median(x[i] for x in quiet) for i in (0, 1)]
    b = [statistics.median(x[i] for x in busy) for i in (0, 1)]
    return {"client_quiet_ms": q[0], "client_busy_ms": b[0], "client_ratio": b[0] / q[0],
            "service_quiet_ms": q[1], "service_busy_ms": b[1], "service_ratio": b[1] / q[1]}  # fmt: skip


# ------------------------------------------------------------------------------------------------ report
def write_docs(results: dict[str, Any], command: str) -> None:
    if "jobs" in results:
        j = results["jobs"]
        rows = "\n".join(
            f"| {c['case']} | {c['page']['p50_ms']:.1f} | {c['page']['p95_ms']:.1f} | {c['rest_api']['p95_ms']:.1f} "
            f"| {c['ratio_p95']:.2f}x |"
            for c in j["cases"]
        )
        block = f"""### Jobs page with 10,000 jobs (bench_dashboard.py --only jobs)

Command: `{command}`. {j["jobs"]:,} jobs in the store (9,000 ended, 1,000 queued behind a job holding every
device, three users), {j["repeats"]} requests per case after 5 warm-ups, one signed-in client on loopback.
Server time is the dashboard's `Server-Timing` header (handler start to response headers). Reference: the REST
API's `GET /v1/jobs?limit=50` with the same filters, same run.

| case | page p50 ms | page p95 ms | REST API p95 ms | page / API (p95) |
|---|---|---|---|---|
{rows}
| the queue right after a submission (forecast recomputed), {j["after_submit"]["samples"]} samples | {j["after_submit"]["p50_ms"]:.1f} | {j["after_submit"]["p95_ms"]:.1f} | | |

Worst p95: **{j["worst_p95_ms"]:.1f} ms** (target < 100 ms: {"met" if j["met"] else "MISSED"}).
"""
        replace_subsection(SECTION, "### Jobs page with 10,000 jobs (bench_dashboard.py --only jobs)", block,
                           intro=INTRO)  # fmt: skip
    if "chart" in results:
        c = results["chart"]
        block = f"""### Job page: first chart and live updates (bench_dashboard.py --only chart)

Command: `{command}`. A run with {c["rows"]:,} metric rows, Debian's Chromium (headless, Playwright), the
daemon on loopback. First chart: navigation start to `performance.mark("deskpod:first-chart")`.
Reference in the same run: the same page with every point sent (`?points={c["rows"]}`, no downsampling).

| figure | ms |
|---|---|
| first chart, cold (the daemon reads the 100,000 rows for the first time) | {c["cold_ms"]:.0f} |
| first chart, warm (median) | {c["warm_ms"]:.0f} |
| reference: every point, no downsampling (median) | {c["all_points_ms"]:.0f} ({c["ratio_all_points_over_warm"]:.1f}x the warm page) |
| live: a row written -> the open page has it, median of {c["live_appends"]} | {c["live_p50_ms"]:.0f} |
| live: the slowest of {c["live_appends"]} | {c["live_max_ms"]:.0f} |

Event-stream connections opened by the tab: {c["event_streams"]}. Targets: first chart < 1 s ({"met" if c["chart_met"] else "MISSED"}),
live < 1 s with one connection per tab ({"met" if c["live_met"] else "MISSED"}).
"""
        replace_subsection(SECTION, "### Job page: first chart and live updates (bench_dashboard.py --only chart)",
                           block, intro=INTRO)  # fmt: skip
    if "scheduling" in results:
        s = results["scheduling"]

        def row(label: str, r: dict[str, float], cpu: str) -> str:
            return (f"| {label} | {r['client_quiet_ms']:.1f} | {r['client_busy_ms']:.1f} | {r['client_ratio']:.2f}x "
                    f"| {r['service_quiet_ms']:.2f} | {r['service_busy_ms']:.2f} | {r['service_ratio']:.2f}x | {cpu} |")  # fmt: skip

        rows = [row(f"round {i + 1}", r, f"{100 * r['daemon_cpu_quiet']:.0f}% -> {100 * r['daemon_cpu_busy']:.0f}%")
                for i, r in enumerate(s["rounds"])]  # fmt: skip
        rows.append(row(f"**all {s['repeats']} rounds**", s["pooled"], ""))
        table = "\n".join(rows)
        block = f"""### Scheduling with 50 open dashboards (bench_dashboard.py --only scheduling)

Command: `{command}`. Submit -> running of a one-device job (`python -c pass`) on a pod scheduling as a
DGX-1 (`--machine dgx1-v100`), {s["trials"]} trials per condition per round, the conditions alternating in
blocks of 10, {s["repeats"]} rounds. *Client*: before the POST until the client sees the job running (polling
every 5 ms); *service*: the daemon's own submitted -> started timestamps. An open dashboard is a Job page as
a tab has it (the page loaded, then one event stream from its cursor) on a run that writes {s["rows_per_s"]:g} metric row(s) per second,
plus the Pod page's live-usage poll every 2 s, each tab's poll starting at a random point of its period as tabs
opened at different times do; {s["dashboards"]} of them run in one separate process on the same 2 cores, at the
lowest CPU priority (`nice 19`: it stands in for browsers on other machines, so the figure is what serving
them costs the daemon, not what the load generator costs the box). Daemon CPU: its user + system time over the
timed blocks, as a share of one core.

| | client, none (ms) | client, {s["dashboards"]} (ms) | ratio | service, none (ms) | service, {s["dashboards"]} (ms) | ratio | daemon CPU |
|---|---|---|---|---|---|---|---|
{table}

Pooled medians: client **{s["pooled"]["client_ratio"]:.2f}x**, service **{s["pooled"]["service_ratio"]:.2f}x** (target <= 1.2x:
{"met" if s["met"] else "MISSED"}). Rounds differ by more than the effect (the box is shared; a plain CPU burner
of 10% of a core in place of the dashboards gave rounds from 0.74x to 1.35x). With all 50 polls in lockstep — a
burst of 50 requests every 2 s, which a load generator makes and real tabs do not — one run of 5 rounds (the load
generator then at normal priority) gave 1.45x client, 1.41x service, and streams alone without the polls 1.10x
client, 1.07x service (3 rounds): the bursts, not the open streams, are what costs.
"""
        replace_subsection(SECTION, "### Scheduling with 50 open dashboards (bench_dashboard.py --only scheduling)",
                           block, intro=INTRO)  # fmt: skip


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", choices=["jobs", "chart", "scheduling"], action="append")
    parser.add_argument("--repeats", type=int, default=100, help="requests per Jobs page case (default 100)")
    parser.add_argument("--rows", type=int, default=100_000, help="metric rows of the charted run (default 100,000)")
    parser.add_argument("--trials", type=int, default=40, help="submit->running trials per condition and round (40)")
    parser.add_argument("--rounds", type=int, default=3, help="rounds of the scheduling comparison (default 3)")
    parser.add_argument("--dashboards", type=int, default=50)
    parser.add_argument(
        "--rows-per-s",
        type=float,
        default=1.0,
        help="metric rows/s the watched run writes (default 1: logging every 20 steps at 20 steps/s)",
    )
    parser.add_argument("--no-docs", action="store_true")
    args = parser.parse_args()
    parts = args.only or ["jobs", "chart", "scheduling"]
    results: dict[str, Any] = {}
    with tempfile.TemporaryDirectory(prefix="deskpod-bench-web-") as tmp:
        if "jobs" in parts:
            results["jobs"] = bench_jobs(Path(tmp), args.repeats)
            for c in results["jobs"]["cases"]:
                print(f"jobs page, {c['case']}: p50 {c['page']['p50_ms']:.1f} ms, p95 {c['page']['p95_ms']:.1f} ms "
                      f"(REST API p95 {c['rest_api']['p95_ms']:.1f} ms)")  # fmt: skip
            a = results["jobs"]["after_submit"]
            print(f"jobs page right after a submission: p50 {a['p50_ms']:.1f} ms, p95 {a['p95_ms']:.1f} ms")
        if "chart" in parts:
            results["chart"] = c = bench_chart_and_live(Path(tmp), args.rows, 5, 10)
            print(f"first chart: cold {c['cold_ms']:.0f} ms, warm {c['warm_ms']:.0f} ms, every point "
                  f"{c['all_points_ms']:.0f} ms; live p50 {c['live_p50_ms']:.0f} ms, max {c['live_max_ms']:.0f} ms, "
                  f"{c['event_streams']} stream(s)")  # fmt: skip
        if "scheduling" in parts:
            results["scheduling"] = s = bench_scheduling(
                Path(tmp), args.trials, args.dashboards, args.rounds, args.rows_per_s
            )
            for r in [*s["rounds"], s["pooled"]]:
                print(f"submit->running: client {r['client_quiet_ms']:.1f} -> {r['client_busy_ms']:.1f} ms "
                      f"({r['client_ratio']:.2f}x), service {r['service_quiet_ms']:.2f} -> {r['service_busy_ms']:.2f} ms "
                      f"({r['service_ratio']:.2f}x)" + (f"; daemon CPU {100 * r['daemon_cpu_quiet']:.0f}% -> "
                      f"{100 * r['daemon_cpu_busy']:.0f}% of a core" if "daemon_cpu_busy" in r else " (pooled)"))  # fmt: skip
    print(json.dumps({"benchmark": "dashboard", **results}))
    if not args.no_docs:
        write_docs(results, " ".join([".venv/bin/python benchmarks/bench_dashboard.py", *sys.argv[1:]]))
    return 0 if all(r.get("met", True) and r.get("chart_met", True) and r.get("live_met", True)
                    for r in results.values()) else 1  # fmt: skip


if __name__ == "__main__":
    sys.exit(main())
