"""Models that take images: decode, resize/crop and scale encoded JPEG/PNG in the server; top-k class names.

An image model (``deskpod export RUN --image-input``) takes one encoded image per request row — a ``BYTES``
input of shape ``[N]`` — and its ``config.toml`` records how to turn it into the network's input in a
``[preprocess]`` table (`ImagePreprocess`)::

    [preprocess]
    input = "image"       # the BYTES input clients send
    tensor = "input"      # the network's FP32 [C, H, W] input it becomes
    channels = 3          # 3: RGB (PIL's convert("RGB"), as the run read its files); 1: grayscale
    height = 224
    width = 224
    resize = 256          # the shorter side is resized to this, then the centre H×W is cut out; 0: resize to H×W
    max_pixels = 25000000 # a larger canvas is refused before it is decoded

These are the numbers of the run's own evaluation transform (`deskpod.train.data`: ``Resize(size * 256 / 224)``,
``CenterCrop(size)``, ``ToTensor``), done here with PIL alone, and the graph still applies the run's mean/std
itself, as for a tensor export. `decode_images` runs on a thread of the `Decoder` (PIL releases the GIL while
it decodes and resizes), never on the event loop; the decoded tensors then queue and batch like any request.
An image that cannot be used is a `BadImage` (HTTP 400) naming the problem and the row.

`classify` is Triton's classification extension: a requested output with ``parameters: {"classification": k}``
comes back as ``BYTES`` of shape ``[N, k]``, each element ``b"score:index:label"`` (``b"score:index"`` without
labels), highest score first, the score printed as C++'s ``std::to_string(float)`` does (six decimals).
"""

from __future__ import annotations

import asyncio
import functools
import io
import json
import os
import warnings
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, fields, replace
from typing import Any

import numpy as np

from deskpod.errors import ConfigError
from deskpod.serve.batcher import Overloaded
from deskpod.serve.protocol import ProtocolError
from deskpod.serve.repository import ModelConfig, TensorSpec

MAX_PIXELS = 25_000_000
"""The largest canvas (width × height) decoded, e.g. 5000×5000: a small file can claim a huge one (a
decompression bomb). Far below PIL's own limit (``Image.MAX_IMAGE_PIXELS``, 89,478,485 pixels: PIL only warns
above it and refuses at twice it)."""
RAW_IMAGE_TOP_K = 5
"""A request whose body is an image itself (``Content-Type: image/...``) is answered with this many top classes."""
MAX_DECODING = 256
"""Image requests waiting to be decoded, over every model, beyond which more are refused (HTTP 503)."""
RESIZE_RATIO = 256 / 224
"""The evaluation transform's resize before the centre crop (`deskpod.train.data.FolderSource`)."""


class BadImage(ProtocolError):
    """An image input that is not an image, is damaged, or is too large (HTTP 400)."""


@dataclass(frozen=True, kw_only=True, slots=True)
class ImagePreprocess:
    """How an encoded image becomes the network's input: the ``[preprocess]`` table of ``config.toml``."""

    input: str = "image"
    """The BYTES input clients send, one encoded image per row."""
    tensor: str = "input"
    """The network's FP32 input of shape [channels, height, width], values in [0, 1]."""
    channels: int
    """3: RGB; 1: grayscale (transparency laid over black first)."""
    height: int
    width: int
    resize: int = 0
    """The shorter side is resized to this, then the centre height×width is cut out; 0: resize to height×width."""
    max_pixels: int = MAX_PIXELS
    """A canvas larger than this (width × height) is refused before decoding."""

    def __post_init__(self) -> None:
        if self.channels not in (1, 3):
            raise ConfigError(f"preprocess: channels = {self.channels}; valid: 1 (grayscale) or 3 (RGB)")
        for key in ("height", "width", "max_pixels"):
            if getattr(self, key) < 1:
                raise ConfigError(f"preprocess: {key} = {getattr(self, key)} must be >= 1")
        if self.resize and self.resize < max(self.height, self.width):
            raise ConfigError(
                f"preprocess: resize = {self.resize} is smaller than the crop {self.height}×{self.width}; "
                "give at least the larger side, or 0"
            )
        if not self.input or not self.tensor:
            raise ConfigError("preprocess: input and tensor need names, e.g. input = 'image', tensor = 'input'")

    @classmethod
    def from_dict(cls, doc: dict[str, Any]) -> ImagePreprocess:
        valid = {f.name for f in fields(cls)}
        unknown = sorted(set(doc) - valid)
        if unknown:
            raise ConfigError(f"preprocess: unknown keys {unknown}; valid: {sorted(valid)}")
        try:
            return cls(**doc)
        except TypeError as e:
            raise ConfigError(f"preprocess: bad value ({e}); needs channels, height, width") from None

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def for_run(channels: int, height: int, width: int, data: str) -> ImagePreprocess:
    """The evaluation transform of a run trained on ``data``: files (``imagefolder``) were resized and
    centre-cropped; tensor datasets (Fashion-MNIST, synthetic) were used at their size, so an image is resized."""
    # torchvision's Resize(int(size * 256 / 224)) truncates: 224 -> 256, 32 -> 36.
    resize = int(min(height, width) * RESIZE_RATIO) if data.startswith("imagefolder") else 0
    return ImagePreprocess(channels=channels, height=height, width=width, resize=resize)


