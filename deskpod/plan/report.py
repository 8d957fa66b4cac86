"""``deskpod plan report``: the DGX-1's headline claims, and later machines' published figures, against the model.

Each row: the claim as published, its source (``shared/reference/calibration.md`` §4.4), what the
model predicts for the same thing, the ratio predicted / claimed and the error. One row is marked
``fit``: the CPU baseline the CPU efficiency is fitted to (it reproduces itself and is not counted).
No other figure was used to fit the model (the GPU factors come from the DGX-1 P100 TensorFlow
table only), so the error column is the model's honest out-of-sample error. Where the claim leaves
something open (epochs, precision, batch, network), the assumption is written in the row.

Writes ``report.md`` and two PNGs (``claims.png``: ratio per claim; ``calibration.png``: the
fitted DGX-1 P100 scaling, published against predicted) into the output folder.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from deskpod.comm.cost import Network
from deskpod.hardware.catalog import find_machine
from deskpod.plan.predict import machine_facts, match_nodes, predict_plan
from deskpod.plan.workload import MODELS, Precision, Workload

ITWIRE = "itwire.com DGX-1 article (calibration.md 4.4)"
TF_BENCHMARKS = "tensorflow/docs benchmarks.md @62da04c0, the comparison row (calibration.md 4.2)"


@dataclass(frozen=True, slots=True)
class Claim:
    claim: str
    source: str
    claimed: float
    unit: str
    assumption: str
    predict: Callable[[], float]
    fitted: bool = False
    """The figure the model was fitted to (shown, not counted in the out-of-sample error)."""


def _w(model: str, precision: Precision, batch: int, data: Any = "real", epochs: float = 90) -> Workload:
    return Workload(MODELS[model], batch=batch, precision=precision, data=data, epochs=epochs)


def _hours(w: Workload, machine: str, nodes: int = 1) -> float:
    return predict_plan(w, machine, nodes).time_to_train_s / 3600


def _rate(w: Workload, machine: str, nodes: int = 1) -> float:
    return predict_plan(w, machine, nodes).images_per_s


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


def _servers_to_match() -> float:
    """Dual-Xeon servers, data-parallel over `SERVER_NETWORK`, that reach one DGX-1's AlexNet images/s."""
    target = _rate(ALEX_GPU, "dgx1-p100")
    n = match_nodes(ALEX_CPU, "xeon-e5-2697v3-2s", target, network=SERVER_NETWORK)
    return float("inf") if n is None else float(n)


FACEBOOK = "developer.nvidia.com 'Facebook Trains ImageNet in 1 Hour' (Goyal et al. 2017); 90 epochs: aimechanic.com"
BIG_BASIN = "Big Basin (8 P100 on NVLink) modelled as the DGX-1 (P100)"
FB_R50 = _w("resnet50", "fp32", 32)

NVIDIA_CNN_RUNNER = "tensorflow nvidia-examples/cnn/nvutils/runner.py: no --data_dir -> fake_image_set"

