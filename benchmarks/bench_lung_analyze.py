"""``deskpod lung analyze`` on a 512×512×300 chest CT with a prior: time per stage and the whole command.

    .venv/bin/python benchmarks/bench_lung_analyze.py              # table + JSON, updates docs/benchmarks.md
    .venv/bin/python benchmarks/bench_lung_analyze.py --shape 96 256 256 --no-docs     # a quick look

The scans are PHANTOM data, not clinical: `deskpod.lung.phantom.write_followup` writes a prior and a current
chest CT of one synthetic patient (512×512 in-plane, 300 slices; LUNA16-like spacing 0.7×0.7×1.0 mm; the body
moved and turned a little between them; a growing solid nodule, a stable part-solid one, a new solid one and a
resolved ground-glass one, truth in truth.json). Writing them is set-up and is not timed.

The timed part is the command a user runs, in a new Python, on this box's cores::

    python -m deskpod lung analyze current.mhd --prior prior.mhd --interval-days 365 --out OUT --json

its wall time (Python start and imports included) and the stage times it reports in report.json (read, lung mask,
detect, segment + measure, malignancy, radiomics, Lung-RADS, the same for the prior, registration, matching and
growth, the pictures). Target: the whole under 2 minutes on 2 CPU cores. The results are checked against the
truth outside the timing: each current nodule found within 3 mm, the growing one growing with a doubling time
within 30 % of the truth's, the stable one stable, the new one new, the resolved one resolved; a wrong result
fails the run (exit 1). Peak memory is the child's maximum resident set (``getrusage``).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import resource
import shlex
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from docs_section import cpu_model, publish

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench_lung_eval import INTRO, SECTION  # noqa: E402  (one "## Lung CT" section, one introduction)

from deskpod.lung.phantom import write_followup  # noqa: E402

SUB = "### deskpod lung analyze at 512×512×300 (bench_lung_analyze.py)"
PY = sys.executable
TARGET_S = 120.0
FOUND_MM = 3.0
VDT_REL = 0.3


def log(text: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {text}", file=sys.stderr, flush=True)


def check(report: dict[str, Any], truth: dict[str, Any]) -> list[str]:
    """What the analysis got wrong against the phantom's truth (empty: all right)."""
    wrong: list[str] = []
    found: dict[str, dict[str, Any]] = {}
    for n in truth["nodules"]:
        if n["current"] is None:
            continue
        best = min(report["nodules"], key=lambda f: math.dist(f["position"]["world_mm_lps"], n["current"]["world_xyz"]),
                   default=None)  # fmt: skip
        if best is None or math.dist(best["position"]["world_mm_lps"], n["current"]["world_xyz"]) > FOUND_MM:
            wrong.append(f"{n['name']} nodule not found within {FOUND_MM} mm")
            continue
        found[n["name"]] = best | {"truth_mm": n["current"]["diameter_mm"]}
    grew = found.get("growing")
    if grew is not None:
        g = grew["growth"]
        vdt = truth["nodules"][0]["vdt_days"]
        if g is None or g["mean_diameter"]["status"] != "growing":
            wrong.append("the growing nodule is not reported growing")
        elif not abs(g["volume_doubling_time_days"] - vdt) <= VDT_REL * vdt:
            wrong.append(f"VDT {g['volume_doubling_time_days']} days, truth {vdt}")
    stable = found.get("stable")
    if stable is not None and (stable["growth"] is None or stable["growth"]["mean_diameter"]["status"] != "stable"):
        wrong.append("the stable nodule is not reported stable")
    new = found.get("new")
    if new is not None and new["status"] != "new":
        wrong.append("the new nodule is not reported new")
    gone = next(n for n in truth["nodules"] if n["name"] == "resolved")["prior"]["world_xyz"]
    resolved = [p for p in report["prior"]["nodules"] if p["resolved"]]
    if not any(math.dist(p["world_mm_lps_prior"], gone) <= FOUND_MM for p in resolved):
        wrong.append("the resolved nodule is not reported resolved")
    return wrong


