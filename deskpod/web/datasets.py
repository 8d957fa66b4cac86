"""Step 1 of New training: the datasets, what each holds (DIGITS' "explore"), and sample images per class.

`explore` checks a ``--data`` value with the trainer's own `deskpod.train.data.describe` (so a bad one
gets the CLI's message) and adds what a person wants to see before training on it: the classes and,
where the files say, how many images each has for training and validation; `samples_png` draws the
first images of each class. Fashion-MNIST is read from its IDX files (the labels give the per-class
counts: train from the training set, validation from the test set, as the trainer splits it); an
image folder is scanned with the trainer's rules (`deskpod.train.data.scan_classes`, ``train/`` + ``val/`` when both
exist) and its first images per class are thumbnailed; synthetic data is noise made per run, so it has
no samples to show.

Everything is cached in the cache dict the caller passes (the dashboard's ``web.cache["datasets"]``):
a summary until the files it came from change (the label files' mtimes; an image folder's and its
class folders' mtimes), a PNG for the life of the cache.

On a root pod the dashboard reads as root, but shows a user only what their jobs could read: an image folder
is scanned, and its sample images opened, with the signed-in user's own rights (``account``:
`deskpod.envs.accounts.as_account`), so a class folder that is a link into someone else's private photos
shows nothing of them; the images are decoded afterwards, from the bytes the user could read. Cache entries of
an image folder are the account's own.
"""

from __future__ import annotations

import io
import threading
from collections import Counter
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, TypeVar

import numpy as np

from deskpod.envs.accounts import Account, as_account
from deskpod.errors import DataError, NotFoundError

T = TypeVar("T")
SAMPLES_PER_CLASS = 8
SAMPLE_CLASSES = 24
"""Classes that get a strip of samples (the first ones); a 1000-class folder still lists every count."""
FASHION_CELL = 56
"""Fashion-MNIST's 28×28 images drawn at twice their size (nearest neighbour: the pixels stay crisp)."""
FOLDER_CELL = 72
GAP = 2
CACHE_LIMIT = 64

CARDS: tuple[dict[str, str], ...] = (
    {
        "data": "fashion-mnist",
        "title": "Fashion-MNIST",
        "about": "70,000 grayscale 28×28 photos of clothing in 10 classes (Zalando Research, 2017): "
        "60,000 to train on, 10,000 to validate. A convnet reaches about 91.5% in 4 epochs.",
    },
    {
        "data": "synthetic",
        "title": "Synthetic",
        "about": "Random 3×224×224 images made once on each device, 1000 classes: measures the network and "
        "the devices, not the input pipeline (type synthetic:CxHxW below for another shape).",
    },
)
"""The built-in datasets shown as cards; an image folder is typed as ``imagefolder:PATH``."""

_LOCKS: dict[Any, threading.Lock] = {}
_LOCKS_LOCK = threading.Lock()


def _lock(key: Any) -> threading.Lock:
    """One scan or decode per dataset at a time (two tabs opening it do the work once); other datasets go on."""
    with _LOCKS_LOCK:
        if len(_LOCKS) >= CACHE_LIMIT:
            _LOCKS.pop(next((k for k, v in _LOCKS.items() if not v.locked()), None), None)
        return _LOCKS.setdefault(key, threading.Lock())


def _request(data: str) -> Any:
    """The trainer's `DataRequest` for ``data`` with every other key at its default."""
    from deskpod.train.config import TrainConfig
    from deskpod.train.data import DataRequest

    d = TrainConfig()
    return DataRequest(data, d.num_classes, d.synthetic_samples, d.image_size, d.val_fraction, d.seed, d.loader_workers)


def normalize(data: str) -> str:
    """The ``--data`` value a job gets: an image folder as an absolute path (the job runs in its own folder)."""
    text = data.strip()
    kind, _, arg = text.partition(":")
    if kind == "imagefolder" and arg:
        root = Path(arg).expanduser()
        if not root.is_absolute():
            raise DataError(
                f"imagefolder path {arg!r} is relative; give an absolute path (the job runs in its own folder), "
                "e.g. imagefolder:/data/photos"
            )
        return f"imagefolder:{root}"
    return text


