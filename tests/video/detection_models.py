"""Real detection models for the tests of ``--detect repo:...``, built here: no weights can be downloaded.

- `torchvision_model`: torchvision's SSDlite (``ssdlite320_mobilenet_v3_large``, untrained, 3 classes), exported to
  ONNX as torchvision's detection models export (one image of any size in; boxes, scores, labels out), with a
  ``config.toml`` declaring ``[detection] layout = "torchvision"``.
- `yolo_model`: Ultralytics' YOLOv8n, built from the ``yolov8n.yaml`` its package ships (untrained, 2 classes), exported
  to ONNX the way ``yolo export format=onnx`` lays it out ([B, 4+C, N]), with a Triton ``config.pbtxt`` declaring
  ``deskpod.detection.layout: yolo``.

Untrained networks with BatchNorm's initial statistics (mean 0, variance 1) pass activations that shrink layer by
layer to nothing, and every score ties; so each network's BatchNorm statistics are first measured on frames of the
real clip (`calibrate`: one pass in training mode with cumulative averages). Their boxes are then real outputs of
the real graphs, of no accuracy: the tests check the plumbing (layouts, coordinates, thresholds, batching), not what
the models find.
"""

from __future__ import annotations

import os
import warnings
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch

SSD_LABELS = ("__background__", "person", "car")
YOLO_LABELS = ("person", "car")
YOLO_SIZE = 320


def rgb_tensor(frames: Sequence[np.ndarray]) -> list[torch.Tensor]:
    """BGR frames as torchvision takes images: RGB float in [0, 1], C×H×W."""
    return [torch.from_numpy(np.ascontiguousarray(f[:, :, ::-1])).permute(2, 0, 1).float() / 255 for f in frames]


def calibrate(net: torch.nn.Module, batch: torch.Tensor) -> None:
    """Set every BatchNorm's running statistics to the ones of ``batch`` through ``net`` (one training-mode pass)."""
    for m in net.modules():
        if isinstance(m, torch.nn.BatchNorm2d):
            m.reset_running_stats()
            m.momentum = None  # a cumulative average: after one pass, exactly that pass's statistics
    net.train()
    with torch.no_grad():
        net(batch)
    net.eval()


def torchvision_model(repo: Path, frames: Sequence[np.ndarray], *, score_threshold: float) -> Any:
    """SSDlite into ``repo/ssd`` (version 1, ONNX); returns the eager model (torchvision's own postprocessing)."""
    import torchvision

    torch.manual_seed(0)
    model = torchvision.models.detection.ssdlite320_mobilenet_v3_large(
        weights=None, weights_backbone=None, num_classes=len(SSD_LABELS)
    )
    images, _ = model.transform(rgb_tensor(frames))
    calibrate(model.backbone, images.tensors)
    model.eval()
    folder = repo / "ssd"
    (folder / "1").mkdir(parents=True)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the tracer's warnings about torchvision's data-dependent control flow
        torch.onnx.export(
            model, ([rgb_tensor(frames[:1])[0]],), str(folder / "1" / "model.onnx"),
            input_names=["image"], output_names=["boxes", "scores", "labels"], opset_version=17, dynamo=False,
            dynamic_axes={"image": {1: "height", 2: "width"}, "boxes": {0: "n"}, "scores": {0: "n"}, "labels": {0: "n"}},
        )  # fmt: skip
    labels = ", ".join(f'"{n}"' for n in SSD_LABELS)
    (folder / "config.toml").write_text(
        f'platform = "onnxruntime"\nmax_batch_size = 0\ninstances = 2\nlabels = [{labels}]\n'
        f'[detection]\nlayout = "torchvision"\nscore_threshold = {score_threshold}\n'
        '[[input]]\nname = "image"\ndatatype = "FP32"\ndims = [3, -1, -1]\n'
        '[[output]]\nname = "boxes"\ndatatype = "FP32"\ndims = [-1, 4]\n'
        '[[output]]\nname = "scores"\ndatatype = "FP32"\ndims = [-1]\n'
        '[[output]]\nname = "labels"\ndatatype = "INT64"\ndims = [-1]\n'
    )
    return model


def yolo_network(frames: Sequence[np.ndarray], config_dir: Path) -> Any:
    """Ultralytics' YOLOv8n with 2 classes, its head set to export's output (one [B, 4+C, N] tensor)."""
    os.environ["YOLO_CONFIG_DIR"] = str(config_dir)  # its settings file, not the user's
    os.environ["YOLO_OFFLINE"] = "1"
    from ultralytics.nn.tasks import DetectionModel

    torch.manual_seed(0)
    net = DetectionModel("yolov8n.yaml", nc=len(YOLO_LABELS), verbose=False)
    for m in net.modules():
        if type(m).__name__ == "Detect":
            m.export, m.format = True, "onnx"  # what ultralytics' exporter sets: the decoded boxes and scores only
    x = torch.stack([torch.nn.functional.interpolate(t[None], size=(YOLO_SIZE, YOLO_SIZE))[0]
                     for t in rgb_tensor(frames)])  # fmt: skip
    calibrate(net, x)
    head = next(m for m in net.modules() if type(m).__name__ == "Detect")
    with torch.no_grad():  # class logits of a few units, not tens: scores spread over (0, 1) instead of tying at 1
        for branch in head.cv3:
            branch[-1].weight.mul_(0.5)
            branch[-1].bias.zero_()
    return net


def yolo_model(repo: Path, net: Any, *, score_threshold: float, iou_threshold: float) -> Path:
    """``net`` into ``repo/yolo`` (version 1, ONNX, batches of any size) with a Triton config.pbtxt."""
    folder = repo / "yolo"
    (folder / "1").mkdir(parents=True)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(
            net, (torch.rand(2, 3, YOLO_SIZE, YOLO_SIZE),), str(folder / "1" / "model.onnx"),
            input_names=["images"], output_names=["output0"], opset_version=17, dynamo=False,
            dynamic_axes={"images": {0: "batch"}, "output0": {0: "batch"}},
        )  # fmt: skip
    with torch.no_grad():
        n = net(torch.rand(1, 3, YOLO_SIZE, YOLO_SIZE)).shape[-1]
    (folder / "config.pbtxt").write_text(f"""name: "yolo"
platform: "onnxruntime_onnx"
max_batch_size: 8
input [ {{ name: "images" data_type: TYPE_FP32 dims: [ 3, {YOLO_SIZE}, {YOLO_SIZE} ] }} ]
output [ {{ name: "output0" data_type: TYPE_FP32 dims: [ {4 + len(YOLO_LABELS)}, {n} ] }} ]
dynamic_batching {{ max_queue_delay_microseconds: 2000 }}
instance_group [ {{ count: 1 kind: KIND_CPU }} ]
parameters {{ key: "deskpod.detection.layout" value {{ string_value: "yolo" }} }}
parameters {{ key: "deskpod.detection.labels" value {{ string_value: "{",".join(YOLO_LABELS)}" }} }}
parameters {{ key: "deskpod.detection.score_threshold" value {{ string_value: "{score_threshold}" }} }}
parameters {{ key: "deskpod.detection.iou_threshold" value {{ string_value: "{iou_threshold}" }} }}
""")
    return folder