CLAIMS: tuple[Claim, ...] = (
    Claim("DGX-1 (P100): 170 FP16 TFLOPS", "datascienceassn.org; itwire", 170, "TFLOPS",
          "8 x the catalog's P100 FP16 peak", lambda: 8 * machine_facts("dgx1-p100", "fp16").peak_tflops),
    Claim("AlexNet takes 2 hours on a DGX-1", ITWIRE, 2, "h", "90 epochs of ImageNet-1k, FP16, batch 512/GPU, real data",
          lambda: _hours(ALEX_GPU, "dgx1-p100")),
    Claim("12x: four Maxwell GPUs take 25 hours", ITWIRE, 25, "h",
          "the same AlexNet run in FP32 (Maxwell has no fast FP16) on the DIGITS DevBox, 4x TITAN X",
          lambda: _hours(ALEX_CPU, "digits-devbox")),
    Claim("12x faster than four Maxwell GPUs", ITWIRE, 12, "x",
          "AlexNet images/s, DGX-1 P100 FP16 over the DevBox FP32",
          lambda: _rate(ALEX_GPU, "dgx1-p100") / _rate(ALEX_CPU, "digits-devbox")),
    Claim("... against 150 hours on a dual Xeon server", ITWIRE, 150, "h",
          "same run in FP32 on the dual E5-2697 v3 model", lambda: _hours(ALEX_CPU, "xeon-e5-2697v3-2s")),
    Claim("75x faster DL training than a dual Xeon E5-2697 v3", "sheffield_hpc dgx-1.rst; deskpod source documents",
          75, "x", "AlexNet images/s, DGX-1 P100 FP16 over dual Xeon FP32",
          lambda: _rate(ALEX_GPU, "dgx1-p100") / _rate(ALEX_CPU, "xeon-e5-2697v3-2s")),
    Claim("more than 250 Xeon servers to match a DGX-1", ITWIRE, 250, "servers",
          "fewest dual E5-2697 v3 servers, AlexNet FP32 batch 512/socket, ring all-reduce over one 10 GbE port "
          "each, reaching the DGX-1's AlexNet images/s (the claim names no network; over 1 GbE the model needs 229)",
          _servers_to_match),
    Claim("8x K80 (GCE): ResNet-50 387 images/s", TF_BENCHMARKS, 387, "images/s",
          "Kepler, same software as the fit (TensorFlow, May 2017): FP32, batch 64/GPU, synthetic data",
          lambda: _rate(_w("resnet50", "fp32", 64, "synthetic"), "gce-k80-8")),
    Claim("8x K80 (GCE): AlexNet 4,640 images/s", TF_BENCHMARKS, 4640, "images/s",
          "as above, batch 512/GPU", lambda: _rate(_w("alexnet", "fp32", 512, "synthetic"), "gce-k80-8")),
    Claim("Facebook: ResNet-50 on 8 P100 (Big Basin, Caffe2) in 29 hours", FACEBOOK, 29, "h",
          f"90 epochs, FP32, batch 256 over 8 GPUs, real data; {BIG_BASIN}", lambda: _hours(FB_R50, "dgx1-p100")),
    Claim("Facebook: ResNet-50 on 256 P100 (32 servers) in 1 hour", FACEBOOK, 1, "h",
          f"batch 8,192 over 256 GPUs (32 each), otherwise as above; {BIG_BASIN}; one 50 Gb/s Ethernet port per "
          "server (assumed from the paper, arXiv 1706.02677; not in the stored sources)",
          lambda: predict_plan(FB_R50, "dgx1-p100", 32, network=Network(1, 50)).time_to_train_s / 3600),
    Claim("DGX-1V vs DGX-1P: up to 3.1x faster CNN training", "DGX-1V whitepaper (leslivresblancs.fr)", 3.1, "x",
          "ResNet-50 synthetic, 8 GPUs: V100 FP16 Tensor Cores over P100 FP32",
          lambda: _rate(_w("resnet50", "fp16", 64, "synthetic"), "dgx1-v100")
          / _rate(_w("resnet50", "fp32", 64, "synthetic"), "dgx1-p100")),
    Claim("ResNet-50, 90 epochs: DGX-1 (V100) 7.4 h", "scan.co.uk deep-learning-hardware", 7.4, "h",
          "FP16, batch 64/GPU, real data", lambda: _hours(R50_GPU, "dgx1-v100")),
    Claim("ResNet-50, 90 epochs: dual Xeon E5-2699 v4 711 h", "scan.co.uk deep-learning-hardware", 711, "h",
          "FP32, batch 64/socket, real data; the CPU efficiency is fitted to this figure",
          lambda: _hours(R50_CPU, "xeon-e5-2699v4-2s"), fitted=True),
    Claim("HGX-2 / DGX-2: 15,500 images/s on ResNet-50", "ZDNet via blog.cynexia.com", 15500, "images/s",
          "DGX-2, FP16, batch 64/GPU, real data", lambda: _rate(R50_GPU, "dgx-2")),
    Claim("DGX-2 measured: ResNet-18 ~30,800 images/s", "CESNET/eInfra-docs dgx2/job_execution.md", 30800, "images/s",
          f"FP16, batch 512/GPU, 16 GPUs, synthetic data (the command gives no --data_dir; {NVIDIA_CNN_RUNNER})",
          lambda: _rate(_w("resnet18", "fp16", 512, "synthetic"), "dgx-2")),
    Claim("DGX-2: AlexNet now takes 18 minutes", "CESNET/eInfra-docs dgx2/introduction.md", 0.3, "h",
          "90 epochs, FP16, batch 512/GPU, real data", lambda: _hours(ALEX_GPU, "dgx-2")),
    Claim("DGX A100: 5 PFLOPS", "gadgetmix.com A100 article", 5000, "TFLOPS",
          "8 x the catalog's FP16 Tensor Core peak with 2:4 sparsity (the dense peak is half)",
          lambda: 8 * _sparse_peak("dgx-a100")),
)  # fmt: skip