def preprocess_of(config: ModelConfig) -> ImagePreprocess | None:
    """The model's image preprocessing, or None for a model that takes tensors."""
    return ImagePreprocess.from_dict(dict(config.preprocess)) if config.preprocess else None


def network_config(config: ModelConfig) -> ModelConfig:
    """The config the runtime sees: the image input replaced by the network's FP32 tensor (load, warm-up)."""
    pre = preprocess_of(config)
    if pre is None:
        return config
    tensor = TensorSpec(pre.tensor, "FP32", (pre.channels, pre.height, pre.width))
    inputs = tuple(tensor if t.name == pre.input else t for t in config.inputs)
    return replace(config, inputs=inputs, preprocess=None)


# ----------------------------------------------------------------------------------------- decoding
def _open(data: bytes, pre: ImagePreprocess, row: int) -> Any:
    from PIL import Image, UnidentifiedImageError

    where = f"input {pre.input!r} row {row}"
    if not data:
        raise BadImage(f"{where} is empty; send an encoded JPEG or PNG")
    kind = "image"
    try:
        im = Image.open(io.BytesIO(data))
        kind = im.format or kind
        w, h = im.size
        if w * h > pre.max_pixels:
            raise BadImage(f"{where}: the image is {w}×{h} = {w * h:,} pixels; the limit is {pre.max_pixels:,} pixels")
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", Image.DecompressionBombWarning)  # our own cap is lower
            im.load()
    except BadImage:
        raise
    except UnidentifiedImageError:
        raise BadImage(f"{where} is not an image PIL can read (send JPEG or PNG; got {data[:8]!r}...)") from None
    except Image.DecompressionBombError as e:
        raise BadImage(f"{where}: the image is too large to decode: {e}") from None
    except (OSError, ValueError, SyntaxError, EOFError) as e:  # truncated or corrupt data after a valid header
        raise BadImage(f"{where}: the {kind} is damaged or truncated: {e}") from None
    return im


def _converted(im: Any, channels: int) -> Any:
    from PIL import Image

    if channels == 3:
        return im if im.mode == "RGB" else im.convert("RGB")  # as deskpod.train.data reads its files
    if im.mode in ("RGBA", "LA", "PA") or (im.mode == "P" and "transparency" in im.info):
        im = Image.alpha_composite(Image.new("RGBA", im.size, (0, 0, 0, 255)), im.convert("RGBA"))
    return im if im.mode == "L" else im.convert("L")


def _sized(im: Any, pre: ImagePreprocess) -> Any:
    """torchvision's ``Resize(resize)`` + ``CenterCrop((h, w))`` on a PIL image, or a plain resize to h×w.

    Where Pillow would compute the very same filter for the pixels the crop keeps, only those are resampled
    (`_crop_box`): the same bytes for less work. Otherwise the whole image is resized and then cropped."""
    from PIL import Image

    w, h = im.size
    if not pre.resize:
        size = (pre.width, pre.height)
        return im if im.size == size else im.resize(size, Image.Resampling.BILINEAR)
    short, long = (w, h) if w <= h else (h, w)
    new_short, new_long = pre.resize, int(pre.resize * long / short)
    new_w, new_h = (new_short, new_long) if w <= h else (new_long, new_short)
    top, left = round((new_h - pre.height) / 2.0), round((new_w - pre.width) / 2.0)  # torchvision's CenterCrop
    box, size, (left, top) = _crop_box((w, h), (new_w, new_h), (left, top), (pre.width, pre.height))
    if size != (w, h) or box != (0.0, 0.0, float(w), float(h)):
        im = im.resize(size, Image.Resampling.BILINEAR, box=box)
    return im.crop((left, top, left + pre.width, top + pre.height))


