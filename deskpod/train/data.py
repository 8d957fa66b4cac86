"""Data sources: ``fashion-mnist``, ``synthetic[:CxHxW]`` and ``imagefolder:PATH``.

Each source gives a `DataSpec` (classes, shape, normalisation) and, per rank, a train and a
validation `Source`. A source yields batches of *given indices*: the sampler (`sampler.py`)
decides which samples a rank sees, so sharding, reshuffling and resuming mid-epoch are the
same code for every dataset.

- In-memory sources (Fashion-MNIST, synthetic) index a tensor directly: no DataLoader, no copies
  beyond the batch. Augmentation (horizontal flips) is decided per (seed, epoch, sample), so it is
  the same whatever the number of workers and whether the run was resumed.
- ``imagefolder`` decodes JPEG/PNG with torchvision in DataLoader worker processes; a file that
  fails to decode is skipped and counted, and the trainer stops when too many are bad. Every folder is a
  class but hidden ones and ``unsorted/`` (images waiting to be sorted); a class folder with no image is an
  error, not a class the model would be asked to predict without ever seeing it.
"""

from __future__ import annotations

import gzip
import math
import os
import struct
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import torch

from deskpod.errors import DataError

FASHION_MNIST_DIR = Path("/usr/share/datasets/fashion-mnist")
FASHION_MNIST_CLASSES = (
    "T-shirt/top", "Trouser", "Pullover", "Dress", "Coat", "Sandal", "Shirt", "Sneaker", "Bag", "Ankle boot",
)  # fmt: skip
# Per-channel statistics of the Fashion-MNIST training set (computed from the 60,000 images).
FASHION_MNIST_MEAN, FASHION_MNIST_STD = (0.2860,), (0.3530,)
# ImageNet statistics, the convention torchvision's models are trained with.
IMAGENET_MEAN, IMAGENET_STD = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)
IMAGE_SUFFIXES = {".jpg", ".jpeg", ".png", ".bmp", ".webp"}
UNSORTED = "unsorted"
"""A folder of images not sorted into a class yet (``deskpod video crops`` writes its crops there): not a class."""


@dataclass(frozen=True, slots=True)
class DataSpec:
    """What the model and the exporter need to know about a dataset."""

    name: str
    num_classes: int
    in_channels: int
    image_size: tuple[int, int]
    class_names: tuple[str, ...]
    mean: tuple[float, ...]
    std: tuple[float, ...]
    train_size: int
    val_size: int


def data_spec_from(d: dict[str, Any]) -> DataSpec:
    """A `DataSpec` from its JSON form (lists back to tuples)."""
    return DataSpec(
        name=str(d["name"]), num_classes=int(d["num_classes"]), in_channels=int(d["in_channels"]),
        image_size=(int(d["image_size"][0]), int(d["image_size"][1])), class_names=tuple(d["class_names"]),
        mean=tuple(float(v) for v in d["mean"]), std=tuple(float(v) for v in d["std"]),
        train_size=int(d["train_size"]), val_size=int(d["val_size"]),
    )  # fmt: skip


@dataclass(slots=True)
class Batch:
    images: torch.Tensor
    labels: torch.Tensor
    bad: int = 0
    """Samples of this batch that could not be read and were skipped."""
    targets: Any = None
    """What a task other than classification trains towards (e.g. boxes per image); see `deskpod.train.tasks`."""

    @property
    def size(self) -> int:
        """Samples in the batch."""
        return int(self.images.shape[0])


class Source(Protocol):
    """A dataset split that produces a batch for a list of sample indices."""

    def __len__(self) -> int: ...
    def batches(self, index_batches: Iterator[Sequence[int]], epoch: int) -> Iterator[Batch]: ...


