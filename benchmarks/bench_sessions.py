"""Notebook sessions: how fast one opens, and what the pod's proxy adds to a kernel's messages.

    .venv/bin/python benchmarks/bench_sessions.py                  # both parts; table + JSON; updates docs/benchmarks.md
    .venv/bin/python benchmarks/bench_sessions.py --only start --no-docs

Run as root: the pod is a root pod with its default sandbox and the notebook is a real test user's (``useradd``),
as users deploy it (tests/web/test_sessions.py does the same).

1. **start** — "New notebook" on the dashboard (the form's POST, signed in as the user, no environment to build) to
   a kernel that answers: the browser's path, timed by a client that follows it — the waiting page until JupyterLab
   answers ``/lab`` through the pod, ``POST api/kernels`` (with Jupyter's ``_xsrf``), then an ``execute_request`` of
   ``1`` over the kernel's WebSocket through the pod until its ``execute_reply``. Target ≤ 5 s (median). Reference:
   a plain ``jupyter lab`` started by hand on the same box (root, loopback port, a token), the same three steps
   straight to it, from the command's start.
2. **roundtrip** — one kernel of a running notebook: an ``execute_request`` of ``1`` to its ``execute_reply`` over
   the kernel WebSocket, through the pod's proxy (``ws://127.0.0.1:PORT/sessions/<id>/...``, bearer token) and
   directly on the session's Unix socket (``<job folder>/session.sock``), in alternating blocks so drift hits both
   alike; p50/p95 of each; target: proxy p50 and p95 ≤ 1.2× direct.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

import httpx
from docs_section import cpu_model, publish
from websockets.asyncio.client import ClientConnection, connect, unix_connect

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench_dashboard import sign_in  # noqa: E402

from deskpod.environment.network import free_port  # noqa: E402
from deskpod.jobs.kinds.notebook import LAB_OPTIONS  # noqa: E402
from deskpod.web.session import COOKIE  # noqa: E402
from tests.jobs.pods import Pod, Pods, wait_for, wait_state  # noqa: E402
from tests.unix_users import make_users, shared_folder  # noqa: E402

SECTION = "## Sessions"
INTRO = ("Interactive sessions (`deskpod/jobs/kinds/notebook.py`, the pod's proxy `deskpod/web/sessions.py`): a "
         "notebook's start,\nand a kernel message through the proxy against the session's own socket.")  # fmt: skip
SUB = "### New notebook to a kernel that answers; a kernel round trip through the proxy (bench_sessions.py)"
START_TARGET_S = 5.0
RATIO_TARGET = 1.2


def percentile(xs: list[float], q: float) -> float:
    s = sorted(xs)
    return s[min(len(s) - 1, max(0, round(q / 100 * (len(s) - 1))))]


def execute_request(code: str) -> tuple[str, str]:
    """A Jupyter ``execute_request`` of ``code`` (messaging 5.3, JSON over the kernel WebSocket) and its msg_id."""
    msg_id = uuid.uuid4().hex
    return msg_id, json.dumps({
        "header": {"msg_id": msg_id, "msg_type": "execute_request", "username": "", "session": uuid.uuid4().hex,
                   "version": "5.3", "date": ""},
        "parent_header": {}, "metadata": {}, "channel": "shell", "buffers": [],
        "content": {"code": code, "silent": False, "store_history": False, "user_expressions": {},
                    "allow_stdin": False, "stop_on_error": True},
    })  # fmt: skip


async def round_trip(ws: ClientConnection, code: str = "1") -> str:
    """Send ``code``, wait for its ``execute_reply``; the reply's status (checked by the caller, untimed)."""
    msg_id, text = execute_request(code)
    await ws.send(text)
    while True:
        raw = await asyncio.wait_for(ws.recv(), 60)
        # the reply is the one shell message naming our request; iopub's (status, execute_input/result) are skipped
        if msg_id in raw and '"execute_reply"' in raw:
            m = json.loads(raw)
            if m["msg_type"] == "execute_reply" and m["parent_header"].get("msg_id") == msg_id:
                return str(m["content"]["status"])