def _axis_box(n_in: int, n_out: int, offset: int, n_crop: int) -> tuple[float, float, int, int] | None:
    """The source interval of output pixels [offset, offset + n_crop) of an ``n_in → n_out`` resample along one
    axis, as (start, end, n_crop, 0), if Pillow's filter for them comes out bit for bit the same from it; else None.

    Pillow's ``precompute_coeffs`` takes the box as C floats and computes ``scale = (double)(in1 - in0) / out``
    and each pixel's ``center = in0 + (x + 0.5) * scale``; every tap and weight follows from those two values.
    The whole-axis resample has ``in0 = 0`` and ``scale = n_in / n_out``."""
    if n_in == n_out:
        return None  # no pass along this axis at all
    scale = n_in / n_out
    in0, in1 = np.float32(offset * scale), np.float32((offset + n_crop) * scale)
    box_scale = float(np.float32(in1 - in0)) / n_crop
    x = np.arange(n_crop, dtype=np.float64) + 0.5
    if box_scale != scale or not np.array_equal(float(in0) + x * box_scale, (x + offset) * scale):
        return None
    return float(in0), float(in1), n_crop, 0


def _horizontal_first(size_in: tuple[int, int], size_out: tuple[int, int]) -> bool:
    """Pillow's choice of pass order (``ImagingResampleInner``): vertical first when the height shrinks by more
    than twice as many pixels as the width does. The order changes the rounding in between, so it must agree."""
    dy, dx = size_in[1] - size_out[1], size_in[0] - size_out[0]
    return not (dy > 0 and dy > dx * 2)


@functools.lru_cache(maxsize=1024)
def _crop_box(
    size: tuple[int, int], resized: tuple[int, int], corner: tuple[int, int], crop: tuple[int, int]
) -> tuple[tuple[float, float, float, float], tuple[int, int], tuple[int, int]]:
    """What to resample for ``resize(resized)`` then a ``crop`` at ``corner``: (box, output size, corner within
    that output). The cropped box alone where that gives identical pixels, else the whole image."""
    full = [(0.0, float(n), r, c) for n, r, c in zip(size, resized, corner, strict=True)]
    boxed = [_axis_box(n, r, c, k) for n, r, c, k in zip(size, resized, corner, crop, strict=True)]
    order = _horizontal_first(size, resized)
    for use in ((True, True), (True, False), (False, True)):
        axes = [b if (u and b) else f for u, b, f in zip(use, boxed, full, strict=True)]
        out = (axes[0][2], axes[1][2])
        if axes != full and _horizontal_first(size, out) == order:
            (x0, x1, w, left), (y0, y1, h, top) = axes
            return (x0, y0, x1, y1), (w, h), (left, top)
    return (0.0, 0.0, float(size[0]), float(size[1])), resized, corner


def prepared_image(data: bytes, pre: ImagePreprocess, row: int = 0) -> Any:
    """One encoded image decoded, converted and sized as the network sees it (a PIL image). Raises `BadImage`."""
    return _sized(_converted(_open(data, pre, row), pre.channels), pre)


def decode_image(data: bytes, pre: ImagePreprocess, row: int = 0, out: np.ndarray | None = None) -> np.ndarray:
    """One encoded image as the network's input: FP32 (C, H, W) in [0, 1], written into ``out`` when given.
    Raises `BadImage`."""
    im = prepared_image(data, pre, row)
    if out is None:
        out = np.empty((pre.channels, pre.height, pre.width), dtype=np.float32)
    # One plane at a time, each contiguous: PIL splits the bands faster than numpy reads an HWC array across.
    for c, band in enumerate(im.split()):
        np.multiply(np.asarray(band, dtype=np.uint8), np.float32(1 / 255), dtype=np.float32, out=out[c])
    return out


def decode_images(images: np.ndarray, pre: ImagePreprocess) -> np.ndarray:
    """A BYTES array of N encoded images (shape [N] or [N, 1]) as FP32 (N, C, H, W). Raises `BadImage`."""
    flat = images.reshape(-1)
    out = np.empty((len(flat), pre.channels, pre.height, pre.width), dtype=np.float32)
    for i, data in enumerate(flat):
        if not isinstance(data, bytes | bytearray | memoryview):
            raise BadImage(f"input {pre.input!r} row {i} is {type(data).__name__}, not encoded image bytes")
        decode_image(bytes(data), pre, i, out=out[i])
    return out


