"""``deskpod lung``: lung-nodule CT analysis; each ``lung WHAT`` is registered by one function below.

deskpod lung evaluate --annotations annotations.csv --excluded annotations_excluded.csv \\
    --candidates results.csv --seriesuids seriesuids.csv     FROC, CPM and 95% intervals by the LUNA16 rules
... --bootstrap 1000 --seed 0                                resamplings over scans (0: no intervals)
... --out DIR                                                where froc.png and evaluation.json go
... --json                                                   print evaluation.json instead of the table

Decision support, not a medical device: what these commands print says so.
"""

from __future__ import annotations

import argparse
import json


def register(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    p = sub.add_parser(
        "lung",
        help="lung-nodule CT: evaluate a detector by the LUNA16 rules (decision support, not a medical device)",
        description="Lung-nodule analysis on chest CT. Decision support, not a medical device.",
    )
    lung = p.add_subparsers(dest="lung_command", metavar="WHAT")
    lung.required = True
    _register_evaluate(lung)


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
    from deskpod.errors import ConfigError
    from deskpod.lung.evaluate import evaluate_files, format_table, write_outputs

    if args.max_marks < 0:
        raise ConfigError(f"--max-marks {args.max_marks}: give a number of candidates per scan, or 0 for all")
    ev = evaluate_files(args.annotations, args.excluded, args.candidates, args.seriesuids,
                        samples=args.bootstrap, seed=args.seed, max_marks=args.max_marks or None)  # fmt: skip
    png, data = write_outputs(ev, args.out)
    if args.json:
        print(json.dumps(ev.to_json(), indent=2))
    else:
        print(format_table(ev))
        print(f"wrote {png} and {data}")
    return 0