def _stamp(paths: Sequence[Path]) -> tuple[int, ...]:
    out = []
    for p in paths:
        try:
            out.append(p.stat().st_mtime_ns)
        except OSError:
            out.append(-1)
    return tuple(out)


def _folder_stamp(root: Path) -> tuple[int, ...]:
    """mtimes of the folder and of its first-level folders: a class or an image added at the top shows."""
    try:
        dirs = sorted(d for d in root.iterdir() if d.is_dir())
    except OSError:
        return (-1,)
    inner = [c for d in dirs if d.name in ("train", "val") for c in sorted(d.iterdir()) if c.is_dir()]
    return _stamp([root, *dirs, *inner])


def _remember(cache: dict[Any, Any], key: Any, value: Any) -> Any:
    if len(cache) >= CACHE_LIMIT:
        cache.pop(next(iter(cache)))
    cache[key] = value
    return value


def _as(account: Account | None, fn: Callable[[], T]) -> T:
    """``fn()`` with ``account``'s file-system rights (None: the dashboard's own)."""
    return fn() if account is None else as_account(account, fn)


def _reader(kind: str, account: Account | None) -> int | None:
    """Whose rights an explore of this kind reads with, for the cache keys: an image folder is the account's."""
    return account.uid if account is not None and kind == "imagefolder" else None


def explore(data: str, cache: dict[Any, Any], fashion_root: Path, account: Account | None = None) -> dict[str, Any]:
    """What ``data`` holds, or `DataError` with the trainer's message (a missing folder, one class, no images...).
    An image folder is read with ``account``'s rights when given (see the module docstring)."""
    from deskpod.train.data import describe

    text = normalize(data)
    if not text:
        raise DataError(
            "give a dataset: fashion-mnist, synthetic[:CxHxW] (e.g. synthetic:3x224x224), or imagefolder:PATH"
        )
    kind, _, arg = text.partition(":")
    stamp: tuple[int, ...] = ()
    reader = account if kind == "imagefolder" else None
    if kind == "fashion-mnist":
        stamp = _stamp([fashion_root / "train-labels-idx1-ubyte.gz", fashion_root / "t10k-labels-idx1-ubyte.gz"])
    elif kind == "imagefolder":
        stamp = _as(reader, lambda: _folder_stamp(Path(arg)))
    key = ("explore", text, str(fashion_root), stamp, _reader(kind, account))
    hit = cache.get(key)
    if hit is not None:
        return hit  # type: ignore[no-any-return]
    with _lock(("explore", text, _reader(kind, account))):
        hit = cache.get(key)
        if hit is not None:
            return hit  # type: ignore[no-any-return]
        request = _request(text)
        spec = _as(reader, lambda: describe(request, fashion_root))
        out: dict[str, Any] = {
            "data": text,
            "name": spec.name,
            "title": next((c["title"] for c in CARDS if c["data"] == text), spec.name),
            "kind": kind,
            "num_classes": spec.num_classes,
            "input_shape": [spec.in_channels, *spec.image_size],
            "train_size": spec.train_size,
            "val_size": spec.val_size,
            "classes": [],
            "samples": kind != "synthetic",
            "note": "",
        }
        if kind == "fashion-mnist":
            out["classes"] = _fashion_counts(spec.class_names, fashion_root)
            out["note"] = "validation is the 10,000-image test set; training flips images left-right at random"
        elif kind == "imagefolder":
            names = spec.class_names
            out["classes"], out["note"] = _as(reader, lambda: _folder_counts(Path(arg), names))
        else:
            out["note"] = (
                f"random images with random labels among {spec.num_classes} classes, made once per run on each "
                "device: there are no samples to show"
            )
        return _remember(cache, key, out)  # type: ignore[no-any-return]


