"""The 3D nodule detector: MONAI's RetinaNet, trained by ``deskpod train`` as a task, run on whole scans.

The network is the one of MONAI's LUNA16 detection app (``monai.apps.detection``): a 3D ResNet with a
feature pyramid (levels 1 and 2), RetinaNet's classification and box-regression heads, anchors of three
shapes on three feature-map scales, the ATSS matcher, hard-negative sampling, focal-style classification
loss and box regression — built from MONAI's own classes, not rewritten. ``retinanet3d`` is the app's
ResNet-50 backbone; ``retinanet3d-small`` is a ResNet-10 of quarter width for CPUs and tests.

As a `deskpod.train.tasks.Task` (``task = "deskpod.lung.detect:luna16"``) it trains through the trainer
unchanged: every device, DDP, AMP, checkpoints, resume, metrics.jsonl, the run folder, the pod service.
Options (``task_options``): ``fold`` (the held-out subset), ``spacing`` (mm, XxYxZ), ``patch`` (voxels,
XxYxZ), ``negatives`` (per positive), ``cache`` (the resampled scans' folder).

`load_detector` opens a trained run and `Detector.detect` runs it on a whole scan with MONAI's sliding-window
inference, returning candidates with probabilities in world coordinates (LPS mm).
"""

from __future__ import annotations

import csv
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from deskpod.errors import ConfigError, DataError
from deskpod.lung.candidates import Candidate
from deskpod.lung.images import Scan, voxel_to_world
from deskpod.lung.luna16 import (
    Layout,
    PatchSource,
    cache_folder,
    ensure_cache,
    normalise,
    read_layout,
    samples_of,
    split,
    volume_of,
)
from deskpod.train.data import Batch, DataRequest, DataSpec, Source
from deskpod.train.tasks import parse_options

TASK = "deskpod.lung.detect:luna16"
MODELS = ("retinanet3d", "retinanet3d-small")
MONAI_SPACING = (0.703125, 0.703125, 1.25)
"""The spacing of MONAI's LUNA16 app (mm, x, y, z) and the one its anchor shapes are given in."""
MONAI_ANCHORS = ((6, 8, 4), (8, 6, 5), (10, 10, 6))
"""The app's base anchor shapes in voxels at `MONAI_SPACING`; scaled here to the run's spacing."""
DEFAULTS = {
    "fold": "-1",
    "spacing": "0.703125x0.703125x1.25",
    "patch": "192x192x80",
    "negatives": "1",
    "repeats": "1",
    "cache": "",
}
OPTIONS = {
    "fold": "the subset held out for validation; -1 (default) the last",
    "spacing": "mm per voxel XxYxZ the scans are resampled to (default MONAI's 0.703125x0.703125x1.25)",
    "patch": "training crop in voxels XxYxZ (default MONAI's 192x192x80)",
    "negatives": "negative crops per nodule crop (default 1)",
    "repeats": "crops of each nodule per epoch, each at its own offset (default 1)",
    "cache": "folder for the resampled scans (default ~/.cache/deskpod/luna16)",
}
SMALL_PYRAMID = 32
"""Feature-pyramid channels of ``retinanet3d-small``."""
SCORE_THRESHOLD = 0.5
"""The score at which validation counts a detection as a finding."""


def _triple(text: str, key: str, kind: type) -> tuple[Any, Any, Any]:
    parts = text.lower().split("x")
    try:
        values = tuple(kind(p) for p in parts)
    except ValueError:
        values = ()
    if len(values) != 3 or any(v <= 0 for v in values):
        example = "0.703125x0.703125x1.25" if kind is float else "192x192x80"
        raise ConfigError(f"task option {key}={text!r} is not valid: give three positive numbers XxYxZ, e.g. {example}")
    return values  # type: ignore[return-value]


