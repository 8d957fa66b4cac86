"""The LUNA16 evaluation at full size, against a per-candidate Python loop of the same rules.

    .venv/bin/python benchmarks/bench_lung_eval.py              # table + JSON, updates docs/benchmarks.md
    .venv/bin/python benchmarks/bench_lung_eval.py --rounds 1 --no-docs

Synthetic data of LUNA16's size, written as the challenge's CSV files and seeded: 888 scans, 1,186
nodules (diameters 3.25-32.3 mm, log-normal around 7 mm, in random scans), 1,500 excluded findings (a
third with diameter -1), and exactly 100 candidates per scan: about 90% of the nodules and a quarter of
the excluded findings have a candidate near them, some nodules two, the rest lie anywhere in the chest
box; probabilities have 6 decimals, so ties occur as in real results files.

1. **The evaluation, timed**: `deskpod.lung.evaluate.evaluate_files` (read the four CSVs, apply the hit
   rules, the FROC curve, 1,000 bootstraps over scans) and, apart, writing froc.png + evaluation.json;
   then the whole command, ``python -m deskpod lung evaluate ...``, as a user runs it (Python start,
   imports, plot). Medians over ``--rounds``. Target: the whole command under 10 s.
2. **The reference**, in the same run: the rules written again here as a straightforward loop over
   candidates and findings (dicts of rows read with ``csv.DictReader``, as the LUNA16 script does), the
   FROC curve by a threshold sweep, each bootstrap draw concatenating the drawn scans' entries. It must
   give the same CPM as deskpod on the full data set (no bootstrap), and the same sensitivities, CPM and
   intervals on a subset (the first ``--ref-scans`` scans, ``--ref-bootstrap`` draws of the same seeded
   resampling, `deskpod.lung.evaluate.resample_scans`); both are timed on that subset. The run fails
   (exit 1) if any of them differ by more than 1e-12.
"""

from __future__ import annotations

import argparse
import csv
import json
import math
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

import numpy as np
from docs_section import cpu_model, publish

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from deskpod.lung.evaluate import FP_RATES, MAX_MARKS, evaluate_files, resample_scans, write_outputs  # noqa: E402

SECTION = "## Lung CT"
INTRO = (
    "deskpod's lung-nodule application (`deskpod/lung/`). Decision support, not a medical device:\n"
    "the figures here are timings and checks on synthetic data, not clinical results."
)
SUB = "### LUNA16 evaluation at full size (bench_lung_eval.py)"
PY = sys.executable
TARGET_S = 10.0
HEAD = "seriesuid,coordX,coordY,coordZ,"