def _fashion_counts(names: Sequence[str], root: Path) -> list[dict[str, Any]]:
    import torch

    from deskpod.train.data import fashion_mnist_files, read_idx

    files = fashion_mnist_files(root)
    train = torch.bincount(read_idx(files["train_labels"]).long(), minlength=len(names)).tolist()
    val = torch.bincount(read_idx(files["test_labels"]).long(), minlength=len(names)).tolist()
    return [{"index": i, "name": n, "train": train[i], "val": val[i], "images": train[i] + val[i]}
            for i, n in enumerate(names)]  # fmt: skip


def _folder_counts(root: Path, names: Sequence[str]) -> tuple[list[dict[str, Any]], str]:
    from deskpod.train.data import folder_roots, scan_classes  # the trainer's own rules for what counts

    train_root, val_root = folder_roots(root)
    _, train = scan_classes(train_root)
    per_class = np.bincount([c for _, c in train], minlength=len(names)).tolist()
    if val_root is None:
        rows = [{"index": i, "name": n, "train": None, "val": None, "images": per_class[i]}
                for i, n in enumerate(names)]  # fmt: skip
        return rows, "no train/ and val/ folders: a random tenth of the images is held out for validation"
    val_classes, val = scan_classes(val_root)
    val_by_name = Counter(val_classes[c] for _, c in val)
    rows = [{"index": i, "name": n, "train": per_class[i], "val": val_by_name.get(n, 0),
             "images": per_class[i] + val_by_name.get(n, 0)} for i, n in enumerate(names)]  # fmt: skip
    return rows, "validation images from val/, training images from train/"


# --------------------------------------------------------------------------- sample images
def _fashion_samples(root: Path) -> list[list[np.ndarray]]:
    from deskpod.train.data import fashion_mnist_files, read_idx

    files = fashion_mnist_files(root)
    images = read_idx(files["train_images"]).numpy()
    labels = read_idx(files["train_labels"]).numpy()
    out: list[list[np.ndarray]] = []
    for c in range(int(labels.max()) + 1):
        idx = np.flatnonzero(labels == c)[:SAMPLES_PER_CLASS]
        out.append([_cell_gray(images[i]) for i in idx])
    return out


def _cell_gray(img: np.ndarray) -> np.ndarray:
    from PIL import Image

    big = Image.fromarray(img).resize((FASHION_CELL, FASHION_CELL), Image.Resampling.NEAREST)
    return np.asarray(big.convert("RGBA"))