def kernel_answers(http: httpx.Client, base: str, headers: dict[str, str], xsrf: str, ws_url: str,
                   ws_headers: dict[str, str]) -> None:  # fmt: skip
    """The browser's steps once JupyterLab answers (its page set ``xsrf``): a new kernel, ``1`` run on it."""
    r = http.post(f"{base}api/kernels", headers={**headers, "X-XSRFToken": xsrf}, json={})
    if r.status_code != 201:
        raise SystemExit(f"POST {base}api/kernels answered {r.status_code}: {r.text[:300]}")
    url = ws_url.format(kernel=r.json()["id"])

    async def run() -> None:
        async with connect(url, additional_headers=ws_headers, max_size=None, open_timeout=30) as ws:
            status = await round_trip(ws)
        if status != "ok":
            raise SystemExit(f"the kernel's execute_reply was {status!r}, not 'ok'")

    asyncio.run(run())


# ---------------------------------------------------------------------------------------------- 1. start
def new_notebook(pod: Pod, c: httpx.Client) -> dict[str, float]:
    """One "New notebook" to a kernel that answers; the time of each step from the click (seconds)."""
    page = c.get("/ui/sessions")
    csrf = re.search(r'name="csrf" value="([^"]+)"', page.text)
    assert csrf, page.text
    t0 = time.perf_counter()
    r = c.post("/ui/sessions/notebook", data={"csrf": csrf.group(1), "devices": "1", "time": "1h"},
               follow_redirects=False)  # fmt: skip
    if r.status_code != 303:
        raise SystemExit(f"New notebook answered {r.status_code}: {r.text[:300]}")
    lab = r.headers["location"]
    job = lab.split("/")[2]
    submitted = time.perf_counter() - t0
    while True:  # the waiting page reloads itself each second; a script polls faster, as the browser's first try
        got = c.get(lab, headers={"Accept": "text/html"})
        if got.status_code == 200:
            break
        if got.status_code != 503 or time.perf_counter() - t0 > 120:
            raise SystemExit(
                f"{lab} answered {got.status_code} after {time.perf_counter() - t0:.1f} s: {got.text[:300]}"
            )
        time.sleep(0.02)
    answered = time.perf_counter() - t0
    cookie = "; ".join(f"{k.name}={k.value}" for k in c.cookies.jar if k.name == COOKIE)  # the pod's sign-in
    kernel_answers(c, f"/sessions/{job}/", {}, got.cookies.get("_xsrf") or "", f"ws://127.0.0.1:{pod.port}/sessions/{job}/api/kernels/{{kernel}}/channels",
                   {"Cookie": cookie})  # fmt: skip
    total = time.perf_counter() - t0
    pod.client().cancel(job)
    wait_state(pod.client(), job, "cancelled", "succeeded", "failed", timeout=60)
    return {"submit_s": submitted, "lab_s": answered, "kernel_s": total, "job": float(job)}


