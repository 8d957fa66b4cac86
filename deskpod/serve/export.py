"""Export a model into a repository: the graph with its preprocessing baked in, its input spec, its labels.

The exported graph takes what a client naturally has — float32 images in [0, 1], shape (N, C, H, W) — and
applies the run's per-channel normalisation itself, so a client never has to know ``mean``/``std``; they are
still written to ``config.toml`` for the record. ONNX (for ONNX Runtime) is the default format; ``torch`` writes
TorchScript. Each export adds a new numbered version beside the earlier ones.

With ``image_input`` (``deskpod export RUN --image-input``) the model takes encoded JPEG/PNG instead: its one
input is ``BYTES`` ``[N]`` (one image per row), and ``config.toml`` gains a ``[preprocess]`` table with the run's
evaluation transform (`deskpod.serve.images.ImagePreprocess`: channels, size, resize and crop) that the server
applies before the graph — which still takes FP32 [0, 1] and normalises with the run's mean/std itself.
"""

from __future__ import annotations

import warnings
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from deskpod.errors import ConfigError, UsageError
from deskpod.serve.images import ImagePreprocess, for_run
from deskpod.serve.repository import PLATFORMS, ModelConfig, TensorSpec, next_version, write_config

FORMATS = {"onnx": "onnxruntime", "torch": "torch"}


@dataclass(frozen=True, kw_only=True, slots=True)
class ExportOptions:
    repo: Path
    """The model repository to write into (created if missing)."""
    name: str
    """The model's folder name in the repository."""
    format: str = "onnx"
    """``onnx`` (ONNX Runtime) or ``torch`` (TorchScript)."""
    max_batch_size: int = 32
    max_queue_delay_us: int = 2000
    instances: int = 1
    threads: int = 0
    image_input: bool = False
    """Take encoded JPEG/PNG (a BYTES input) and apply the run's preprocessing in the server."""

    def __post_init__(self) -> None:
        if self.format not in FORMATS:
            raise ConfigError(f"--format {self.format!r} is not one of {', '.join(FORMATS)}")
        if not self.name or "/" in self.name or self.name.startswith("."):
            raise ConfigError(f"model name {self.name!r} must be a plain folder name, e.g. 'convnet'")
        if self.max_batch_size < 1:
            raise ConfigError(f"max_batch_size {self.max_batch_size} must be >= 1")


def _normalized(model: Any, mean: Sequence[float], std: Sequence[float]) -> Any:
    import torch

    class Normalized(torch.nn.Module):
        """``model((x - mean) / std)`` with mean/std as per-channel constants of the graph."""

        def __init__(self) -> None:
            super().__init__()
            self.model = model
            self.register_buffer("mean", torch.tensor(list(mean), dtype=torch.float32).view(1, -1, 1, 1))
            self.register_buffer("std", torch.tensor(list(std), dtype=torch.float32).view(1, -1, 1, 1))

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.model((x - self.mean) / self.std)  # type: ignore[no-any-return]

    return Normalized().eval() if mean else model.eval()


def export_model(
    model: Any,
    input_shape: tuple[int, ...],
    options: ExportOptions,
    *,
    class_names: Sequence[str] = (),
    mean: Sequence[float] = (),
    std: Sequence[float] = (),
    preprocess: ImagePreprocess | None = None,
) -> Path:
    """Write ``model`` (a torch module taking (N, *input_shape)) as a new version; returns the version folder.

    With ``preprocess`` the served input is the encoded image it describes (its C×H×W must be ``input_shape``)."""
    import torch

    if preprocess is not None and (preprocess.channels, preprocess.height, preprocess.width) != tuple(input_shape):
        raise ConfigError(
            f"image preprocessing makes {preprocess.channels}×{preprocess.height}×{preprocess.width} "
            f"but the model takes {'×'.join(map(str, input_shape))}"
        )
    if bool(mean) != bool(std) or (mean and len(mean) != len(std)):
        raise ConfigError(f"mean {list(mean)} and std {list(std)} must both be given, one value per channel")
    wrapped = _normalized(model.cpu().float().eval(), mean, std)
    example = torch.rand(2, *input_shape)
    with torch.inference_mode():
        out = wrapped(example)
    if not isinstance(out, torch.Tensor) or out.ndim < 1:
        raise UsageError("export needs a model that returns one tensor with a batch dimension")
    platform = FORMATS[options.format]
    model_dir = options.repo / options.name
    version_dir = model_dir / str(next_version(model_dir))
    version_dir.mkdir(parents=True)
    path = version_dir / PLATFORMS[platform]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # torch's exporters warn about their own deprecations
        if options.format == "onnx":
            torch.onnx.export(
                wrapped,
                (example,),
                str(path),
                input_names=["input"],
                output_names=["logits"],
                dynamic_axes={"input": {0: "batch"}, "logits": {0: "batch"}},
                opset_version=17,
                dynamo=False,
            )
        else:
            torch.jit.save(torch.jit.trace(wrapped, example), str(path))
    if preprocess is not None:
        preprocess = replace(preprocess, tensor="input")  # the graph's input, as exported above
        inputs = (TensorSpec(preprocess.input, "BYTES", ()),)
    else:
        inputs = (TensorSpec("input", "FP32", tuple(input_shape)),)
    config = ModelConfig(
        name=options.name,
        platform=platform,
        inputs=inputs,
        outputs=(TensorSpec("logits", "FP32", tuple(out.shape[1:])),),
        max_batch_size=options.max_batch_size,
        max_queue_delay_us=options.max_queue_delay_us,
        instances=options.instances,
        threads=options.threads,
        labels=tuple(class_names),
        mean=tuple(float(m) for m in mean),
        std=tuple(float(s) for s in std),
        preprocess=None if preprocess is None else preprocess.to_dict(),
    )
    write_config(model_dir, config)
    return version_dir


def export_run(
    run_dir: Path, options: ExportOptions | None = None, *, repo: Path | None = None, format: str = "onnx"
) -> Path:
    """Export a training run's latest checkpoint (`deskpod.train.checkpoint.load_model`); with
    ``options.image_input``, with the run's evaluation transform (from its dataset, in ``config.toml``)."""
    from deskpod.train.checkpoint import load_model

    loaded = load_model(run_dir)
    if options is None:
        options = ExportOptions(repo=repo or Path("models"), name=run_dir.name, format=format)
    elif repo is not None:
        options = replace(options, repo=repo)
    preprocess = None
    if options.image_input:
        c, h, w = loaded.input_shape
        if c not in (1, 3):
            raise UsageError(f"--image-input needs a run on 1- or 3-channel images; run {run_dir} takes {c} channels")
        preprocess = for_run(c, h, w, run_dataset(run_dir))
    return export_model(
        loaded.model,
        tuple(loaded.input_shape),
        options,
        class_names=loaded.class_names,
        mean=loaded.mean,
        std=loaded.std,
        preprocess=preprocess,
    )


def run_dataset(run_dir: Path) -> str:
    """The ``data`` a run was trained on, from its resolved ``config.toml`` ("" when it does not say)."""
    import tomllib

    from deskpod.train.runs import RunPaths

    path = RunPaths(run_dir).config
    try:
        return str(tomllib.loads(path.read_text()).get("data", ""))
    except (OSError, tomllib.TOMLDecodeError, UnicodeDecodeError):
        return ""
