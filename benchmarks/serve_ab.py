"""Does a change make `deskpod serve` faster or slower? This tree's server against another's, interleaved.

    .venv/bin/python benchmarks/serve_ab.py                     # against `git archive HEAD deskpod`
    .venv/bin/python benchmarks/serve_ab.py --rev e57ff32 --repeats 5 --protocols http,grpc

Absolute req/s on the shared 2 cores move with the load more than with the code (docs/benchmarks.md), so a
change is judged against the server it replaces, in the same run. Both servers serve one repository (the MLP
of serve_grpc_vs_http.py: 784-512-512-10, ONNX, max batch 32, queue delay 0, 1 instance, 2 intra-op threads)
from their own process, each importing ``deskpod`` from its own tree (the editable-install finder removed so
that the path decides); the load generator is this tree's, in its own process. For each repeat, each protocol
and each concurrency the two servers are measured back to back, which one goes first alternating, and the
ratio this / other is taken per pair: its median over the repeats is the figure, for throughput and for the
server's CPU time per request (user + system from /proc/PID/stat over the level, warm-up included, divided by
the requests answered: the server's own cost, free of the client's). Prints a table; --out writes JSON.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from ab_tree import ROOT, tree_at
from serve_grpc_vs_http import build_repo, cpu_s, loadgen, start_server


def start(tree: Path, repo: Path, port_file: Path) -> tuple[subprocess.Popen[bytes], dict[str, str]]:
    """`deskpod serve REPO` from ``tree``; the process and its addresses."""
    proc = start_server(repo, port_file, tree)
    doc = json.loads(port_file.read_text())
    return proc, {"http": doc["url"].removeprefix("http://"), "grpc": doc["grpc"]}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rev", default="HEAD", help="the other server: deskpod/ at this git revision (default HEAD)")
    ap.add_argument("--protocols", default="http", help="comma-separated: http, grpc, grpc-stream")
    ap.add_argument("--concurrency", default="1,32", help="comma-separated client counts")
    ap.add_argument("--duration", type=float, default=4.0, help="measured seconds per level")
    ap.add_argument("--warmup", type=float, default=1.0)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--out", type=Path, default=None)
    a = ap.parse_args()
    protocols = a.protocols.split(",")
    bad = sorted(set(protocols) - {"http", "grpc", "grpc-stream"})
    if bad:
        raise SystemExit(f"--protocols: {', '.join(bad)} unknown; valid: http, grpc, grpc-stream")
    levels = [int(c) for c in a.concurrency.split(",")]
    rows: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="deskpod-serve-ab-") as tmp:
        build_repo(Path(tmp) / "repo")
        trees = {"this": ROOT, "other": tree_at(a.rev, Path(tmp) / "other")}
        servers = {k: start(t, Path(tmp) / "repo", Path(tmp) / f"{k}.json") for k, t in trees.items()}
        try:
            for rep in range(a.repeats):
                for p in protocols:
                    for c in levels:
                        for side in ("this", "other") if rep % 2 == 0 else ("other", "this"):
                            proc, urls = servers[side]
                            c0 = cpu_s(proc.pid)
                            r = loadgen(urls["http" if p == "http" else "grpc"], p, c, a.duration, a.warmup)
                            r["server_us_per_request"] = (
                                (cpu_s(proc.pid) - c0) / (r["ok"] * (a.duration + a.warmup) / a.duration) * 1e6
                            )
                            rows.append({"side": side, "protocol": p, "clients": c, "repeat": rep, **r})
        finally:
            for proc, _ in servers.values():
                proc.terminate()
                proc.wait(timeout=60)
    summary = []
    for p in protocols:
        for c in levels:
            pick = {s: [r for r in rows if (r["side"], r["protocol"], r["clients"]) == (s, p, c)] for s in trees}
            entry: dict[str, Any] = {"protocol": p, "clients": c}
            for key in ("throughput", "p99_ms", "server_us_per_request"):
                here, there = ([r[key] for r in pick[s]] for s in ("this", "other"))
                ratios = [x / y for x, y in zip(here, there, strict=True)]
                entry[key] = {"this": round(statistics.median(here), 2), "other": round(statistics.median(there), 2),
                              "ratio": round(statistics.median(ratios), 3), "per_repeat": [round(x, 3) for x in ratios]}  # fmt: skip
            summary.append(entry)
    print(f"this tree against deskpod/ at {a.rev}: MLP, {a.repeats} alternating repeats of {a.duration:g} s per level")
    print(
        f"{'protocol':<12}{'clients':>8}  {'req/s this / other (ratio)':<36}{'server us/request this / other (ratio)'}"
    )
    for e in summary:
        t, u = e["throughput"], e["server_us_per_request"]
        print(f"{e['protocol']:<12}{e['clients']:>8}  {t['this']:>9.1f} / {t['other']:<9.1f} ({t['ratio']:.3f})"
              f"{'':<8}{u['this']:>7.1f} / {u['other']:<7.1f} ({u['ratio']:.3f} {u['per_repeat']})")  # fmt: skip
    if a.out is not None:
        a.out.write_text(json.dumps({"rev": a.rev, "summary": summary, "rows": rows}, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