def decode_inputs(inputs: dict[str, np.ndarray], pre: ImagePreprocess) -> dict[str, np.ndarray]:
    """A request's inputs with the image input replaced by the decoded tensor (on a `Decoder` thread)."""
    return {
        (pre.tensor if k == pre.input else k): (decode_images(v, pre) if k == pre.input else v)
        for k, v in inputs.items()
    }


class Decoder:
    """The threads that decode images (one per core, shared by every image model), with a bound on the requests
    waiting for them: beyond ``max_pending`` a request is refused at once (`Overloaded`, HTTP 503), as a full
    batcher queue refuses, instead of piling up decoded tensors in memory."""

    def __init__(self, threads: int, max_pending: int = MAX_DECODING) -> None:
        self.executor = ThreadPoolExecutor(threads, thread_name_prefix="deskpod-decode")
        self.max_pending = max_pending
        self.pending = 0

    def decode(self, inputs: dict[str, np.ndarray], pre: ImagePreprocess) -> asyncio.Future[dict[str, np.ndarray]]:
        """`decode_inputs` on a decoder thread; the future resolves on the running event loop."""
        if self.pending >= self.max_pending:
            raise Overloaded(f"image decoding is full ({self.max_pending} requests waiting); retry later")
        self.pending += 1
        fut = asyncio.get_running_loop().run_in_executor(self.executor, decode_inputs, inputs, pre)
        fut.add_done_callback(self._done)
        return fut

    def _done(self, _: object) -> None:
        self.pending -= 1


_DECODER: list[Decoder] = []


def decoder() -> Decoder:
    """The process's `Decoder` (created on first use)."""
    if not _DECODER:
        _DECODER.append(Decoder(os.cpu_count() or 1))
    return _DECODER[0]


def decoder_pool() -> ThreadPoolExecutor:
    """The decoder's threads themselves, without its bound (prefer ``decoder().decode``, which refuses at once
    when too many images wait)."""
    return decoder().executor


# ----------------------------------------------------------------------------------------- classification
def classify(outputs: dict[str, np.ndarray], output_name: str, labels: Sequence[str], k: int) -> np.ndarray:
    """Triton's classification extension for one output: BYTES (batch, k) of ``b"score:index:label"``, best first.

    The output's rows are (batch, classes...) — the classes flattened; ``k`` is capped at the number of classes."""
    if output_name not in outputs:
        raise ProtocolError(f"classification asked of output {output_name!r}; outputs: {sorted(outputs)}")
    if isinstance(k, bool) or not isinstance(k, int) or k < 1:
        raise ProtocolError(f"output {output_name!r}: classification must be a positive integer, got {k!r}")
    arr = np.asarray(outputs[output_name])
    if arr.dtype.kind not in "biuf":
        raise ProtocolError(f"output {output_name!r} is not numeric: classification needs scores")
    rows = arr.reshape(arr.shape[0], -1) if arr.ndim > 1 else arr.reshape(1, -1)
    k = min(k, rows.shape[1])
    out = np.empty((rows.shape[0], k), dtype=object)
    for r, row in enumerate(rows):
        order = np.argsort(-row.astype(np.float64), kind="stable")[:k]
        for j, idx in enumerate(order):
            label = labels[idx] if idx < len(labels) else ""
            text = f"{float(row[idx]):f}:{int(idx)}" + (f":{label}" if label else "")
            out[r, j] = text.encode()
    return out


def classification_requests(body: bytes, header_length: int | None) -> dict[str, int]:
    """``{output: k}`` for every requested output with ``parameters.classification`` (re-reads the JSON head
    only when the word occurs in it, so a plain request pays one byte search)."""
    head = body if header_length is None else body[:header_length]
    if b"classification" not in head:
        return {}
    doc = json.loads(head)  # decode_request has parsed it already: it is valid JSON
    found: dict[str, int] = {}
    for o in doc.get("outputs") or []:
        k = (o.get("parameters") or {}).get("classification")
        if k is not None:
            if isinstance(k, bool) or not isinstance(k, int) or k < 1:
                raise ProtocolError(f"output {o.get('name')!r}: classification must be a positive integer, got {k!r}")
            found[str(o["name"])] = k
    return found
