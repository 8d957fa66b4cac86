"""A detector from a model repository: ``--detect repo:PATH/MODEL[:VERSION]``, any model whose config declares its
output layout (`deskpod.serve.detection`: torchvision-style boxes, or a YOLO tensor).

The model is loaded by the server's own `ModelRegistry` (ONNX Runtime or TorchScript, its instances and devices as
its config says) and every frame goes through its dynamic batcher (`deskpod.serve.batcher`) as a request of its
own: the indexer's batch holds frames of many streams, and the batcher merges them into batches of up to the model's
``max_batch_size`` (a torchvision-style model, which takes one image, runs them one by one on each of its
instances). The registry lives on an event loop of its own thread, so the indexer's loop stays synchronous.

A frame goes in as the layout says (letterboxed or stretched into a fixed-size input, or as it is into one of any
size; RGB or BGR; scaled), and the boxes come back in the frame's pixels, clipped to it.
"""

from __future__ import annotations

import asyncio
import dataclasses
import threading
from collections.abc import Coroutine, Sequence
from typing import Any, TypeVar

import cv2
import numpy as np

from deskpod.errors import require_extra
from deskpod.serve.detection import LETTERBOX_PAD, Layout, ModelRef, check_model, decode, names
from deskpod.video.detectors import Detection

T = TypeVar("T")


@dataclasses.dataclass(frozen=True, slots=True)
class Geometry:
    """How a frame was fitted into the input: input = frame × gain + pad."""

    gain_x: float
    gain_y: float
    pad_x: float
    pad_y: float
    width: int
    """The frame's size."""
    height: int

    def to_frame(self, boxes: np.ndarray) -> np.ndarray:
        """Boxes [K, 4] x1y1x2y2 in the input's pixels, in the frame's pixels, clipped to the frame."""
        out = np.empty_like(boxes, dtype=np.float64)
        out[:, 0::2] = (boxes[:, 0::2] - self.pad_x) / self.gain_x
        out[:, 1::2] = (boxes[:, 1::2] - self.pad_y) / self.gain_y
        out[:, 0::2] = out[:, 0::2].clip(0, self.width)
        out[:, 1::2] = out[:, 1::2].clip(0, self.height)
        return out


def prepare(frame: np.ndarray, layout: Layout) -> tuple[np.ndarray, Geometry]:
    """A BGR uint8 frame as the model's input (C×H×W float32) and how to map its boxes back."""
    fh, fw = frame.shape[:2]
    img, geo = frame, Geometry(1.0, 1.0, 0.0, 0.0, fw, fh)
    if layout.height > 0 and (fh, fw) != (layout.height, layout.width):
        resize = layout.settings.resize or ("letterbox" if layout.layout == "yolo" else "stretch")
        if resize == "stretch":
            img = cv2.resize(frame, (layout.width, layout.height), interpolation=cv2.INTER_LINEAR)
            geo = Geometry(layout.width / fw, layout.height / fh, 0.0, 0.0, fw, fh)
        else:
            r = min(layout.height / fh, layout.width / fw)
            nw, nh = max(1, round(fw * r)), max(1, round(fh * r))
            left, top = (layout.width - nw) // 2, (layout.height - nh) // 2
            img = np.full((layout.height, layout.width, 3), LETTERBOX_PAD, dtype=np.uint8)
            img[top : top + nh, left : left + nw] = cv2.resize(frame, (nw, nh), interpolation=cv2.INTER_LINEAR)
            geo = Geometry(nw / fw, nh / fh, float(left), float(top), fw, fh)
    if layout.channels == 1:
        chw = cv2.cvtColor(img, cv2.COLOR_BGR2GRAY)[None]
    else:
        chw = (img[:, :, ::-1] if layout.settings.channels == "rgb" else img).transpose(2, 0, 1)
    x = np.ascontiguousarray(chw, dtype=np.float32)
    x *= np.float32(layout.settings.scale)
    return x, geo


class ModelDetector:
    """A detector served from a model repository (`ModelRef`), its frames batched across streams."""

    def __init__(self, spec: str) -> None:
        require_extra("serve", f"--detect {spec}")
        self.ref = ModelRef.parse(spec)
        self.name = str(self.ref)
        self.layout = check_model(self.ref)  # before loading: a model that declares no layout is one clear line
        self.labels = names(self.layout.labels)
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="deskpod-detect-model", daemon=True)
        self._thread.start()
        from deskpod.serve.registry import ModelRegistry

        self._registry = ModelRegistry(self.ref.repo)
        try:
            self._call(self._registry.load(self.ref.name))
            self._version = self._registry.get(self.ref.name, self.ref.version)
        except BaseException:
            self.close()
            raise

    def _call(self, coro: Coroutine[Any, Any, T]) -> T:
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result()

    async def _run(self, inputs: list[np.ndarray]) -> list[dict[str, np.ndarray]]:
        lv = self._version
        window = max(1, lv.config.max_queue_size // 2)  # the batcher's queue is bounded: send at most this at once
        out: list[dict[str, np.ndarray]] = []
        for i in range(0, len(inputs), window):
            futures = [lv.batcher.submit({self.layout.input: x[None] if self.layout.batched else x}, None)
                       for x in inputs[i : i + window]]  # fmt: skip
            out += await asyncio.gather(*futures)
        return out

    def detect(self, frames: Sequence[np.ndarray]) -> list[list[Detection]]:
        prepared = [prepare(f, self.layout) for f in frames]
        results = self._call(self._run([x for x, _ in prepared]))
        out: list[list[Detection]] = []
        for (_, geo), result in zip(prepared, results, strict=True):
            found = decode(result, self.layout)[0]
            boxes = geo.to_frame(found[:, :4])
            dets = []
            for box, row in zip(boxes, found, strict=True):
                label = self.layout.name_of(int(row[5]))
                x1, y1, x2, y2 = (float(v) for v in box)
                if label and x2 > x1 and y2 > y1:
                    dets.append(Detection((x1, y1, x2, y2), float(row[4]), label))
            out.append(dets)
        return out

    def close(self) -> None:
        """Unload the model and end its loop."""
        if self._loop.is_closed():
            return
        if self._thread.is_alive():
            self._call(self._registry.close())
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join()
        self._loop.close()
