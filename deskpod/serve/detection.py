"""A detection model's outputs: the layout it declares, checked against its config, and decoded into boxes.

A model of a repository (`deskpod.serve.repository`) is a detector when its config declares how its outputs are
laid out; deskpod never guesses it from the shapes. In ``config.toml`` that is a ``[detection]`` table, with the
class names in the model's ``labels``::

    labels = ["__background__", "person", "car"]   # class index -> name
    [detection]
    layout = "torchvision"        # or "yolo"
    score_threshold = 0.5         # detections below it are dropped
    iou_threshold = 0.45          # yolo: non-maximum suppression between boxes of one class
    resize = "stretch"            # a fixed-size input: "letterbox" (keep the aspect, pad) or "stretch"
    channels = "rgb"              # the input's channel order ("bgr": as OpenCV decodes)
    scale = 0.00392156862745098   # pixel values are multiplied by this (1/255: [0, 1])

In a Triton ``config.pbtxt`` the same settings are ``parameters`` keyed ``deskpod.detection.<setting>`` (string
values), and the class names are the output's ``label_filename`` or ``deskpod.detection.labels`` ("person,car").

The layouts (`LAYOUTS`):

- ``torchvision``: three outputs of one image, as torchvision's detection models return them (and export to ONNX):
  ``boxes`` [N, 4] (x1, y1, x2, y2 in the input's pixels), ``scores`` [N], ``labels`` [N] (class indices; index 0
  is torchvision's background). One image per execution (``max_batch_size = 0``); the input is one C×H×W image,
  H and W may be -1 (any size: the frame goes as it is; the model resizes it itself and maps its boxes back).
- ``yolo``: one output [B, N, 4 + C] or [B, 4 + C, N] (Ultralytics' export: [B, 84, 8400] for COCO at 640):
  each of the N candidates is cx, cy, w, h in the input's pixels and C class scores. Its score is its best
  class's; boxes of one class overlapping more than ``iou_threshold`` are suppressed
  (``torchvision.ops.batched_nms``). The input has a fixed H×W; a frame is letterboxed into it.

Boxes are mapped back to the frame's pixels (the letterbox or stretch undone) and clipped to it.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from deskpod.errors import ConfigError, UsageError
from deskpod.serve.repository import ModelConfig, TensorSpec

LAYOUTS = {
    "torchvision": "boxes [N,4] x1y1x2y2, scores [N], labels [N] of one image (torchvision's detection models)",
    "yolo": "one [B, N, 4+C] or [B, 4+C, N] tensor of cx, cy, w, h and C class scores (Ultralytics' export)",
}
RESIZES = ("letterbox", "stretch")
CHANNELS = ("rgb", "bgr")
PREFIX = "repo:"
"""A detector spec naming a model of a repository: ``repo:PATH/MODEL`` or ``repo:PATH/MODEL:VERSION``."""
LETTERBOX_PAD = 114
"""The grey a letterbox pads with: Ultralytics' (its ``LetterBox`` transform), which its models were trained on."""
MAX_DETECTIONS = 300
"""At most this many boxes per frame after suppression (torchvision's ``detections_per_img``, Ultralytics' max_det)."""


@dataclasses.dataclass(frozen=True, kw_only=True, slots=True)
class DetectionSettings:
    """The ``[detection]`` table of a model's config, as written (checked against the model by `layout_of`)."""

    layout: str
    """One of `LAYOUTS`."""
    score_threshold: float = 0.25
    """Detections scoring below it are dropped (a probability for both layouts: softmax or sigmoid)."""
    iou_threshold: float = 0.45
    """``yolo``: a box overlapping a better one of its class more than this is suppressed."""
    resize: str = ""
    """How a frame goes into a fixed-size input: ``letterbox`` (aspect kept, padded) or ``stretch``; "" the
    layout's own (yolo: letterbox, torchvision: stretch). An input of any size (-1) takes the frame as it is."""
    channels: str = "rgb"
    """The input's channel order: ``rgb`` or ``bgr``."""
    scale: float = 1 / 255
    """Pixel values (0..255) are multiplied by this before they go in."""
    boxes: str = "boxes"
    """``torchvision``: the output of boxes."""
    scores: str = "scores"
    """``torchvision``: the output of scores."""
    classes: str = "labels"
    """``torchvision``: the output of class indices."""
    output: str = ""
    """``yolo``: the output tensor ("" the model's only output)."""

    @classmethod
    def from_dict(cls, model: str, doc: Mapping[str, Any]) -> DetectionSettings:
        valid = [f.name for f in dataclasses.fields(cls)]
        unknown = sorted(set(doc) - set(valid))
        if unknown:
            raise ConfigError(f"model {model!r}: unknown [detection] keys {unknown}; valid: {', '.join(valid)}")
        if "layout" not in doc:
            raise ConfigError(_no_layout(model))
        doc = dict(doc)
        for f in dataclasses.fields(cls):  # a config.pbtxt's parameters are strings
            if f.type == "float" and isinstance(doc.get(f.name), str):
                try:
                    doc[f.name] = float(doc[f.name])
                except ValueError:
                    raise ConfigError(f"model {model!r}: detection {f.name} {doc[f.name]!r} is not a number") from None
        try:
            return cls(**doc)
        except TypeError as e:
            raise ConfigError(f"model {model!r}: bad [detection] value ({e})") from None