@dataclass(frozen=True, slots=True)
class Options:
    fold: int
    spacing: tuple[float, float, float]
    patch: tuple[int, int, int]
    negatives: int
    repeats: int
    cache: str

    @staticmethod
    def parse(text: str) -> Options:
        given = {**DEFAULTS, **parse_options(text, OPTIONS, "lung detection")}
        try:
            fold, negatives, repeats = int(given["fold"]), int(given["negatives"]), int(given["repeats"])
        except ValueError:
            raise ConfigError(
                f"task options fold={given['fold']!r}, negatives={given['negatives']!r}, repeats={given['repeats']!r}: "
                "each is a whole number"
            ) from None
        if negatives < 0:
            raise ConfigError(f"task option negatives={negatives} is not valid: 0 or more crops per nodule crop")
        if repeats < 1:
            raise ConfigError(f"task option repeats={repeats} is not valid: 1 or more crops of each nodule per epoch")
        patch = _triple(given["patch"], "patch", int)
        if any(p < 16 for p in patch):
            raise ConfigError(f"task option patch={given['patch']!r}: every side must be at least 16 voxels")
        return Options(fold, _triple(given["spacing"], "spacing", float), patch, negatives, repeats, given["cache"])


# --------------------------------------------------------------------------- the network
def build_detector(model: str, spacing: tuple[float, float, float]) -> Any:
    """MONAI's RetinaNetDetector as its LUNA16 app configures it, with anchors scaled to ``spacing``."""
    from monai.apps.detection.networks.retinanet_detector import RetinaNetDetector
    from monai.apps.detection.networks.retinanet_network import RetinaNet, resnet_fpn_feature_extractor
    from monai.apps.detection.utils.anchor_utils import AnchorGeneratorWithAnchorShape
    from monai.networks.blocks.backbone_fpn_utils import BackboneWithFPN
    from monai.networks.blocks.feature_pyramid_network import LastLevelMaxPool
    from monai.networks.nets import resnet

    if model not in MODELS:
        raise ConfigError(f"model {model!r} is not a lung detector; valid: {', '.join(MODELS)}")
    returned_layers = (1, 2)
    if model == "retinanet3d":
        backbone = resnet.ResNet(block=resnet.ResNetBottleneck, layers=[3, 4, 6, 3], block_inplanes=resnet.get_inplanes(),
                                 n_input_channels=1, conv1_t_stride=(2, 2, 1), conv1_t_size=(7, 7, 7))  # fmt: skip
        features = resnet_fpn_feature_extractor(backbone, 3, pretrained_backbone=False,
                                                returned_layers=returned_layers, trainable_backbone_layers=None)  # fmt: skip
    else:  # the same construction with a ResNet-10 of quarter width and a 32-channel pyramid (the app's is 256)
        backbone = resnet.ResNet(block=resnet.ResNetBlock, layers=[1, 1, 1, 1], block_inplanes=[16, 32, 64, 128],
                                 n_input_channels=1, conv1_t_stride=(2, 2, 1), conv1_t_size=(7, 7, 7))  # fmt: skip
        widths = [16 * 2 ** (i - 1) for i in returned_layers]
        features = BackboneWithFPN(backbone, {f"layer{k}": str(v) for v, k in enumerate(returned_layers)}, widths,
                                   SMALL_PYRAMID, spatial_dims=3, extra_blocks=LastLevelMaxPool(3))  # fmt: skip
    scale = np.array(MONAI_SPACING) / np.array(spacing)
    shapes = [tuple(max(1.0, float(v)) for v in np.array(s) * scale) for s in MONAI_ANCHORS]
    anchors = AnchorGeneratorWithAnchorShape(feature_map_scales=[2**i for i in range(len(returned_layers) + 1)],
                                             base_anchor_shapes=shapes)  # fmt: skip
    size_divisible = [s * 2 * 2 ** max(returned_layers) for s in features.body.conv1.stride]
    network = RetinaNet(spatial_dims=3, num_classes=1, num_anchors=anchors.num_anchors_per_location()[0],
                        feature_extractor=features, size_divisible=size_divisible)  # fmt: skip
    detector = RetinaNetDetector(network=network, anchor_generator=anchors, debug=False)
    detector.set_atss_matcher(num_candidates=4, center_in_gt=False)
    detector.set_hard_negative_sampler(batch_size_per_image=64, positive_fraction=0.3, pool_size=20, min_neg=16)
    detector.set_target_keys(box_key="boxes", label_key="labels")
    detector.set_box_selector_parameters(score_thresh=0.02, topk_candidates_per_level=1000, nms_thresh=0.22,
                                         detections_per_img=100)  # fmt: skip
    return detector