def _thumbnail(data: bytes) -> np.ndarray | None:
    """A square RGBA cell of the image (its file's bytes), letterboxed on transparency; None when it does not
    decode."""
    from PIL import Image, UnidentifiedImageError

    try:
        with Image.open(io.BytesIO(data)) as opened:
            opened.draft("RGB", (FOLDER_CELL, FOLDER_CELL))  # JPEG: decode at a fraction of the size
            im = opened.convert("RGB")
        im.thumbnail((FOLDER_CELL, FOLDER_CELL))
    except (OSError, UnidentifiedImageError, ValueError, SyntaxError, Image.DecompressionBombError):
        return None
    cell = Image.new("RGBA", (FOLDER_CELL, FOLDER_CELL), (0, 0, 0, 0))
    cell.paste(im, ((FOLDER_CELL - im.width) // 2, (FOLDER_CELL - im.height) // 2))
    return np.asarray(cell)


MAX_SAMPLE_BYTES = 32 << 20
"""A file bigger than this is not read for a thumbnail (a strip shows a few small images)."""


def _sample_files(root: Path) -> list[list[bytes]]:
    """The first files of each shown class, read (as whoever calls this: see `_folder_samples`)."""
    from deskpod.train.data import folder_roots, scan_classes

    classes, files = scan_classes(folder_roots(root)[0])
    by_class: list[list[str]] = [[] for _ in classes]
    for path, c in files:
        by_class[c].append(path)
    out: list[list[bytes]] = []
    for paths in by_class[:SAMPLE_CLASSES]:
        read: list[bytes] = []
        for p in paths[: SAMPLES_PER_CLASS * 2]:  # a few bad files do not empty the strip
            try:
                with open(p, "rb") as f:
                    read.append(f.read(MAX_SAMPLE_BYTES))
            except OSError:
                continue
        out.append(read)
    return out


def _folder_samples(root: Path, account: Account | None) -> list[list[np.ndarray]]:
    """Each shown class's sample cells: the files read with ``account``'s rights, decoded here."""
    out: list[list[np.ndarray]] = []
    for datas in _as(account, lambda: _sample_files(root)):
        cells: list[np.ndarray] = []
        for data in datas:
            cell = _thumbnail(data)
            if cell is not None:
                cells.append(cell)
            if len(cells) == SAMPLES_PER_CLASS:
                break
        out.append(cells)
    return out


def _strip(cells: Sequence[np.ndarray], cell: int) -> np.ndarray:
    width = SAMPLES_PER_CLASS * cell + (SAMPLES_PER_CLASS - 1) * GAP
    row = np.zeros((cell, width, 4), dtype=np.uint8)
    for i, c in enumerate(cells):
        x = i * (cell + GAP)
        row[:, x : x + cell] = c
    return row


def samples(
    data: str, cache: dict[Any, Any], fashion_root: Path, account: Account | None = None
) -> tuple[list[list[np.ndarray]], int]:
    """The sample cells of each class (the first `SAMPLE_CLASSES` classes) and the cell size."""
    summary = explore(data, cache, fashion_root, account)  # bad data fails here, with the trainer's message
    if not summary["samples"]:
        raise NotFoundError(f"{summary['name']} is random data made per run: it has no sample images to show")
    reader = _reader(summary["kind"], account)
    key = ("samples", summary["data"], str(fashion_root), summary["train_size"], reader)
    hit = cache.get(key)
    if hit is None:
        with _lock(("samples", summary["data"], reader)):
            hit = cache.get(key)
            if hit is None:
                if summary["kind"] == "fashion-mnist":
                    hit = (_fashion_samples(fashion_root), FASHION_CELL)
                else:
                    root = Path(summary["data"].partition(":")[2])
                    hit = (_folder_samples(root, account), FOLDER_CELL)
                _remember(cache, key, hit)
    return hit  # type: ignore[no-any-return]


def samples_png(
    data: str, cls: int | None, cache: dict[Any, Any], fashion_root: Path, account: Account | None = None
) -> bytes:
    """A PNG strip of the first images of class ``cls``, or every shown class's strip stacked (``cls`` None)."""
    summary = explore(data, cache, fashion_root, account)
    key = ("png", summary["data"], str(fashion_root), summary["train_size"], cls, _reader(summary["kind"], account))
    hit = cache.get(key)
    if hit is not None:
        return hit  # type: ignore[no-any-return]
    per_class, cell = samples(data, cache, fashion_root, account)
    if cls is not None and not 0 <= cls < len(per_class):
        shown = min(summary["num_classes"], SAMPLE_CLASSES)
        raise NotFoundError(f"class {cls} has no samples to show; {summary['name']} shows classes 0-{shown - 1}")
    rows = [per_class[cls]] if cls is not None else per_class
    strips = [_strip(r, cell) for r in rows]
    gap = np.zeros((GAP, strips[0].shape[1], 4), dtype=np.uint8)
    picture = np.concatenate([part for s in strips for part in (s, gap)][:-1], axis=0)
    from PIL import Image

    buf = io.BytesIO()
    Image.fromarray(picture).save(buf, "PNG")
    return _remember(cache, key, buf.getvalue())  # type: ignore[no-any-return]


def sample_size(summary: dict[str, Any]) -> tuple[int, int]:
    """Width and height of one class's strip, for the page's ``<img width height>``."""
    cell = FASHION_CELL if summary["kind"] == "fashion-mnist" else FOLDER_CELL
    return SAMPLES_PER_CLASS * cell + (SAMPLES_PER_CLASS - 1) * GAP, cell