# --------------------------------------------------------------------------- in memory
class TensorSource:
    """Images as one uint8 (or float) tensor ``[N, C, H, W]``; batches are gathered by index."""

    def __init__(self, images: torch.Tensor, labels: torch.Tensor, mean: Sequence[float], std: Sequence[float],
                 *, augment: bool, seed: int, scale: float = 1 / 255) -> None:  # fmt: skip
        self.images, self.labels = images, labels
        self.mean = torch.tensor(mean).view(1, -1, 1, 1)
        self.std = torch.tensor(std).view(1, -1, 1, 1)
        self.augment, self.seed, self.scale = augment, seed, scale

    def __len__(self) -> int:
        return int(self.labels.shape[0])

    def _flips(self, epoch: int) -> torch.Tensor:
        g = torch.Generator().manual_seed(self.seed * 1_000_003 + epoch)
        return torch.rand(len(self), generator=g) < 0.5

    def batches(self, index_batches: Iterator[Sequence[int]], epoch: int) -> Iterator[Batch]:
        flips = self._flips(epoch) if self.augment else None
        for idx_list in index_batches:
            idx = torch.as_tensor(idx_list, dtype=torch.long)
            x = self.images.index_select(0, idx).float().mul_(self.scale)
            if flips is not None:
                f = flips.index_select(0, idx)
                if bool(f.any()):
                    x[f] = x[f].flip(-1)
            yield Batch((x - self.mean) / self.std, self.labels.index_select(0, idx))


class SyntheticSource:
    """Random images of one shape, generated once: measures the network, not the input pipeline.

    Like tf_cnn_benchmarks' synthetic mode, a small pool of images is made once (on the device it
    will be used on) and reused, so the data costs nothing per step.
    """

    POOL = 64

    def __init__(
        self, size: int, shape: tuple[int, int, int], num_classes: int, seed: int, device: torch.device
    ) -> None:
        g = torch.Generator().manual_seed(seed + 7)
        pool = min(self.POOL, size)
        self.size = size
        self.images = torch.randn(pool, *shape, generator=g).to(device)
        self.labels = torch.randint(0, num_classes, (pool,), generator=g).to(device)

    def __len__(self) -> int:
        return self.size

    def batches(self, index_batches: Iterator[Sequence[int]], epoch: int) -> Iterator[Batch]:
        pool = self.images.shape[0]
        for idx_list in index_batches:
            idx = torch.as_tensor([i % pool for i in idx_list], dtype=torch.long, device=self.images.device)
            yield Batch(self.images.index_select(0, idx), self.labels.index_select(0, idx))


# --------------------------------------------------------------------------- Fashion-MNIST
def read_idx(path: Path) -> torch.Tensor:
    """Read a gzipped IDX file (big-endian header: magic, dims; then uint8 data)."""
    with gzip.open(path, "rb") as f:
        raw = f.read()
    zero, dtype, ndim = struct.unpack(">HBB", raw[:4])
    if zero != 0 or dtype != 0x08:
        raise DataError(f"{path}: not an IDX file of unsigned bytes (magic {raw[:4].hex()})")
    dims = struct.unpack(">" + "I" * ndim, raw[4 : 4 + 4 * ndim])
    body = raw[4 + 4 * ndim :]
    expected = math.prod(dims)
    if len(body) != expected:
        raise DataError(f"{path}: truncated IDX file ({len(body)} of {expected} bytes)")
    return torch.frombuffer(bytearray(body), dtype=torch.uint8).reshape(dims)


def fashion_mnist_files(root: Path = FASHION_MNIST_DIR) -> dict[str, Path]:
    names = {
        "train_images": "train-images-idx3-ubyte.gz",
        "train_labels": "train-labels-idx1-ubyte.gz",
        "test_images": "t10k-images-idx3-ubyte.gz",
        "test_labels": "t10k-labels-idx1-ubyte.gz",
    }
    files = {k: root / v for k, v in names.items()}
    missing = [p.name for p in files.values() if not p.is_file()]
    if missing:
        raise DataError(
            f"Fashion-MNIST not found in {root} (missing {', '.join(missing)}). Install it with "
            "'sudo apt-get install dataset-fashion-mnist' (Debian/Ubuntu), or put the four IDX .gz files from "
            "github.com/zalandoresearch/fashion-mnist there and set DESKPOD_FASHION_MNIST to the folder"
        )
    return files


# --------------------------------------------------------------------------- image folders
def scan_classes(root: Path) -> tuple[list[str], list[tuple[str, int]]]:
    """Class folders (sorted) and every image under them as (path, class index): the trainer's view of a folder.
    Hidden folders and `UNSORTED` are not classes."""
    classes = sorted(d.name for d in root.iterdir() if d.is_dir() and not d.name.startswith(".") and d.name != UNSORTED)
    samples: list[tuple[str, int]] = []
    for ci, c in enumerate(classes):
        for dirpath, _, files in os.walk(root / c):
            for fn in sorted(files):
                if Path(fn).suffix.lower() in IMAGE_SUFFIXES:
                    samples.append((os.path.join(dirpath, fn), ci))
    return classes, samples


