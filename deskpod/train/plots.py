"""PNG plots of a run's loss, accuracy and throughput, drawn from ``metrics.jsonl``."""

from __future__ import annotations

from pathlib import Path

from deskpod.train.runs import RunPaths, read_metrics


def write_plots(run_dir: Path) -> list[Path]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    records = read_metrics(run_dir)
    train = [r for r in records if r.get("kind") == "train"]
    val = [r for r in records if r.get("kind") == "val"]
    out = RunPaths(run_dir).plots
    out.mkdir(parents=True, exist_ok=True)
    written = []
    panels = [
        ("loss.png", "loss", [(train, "loss", "train"), (val, "val_loss", "validation")]),
        ("accuracy.png", "validation accuracy", [(val, "val_accuracy", "validation")]),
        ("throughput.png", "images/s (all devices)", [(train, "images_per_s", "train")]),
    ]
    for filename, ylabel, series in panels:
        fig, ax = plt.subplots(figsize=(6, 3.5), dpi=100)
        for recs, key, label in series:
            pts = [(r["step"], r[key]) for r in recs if isinstance(r.get(key), int | float)]
            if pts:
                xs, ys = zip(*pts, strict=True)
                ax.plot(xs, ys, marker="o" if len(pts) < 20 else None, label=label)
        ax.set_xlabel("optimizer step")
        ax.set_ylabel(ylabel)
        ax.grid(alpha=0.3)
        if len(series) > 1:
            ax.legend()
        fig.tight_layout()
        path = out / filename
        fig.savefig(path)
        plt.close(fig)
        written.append(path)
    return written