@dataclasses.dataclass(frozen=True, kw_only=True, slots=True)
class Layout:
    """A detection model's layout, checked against its config: what goes in, what comes out."""

    model: str
    settings: DetectionSettings
    labels: tuple[str, ...]
    """Class names by class index; a class named "" or ``__background__`` (or past the list) is not reported."""
    input: str
    """The image input's name."""
    channels: int
    height: int
    """The input's height (-1: any)."""
    width: int
    batched: bool
    """The model takes a batch dimension (``max_batch_size`` > 0)."""
    candidates_last: bool = False
    """``yolo``: [B, 4+C, N] (Ultralytics') rather than [B, N, 4+C]."""

    @property
    def layout(self) -> str:
        return self.settings.layout

    def name_of(self, index: int) -> str:
        """Class ``index``'s name; "" for a class that is not reported."""
        name = self.labels[index] if 0 <= index < len(self.labels) else ""
        return "" if name == "__background__" else name


def _no_layout(model: str) -> str:
    return (
        f"model {model!r} declares no detection layout: add [detection] layout = one of {', '.join(LAYOUTS)} to its "
        "config.toml (or parameters key deskpod.detection.layout in its config.pbtxt); docs/video.md, 'Your own detector'"
    )


def _check(ok: bool, model: str, what: str) -> None:
    if not ok:
        raise ConfigError(f"model {model!r}: {what}")


def _output(config: ModelConfig, name: str, layout: str) -> TensorSpec:
    for t in config.outputs:
        if t.name == name:
            return t
    have = ", ".join(t.name for t in config.outputs)
    raise ConfigError(f"model {config.name!r}: layout {layout} needs an output {name!r}; its outputs are {have}")


def layout_of(config: ModelConfig) -> Layout:
    """The detection layout ``config`` declares, checked against its inputs and outputs; `ConfigError` (one line)
    when it declares none, an unknown one, or one its outputs do not have."""
    m = config.name
    if config.detection is None:
        raise ConfigError(_no_layout(m))
    if not names(config.labels):
        raise ConfigError(
            f'model {m!r}: a detector needs its class names, by class index: labels = ["__background__", '
            '"person", ...] in config.toml (or an output\'s label_filename, or parameters key '
            "deskpod.detection.labels, in config.pbtxt)"
        )
    s = DetectionSettings.from_dict(m, config.detection)
    _check(s.layout in LAYOUTS, m, f"detection layout {s.layout!r} is not one of {', '.join(LAYOUTS)}")
    _check(0.0 <= s.score_threshold <= 1.0, m, f"score_threshold {s.score_threshold} is not within 0..1")
    _check(0.0 < s.iou_threshold <= 1.0, m, f"iou_threshold {s.iou_threshold} is not within (0, 1]")
    _check(s.resize in ("", *RESIZES), m, f"resize {s.resize!r} is not one of {', '.join(RESIZES)}")
    _check(s.channels in CHANNELS, m, f"channels {s.channels!r} is not one of {', '.join(CHANNELS)}")
    _check(s.scale > 0, m, f"scale {s.scale} must be > 0")
    images = [t for t in config.inputs if t.datatype in ("FP32", "FP16")]
    _check(len(config.inputs) == 1 and len(images) == 1, m,
           f"a detector takes one FP32 image input; its inputs are {[t.as_dict() for t in config.inputs]}")  # fmt: skip
    image = images[0]
    dims = image.dims
    if not config.max_batch_size and len(dims) == 4 and dims[0] == 1:
        dims = dims[1:]  # a model exported for batch 1 states it in its dims
    _check(len(dims) == 3 and dims[0] in (1, 3), m, f"input {image.name!r} dims {list(image.dims)} are not C×H×W")
    c, h, w = dims
    _check((h == -1) == (w == -1), m, f"input {image.name!r} dims {list(image.dims)}: give H and W both, or neither")
    batched = config.max_batch_size > 0
    candidates_last = False
    if s.layout == "torchvision":
        _check(not batched, m, f"layout torchvision gives one image's boxes: set max_batch_size = 0 (it is "
                               f"{config.max_batch_size})")  # fmt: skip
        for name, want in ((s.boxes, 2), (s.scores, 1), (s.classes, 1)):
            t = _output(config, name, s.layout)
            _check(len(t.dims) == want and (want == 1 or t.dims[1] == 4), m,
                   f"layout torchvision: output {name!r} dims {list(t.dims)} are not "
                   f"{'[N, 4]' if want == 2 else '[N]'}")  # fmt: skip
    else:
        _check(h > 0, m, f"layout yolo needs a fixed input size; input {image.name!r} dims are {list(image.dims)}")
        name = s.output or (config.outputs[0].name if len(config.outputs) == 1 else "")
        _check(bool(name), m, f"layout yolo: {len(config.outputs)} outputs; name the one with output = NAME")
        t = _output(config, name, s.layout)
        odims = t.dims if batched else t.dims[1:]
        _check(len(odims) == 2 and (batched or t.dims[0] in (1, -1)), m,
               f"layout yolo: output {name!r} dims {list(t.dims)} are not [N, 4+C] or [4+C, N] "
               f"({'after' if batched else 'with'} the batch dimension)")  # fmt: skip
        a, b = odims
        n = len(config.labels)
        fits = [i for i, d in enumerate((a, b)) if d == 4 + n]
        _check(bool(fits), m, f"layout yolo: output {name!r} dims {list(t.dims)} have no side of 4 + {n} labels = "
                              f"{4 + n}; give one class name per class score")  # fmt: skip
        candidates_last = fits[0] == 0  # both sides fit (N = 4 + C): Ultralytics' order
    return Layout(model=m, settings=s, labels=config.labels, input=image.name, channels=c, height=h, width=w,
                  batched=batched, candidates_last=candidates_last)  # fmt: skip