class _FolderDataset(torch.utils.data.Dataset[Any]):
    """Decodes one image; returns None for a file that cannot be decoded (counted by the collate)."""

    def __init__(self, samples: Sequence[tuple[str, int]], transform: Callable[[Any], torch.Tensor]) -> None:
        self.samples, self.transform = list(samples), transform

    def __len__(self) -> int:
        return len(self.samples)

    def __getitem__(self, i: int) -> tuple[torch.Tensor, int] | None:
        from PIL import Image, UnidentifiedImageError

        path, label = self.samples[i]
        try:
            with Image.open(path) as im:
                img = im.convert("RGB")
            return self.transform(img), label
        except (OSError, UnidentifiedImageError, ValueError, SyntaxError):
            return None


def _collate_skip_bad(items: list[tuple[torch.Tensor, int] | None]) -> Batch:
    good = [it for it in items if it is not None]
    bad = len(items) - len(good)
    if not good:
        return Batch(torch.empty(0), torch.empty(0, dtype=torch.long), bad)
    return Batch(torch.stack([g[0] for g in good]), torch.tensor([g[1] for g in good]), bad)


class FolderSource:
    """JPEG/PNG class folders, decoded and augmented by DataLoader workers."""

    def __init__(self, samples: Sequence[tuple[str, int]], train: bool, size: int, workers: int, pin: bool) -> None:
        from torchvision import transforms as T

        norm = T.Normalize(IMAGENET_MEAN, IMAGENET_STD)
        if train:
            tf = T.Compose([T.RandomResizedCrop(size), T.RandomHorizontalFlip(), T.ToTensor(), norm])
        else:
            tf = T.Compose([T.Resize(int(size * 256 / 224)), T.CenterCrop(size), T.ToTensor(), norm])
        self.dataset = _FolderDataset(samples, tf)
        self.workers, self.pin = workers, pin

    def __len__(self) -> int:
        return len(self.dataset)

    def batches(self, index_batches: Iterator[Sequence[int]], epoch: int) -> Iterator[Batch]:
        loader = torch.utils.data.DataLoader(
            self.dataset,
            batch_sampler=list(index_batches),
            num_workers=self.workers,
            collate_fn=_collate_skip_bad,
            pin_memory=self.pin,
            prefetch_factor=4 if self.workers else None,
            persistent_workers=False,
        )
        yield from loader


# --------------------------------------------------------------------------- the registry
@dataclass(frozen=True, slots=True)
class DataRequest:
    """The parts of the config a data source reads."""

    data: str
    num_classes: int
    synthetic_samples: int
    image_size: int
    val_fraction: float
    seed: int
    loader_workers: int


def parse_shape(text: str) -> tuple[int, int, int]:
    parts = text.lower().split("x")
    if len(parts) != 3 or not all(p.isascii() and p.isdigit() and len(p) <= 9 and int(p) > 0 for p in parts):
        raise DataError(f"synthetic shape {text!r} is not valid: use CxHxW, e.g. synthetic:3x224x224")
    c, h, w = (int(p) for p in parts)
    return c, h, w


DATA_HELP = "fashion-mnist, synthetic[:CxHxW] (e.g. synthetic:3x224x224), or imagefolder:PATH"