def plain_lab(tmp: Path) -> dict[str, float]:
    """``jupyter lab`` by hand: from the command's start to ``1`` answered on a new kernel, straight to it."""
    port, token = free_port(), uuid.uuid4().hex
    root = tmp / f"lab-{port}"
    root.mkdir()
    env = {**os.environ, "JUPYTER_RUNTIME_DIR": str(root / "runtime"), "JUPYTER_DATA_DIR": str(root / "data")}
    argv = [sys.executable, "-m", "jupyterlab", *[o for o in LAB_OPTIONS if "token" not in o and "sock" not in o],
            "--allow-root", f"--ServerApp.port={port}", "--ServerApp.ip=127.0.0.1", f"--IdentityProvider.token={token}",
            f"--ServerApp.root_dir={root}"]  # fmt: skip
    t0 = time.perf_counter()
    proc = subprocess.Popen(argv, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        headers = {"Authorization": f"token {token}"}
        with httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=60, trust_env=False) as http:

            def up() -> bool:
                with contextlib.suppress(httpx.TransportError):
                    return http.get("/lab", headers=headers).status_code == 200
                return False

            wait_for(up, 120, "jupyter lab to answer /lab")
            answered = time.perf_counter() - t0
            xsrf = http.cookies.get("_xsrf") or ""
            kernel_answers(http, "/", headers, xsrf, f"ws://127.0.0.1:{port}/api/kernels/{{kernel}}/channels", headers)
        return {"lab_s": answered, "kernel_s": time.perf_counter() - t0}
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def bench_start(pod: Pod, token: str, tmp: Path, trials: int) -> dict[str, Any]:
    c = sign_in(pod.url, token)
    try:
        new_notebook(pod, c)  # untimed warm-up: the page cache holds JupyterLab's files afterwards, as on a used box
        plain_lab(tmp)
        pods, plains = [], []
        for _ in range(trials):  # alternate, so drift hits both alike
            pods.append(new_notebook(pod, c))
            plains.append(plain_lab(tmp))
    finally:
        c.close()
    med = {k: statistics.median(t[k] for t in pods) for k in ("submit_s", "lab_s", "kernel_s")}
    ref = {k: statistics.median(t[k] for t in plains) for k in ("lab_s", "kernel_s")}
    return {"trials": trials, "pod": med, "plain": ref, "pod_all": [t["kernel_s"] for t in pods],
            "plain_all": [t["kernel_s"] for t in plains], "met": med["kernel_s"] <= START_TARGET_S}  # fmt: skip


# ---------------------------------------------------------------------------------------------- 2. roundtrip
def bench_roundtrip(pod: Pod, token: str, blocks: int, per_block: int) -> dict[str, Any]:
    c = pod.client(token)
    job = str(c.submit({"notebook": {}, "devices": 1})["id"])
    wait_state(c, job, "running", timeout=60)
    bearer = {"Authorization": f"Bearer {token}"}
    with httpx.Client(base_url=pod.url, trust_env=False, timeout=60) as http:
        wait_for(lambda: http.get(f"/sessions/{job}/lab", headers=bearer).status_code == 200, 60, "the notebook")
        r = http.post(f"/sessions/{job}/api/kernels", json={},
                      headers={**bearer, "X-XSRFToken": http.cookies.get("_xsrf") or ""})  # fmt: skip
        assert r.status_code == 201, r.text
        kernel = r.json()["id"]
    path = f"/sessions/{job}/api/kernels/{kernel}/channels"
    sock = str(pod.home / "jobs" / job / "session.sock")

    async def block(proxied: bool) -> list[float]:
        opened = (connect(f"ws://127.0.0.1:{pod.port}{path}", additional_headers=bearer, max_size=None)
                  if proxied else unix_connect(sock, f"ws://localhost{path}", max_size=None))  # fmt: skip
        async with opened as ws:
            for _ in range(10):  # untimed: the connection's first messages
                assert await round_trip(ws) == "ok"
            times = []
            for _ in range(per_block):
                t0 = time.perf_counter()
                status = await round_trip(ws)
                times.append(time.perf_counter() - t0)
                assert status == "ok", status
            return times

    async def run() -> tuple[list[float], list[float]]:
        proxy: list[float] = []
        direct: list[float] = []
        for i in range(blocks):
            for proxied in (True, False) if i % 2 == 0 else (False, True):
                (proxy if proxied else direct).extend(await block(proxied))
        return proxy, direct

    proxy, direct = asyncio.run(run())
    c.cancel(job)
    out: dict[str, Any] = {"round_trips": len(proxy)}
    for name, xs in (("proxy", proxy), ("direct", direct)):
        out[name] = {"p50_ms": percentile(xs, 50) * 1e3, "p95_ms": percentile(xs, 95) * 1e3,
                     "mean_ms": statistics.fmean(xs) * 1e3}  # fmt: skip
    out["ratio_p50"] = out["proxy"]["p50_ms"] / out["direct"]["p50_ms"]
    out["ratio_p95"] = out["proxy"]["p95_ms"] / out["direct"]["p95_ms"]
    out["met"] = out["ratio_p50"] <= RATIO_TARGET and out["ratio_p95"] <= RATIO_TARGET
    return out


