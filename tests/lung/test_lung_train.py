"""``deskpod lung train`` end to end: a 2-worker detector run on phantom scans, resumed, then detect and evaluate.

Phantom data: the sensitivity and CPM printed here describe a detector on synthetic scans, never a clinical
result; the test asserts that training learns and that the pieces fit, not a figure.
"""

from __future__ import annotations

import csv
import json
import time
from pathlib import Path

import numpy as np
import pytest

from deskpod.lung.phantom import write_phantom
from tests.train.conftest import metrics, run_deskpod

SPACING = "1.4x1.4x2.5"
PATCH = "48x48x24"


@pytest.mark.slow
@pytest.mark.timeout(0)  # no limit for the whole: each command below has its own, scaled by the work done
def test_two_workers_train_the_detector_resume_and_find_the_large_nodules(tmp_path: Path) -> None:
    data = write_phantom(tmp_path / "luna16", 6, seed=5, subsets=2, shape=(64, 160, 160), spacing=(1.4, 1.4, 2.5),
                         nodules=(2, 4))  # fmt: skip
    common = ["--data", f"luna16:{data}", "--model", "retinanet3d-small", "--spacing", SPACING, "--patch", PATCH,
              "--repeats", "6", "--cache", str(tmp_path / "cache"), "--batch-size", "4", "--devices", "2",
              "--out", str(tmp_path / "runs"), "--name", "det", "--quiet"]  # fmt: skip
    watch = tmp_path / "runs" / "det" / "metrics.jsonl"  # a row every few steps: the training's progress
    started = time.monotonic()
    first = run_deskpod("lung", "train", *common, "--steps", "100", timeout=300, progress=watch)
    # detect and analyze print nothing to watch until they end: their limit scales with how fast this box trained
    budget = max(300.0, 2 * (time.monotonic() - started))
    assert first.code == 0, first.err[-3000:]
    run = tmp_path / "runs" / "det"
    summary = json.loads((run / "summary.json").read_text())
    assert summary["world_size"] == 2 and summary["steps"] == 100
    assert set(summary["validation"]) == {"val_loss", "val_sensitivity", "val_fp_per_crop"}
    assert "sensitivity" in first.out  # the summary line speaks of the task's own figures

    # Resume: the run goes on from its checkpoint, not from step 0.
    again = run_deskpod("lung", "train", *common, "--steps", "125", "--resume", timeout=300, progress=watch)
    assert again.code == 0, again.err[-3000:]
    train = metrics(run)
    steps = [r["step"] for r in train]
    assert steps == sorted(steps) and steps[-1] == 125 and len(set(steps)) == len(steps)
    assert train[-1]["loss"] < 0.7 * train[0]["loss"], [r["loss"] for r in train]

    # Detect on the training scans (the model has seen them; this checks the inference path, world coordinates
    # included) and on the held-out subset, then evaluate by the LUNA16 rules.
    results = tmp_path / "results.csv"
    detect = run_deskpod("lung", "detect", "--detector", str(run), "--data", f"luna16:{data}", "--subset", "0",
                         "--out", str(results), timeout=budget)  # fmt: skip
    assert detect.code == 0, detect.err[-3000:]
    assert "PHANTOM DATA" in detect.out
    with results.open() as f:
        rows = list(csv.DictReader(f))
    assert rows and set(rows[0]) == {"seriesuid", "coordX", "coordY", "coordZ", "probability"}
    with (data / "annotations.csv").open() as f:
        nodules = [r for r in csv.DictReader(f)]
    subset0 = {p.stem for p in (data / "subset0").glob("*.mhd")}
    large = [n for n in nodules if n["seriesuid"] in subset0 and float(n["diameter_mm"]) >= 10]
    assert large, "the phantom's seed gives subset0 at least one nodule of 10 mm or more"
    found = 0
    for n in large:
        centre = np.array([float(n[k]) for k in ("coordX", "coordY", "coordZ")])
        mine = [r for r in rows if r["seriesuid"] == n["seriesuid"] and float(r["probability"]) >= 0.5]
        near = [np.linalg.norm(np.array([float(r[k]) for k in ("coordX", "coordY", "coordZ")]) - centre) for r in mine]
        found += any(d < float(n["diameter_mm"]) / 2 for d in near)
    assert found == len(large), f"{found} of {len(large)} large phantom nodules found"

    # analyze with the trained detector: the large nodule of one scan is found, segmented and measured.
    n = max(large, key=lambda r: float(r["diameter_mm"]))
    scan = data / "subset0" / f"{n['seriesuid']}.mhd"
    out = tmp_path / "analysis"
    an = run_deskpod("lung", "analyze", str(scan), "--detector", str(run), "--out", str(out), timeout=budget)
    assert an.code == 0, an.err[-3000:]
    assert an.out.startswith("deskpod lung analyze: decision support, not a medical device") and "PHANTOM" in an.out
    report = json.loads((out / "report.json").read_text())
    centre = np.array([float(n[k]) for k in ("coordX", "coordY", "coordZ")])
    kept = [f for f in report["nodules"] if f["detection"]["source"] == "detector:det"]
    hit = [
        f
        for f in kept
        if np.linalg.norm(np.array(f["position"]["world_mm_lps"]) - centre) < float(n["diameter_mm"]) / 2
    ]
    assert hit, [f["position"] for f in kept]
    assert abs(hit[0]["mean_diameter_mm"] - float(n["diameter_mm"])) < 3.0, (
        hit[0]["mean_diameter_mm"],
        n["diameter_mm"],
    )

    uids = tmp_path / "uids.csv"
    uids.write_text("\n".join(sorted(subset0)) + "\n")
    ev = run_deskpod("lung", "evaluate", "--annotations", str(data / "annotations.csv"), "--excluded",
                     str(data / "annotations_excluded.csv"), "--candidates", str(results), "--seriesuids", str(uids),
                     "--bootstrap", "50", "--out", str(tmp_path / "ev"), timeout=120)  # fmt: skip
    assert ev.code == 0, ev.err
    assert ev.out.startswith("PHANTOM DATA: synthetic scans, not a clinical result")
    report = json.loads((tmp_path / "ev" / "evaluation.json").read_text())
    print(f"phantom data (synthetic, not clinical): CPM on the training subset {report['cpm']['value']:.3f}")
