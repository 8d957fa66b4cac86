"""The fleet against its targets: the members view with many real member pods, the routing decision with 10,000
queued jobs over 30 members, and submit-to-running through the fleet against straight to the member.

    sudo .venv/bin/python benchmarks/bench_fleet.py                   # 30 members; table + JSON
    sudo .venv/bin/python benchmarks/bench_fleet.py --members 10 --submits 5

Runs as root: the members run their jobs sandboxed, each as its user's own OS account (a test user made here and
removed at the end), as in production. All in one run:

- **Members view.** ``--members`` real pods (``deskpod up --name box-i --trust-fleet``, each with its own home and
  port on 127.0.0.1, scheduling as a DGX-1's 8 devices, ``--machine dgx1-v100``) and one real fleet pod
  (``deskpod fleet up``) they trust. ``GET /v1/fleet/members`` as the fleet's admin: *cold* with ``fresh=true``
  (every member asked now, concurrently, each with its own signed assertion) and *cached* (answers kept 2 s).
  Target: p95 <= 300 ms.
- **Routing.** One real member gets a job holding all 8 devices for an hour and ``--queued / 30`` jobs queued
  behind it, each with a time limit (so its forecast promises every start); its ``GET /v1/status`` becomes a
  `MemberSnapshot` (`deskpod.fleet.snapshot.from_status`), replicated under 30 names: 30 members holding 10,000
  queued jobs between them. Timed: `deskpod.fleet.routing.route` for a new 2-device job, as the fleet's executor
  calls it. Target: <= 20 ms.
- **Health.** A member's ``GET /v1/doctor`` as its admin: a run (``max_age=0``: ``deskpod doctor`` in a process of its
  own, the box's CPU slots measured; 10 s apart, as a member keeps a report that long whatever it is asked) and the
  kept report. The fleet's own schedule is off here (``--health-every
  0``): 30 doctor runs at once would measure this one box's 2 cores, not the view; on real members each box runs its
  own.
- **Submit.** A one-device job (``true``) submitted by the same user straight to a member and through the fleet (which
  routes it, forwards it with an assertion and a lease, and follows it), alternating; time from the submit call to
  the first answer that says ``running`` (or later), both polled every 20 ms. Target: fleet <= 1.2x direct.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from deskpod.fleet.routing import Wanted, route
from deskpod.fleet.snapshot import from_status
from deskpod.jobs.client import PodClient
from deskpod.jobs.doctor import MIN_AGE_S
from tests.jobs.pods import Pod, Pods, wait_state
from tests.unix_users import make_users

STARTED = {"running", "succeeded", "failed"}


def p95(xs: list[float]) -> float:
    return statistics.quantiles(xs, n=20)[-1] if len(xs) >= 2 else xs[0]


def rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


def timed(fn: Callable[[], object], n: int) -> list[float]:
    out = []
    for _ in range(n):
        t = time.perf_counter()
        fn()
        out.append((time.perf_counter() - t) * 1000)
    return out


def to_running(client: PodClient, spec: dict[str, Any]) -> float:
    t = time.perf_counter()
    job = client.submit(spec)
    while client.job(job["id"])["state"] not in STARTED:
        if time.perf_counter() - t > 120:
            raise SystemExit(f"job {job['id']} did not start in 120 s")
        time.sleep(0.02)
    return time.perf_counter() - t


def members_view(fleet: Pod, members: list[Pod], samples: int) -> dict[str, Any]:
    admin = fleet.client()
    for i, m in enumerate(members):
        admin.request("POST", "/v1/fleet/members", json={"name": f"box-{i}", "url": m.url})
    view = admin.request("GET", "/v1/fleet/members", params={"fresh": "true"}).json()["members"]
    if not all(s["reachable"] for s in view) or len(view) != len(members):
        raise SystemExit(f"not every member answered: {[s['name'] for s in view if not s['reachable']]}")
    cold = timed(lambda: admin.request("GET", "/v1/fleet/members", params={"fresh": "true"}), samples)
    admin.request("GET", "/v1/fleet/members")
    cached = timed(lambda: admin.request("GET", "/v1/fleet/members"), samples)
    return {"members": len(members), "cold_ms": cold, "cached_ms": cached,
            "cold_p95_ms": p95(cold), "cached_p95_ms": p95(cached),
            "member_rss_mb": statistics.median(rss_mb(m.proc.pid) for m in members if m.proc),
            "fleet_rss_mb": rss_mb(fleet.proc.pid) if fleet.proc else 0.0}  # fmt: skip


def routing(member: Pod, queued: int, members: int, samples: int) -> dict[str, Any]:
    admin = member.client()
    hold = admin.submit({"name": "hold", "devices": 8, "max_runtime": 3600, "command": ["sleep", "3600"]})
    wait_state(admin, hold["id"], "running", timeout=60)
    per = queued // members
    for i in range(per):
        admin.submit({"name": f"q{i}", "devices": 1 + i % 8, "max_runtime": 60 + i % 600, "command": ["true"]})
    status = admin.status()
    if int(status.get("queued", 0)) != per:
        raise SystemExit(f"the member says {status.get('queued')} queued, expected {per}")
    now = time.time()
    snaps = [from_status(f"box-{i}", member.url, status, now, False) for i in range(members)]
    job = Wanted(2, "best", 600.0)
    chosen = route(job, snaps, now)
    ms = timed(lambda: route(job, snaps, time.time()), samples)
    admin.cancel(hold["id"])
    return {"members": members, "queued_total": per * members, "forecast_steps": len(snaps[0].free),
            "p50_ms": statistics.median(ms), "p95_ms": p95(ms), "chosen": chosen.member,
            "reason": chosen.reasons.get(chosen.member or "", "")}  # fmt: skip


def doctor(member: Pod, samples: int, runs: int) -> dict[str, Any]:
    admin = member.client()
    answer: dict[str, Any] = {}

    def ask(max_age: float) -> None:
        answer.update(admin.request("GET", "/v1/doctor", params={"max_age": max_age}, timeout=300).json())

    cold = []
    for _ in range(runs):
        time.sleep(MIN_AGE_S)  # a report younger than that is kept whatever max_age says
        cold += timed(lambda: ask(0), 1)
    kept = timed(lambda: ask(3600), samples)
    return {"run_ms": cold, "run_median_ms": statistics.median(cold), "kept_p95_ms": p95(kept),
            "ok": answer.get("ok"), "checks": len(answer.get("report", {}).get("checks", []))}  # fmt: skip


def submits(fleet_client: PodClient, member_client: PodClient, n: int) -> dict[str, Any]:
    spec = {"devices": 1, "command": ["true"]}
    direct, through = [], []
    to_running(member_client, {**spec, "name": "warm"})
    for i in range(n):
        pair = [(direct, member_client), (through, fleet_client)]
        for out, client in pair if i % 2 == 0 else pair[::-1]:
            out.append(to_running(client, {**spec, "name": f"s{i}"}))
    d, f = statistics.median(direct), statistics.median(through)
    return {"direct_s": direct, "fleet_s": through, "direct_median_s": d, "fleet_median_s": f, "ratio": f / d}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--members", type=int, default=30, help="real member pods for the members view (default 30)")
    p.add_argument("--queued", type=int, default=10_000, help="queued jobs over 30 members for routing")
    p.add_argument("--samples", type=int, default=50, help="timed requests per figure (default 50)")
    p.add_argument("--submits", type=int, default=10, help="submits each way (default 10)")
    p.add_argument("--out", type=Path, help="write the JSON here too")
    args = p.parse_args()
    if os.geteuid() != 0:
        raise SystemExit("run as root: members run jobs as their users' own accounts in sandboxes")
    res: dict[str, Any] = {"command": " ".join(sys.argv), "load_before": os.getloadavg()[0]}
    with tempfile.TemporaryDirectory(prefix="bench-fleet-") as tmp, make_users("ann") as (ann,):
        pods = Pods(Path(tmp))
        try:
            fleet = pods("--lease", "15", "--health-every", "0", fleet=True)
            pem = str(fleet.home / "fleet.pub.pem")
            t = time.perf_counter()
            members = [pods("--name", f"box-{i}", "--machine", "dgx1-v100", "--trust-fleet", pem, sandbox=True)
                       for i in range(args.members)]  # fmt: skip
            res["start_members_s"] = time.perf_counter() - t
            res["view"] = members_view(fleet, members, args.samples)
            print(f"view: {json.dumps({k: v for k, v in res['view'].items() if not k.endswith('_ms')})}", flush=True)
            res["routing"] = routing(members[-1], args.queued, 30, args.samples * 10)
            print(f"routing: {json.dumps(res['routing'])}", flush=True)
            res["doctor"] = doctor(members[1], args.samples, 3)
            print(f"doctor: {json.dumps(res['doctor'])}", flush=True)
            token = fleet.client().add_user("ann")["token"]
            members[0].client().add_user("ann", os_user=ann.name)
            member_token = members[0].client().new_token("ann")
            for i in range(1, len(members) - 1):  # the fleet sends ann's jobs to box-0: the only member that has her
                fleet.client().request("POST", f"/v1/fleet/members/box-{i}/remove", json={"force": True})
            fleet.client().request("POST", f"/v1/fleet/members/box-{len(members) - 1}/remove", json={"force": True})
            res["submit"] = submits(fleet.client(token), members[0].client(member_token), args.submits)
            print(f"submit: {json.dumps(res['submit'])}", flush=True)
        finally:
            pods.stop_all()
    res["load_after"] = os.getloadavg()[0]
    text = json.dumps(res, indent=1)
    print(text)
    if args.out:
        args.out.write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