# ---------------------------------------------------------------------------------------------- report
def report(res: dict[str, Any], command: str) -> str:
    s, rt = res["start"], res["roundtrip"]
    lines = [SUB, "", f"`{command}` — {cpu_model()}, {os.cpu_count()} CPUs (load average {res['load']:.1f} at the end: other work shares the box); {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}.",
             "A root pod with its default sandbox (bubblewrap), the notebook a real test user's, 1 CPU slot, no "
             "environment (the pod's Python with the `sessions` extra).", "",
             f"Start, median of {s['trials']} (alternating with the reference; one untimed warm-up each):", "",
             "| | to JupyterLab answering | to `1` answered on a new kernel | target |", "|---|---|---|---|",
             f"| New notebook through the pod (form POST → `/lab` 200 → kernel → execute_reply) | "
             f"{s['pod']['lab_s']:.2f} s | **{s['pod']['kernel_s']:.2f} s** | ≤ {START_TARGET_S:.0f} s "
             f"{'met' if s['met'] else 'MISSED'} |",
             f"| plain `jupyter lab` by hand (loopback port, token; straight to it) | {s['plain']['lab_s']:.2f} s | "
             f"{s['plain']['kernel_s']:.2f} s | reference |", "",
             f"All trials (s): pod {', '.join(f'{x:.2f}' for x in s['pod_all'])}; plain "
             f"{', '.join(f'{x:.2f}' for x in s['plain_all'])}. The form's POST itself: {s['pod']['submit_s']*1e3:.0f} ms.", "",
             f"Kernel round trip (`execute_request` of `1` → `execute_reply` over the kernel WebSocket), "
             f"{rt['round_trips']} each, in alternating blocks on one kernel:", "",
             "| | p50 | p95 | mean |", "|---|---|---|---|",
             *(f"| {label} | {rt[k]['p50_ms']:.2f} ms | {rt[k]['p95_ms']:.2f} ms | {rt[k]['mean_ms']:.2f} ms |"
               for label, k in (("through the pod's proxy", "proxy"), ("direct on the session's socket", "direct"))),
             f"| **proxy / direct** | **{rt['ratio_p50']:.2f}×** | **{rt['ratio_p95']:.2f}×** | target ≤ "
             f"{RATIO_TARGET}× {'met' if rt['met'] else 'MISSED'} |"]  # fmt: skip
    return "\n".join(lines) + "\n"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--only", choices=["start", "roundtrip"])
    ap.add_argument("--trials", type=int, default=5, help="notebook starts (and plain jupyter lab starts)")
    ap.add_argument("--blocks", type=int, default=10, help="blocks per path of the round trip")
    ap.add_argument("--per-block", type=int, default=50, help="timed round trips per block")
    ap.add_argument("--no-docs", action="store_true")
    args = ap.parse_args()
    if os.geteuid() != 0:
        raise SystemExit("bench_sessions needs root: the pod runs the notebook as a real test user")
    res: dict[str, Any] = {}
    with tempfile.TemporaryDirectory(prefix="bench-sessions-") as t, shared_folder("deskpod-bench-") as box, \
            make_users("ann") as (ann,):  # fmt: skip
        pods = Pods(Path(t))
        try:
            pod = pods("--socket", str(box / "pod.sock"), sandbox=True)
            token = str(pod.client().add_user(ann.name, os_user=ann.name)["token"])
            if args.only in (None, "start"):
                res["start"] = bench_start(pod, token, Path(t), args.trials)
            if args.only in (None, "roundtrip"):
                res["roundtrip"] = bench_roundtrip(pod, token, args.blocks, args.per_block)
        finally:
            pods.stop_all()
    met = all(part["met"] for part in res.values())
    res["load"] = os.getloadavg()[0]
    return publish(res, met, only=args.only is not None, docs=not args.no_docs, report=report, section=SECTION,
                   subsection=SUB, intro=INTRO)  # fmt: skip


if __name__ == "__main__":
    sys.exit(main())
