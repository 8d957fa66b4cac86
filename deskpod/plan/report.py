"""``deskpod plan report``: published claims and results against the model, each row under a named stack.

Each claim row: the claim as published, its source (``docs/reference/calibration.md``), the **stack**
that predicted it (`deskpod.plan.stacks`), what the model predicts for the same
thing, the ratio predicted / claimed and the error. A row whose software is its stack's own
(the same benchmark page, the same table) says "own"; a row from other software (Caffe, Caffe2,
MXNet, unnamed vendor software) is predicted with the fitted stack nearest its era and **marked**
with what its software was. Peak-FLOPS claims need no stack ("-"). One row is marked ``fit``: the CPU
baseline the CPU efficiency is fitted to (it reproduces itself and is not counted).

Then the other GPU generations under a stack (`deskpod.plan.generations`: published, not in the
reference, never fitted to) and each stack's fit to its own table. Where a claim leaves something
open (epochs, precision, batch, network), the assumption is written in the row.

Writes ``report.md`` and two PNGs (``claims.png``: ratio per row; ``calibration.png``: the fitted
DGX-1 P100 scaling, published against predicted) into the output folder.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from deskpod.comm.cost import Network
from deskpod.hardware.catalog import find_machine
from deskpod.plan.predict import machine_facts, match_nodes, predict_plan
from deskpod.plan.stacks import PYTORCH_2021, STACKS, TF1_2017
from deskpod.plan.workload import MODELS, Precision, Workload

TF = TF1_2017.name
PT = PYTORCH_2021.name
NO_STACK = "-"
"""A peak-FLOPS claim: arithmetic on the catalog, no software."""

ITWIRE = "itwire.com DGX-1 article (docs/reference/calibration.md#published-claims)"
TF_BENCHMARKS = "tensorflow/docs benchmarks.md @62da04c0, K80 row (docs/reference/calibration.md#tensorflow-2017)"


@dataclass(frozen=True, slots=True)
class Claim:
    claim: str
    source: str
    claimed: float
    unit: str
    assumption: str
    predict: Callable[[str], float]
    """The prediction under a stack (the row's own, or the other one, shown beside a marked row)."""
    stack: str
    """The stack that predicts it (``-``: a peak claim, no software)."""
    software: str
    """``own``: the stack's own software; otherwise the claim's software, and the row is marked."""
    fitted: bool = False
    """The figure the model was fitted to (shown, not counted in the out-of-sample error)."""


def _w(model: str, precision: Precision, batch: int, data: Any = "real", epochs: float = 90) -> Workload:
    return Workload(MODELS[model], batch=batch, precision=precision, data=data, epochs=epochs)


def _hours(w: Workload, machine: str, stack: str, nodes: int = 1) -> float:
    return predict_plan(w, machine, nodes, stack=stack).time_to_train_s / 3600


def _rate(w: Workload, machine: str, stack: str, nodes: int = 1) -> float:
    return predict_plan(w, machine, nodes, stack=stack).images_per_s


ALEX_GPU = _w("alexnet", "fp16", 512)
ALEX_CPU = _w("alexnet", "fp32", 512)
"""AlexNet in FP32: on CPUs, and on GPUs before Pascal (no fast FP16)."""
R50_GPU = _w("resnet50", "fp16", 64)
R50_CPU = _w("resnet50", "fp32", 64)
SERVER_NETWORK = Network(1, 10)
"""One 10 GbE port per CPU server: assumed, the claim names no network (the row states the 1 GbE answer too)."""


def _sparse_peak(machine: str) -> float:
    spec = find_machine(machine).peak_tflops("fp16_tensor_sparse")
    if spec is None:  # pragma: no cover - a catalog error
        raise AssertionError(f"{machine} has no fp16_tensor_sparse peak in the catalog")
    return spec.value


def _servers_to_match(stack: str) -> float:
    """Dual-Xeon servers, data-parallel over `SERVER_NETWORK`, that reach one DGX-1's AlexNet images/s."""
    target = _rate(ALEX_GPU, "dgx1-p100", stack)
    n = match_nodes(ALEX_CPU, "xeon-e5-2697v3-2s", target, network=SERVER_NETWORK, stack=stack)
    return float("inf") if n is None else float(n)


FACEBOOK = "developer.nvidia.com 'Facebook Trains ImageNet in 1 Hour' (Goyal et al. 2017); 90 epochs: aimechanic.com"
BIG_BASIN = "Big Basin (8 P100 on NVLink) modelled as the DGX-1 (P100)"
FB_R50 = _w("resnet50", "fp32", 32)

NVIDIA_CNN_RUNNER = "tensorflow nvidia-examples/cnn/nvutils/runner.py: no --data_dir -> fake_image_set"

UNNAMED_2016 = "2016 launch claim, software not named"
CAFFE_2015 = "DIGITS / Caffe, 2015"
CAFFE2_2017 = "Caffe2, 2017"
VENDOR_2017 = "2017 vendor claim, software not named"
VENDOR_2018 = "2018 vendor claim, FP16 era, software not named"
TF_2019 = "TensorFlow NGC 19.02, FP16"

CLAIMS: tuple[Claim, ...] = (
    Claim("DGX-1 (P100): 170 FP16 TFLOPS", "datascienceassn.org; itwire", 170, "TFLOPS",
          "8 x the catalog's P100 FP16 peak", lambda s: 8 * machine_facts("dgx1-p100", "fp16").peak_tflops,
          NO_STACK, "peak"),
    Claim("AlexNet takes 2 hours on a DGX-1", ITWIRE, 2, "h", "90 epochs of ImageNet-1k, FP16, batch 512/GPU, real data",
          lambda s: _hours(ALEX_GPU, "dgx1-p100", s), TF, UNNAMED_2016),
    Claim("12x: four Maxwell GPUs take 25 hours", ITWIRE, 25, "h",
          "the same AlexNet run in FP32 (Maxwell has no fast FP16) on the DIGITS DevBox, 4x TITAN X",
          lambda s: _hours(ALEX_CPU, "digits-devbox", s), TF, CAFFE_2015),
    Claim("12x faster than four Maxwell GPUs", ITWIRE, 12, "x",
          "AlexNet images/s, DGX-1 P100 FP16 over the DevBox FP32",
          lambda s: _rate(ALEX_GPU, "dgx1-p100", s) / _rate(ALEX_CPU, "digits-devbox", s), TF, CAFFE_2015),
    Claim("... against 150 hours on a dual Xeon server", ITWIRE, 150, "h",
          "same run in FP32 on the dual E5-2697 v3 model", lambda s: _hours(ALEX_CPU, "xeon-e5-2697v3-2s", s), TF,
          UNNAMED_2016),
    Claim("75x faster DL training than a dual Xeon E5-2697 v3", "sheffield_hpc dgx-1.rst; 2016 DGX-1 launch articles",
          75, "x", "AlexNet images/s, DGX-1 P100 FP16 over dual Xeon FP32",
          lambda s: _rate(ALEX_GPU, "dgx1-p100", s) / _rate(ALEX_CPU, "xeon-e5-2697v3-2s", s), TF, UNNAMED_2016),
    Claim("more than 250 Xeon servers to match a DGX-1", ITWIRE, 250, "servers",
          "fewest dual E5-2697 v3 servers, AlexNet FP32 batch 512/socket, ring all-reduce over one 10 GbE port "
          "each, reaching the DGX-1's AlexNet images/s (the claim names no network; over 1 GbE the model needs 229)",
          _servers_to_match, TF, UNNAMED_2016),
    Claim("8x K80 (GCE): ResNet-50 387 images/s", TF_BENCHMARKS, 387, "images/s",
          "Kepler, FP32, batch 64/GPU, synthetic data",
          lambda s: _rate(_w("resnet50", "fp32", 64, "synthetic"), "gce-k80-8", s), TF, "own"),
    Claim("8x K80 (GCE): AlexNet 4,640 images/s", TF_BENCHMARKS, 4640, "images/s",
          "as above, batch 512/GPU", lambda s: _rate(_w("alexnet", "fp32", 512, "synthetic"), "gce-k80-8", s), TF,
          "own"),
    Claim("Facebook: ResNet-50 on 8 P100 (Big Basin, Caffe2) in 29 hours", FACEBOOK, 29, "h",
          f"90 epochs, FP32, batch 256 over 8 GPUs, real data; {BIG_BASIN}", lambda s: _hours(FB_R50, "dgx1-p100", s),
          TF, CAFFE2_2017),
    Claim("Facebook: ResNet-50 on 256 P100 (32 servers) in 1 hour", FACEBOOK, 1, "h",
          f"batch 8,192 over 256 GPUs (32 each), otherwise as above; {BIG_BASIN}; one 50 Gb/s Ethernet port per "
          "server (assumed from the paper, arXiv 1706.02677; not in the stored sources)",
          lambda s: predict_plan(FB_R50, "dgx1-p100", 32, network=Network(1, 50), stack=s).time_to_train_s / 3600,
          TF, CAFFE2_2017),
    Claim("DGX-1V vs DGX-1P: up to 3.1x faster CNN training", "DGX-1V whitepaper (leslivresblancs.fr)", 3.1, "x",
          "ResNet-50 synthetic, 8 GPUs: V100 FP16 Tensor Cores over P100 FP32",
          lambda s: _rate(_w("resnet50", "fp16", 64, "synthetic"), "dgx1-v100", s)
          / _rate(_w("resnet50", "fp32", 64, "synthetic"), "dgx1-p100", s), TF, VENDOR_2017),
    Claim("ResNet-50, 90 epochs: DGX-1 (V100) 7.4 h", "scan.co.uk deep-learning-hardware", 7.4, "h",
          "FP16, batch 64/GPU, real data", lambda s: _hours(R50_GPU, "dgx1-v100", s), TF, VENDOR_2017),
    Claim("ResNet-50, 90 epochs: dual Xeon E5-2699 v4 711 h", "scan.co.uk deep-learning-hardware", 711, "h",
          "FP32, batch 64/socket, real data; the CPU efficiency is fitted to this figure",
          lambda s: _hours(R50_CPU, "xeon-e5-2699v4-2s", s), TF, "own", fitted=True),
    Claim("HGX-2 / DGX-2: 15,500 images/s on ResNet-50", "ZDNet via blog.cynexia.com", 15500, "images/s",
          "DGX-2, FP16, batch 256/GPU (the stack's own AMP batch), real data",
          lambda s: _rate(_w("resnet50", "fp16", 256), "dgx-2", s), PT,
          VENDOR_2018),
    Claim("DGX-2 measured: ResNet-18 ~30,800 images/s", "CESNET/eInfra-docs dgx2/job_execution.md", 30800, "images/s",
          f"FP16, batch 512/GPU, 16 GPUs, synthetic data (the command gives no --data_dir; {NVIDIA_CNN_RUNNER})",
          lambda s: _rate(_w("resnet18", "fp16", 512, "synthetic"), "dgx-2", s), PT, TF_2019),
    Claim("DGX-2: AlexNet now takes 18 minutes", "CESNET/eInfra-docs dgx2/introduction.md", 0.3, "h",
          "90 epochs, FP16, batch 512/GPU, real data", lambda s: _hours(ALEX_GPU, "dgx-2", s), PT, VENDOR_2018),
    Claim("DGX A100: 5 PFLOPS", "gadgetmix.com A100 article", 5000, "TFLOPS",
          "8 x the catalog's FP16 Tensor Core peak with 2:4 sparsity (the dense peak is half)",
          lambda s: 8 * _sparse_peak("dgx-a100"), NO_STACK, "peak"),
)  # fmt: skip


def evaluate() -> list[dict[str, Any]]:
    """Every claim beside its stack's prediction."""
    rows = []
    for c in CLAIMS:
        pred = c.predict(c.stack)
        marked = c.software not in ("own", "peak")
        other = next((s for s in STACKS if s != c.stack), c.stack)
        rows.append({"claim": c.claim, "source": c.source, "claimed": c.claimed, "unit": c.unit, "stack": c.stack,
                     "software": c.software, "marked": marked, "predicted": pred,
                     "other_stack": other if marked else None, "other_predicted": c.predict(other) if marked else None,
                     "ratio": pred / c.claimed, "error_pct": (pred / c.claimed - 1) * 100,
                     "assumption": c.assumption, "fitted": c.fitted})  # fmt: skip
    return rows


def _fmt(x: float) -> str:
    return f"{x:,.0f}" if x >= 100 else f"{x:,.3g}"


def _within(rows: list[dict[str, Any]]) -> int:
    return sum(1 for r in rows if abs(float(r["error_pct"])) <= 20)


def _stack_cell(r: dict[str, Any]) -> str:
    if r["stack"] == NO_STACK:
        return "- (peak)"
    return f"{r['stack']} (own)" if r["software"] == "own" else f"{r['stack']} (nearest), **marked**: {r['software']}"


def _fit_rows(table: list[dict[str, Any]]) -> list[str]:
    lines = ["| stack | machine | model | devices | precision | batch | data | published images/s | predicted | ratio |"
             " fitted |", "|---|---|---|---|---|---|---|---|---|---|---|"]  # fmt: skip
    for c in table:
        lines.append(
            f"| {c['stack']} | {c['machine']} | {c['model']} | {c['devices']} | {c['precision']} | {c['batch']} | "
            f"{c['data']} | {c['published']} | {c['predicted']} | {c['ratio']} | {'yes' if c['fitted'] else 'no'} |"
        )
    return lines


def markdown(
    rows: list[dict[str, Any]],
    calibration: list[dict[str, Any]],
    held_out: list[dict[str, Any]] | None = None,
    modern: list[dict[str, Any]] | None = None,
) -> str:
    """The report: claims, other GPU generations under a stack (``held_out``), and each stack's fit
    (``calibration``: tf1-2017's; ``modern``: pytorch-2021's). Omitted tables are computed here."""
    from deskpod.plan.calibration import pytorch_2021_table
    from deskpod.plan.generations import held_out_table

    held_out = held_out_table() if held_out is None else held_out
    modern = pytorch_2021_table() if modern is None else modern
    scored = [r for r in rows if not r["fitted"] and r["stack"] != NO_STACK]
    own = [r for r in scored if not r["marked"]]
    marked = [r for r in scored if r["marked"]]
    peaks = [r for r in rows if r["stack"] == NO_STACK]
    stacks = "; ".join(f"**{s.name}**: {s.title}, fitted to {s.fitted_to}" for s in STACKS.values())
    lines = [
        "# deskpod plan report: published claims and results against the model, by software stack",
        "",
        f"Every prediction names the software stack whose factors made it. Stacks: {stacks}. A claim whose",
        "software is not its stack's own is predicted with the fitted stack nearest its era and marked with",
        "its software; peak claims need no stack. The CPU efficiency is fitted to the 711 h CPU baseline (the",
        "row marked fit); no other row was used to fit anything.",
        "",
        f"Within ±20%: {_within(own)} of {len(own)} rows under their own stack's software, "
        f"{_within(marked)} of {len(marked)} marked rows (other software), {_within(peaks)} of {len(peaks)} "
        f"peak claims; other GPU generations under a fitted stack (published, not in the reference): "
        f"{_within(held_out)} of {len(held_out)}.",
        "",
        "| claim | source | stack | claimed | predicted | ratio | error | with the other stack | assumption |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        error = "fit" if r["fitted"] else f"{float(r['error_pct']):+.0f}%"
        other = "-"
        if r["other_predicted"] is not None:
            o = float(r["other_predicted"])
            other = f"{r['other_stack']}: {_fmt(o)} {r['unit']} ({(o / float(r['claimed']) - 1) * 100:+.0f}%)"
        lines.append(
            f"| {r['claim']} | {r['source']} | {_stack_cell(r)} | {_fmt(float(r['claimed']))} {r['unit']} | "
            f"{_fmt(float(r['predicted']))} {r['unit']} | {float(r['ratio']):.2f} | {error} | {other} | "
            f"{r['assumption']} |"
        )
    lines += ["", "## Other GPU generations under the same stack (published, not in the reference; never fitted)", "",
              "| stack | machine | model | precision | batch/GPU | GPUs | data | published images/s | predicted | "
              "ratio | error | another era's stack (comparison only) | source |",
              "|---|---|---|---|---|---|---|---|---|---|---|---|---|"]  # fmt: skip
    for h in held_out:
        o = float(h["other_predicted"])
        lines.append(
            f"| {h['stack']} | {h['machine']} | {h['model']} | {h['precision']} | {h['batch']} | {h['devices']} | "
            f"{h['data']} | {_fmt(float(h['published']))} | {_fmt(float(h['predicted']))} | "
            f"{float(h['ratio']):.2f} | {float(h['error_pct']):+.0f}% | "
            f"{h['other_stack']}: {_fmt(o)} ({(o / float(h['published']) - 1) * 100:+.0f}%) | {h['source']} |"
        )
    lines += ["", f"## The fit of {TF} (DGX-1 P100, TensorFlow, May 2017; the CPU baseline)", ""]
    lines += _fit_rows(calibration)
    lines += ["", f"## The fit of {PT} (DGX-1 V100, PyTorch 21.03; the 16GB rows shown, not fitted)", ""]
    lines += _fit_rows(modern)
    return "\n".join(lines) + "\n"


def write_report(out: Path) -> Path:
    """Write report.md, claims.png and calibration.png into ``out``; return the Markdown path."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from deskpod.plan.calibration import calibration_table

    out.mkdir(parents=True, exist_ok=True)
    from deskpod.plan.generations import held_out_table

    rows = evaluate()
    cal = calibration_table()
    held = held_out_table()
    path = out / "report.md"
    path.write_text(markdown(rows, cal, held))

    fig, ax = plt.subplots(figsize=(9, 6))
    names = [("(fit) " if r["fitted"] else "") + f"[{r['stack']}] " + str(r["claim"])[:44] for r in rows]
    names += [f"[{h['stack']}] {h['machine']} {h['precision']} x{h['devices']}" for h in held]
    ratios = [float(r["ratio"]) for r in rows] + [float(h["ratio"]) for h in held]
    fitted = [bool(r["fitted"]) for r in rows] + [False] * len(held)
    colors = [
        "tab:gray" if f else "tab:green" if 0.8 <= x <= 1.2 else "tab:red" for f, x in zip(fitted, ratios, strict=True)
    ]
    ax.barh(names, ratios, color=colors)
    ax.axvline(1.0, color="black", lw=1)
    ax.axvspan(0.8, 1.2, color="tab:green", alpha=0.1)
    ax.set_xscale("log")
    ax.set_xlabel("predicted / claimed (green band: ±20%)")
    ax.invert_yaxis()
    fig.tight_layout()
    fig.savefig(out / "claims.png", dpi=100)
    plt.close(fig)

    fig, ax = plt.subplots(figsize=(6, 4))
    for model, data, style in (("resnet50", "synthetic", "o-"), ("alexnet", "synthetic", "s-"),
                               ("resnet50", "real", "o--"), ("alexnet", "real", "s--")):  # fmt: skip
        pts = [c for c in cal if c["model"] == model and c["data"] == data and c["machine"] == "dgx1-p100"]
        gpus = [int(c["devices"]) for c in pts]
        ax.plot(gpus, [float(c["published"]) for c in pts], style, label=f"{model} {data} published")
        ax.plot(gpus, [float(c["predicted"]) for c in pts], style, alpha=0.4, label=f"{model} {data} predicted")
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xlabel("GPUs (DGX-1 P100)")
    ax.set_ylabel("images/s")
    ax.legend(fontsize=6)
    fig.tight_layout()
    fig.savefig(out / "calibration.png", dpi=100)
    plt.close(fig)
    return path