# ---- a model named by a detector spec -----------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True, slots=True)
class ModelRef:
    """A model of a repository, as ``repo:PATH/MODEL[:VERSION]`` names it."""

    repo: Path
    name: str
    version: str | None = None

    @property
    def folder(self) -> Path:
        return self.repo / self.name

    @classmethod
    def parse(cls, spec: str, flag: str = "--detect") -> ModelRef:
        if not spec.startswith(PREFIX):
            raise UsageError(f"{flag} {spec}: a model is named repo:PATH/MODEL[:VERSION], e.g. repo:models/yolo")
        rest, version = spec[len(PREFIX) :], None
        found = re.fullmatch(r"(.+):([0-9]+)", rest)
        if found:
            rest, version = found[1], found[2]
        path = Path(rest)
        if not rest or path.name in ("", ".", ".."):
            raise UsageError(f"{flag} {spec}: name a model folder, e.g. repo:models/yolo or repo:models/yolo:2")
        return cls(path.parent, path.name, version)

    def __str__(self) -> str:
        return f"{PREFIX}{self.folder}" + (f":{self.version}" if self.version else "")


def check_model(ref: ModelRef) -> Layout:
    """The model ``ref`` names is a folder of a repository whose config declares a detection layout its outputs
    match; `ConfigError` otherwise (no model, no layout, a layout that does not fit)."""
    from deskpod.serve.repository import is_model_folder, read_config

    if not is_model_folder(ref.folder):
        raise ConfigError(
            f"{ref}: no model folder {ref.folder} (a folder with config.toml or a Triton config.pbtxt, and numbered "
            "versions)"
        )
    return layout_of(read_config(ref.folder))


# ---- boxes out -----------------------------------------------------------------------------------------


def decode(outputs: Mapping[str, np.ndarray], layout: Layout) -> list[np.ndarray]:
    """The detections of each image of one execution, in the input's pixels: [K, 6] rows of x1, y1, x2, y2, score,
    class index, best first, at least ``score_threshold``."""
    if layout.layout == "torchvision":
        s = layout.settings
        return [_torchvision(outputs[s.boxes], outputs[s.scores], outputs[s.classes], s.score_threshold)]
    raw = np.asarray(outputs[layout.settings.output or next(iter(outputs))])
    if not layout.batched:
        raw = raw.reshape(1, *raw.shape[-2:])
    return [_yolo(r.T if layout.candidates_last else r, layout) for r in raw]


def _torchvision(boxes: np.ndarray, scores: np.ndarray, classes: np.ndarray, threshold: float) -> np.ndarray:
    keep = np.asarray(scores).reshape(-1) >= threshold
    out = np.concatenate(
        [np.asarray(boxes, np.float64).reshape(-1, 4)[keep], np.asarray(scores, np.float64).reshape(-1, 1)[keep],
         np.asarray(classes, np.float64).reshape(-1, 1)[keep]], axis=1,
    )  # fmt: skip
    return out[np.argsort(-out[:, 4], kind="stable")]


def _yolo(rows: np.ndarray, layout: Layout) -> np.ndarray:
    """One image's candidates [N, 4+C] → the boxes that survive the threshold and class-wise suppression."""
    import torch
    from torchvision.ops import batched_nms

    s = layout.settings
    scores = rows[:, 4:]
    cls = scores.argmax(axis=1)
    best = scores[np.arange(len(rows)), cls]
    keep = best >= s.score_threshold
    cx, cy, w, h = (rows[keep, i].astype(np.float64) for i in range(4))
    boxes = np.stack([cx - w / 2, cy - h / 2, cx + w / 2, cy + h / 2], axis=1)
    best, cls = best[keep].astype(np.float64), cls[keep]
    chosen = batched_nms(torch.from_numpy(boxes), torch.from_numpy(best), torch.from_numpy(cls), s.iou_threshold)
    idx = chosen[:MAX_DETECTIONS].numpy()
    return np.concatenate([boxes[idx], best[idx, None], cls[idx, None].astype(np.float64)], axis=1)


def names(labels: Sequence[str]) -> tuple[str, ...]:
    """The distinct class names (the background left out)."""
    return tuple(dict.fromkeys(n for n in labels if n and n != "__background__"))