def evaluate() -> list[dict[str, Any]]:
    rows = []
    for c in CLAIMS:
        pred = c.predict()
        rows.append({"claim": c.claim, "source": c.source, "claimed": c.claimed, "unit": c.unit,
                     "predicted": pred, "ratio": pred / c.claimed, "error_pct": (pred / c.claimed - 1) * 100,
                     "assumption": c.assumption, "fitted": c.fitted})  # fmt: skip
    return rows


def _fmt(x: float) -> str:
    return f"{x:,.0f}" if x >= 100 else f"{x:,.3g}"


def markdown(rows: list[dict[str, Any]], calibration: list[dict[str, Any]]) -> str:
    scored = [r for r in rows if not r["fitted"]]
    within = sum(1 for r in scored if abs(float(r["error_pct"])) <= 20)
    lines = [
        "# deskpod plan report: the DGX-1's claims against the model",
        "",
        "The GPU factors are fitted only to the DGX-1 (P100) TensorFlow table (calibration.md 4.2), the CPU",
        "efficiency only to the 711 h ResNet-50 CPU baseline (the row marked fit); every other row is out of",
        f"sample. Within ±20%: {within} of {len(scored)} out-of-sample rows.",
        "",
        "| claim | source | claimed | predicted | ratio | error | assumption |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        error = "fit" if r["fitted"] else f"{float(r['error_pct']):+.0f}%"
        lines.append(
            f"| {r['claim']} | {r['source']} | {_fmt(float(r['claimed']))} {r['unit']} | "
            f"{_fmt(float(r['predicted']))} {r['unit']} | {float(r['ratio']):.2f} | {error} | {r['assumption']} |"
        )
    lines += ["", "## The fit (DGX-1 P100, TensorFlow, May 2017; the CPU baseline)", "",
              "| machine | model | devices | data | published images/s | predicted | ratio |",
              "|---|---|---|---|---|---|---|"]  # fmt: skip
    for c in calibration:
        lines.append(
            f"| {c['machine']} | {c['model']} | {c['devices']} | {c['data']} | {c['published']} | "
            f"{c['predicted']} | {c['ratio']} |"
        )
    return "\n".join(lines) + "\n"


def write_report(out: Path) -> Path:
    """Write report.md, claims.png and calibration.png into ``out``; return the Markdown path."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from deskpod.plan.calibration import calibration_table

    out.mkdir(parents=True, exist_ok=True)
    rows = evaluate()
    cal = calibration_table()
    path = out / "report.md"
    path.write_text(markdown(rows, cal))

    fig, ax = plt.subplots(figsize=(9, 5))
    names = [("(fit) " if r["fitted"] else "") + str(r["claim"])[:48] for r in rows]
    ratios = [float(r["ratio"]) for r in rows]
    colors = [
        "tab:gray" if r["fitted"] else "tab:green" if 0.8 <= x <= 1.2 else "tab:red"
        for r, x in zip(rows, ratios, strict=True)
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