def run(args: argparse.Namespace, work: Path) -> dict[str, Any]:
    shape = tuple(args.shape)
    log(f"writing the phantom pair, {shape[2]}x{shape[1]}x{shape[0]} voxels, spacing {args.spacing} mm")
    t0 = time.perf_counter()
    folder = write_followup(work / "PHANTOM-pair", seed=args.seed, days=args.days, shape=shape,  # type: ignore[arg-type]
                            spacing=tuple(args.spacing))  # type: ignore[arg-type]  # fmt: skip
    setup_s = time.perf_counter() - t0
    truth = json.loads((folder / "truth.json").read_text())
    argv = [PY, "-m", "deskpod", "lung", "analyze", str(folder / "current.mhd"), "--prior", str(folder / "prior.mhd"),
            "--interval-days", str(args.days), "--out", str(work / "out"), "--json"]  # fmt: skip
    log("running: " + shlex.join(argv[1:]))
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    done = subprocess.run(argv, capture_output=True, text=True, cwd=ROOT, timeout=1800)
    whole = time.perf_counter() - t0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if done.returncode != 0:
        raise SystemExit(f"deskpod lung analyze failed ({done.returncode}): {done.stderr}")
    report = json.loads(done.stdout)
    log(f"whole command {whole:.1f} s")
    wrong = check(report, truth)
    return {
        "setup_s": setup_s,
        "whole_s": whole,
        "cpu_s": (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime),
        "peak_rss_mb": after.ru_maxrss / 1024.0,
        "stages": report["stages"],
        "stages_total_s": report["total_seconds"],
        "nodules": [
            {k: n[k] for k in ("id", "type", "mean_diameter_mm", "volume_mm3", "status")}
            | {"lung_rads": n["lung_rads"]["category"]}
            for n in report["nodules"]
        ],
        "prior_nodules": len(report["prior"]["nodules"]),
        "registration": report["prior"]["registration"],
        "exam": report["exam"]["category"],
        "dropped": report["dropped_candidates"]["count"],
        "truth": truth["nodules"],
        "wrong": wrong,
        "met": whole < TARGET_S,
    }


def report_text(res: dict[str, Any], command: str) -> str:
    shape = res["args"]["shape"]
    sx, sy, sz = res["args"]["spacing"]
    ok = "**met**" if res["met"] else "**missed**"
    right = "all right" if not res["wrong"] else "**wrong**: " + "; ".join(res["wrong"])
    rows = [f"| {s['name']} | {s['seconds']:.2f} |" if s["seconds"] is not None else f"| {s['name']} | not run |"
            for s in res["stages"]]  # fmt: skip
    reg = res["registration"] or {}
    lines = [
        SUB,
        "",
        f"Command: `{command}` ({res['date']}, {res['seconds']:.0f} s in all; this 2-core VM, {res['cpu']}; "
        f"load average {res['load_before']:.1f} before and {res['load_after']:.1f} after — other engineers' work "
        "shares the cores).",
        f"**PHANTOM data** (`deskpod.lung.phantom.write_followup`, seed {res['args']['seed']}): a prior and a current "
        f"chest CT of one synthetic patient, {shape[2]}×{shape[1]}×{shape[0]} voxels of {sx}×{sy}×{sz} mm, "
        f"{res['args']['days']} days apart, the body moved and turned a little; writing them took "
        f"{res['setup_s']:.0f} s (not timed). Timed: `deskpod lung analyze current.mhd --prior prior.mhd "
        f"--interval-days {res['args']['days']} --json` in a new Python, classical candidates, on the CPU.",
        "",
        f"Target: the whole under {TARGET_S:.0f} s on 2 CPU cores — {ok}: **{res['whole_s']:.1f} s** for the whole "
        f"command (Python start, imports, both scans, pictures), {res['stages_total_s']:.1f} s in its stages; "
        f"{res['cpu_s']:.0f} s of CPU; peak memory {res['peak_rss_mb']:.0f} MB.",
        "",
        "| stage | seconds |",
        "|---|---|",
        *rows,
        "",
        f"Result against the phantom's truth: {right} (growing nodule growing, VDT within {VDT_REL:.0%} of the "
        f"truth's {res['truth'][0]['vdt_days']:.0f} days; stable stable; new new; resolved resolved; each within "
        f"{FOUND_MM:.0f} mm). Found {len(res['nodules'])} nodules on the current scan and {res['prior_nodules']} on "
        f"the prior (the classical candidates also keep some vessel crossings), {res['dropped']} candidates dropped; "
        f"exam Lung-RADS {res['exam']} (phantom, not a clinical result). Registration: "
        f"{reg.get('iterations', '?')} iterations, correlation {reg.get('correlation', float('nan')):.3f}.",
    ]
    return "\n".join(lines)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--shape", type=int, nargs=3, default=[300, 512, 512], metavar=("Z", "Y", "X"))
    p.add_argument("--spacing", type=float, nargs=3, default=[0.7, 0.7, 1.0], metavar=("X", "Y", "Z"))
    p.add_argument("--days", type=int, default=365)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--no-docs", action="store_true")
    args = p.parse_args()
    started = time.time()
    res: dict[str, Any] = {"benchmark": "lung_analyze", "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
                           "cpu": cpu_model(), "cores": os.cpu_count(), "load_before": os.getloadavg()[0]}  # fmt: skip
    with tempfile.TemporaryDirectory(prefix="deskpod-bench-lung-analyze-") as tmp:
        res |= run(args, Path(tmp))
    res.update(load_after=os.getloadavg()[0], seconds=time.time() - started, args=vars(args))
    return publish(res, res["met"] and not res["wrong"], only=False, docs=not args.no_docs, report=report_text,
                   section=SECTION, subsection=SUB, intro=INTRO)  # fmt: skip


if __name__ == "__main__":
    sys.exit(main())