class DetectorModel(nn.Module):
    """The detector as one module: ``forward(images, targets)`` is the training loss (classification +
    box regression, weighted 1:1 as in MONAI's app), so DDP and the trainer treat it like any network."""

    def __init__(self, model: str, spacing: tuple[float, float, float]) -> None:
        super().__init__()
        self.detector = build_detector(model, spacing)

    def forward(self, images: torch.Tensor, targets: list[dict[str, torch.Tensor]]) -> torch.Tensor:
        losses = self.detector(images, targets)
        box = losses[self.detector.box_reg_key]
        if box.grad_fn is None:
            # No anchor matched a nodule in these crops and MONAI returns a constant 0: every rank's regression
            # head must still take part in DDP's gradient all-reduce (else the ranks with nodules wait forever),
            # so the zero is tied to its weights (their gradient is 0, as the constant's would be).
            head = self.detector.network.regression_head
            box = sum((p.sum() * 0.0 for p in head.parameters()), torch.zeros((), device=images.device))
        return losses[self.detector.cls_key] + box  # type: ignore[no-any-return]

    @torch.no_grad()
    def loss_in_eval(self, images: torch.Tensor, targets: list[dict[str, torch.Tensor]]) -> torch.Tensor:
        """The training loss with the network in eval mode (batch norm's running statistics, nothing updated)."""
        was = self.detector.training
        self.detector.training = True  # the detector computes losses in "training"; its network stays in eval
        try:
            return self.forward(images, targets)
        finally:
            self.detector.training = was

    @torch.no_grad()
    def detections(self, images: torch.Tensor, *, sliding: bool = False) -> list[dict[str, torch.Tensor]]:
        was = self.detector.training
        self.detector.eval()
        try:
            return self.detector(images, use_inferer=sliding)  # type: ignore[no-any-return]
        finally:
            self.detector.train(was)


def _targets_to(targets: list[dict[str, torch.Tensor]], device: torch.device) -> list[dict[str, torch.Tensor]]:
    return [{k: v.to(device, non_blocking=True) for k, v in t.items()} for t in targets]


def hits(boxes: torch.Tensor, truth: torch.Tensor) -> tuple[int, int]:
    """(nodules found, detections on no nodule) by LUNA16's rule: a detection's centre within a nodule's radius
    (the nodule's box is centre ± radius; the radius is half its smallest side)."""
    if truth.numel() == 0:
        return 0, int(boxes.shape[0])
    if boxes.numel() == 0:
        return 0, 0
    centres = (boxes[:, :3] + boxes[:, 3:]) / 2
    t_centres = (truth[:, :3] + truth[:, 3:]) / 2
    radius = (truth[:, 3:] - truth[:, :3]).min(dim=1).values / 2
    near = torch.cdist(centres.float(), t_centres.float()) < radius[None, :]
    return int(near.any(dim=0).sum()), int((~near.any(dim=1)).sum())