def describe(req: DataRequest, fashion_root: Path = FASHION_MNIST_DIR) -> DataSpec:
    """Check the dataset exists and describe it, without loading it (runs in the launcher)."""
    kind, _, arg = req.data.partition(":")
    if kind == "fashion-mnist" and not arg:
        fashion_mnist_files(fashion_root)
        return DataSpec("fashion-mnist", 10, 1, (28, 28), FASHION_MNIST_CLASSES, FASHION_MNIST_MEAN,
                        FASHION_MNIST_STD, 60_000, 10_000)  # fmt: skip
    if kind == "synthetic":
        c, h, w = parse_shape(arg) if arg else (3, 224, 224)
        classes = tuple(f"class{i}" for i in range(req.num_classes))
        mean, std = (IMAGENET_MEAN, IMAGENET_STD) if c == 3 else ((0.0,) * c, (1.0,) * c)
        val = max(1, req.synthetic_samples // 10)
        return DataSpec(
            f"synthetic:{c}x{h}x{w}", req.num_classes, c, (h, w), classes, mean, std, req.synthetic_samples, val
        )
    if kind == "imagefolder":
        root = Path(arg).expanduser()
        if not arg or not root.is_dir():
            raise DataError(
                f"imagefolder path {arg!r} does not exist or is not a folder; give imagefolder:PATH with class folders"
            )
        train_root, val_root = folder_roots(root)
        folder_classes, train = scan_classes(train_root)
        if len(folder_classes) < 2:
            raise DataError(
                f"imagefolder {str(train_root)!r}: found {len(folder_classes)} class folders; need at least 2 (one folder per class)"
            )
        if not train:
            raise DataError(
                f"imagefolder {str(train_root)!r}: no images ({', '.join(sorted(IMAGE_SUFFIXES))}) in the class folders"
            )
        empty = sorted(set(folder_classes) - {folder_classes[c] for _, c in train})
        if empty:
            raise DataError(
                f"imagefolder {str(train_root)!r}: class folder(s) {', '.join(empty)} hold no images; put images in "
                f"them or remove them"
            )
        n_val = len(scan_classes(val_root)[1]) if val_root else max(1, int(len(train) * req.val_fraction))
        n_train = len(train) if val_root else len(train) - n_val
        if n_train < 1 or n_val < 1:
            raise DataError(
                f"imagefolder {str(root)!r}: {len(train)} images are too few to split into train and validation"
            )
        s = req.image_size
        return DataSpec(
            f"imagefolder:{root}",
            len(folder_classes),
            3,
            (s, s),
            tuple(folder_classes),
            IMAGENET_MEAN,
            IMAGENET_STD,
            n_train,
            n_val,
        )
    raise DataError(f"unknown dataset {req.data!r}; valid: {DATA_HELP}")


def folder_roots(root: Path) -> tuple[Path, Path | None]:
    """``root/train`` + ``root/val`` when both exist, else ``root`` alone (split by val_fraction)."""
    if (root / "train").is_dir() and (root / "val").is_dir():
        return root / "train", root / "val"
    return root, None


def open_sources(
    req: DataRequest, spec: DataSpec, device: torch.device, fashion_root: Path = FASHION_MNIST_DIR
) -> tuple[Source, Source]:
    """Load (or open) the train and validation splits in a worker."""
    kind, _, arg = req.data.partition(":")
    if kind == "fashion-mnist":
        files = fashion_mnist_files(fashion_root)
        tx, ty = read_idx(files["train_images"]).unsqueeze(1), read_idx(files["train_labels"]).long()
        vx, vy = read_idx(files["test_images"]).unsqueeze(1), read_idx(files["test_labels"]).long()
        return (
            TensorSource(tx, ty, spec.mean, spec.std, augment=True, seed=req.seed),
            TensorSource(vx, vy, spec.mean, spec.std, augment=False, seed=req.seed),
        )
    if kind == "synthetic":
        shape = (spec.in_channels, *spec.image_size)
        return (
            SyntheticSource(spec.train_size, shape, spec.num_classes, req.seed, device),
            SyntheticSource(spec.val_size, shape, spec.num_classes, req.seed + 1, device),
        )
    root = Path(arg).expanduser()
    train_root, val_root = folder_roots(root)
    _, train = scan_classes(train_root)
    if val_root is not None:
        val = scan_classes(val_root)[1]
    else:
        order = torch.randperm(len(train), generator=torch.Generator().manual_seed(req.seed + 13)).tolist()
        val = [train[i] for i in order[: spec.val_size]]
        train = [train[i] for i in sorted(order[spec.val_size :])]
    workers = req.loader_workers if req.loader_workers >= 0 else min(4, max(1, (os.cpu_count() or 1) // 2))
    pin = device.type == "cuda"
    s = spec.image_size[0]
    return FolderSource(train, True, s, workers, pin), FolderSource(val, False, s, workers, pin)
