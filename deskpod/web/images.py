"""Images for the pages: an upload decoded safely, turned into a model's input, shown back as a data URL.

Used by the Models page's "try it": the upload is decoded by PIL with a pixel cap (a small file can
hold a decompression bomb), converted to what the served model takes — FP32 ``[C, H, W]`` in [0, 1],
grayscale or RGB, transparency over black — and shown next to the result; a Fashion-MNIST test sample
is read from the dataset's own files.
"""

from __future__ import annotations

import base64
import io
import warnings
from typing import Any

import numpy as np

from deskpod.errors import ConfigError
from deskpod.web.app import Web

MAX_PIXELS = 40_000_000
"""The largest image (width × height) decoded: a small file can claim a huge canvas (a decompression bomb)."""
PREVIEW_SIDE = 256
"""Uploaded images are shown re-encoded as PNG, at most this many pixels a side."""


def decode_image(data: bytes) -> Any:
    """The uploaded bytes as a decoded PIL image; anything PIL cannot read, or too large, is refused."""
    from PIL import Image, UnidentifiedImageError

    if not data:
        raise ConfigError("the uploaded file is empty; choose an image (PNG, JPEG, ...)")
    try:
        im = Image.open(io.BytesIO(data))
        w, h = im.size
        if w * h > MAX_PIXELS:
            raise ConfigError(f"the image is {w}×{h} pixels; the limit is {MAX_PIXELS:,} pixels")
        with warnings.catch_warnings():
            warnings.simplefilter("error", Image.DecompressionBombWarning)
            im.load()
    except ConfigError:
        raise
    except UnidentifiedImageError:
        raise ConfigError("the uploaded file is not an image this page can read (PNG, JPEG, GIF, BMP, WebP)") from None
    except (Image.DecompressionBombWarning, Image.DecompressionBombError) as e:
        raise ConfigError(f"the uploaded image is too large to decode: {e}") from None
    except (OSError, ValueError, SyntaxError) as e:  # truncated or corrupt data inside a valid header
        raise ConfigError(f"the uploaded image is damaged and cannot be decoded: {e}") from None
    return im


def to_input(im: Any, channels: int, height: int, width: int) -> tuple[np.ndarray, Any]:
    """A decoded image as the model's input, shape (1, C, H, W) in [0, 1]; and that input as a PIL image.

    Transparency is laid over black (Fashion-MNIST's background); the image is resized to H×W (0: keep it)."""
    from PIL import Image

    if im.mode in ("RGBA", "LA", "PA") or (im.mode == "P" and "transparency" in im.info):
        im = im.convert("RGBA")
        black = Image.new("RGBA", im.size, (0, 0, 0, 255))
        im = Image.alpha_composite(black, im)
    im = im.convert("L" if channels == 1 else "RGB")
    size = (width or im.width, height or im.height)
    if im.size != size:
        im = im.resize(size, Image.Resampling.BILINEAR)
    arr = np.asarray(im, dtype=np.float32) / 255.0
    arr = arr[None] if channels == 1 else arr.transpose(2, 0, 1)
    return np.ascontiguousarray(arr[None]), im


def data_url(im: Any, side: int = PREVIEW_SIDE, *, upscale: bool = False) -> str:
    """A PNG ``data:`` URL of ``im``, at most ``side`` pixels a side (or scaled up to it, pixels kept sharp)."""
    from PIL import Image

    im = im.copy()
    if upscale and max(im.size) < side:
        k = -(-side // max(im.size))  # a whole factor, so pixels stay square and sharp
        im = im.resize((im.width * k, im.height * k), Image.Resampling.NEAREST)
    else:
        im.thumbnail((side, side))
    if im.mode not in ("L", "RGB", "RGBA", "LA"):
        im = im.convert("RGBA")
    buf = io.BytesIO()
    im.save(buf, format="PNG")
    return "data:image/png;base64," + base64.b64encode(buf.getvalue()).decode()


def test_sample(web: Web, index: int) -> tuple[Any, int, str]:
    """Fashion-MNIST test image ``index`` (a PIL image), its label and the label's name."""
    from PIL import Image

    cached = web.cache.get("models.t10k")
    if cached is None:
        from deskpod.environment import Environment
        from deskpod.train.data import FASHION_MNIST_CLASSES, fashion_mnist_files, read_idx

        files = fashion_mnist_files(Environment.read().fashion_mnist_dir)
        images = read_idx(files["test_images"]).numpy()
        labels = read_idx(files["test_labels"]).numpy()
        cached = web.cache["models.t10k"] = (images, labels, tuple(FASHION_MNIST_CLASSES))
    images, labels, names = cached
    label = int(labels[index])
    return Image.fromarray(images[index], mode="L"), label, names[label] if label < len(names) else str(label)