# --------------------------------------------------------------------------- the task
class Luna16Detection:
    """The `deskpod.train.tasks.Task` of lung-nodule detection on a LUNA16 folder (``data = "luna16:PATH"``)."""

    name = "lung detection"
    val_keys = ("val_loss", "val_sensitivity", "val_fp_per_crop")
    val_sums_size = 5  # loss sum, crops, nodules found, nodules, false positives

    def __init__(self, options: str) -> None:
        self.options = Options.parse(options)
        self._layout: Layout | None = None

    def layout(self, data: str) -> Layout:
        kind, _, path = data.partition(":")
        if kind != "luna16" or not path:
            raise ConfigError(f"data {data!r}: lung detection trains on luna16:PATH (a LUNA16 folder)")
        if self._layout is None:
            self._layout = read_layout(path)
        return self._layout

    def describe(self, req: DataRequest) -> DataSpec:
        layout = self.layout(req.data)
        train, val = split(layout, self.options.fold)
        positives = sum(len(layout.nodules[u]) for u in train)
        if positives == 0:
            raise DataError(f"{req.data}: the training subsets hold no annotated nodule")
        n_val = sum(len(layout.nodules[u]) for u in val) * (1 + self.options.negatives)
        px, py, _ = self.options.patch
        return DataSpec(name=f"luna16:{layout.root}", num_classes=1, in_channels=1, image_size=(px, py),
                        class_names=("nodule",), mean=(0.0,), std=(1.0,),
                        train_size=positives * self.options.repeats * (1 + self.options.negatives),
                        val_size=max(1, n_val))  # fmt: skip

    def build_model(self, model: str, spec: DataSpec) -> nn.Module:
        return DetectorModel(model, self.options.spacing)

    def check_model(self, model: nn.Module, spec: DataSpec) -> None:
        assert isinstance(model, DetectorModel)
        x = torch.zeros(1, 1, *self.options.patch)
        box = torch.tensor([[4.0, 4.0, 4.0, 12.0, 12.0, 12.0]])
        model.train()
        loss = model(x, [{"boxes": box, "labels": torch.zeros(1, dtype=torch.long)}])
        if not torch.isfinite(loss):
            raise ConfigError(f"lung detector {self.options.patch}: the loss of a zero crop is not finite")

    def open_sources(self, req: DataRequest, spec: DataSpec, device: torch.device) -> tuple[Source, Source]:
        import torch.distributed as dist

        layout = self.layout(req.data)
        train, val = split(layout, self.options.fold)
        folder = cache_folder(layout.root, self.options.spacing, self.options.cache)
        rank, world = (dist.get_rank(), dist.get_world_size()) if dist.is_initialized() else (0, 1)
        ensure_cache(layout, train + val, self.options.spacing, folder, rank, world)
        p, neg = self.options.patch, self.options.negatives
        train_samples = samples_of(layout, train, neg, self.options.repeats)
        return (PatchSource(layout, train_samples, folder, p, req.seed, augment=True),
                PatchSource(layout, samples_of(layout, val, neg), folder, p, req.seed + 1, augment=False))  # fmt: skip

    def loss(self, model: nn.Module, batch: Batch, device: torch.device) -> torch.Tensor:
        images = batch.images.to(device, non_blocking=True)
        return model(images, _targets_to(batch.targets, device))  # type: ignore[no-any-return]

    def val_sums(self, model: nn.Module, batch: Batch, device: torch.device) -> torch.Tensor:
        assert isinstance(model, DetectorModel)
        images = batch.images.to(device, non_blocking=True)
        targets = _targets_to(batch.targets, device)
        loss = float(model.loss_in_eval(images, targets))
        found = total = false = 0
        for det, truth in zip(model.detections(images), targets, strict=True):
            keep = det["boxes"][det["labels_scores"] >= SCORE_THRESHOLD]
            f, fp = hits(keep, truth["boxes"])
            found, total, false = found + f, total + int(truth["boxes"].shape[0]), false + fp
        n = batch.size
        return torch.tensor([loss * n, n, found, total, false], dtype=torch.float64)

    def val_metrics(self, sums: torch.Tensor) -> dict[str, float]:
        loss, n, found, total, false = (float(v) for v in sums)
        return {"val_loss": round(loss / max(1.0, n), 6), "val_sensitivity": round(found / max(1.0, total), 6),
                "val_fp_per_crop": round(false / max(1.0, n), 6)}  # fmt: skip


def luna16(options: str = "") -> Luna16Detection:
    """The task factory named by ``task = "deskpod.lung.detect:luna16"``."""
    return Luna16Detection(options)