def log(text: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {text}", file=sys.stderr, flush=True)


# ---------------------------------------------------------------- synthetic LUNA16-sized files
def write_dataset(folder: Path, scans: int, nodules: int, excluded: int, per_scan: int, seed: int) -> dict[str, Path]:
    rng = np.random.default_rng(seed)
    digits = rng.integers(0, 10, size=(scans, 30))  # the real uids end in 30 digits
    uids = ["1.3.6.1.4.1.14519.5.2.1.6279.6001." + "".join(map(str, [1 + r[0] % 9, *r[1:]])) for r in digits]
    low, high = np.array([-180.0, -180.0, -350.0]), np.array([180.0, 180.0, 0.0])

    def centre() -> np.ndarray:
        return rng.uniform(low + 40, high - 40)

    nod = [(int(rng.integers(scans)), centre(), float(np.clip(np.exp(rng.normal(np.log(7.0), 0.45)), 3.25, 32.3)))
           for _ in range(nodules)]  # fmt: skip
    exc = [(int(rng.integers(scans)), centre(), -1.0 if rng.random() < 1 / 3 else float(rng.uniform(2.0, 12.0)))
           for _ in range(excluded)]  # fmt: skip
    near: dict[int, list[tuple[np.ndarray, float]]] = defaultdict(list)
    for s, c, d in nod:
        for _ in range(int(rng.random() < 0.9) + int(rng.random() < 0.15)):
            near[s].append((c + rng.normal(0, 0.15 * d, 3), float(rng.beta(5, 2))))
    for s, c, d in exc:
        if rng.random() < 0.25:
            near[s].append((c + rng.normal(0, 0.1 * abs(d), 3), float(rng.beta(3, 3))))
    cands = []
    for s in range(scans):
        rows = near[s][:per_scan]
        rows += [(rng.uniform(low, high), float(rng.beta(1.5, 6))) for _ in range(per_scan - len(rows))]
        cands += [(s, c, p) for c, p in rows]

    def line(s: int, c: np.ndarray, v: float) -> str:
        return f"{uids[s]},{c[0]:.6f},{c[1]:.6f},{c[2]:.6f},{v:.6f}\n"

    files = {"annotations": folder / "annotations.csv", "excluded": folder / "annotations_excluded.csv",
             "candidates": folder / "results.csv", "seriesuids": folder / "seriesuids.csv"}  # fmt: skip
    files["annotations"].write_text(HEAD + "diameter_mm\n" + "".join(line(*r) for r in nod))
    files["excluded"].write_text(HEAD + "diameter_mm\n" + "".join(line(*r) for r in exc))
    files["candidates"].write_text(HEAD + "probability\n" + "".join(line(*r) for r in cands))
    files["seriesuids"].write_text("".join(u + "\n" for u in uids))
    return files


# ---------------------------------------------------------------- the reference: one candidate at a time
def reference(files: dict[str, Path], series: list[str], draws: np.ndarray | None) -> dict[str, Any]:
    """The LUNA16 rules as a plain loop; sensitivities, CPM and (with ``draws``) the bootstrap intervals."""
    listed = set(series)

    def rows(path: Path) -> list[dict[str, str]]:
        with path.open(newline="") as f:
            return list(csv.DictReader(f))

    findings: dict[str, list[tuple[float, float, float, float, bool]]] = defaultdict(list)
    for path, included in ((files["annotations"], True), (files["excluded"], False)):  # included first, as the script
        for r in rows(path):
            if r["seriesuid"] in listed:
                findings[r["seriesuid"]].append(
                    (float(r["coordX"]), float(r["coordY"]), float(r["coordZ"]), float(r["diameter_mm"]), included)
                )
    cands: dict[str, list[tuple[float, float, float, float]]] = defaultdict(list)
    for r in rows(files["candidates"]):
        if r["seriesuid"] in listed:
            cands[r["seriesuid"]].append(
                (float(r["coordX"]), float(r["coordY"]), float(r["coordZ"]), float(r["probability"]))
            )
    entries: dict[str, list[tuple[int, float]]] = {}
    lesions: dict[str, int] = {}
    for uid in series:
        marks = cands[uid]
        if len(marks) > MAX_MARKS:
            cut = sorted((m[3] for m in marks), reverse=True)[MAX_MARKS]
            marks = [m for m in marks if m[3] > cut]
        remaining = set(range(len(marks)))
        scan_entries: list[tuple[int, float]] = []
        lesions[uid] = 0
        for x, y, z, diameter, included in findings[uid]:
            lesions[uid] += included
            radius2 = math.pow((10.0 if diameter < 0.0 else diameter) / 2.0, 2.0)
            best = None
            for i, (x2, y2, z2, p) in enumerate(marks):
                if math.pow(x - x2, 2.0) + math.pow(y - y2, 2.0) + math.pow(z - z2, 2.0) < radius2:
                    remaining.discard(i)
                    if included and (best is None or p > best):
                        best = p
            if included and best is not None:
                scan_entries.append((1, best))
        scan_entries += [(0, marks[i][3]) for i in sorted(remaining)]
        entries[uid] = scan_entries

    def froc(sample: list[tuple[int, float]], n_lesions: int) -> list[float]:
        ranked = sorted(sample, key=lambda e: -e[1])
        fp_pts, tp_pts, tp, fp = [0.0], [0.0], 0, 0
        for i, (is_nodule, p) in enumerate(ranked):
            tp += is_nodule
            fp += 1 - is_nodule
            if i == len(ranked) - 1 or ranked[i + 1][1] != p:
                fp_pts.append(float(fp))
                tp_pts.append(float(tp))
        fps = [(f / fp * fp / len(series)) if fp else 0.0 for f in fp_pts]
        sens = [(t / tp * tp / n_lesions) if tp else 0.0 for t in tp_pts]
        return [float(np.interp(rate, fps, sens)) for rate in FP_RATES]

    point = froc([e for uid in series for e in entries[uid]], sum(lesions.values()))
    out: dict[str, Any] = {"sensitivity": point, "cpm": sum(point) / len(point)}
    if draws is not None:
        per_draw = []
        for draw in draws:
            n_lesions = sum(lesions[series[i]] for i in draw)
            if n_lesions:
                per_draw.append(froc([e for i in draw for e in entries[series[i]]], n_lesions))
        pz = (1.0 - 0.95) / 2.0
        lo_i, hi_i = math.floor(pz * len(per_draw)), math.floor((1.0 - pz) * len(per_draw))
        columns = [sorted(col) for col in zip(*per_draw, strict=True)]
        cpms = sorted(sum(s) / len(s) for s in per_draw)
        out |= {"ci_low": [c[lo_i] for c in columns], "ci_high": [c[hi_i] for c in columns],
                "cpm_ci": [cpms[lo_i], cpms[hi_i]]}  # fmt: skip
    return out


def subset_files(files: dict[str, Path], folder: Path, series: list[str]) -> dict[str, Path]:
    """The same files restricted to ``series`` (the other rows dropped; the results must name listed scans)."""
    keep = set(series)
    folder.mkdir(exist_ok=True)
    out = {}
    for key, path in files.items():
        lines = path.read_text().splitlines(keepends=True)
        head, body = (lines[0:1], lines[1:]) if key != "seriesuids" else ([], lines)
        out[key] = folder / path.name
        out[key].write_text("".join(head + [ln for ln in body if ln.split(",", 1)[0].strip() in keep]))
    return out


# ---------------------------------------------------------------- the run
def timed(fn: Any, *a: Any, **k: Any) -> tuple[float, Any]:
    t0 = time.perf_counter()
    value = fn(*a, **k)
    return time.perf_counter() - t0, value


def run(args: argparse.Namespace, work: Path) -> dict[str, Any]:
    log(f"writing {args.scans} scans, {args.nodules} nodules, {args.candidates_per_scan} candidates per scan")
    files = write_dataset(work, args.scans, args.nodules, args.excluded, args.candidates_per_scan, args.seed)
    series = files["seriesuids"].read_text().split()
    kw = {"samples": args.bootstrap, "seed": args.seed}
    evaluate_files(*files.values(), samples=5, seed=args.seed)  # warm-up, untimed
    evals, outputs, ev = [], [], None
    for r in range(args.rounds):
        t, ev = timed(evaluate_files, *files.values(), **kw)
        evals.append(t)
        outputs.append(timed(write_outputs, ev, work / f"out-{r}")[0])
        log(f"round {r + 1}: evaluate_files {t:.2f} s, outputs {outputs[-1]:.2f} s")
    assert ev is not None and ev.bootstrap is not None
    argv = [PY, "-m", "deskpod", "lung", "evaluate", *[x for k, v in files.items() for x in (f"--{k}", str(v))],
            "--bootstrap", str(args.bootstrap), "--seed", str(args.seed)]  # fmt: skip
    commands = []
    for r in range(args.rounds):
        t0 = time.perf_counter()
        done = subprocess.run([*argv, "--out", str(work / f"cmd-{r}"), "--json"], capture_output=True, text=True,
                              cwd=ROOT, timeout=300)  # fmt: skip
        commands.append(time.perf_counter() - t0)
        if done.returncode != 0:
            raise SystemExit(f"deskpod lung evaluate failed ({done.returncode}): {done.stderr}")
        if json.loads(done.stdout)["cpm"] != ev.to_json()["cpm"]:
            raise SystemExit("the command's CPM differs from the library's in the same run")
    log(f"command: {', '.join(f'{t:.2f}' for t in commands)} s")

    # Stage split of one more library run (the same work as evaluate_files).
    from deskpod.lung.evaluate import bootstrap, froc_curve, match, read_annotations, read_candidates, read_excluded

    t_read, inputs = timed(lambda: (read_annotations(files["annotations"]), read_excluded(files["excluded"]),
                                    read_candidates(files["candidates"])))  # fmt: skip
    t_match, m = timed(match, series, *inputs)
    t_curve, curve = timed(froc_curve, m)
    t_boot, _ = timed(bootstrap, m, samples=args.bootstrap, seed=args.seed)
    del curve

    log("reference: full data set, point estimate")
    t_ref_full, ref_full = timed(reference, files, series, None)
    t_vec_full = [timed(evaluate_files, *files.values(), samples=0)[0] for _ in range(args.rounds)]
    diff_full = float(max(abs(a - b) for a, b in zip(ref_full["sensitivity"], ev.sensitivity, strict=True)))
    log(f"reference on the first {args.ref_scans} scans, {args.ref_bootstrap} bootstraps")
    sub_series = series[: args.ref_scans]
    sub = subset_files(files, work / "subset", sub_series)
    draws = resample_scans(len(sub_series), args.ref_bootstrap, args.seed)
    t_ref_sub, ref_sub = timed(reference, sub, sub_series, draws)
    t_vec_sub = []
    for _ in range(args.rounds):
        t, ev_sub = timed(evaluate_files, *sub.values(), samples=args.ref_bootstrap, seed=args.seed)
        t_vec_sub.append(t)
    assert ev_sub.bootstrap is not None
    lo, hi = ev_sub.bootstrap.sensitivity_interval()
    mine = [*ev_sub.sensitivity, ev_sub.cpm, *lo, *hi, *ev_sub.bootstrap.cpm_interval()]
    theirs = [*ref_sub["sensitivity"], ref_sub["cpm"], *ref_sub["ci_low"], *ref_sub["ci_high"], *ref_sub["cpm_ci"]]
    diff_sub = float(max(abs(a - b) for a, b in zip(mine, theirs, strict=True)))
    m_sub = ev_sub.matching
    cmd_median = statistics.median(commands)
    return {
        "data": {
            "scans": m.scans,
            "nodules": m.nodules,
            "excluded": args.excluded,
            "candidates": m.candidates,
            "detected": m.detected,
            "false_positives": m.false_positives,
            "ignored_on_excluded": m.ignored_on_excluded,
            "double_detections": m.double_detections,
            "multi_nodule_candidates": m.multi_nodule_candidates,
            "froc_entries": len(m.entry_probability),
            "distinct_thresholds": len(np.unique(m.entry_probability)),
        },
        "result": {"sensitivity": ev.sensitivity.tolist(), "cpm": ev.cpm, "cpm_ci": list(ev.bootstrap.cpm_interval())},
        "evaluate_files_s": evals,
        "outputs_s": outputs,
        "command_s": commands,
        "stages_s": {"read": t_read, "match": t_match, "froc_curve": t_curve, "bootstrap": t_boot},
        "reference": {
            "full_point_s": t_ref_full,
            "deskpod_full_point_s": t_vec_full,
            "full_cpm": ref_full["cpm"],
            "full_max_diff": diff_full,
            "subset_scans": len(sub_series),
            "subset_nodules": m_sub.nodules,
            "subset_candidates": m_sub.candidates,
            "subset_bootstrap": args.ref_bootstrap,
            "subset_s": t_ref_sub,
            "deskpod_subset_s": t_vec_sub,
            "subset_max_diff": diff_sub,
            "subset_cpm": ev_sub.cpm,
            "speedup": t_ref_sub / statistics.median(t_vec_sub),
        },
        "same_results": diff_full <= 1e-12 and diff_sub <= 1e-12,
        "met": bool(cmd_median < TARGET_S),
    }


def report(res: dict[str, Any], command: str) -> str:
    d, r, ref, st = res["data"], res["result"], res["reference"], res["stages_s"]
    med = statistics.median
    runs = lambda xs: ", ".join(f"{x:.2f}" for x in xs)  # noqa: E731
    ok = "**met**" if res["met"] else "**missed**"
    same = "the same" if res["same_results"] else "**different** results (the run failed)"
    sens = ", ".join(f"{s:.3f}" for s in r["sensitivity"])
    lines = [
        SUB,
        "",
        f"Command: `{command}` ({res['date']}, {res['seconds']:.0f} s in all; this 2-core VM, {res['cpu']}; "
        f"load average {res['load_before']:.1f} before and {res['load_after']:.1f} after — a CI run and other "
        "engineers' work share the cores).",
        f"Synthetic data of LUNA16's size, written as the challenge's four CSV files (seed {res['args']['seed']}): "
        f"{d['scans']} scans, {d['nodules']} nodules, {d['excluded']} excluded findings (a third with diameter -1), "
        f"{d['candidates']} candidates (100 per scan, 6-decimal probabilities: {d['froc_entries']} FROC entries at "
        f"{d['distinct_thresholds']} distinct thresholds); {d['detected']} nodules hit, {d['false_positives']} false "
        f"positives, {d['ignored_on_excluded']} candidates ignored on excluded findings, {d['double_detections']} "
        f"extra hits on a nodule, {d['multi_nodule_candidates']} candidates on two nodules. "
        f"{res['args']['bootstrap']} bootstraps over scans. Medians of {res['args']['rounds']} round(s); "
        "every run listed.",
        "",
        f"Target: the whole evaluation under {TARGET_S:.0f} s — {ok} ({med(res['command_s']):.2f} s for the whole "
        f"command, {med(res['evaluate_files_s']):.2f} s in the library).",
        "",
        "| what | median, s | runs |",
        "|---|---|---|",
        f"| `deskpod lung evaluate ...` (a new Python: imports, read, match, FROC, {res['args']['bootstrap']} "
        f"bootstraps, plot, JSON) | **{med(res['command_s']):.2f}** | {runs(res['command_s'])} |",
        f"| `evaluate_files` (read the CSVs, match, FROC, bootstraps) | {med(res['evaluate_files_s']):.2f} | "
        f"{runs(res['evaluate_files_s'])} |",
        f"| `write_outputs` (froc.png + evaluation.json) | {med(res['outputs_s']):.2f} | {runs(res['outputs_s'])} |",
        "",
        f"Stages of one more library run: read {st['read']:.2f} s, match {st['match']:.3f} s, FROC curve "
        f"{st['froc_curve']:.3f} s, {res['args']['bootstrap']} bootstraps {st['bootstrap']:.2f} s.",
        f"Result (synthetic, not a clinical figure): sensitivity at 1/8..8 FP/scan {sens}; CPM {r['cpm']:.4f} "
        f"[{r['cpm_ci'][0]:.4f}, {r['cpm_ci'][1]:.4f}].",
        "",
        "**Against a per-candidate Python loop of the same rules** (in this file: `csv.DictReader` rows, a loop "
        "over findings and candidates per scan, a threshold sweep, each bootstrap draw concatenating the drawn "
        "scans' entries, as the LUNA16 script does; both sides read the four CSV files), same run:",
        "",
        "| data | reference loop, s | deskpod, s (median) | speed-up | largest difference |",
        "|---|---|---|---|---|",
        f"| all {d['scans']} scans, point estimate (no bootstrap) | {ref['full_point_s']:.2f} | "
        f"{med(ref['deskpod_full_point_s']):.3f} | {ref['full_point_s'] / med(ref['deskpod_full_point_s']):.1f}x | "
        f"{ref['full_max_diff']:.1e} (CPM {ref['full_cpm']:.6f}) |",
        f"| first {ref['subset_scans']} scans ({ref['subset_nodules']} nodules, {ref['subset_candidates']} "
        f"candidates), {ref['subset_bootstrap']} bootstraps | {ref['subset_s']:.2f} | "
        f"{med(ref['deskpod_subset_s']):.3f} | {ref['speedup']:.0f}x | {ref['subset_max_diff']:.1e} (7 sensitivities, CPM, their intervals) |",
        "",
        f"Both give {same}: the CPM on all scans, and on the subset every sensitivity, the CPM and their 95% "
        "intervals, drawn with the same seeded resampling (`resample_scans`). deskpod weights each FROC entry by "
        "how many times its scan was drawn instead of concatenating copies; the loop does what the script does.",
    ]
    return "\n".join(lines)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--scans", type=int, default=888)
    p.add_argument("--nodules", type=int, default=1186)
    p.add_argument("--excluded", type=int, default=1500)
    p.add_argument("--candidates-per-scan", type=int, default=100)
    p.add_argument("--bootstrap", type=int, default=1000)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--ref-scans", type=int, default=111, help="scans of the subset the reference loop bootstraps")
    p.add_argument("--ref-bootstrap", type=int, default=100, help="bootstraps of the reference loop on the subset")
    p.add_argument("--no-docs", action="store_true")
    args = p.parse_args()
    if args.rounds < 1 or args.bootstrap < 1 or not 1 <= args.ref_scans <= args.scans:
        raise SystemExit("--rounds and --bootstrap must be at least 1, --ref-scans 1..--scans")
    started = time.time()
    res: dict[str, Any] = {"benchmark": "lung_eval", "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
                           "cpu": cpu_model(), "load_before": os.getloadavg()[0]}  # fmt: skip
    with tempfile.TemporaryDirectory(prefix="deskpod-bench-lung-") as tmp:
        res |= run(args, Path(tmp))
    res.update(load_after=os.getloadavg()[0], seconds=time.time() - started, args=vars(args))
    return publish(res, res["same_results"] and res["met"], only=False, docs=not args.no_docs, report=report,
                   section=SECTION, subsection=SUB, intro=INTRO)  # fmt: skip


if __name__ == "__main__":
    sys.exit(main())