# --------------------------------------------------------------------------- inference
class Detector:
    """A trained detector (a run folder of ``deskpod lung train``), run on whole scans."""

    def __init__(self, run_dir: Path, model: DetectorModel, options: Options, step: int) -> None:
        self.run_dir, self.model, self.options, self.step = run_dir, model, options, step
        roi = tuple(int(v) for v in options.patch)
        model.detector.set_sliding_window_inferer(roi_size=roi, sw_batch_size=1, overlap=0.25, mode="constant",
                                                  padding_mode="constant", cval=0.0, progress=False)  # fmt: skip
        self.model.eval()

    def detect(self, scan: Scan, *, max_candidates: int = 100) -> list[Candidate]:
        """Candidates of ``scan`` (most probable first): box centres in world mm (LPS) and their scores."""
        vol = volume_of(scan, self.options.spacing)
        image = torch.from_numpy(normalise(vol.hu))[None, None]
        found = self.model.detections(
            image, sliding=any(a > b for a, b in zip(vol.hu.shape, self.options.patch, strict=True))
        )[0]
        boxes, scores = found["boxes"].double().numpy(), found["labels_scores"].double().numpy()
        order = np.argsort(-scores)[:max_candidates]
        centres = (boxes[order, :3] + boxes[order, 3:]) / 2
        world = voxel_to_world(vol.geometry(), centres) if len(order) else np.zeros((0, 3))
        source = f"detector:{self.run_dir.name}"
        return [Candidate((float(w[0]), float(w[1]), float(w[2])), float(scores[i]), source)
                for w, i in zip(world, order, strict=True)]  # fmt: skip


def scans_to_detect(data: str | None, scans: Sequence[str | Path] = (), *, subset: int | None = None,
                    fold: int = -1) -> list[tuple[str, Path]]:  # fmt: skip
    """What to detect on, each scan with its series uid: one subset of a LUNA16 folder (``data = "luna16:PATH"``;
    default: ``fold``, the detector's held-out one, -1 for the last), or scan files, named after their file."""
    if data is not None:
        kind, _, path = data.partition(":")
        if kind != "luna16" or not path:
            raise ConfigError(f"--data {data!r}: give a LUNA16 folder as luna16:PATH")
        layout = read_layout(path)
        chosen = subset if subset is not None else fold
        chosen = layout.subsets[-1] if chosen < 0 else chosen
        if chosen not in layout.subsets:
            raise ConfigError(f"--subset {chosen}: not in {path}; valid: {', '.join(map(str, layout.subsets))}")
        return [(uid, layout.scans[uid]) for uid in layout.uids([chosen])]
    if subset is not None:
        raise ConfigError("--subset goes with --data luna16:PATH, not with --scan")
    return [(Path(p).name.removesuffix(".gz").rsplit(".", 1)[0], Path(p)) for p in scans]


def write_results(detector: Detector, scans: Sequence[tuple[str, Path]], out: Path) -> int:
    """Detect on each of ``scans`` (`scans_to_detect`) and write the candidates as a LUNA16 results file
    (``seriesuid,coordX,coordY,coordZ,probability``, world mm) for ``deskpod lung evaluate``; returns their count."""
    from deskpod.lung.images import read_scan

    rows = 0
    with out.open("w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(["seriesuid", "coordX", "coordY", "coordZ", "probability"])
        for uid, path in scans:
            for c in detector.detect(read_scan(path)):
                writer.writerow([uid, *(f"{v:.3f}" for v in c.world_xyz), f"{c.probability:.6f}"])
                rows += 1
    return rows


def load_detector(run_dir: str | Path) -> Detector:
    """The detector of a ``deskpod lung train`` run (its latest checkpoint); a `ConfigError` when it is not one."""
    from deskpod.train import checkpoint as ckpt
    from deskpod.train.config import load_config
    from deskpod.train.runs import RunPaths

    run = Path(run_dir).expanduser()
    paths = RunPaths(run)
    if not paths.config.is_file():
        raise ConfigError(
            f"--detector {str(run_dir)!r}: not a run folder (no config.toml); give a deskpod lung train run"
        )
    cfg = load_config(paths.config)
    if cfg.task != TASK:
        raise ConfigError(f"--detector {str(run_dir)!r}: a {cfg.task} run, not a lung detector (task {TASK})")
    if not ckpt.has_checkpoint(run):
        raise ConfigError(f"--detector {str(run_dir)!r}: the run has no checkpoint yet")
    _, state = ckpt.load_latest(run)
    options = Options.parse(cfg.task_options)
    model = DetectorModel(cfg.model, options.spacing)
    model.load_state_dict(state["model"])
    return Detector(run, model, options, int(state["step"]))
