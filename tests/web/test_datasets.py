"""Step 1's datasets: the summary of each (classes, counts, shape), its sample images, and bad input."""

from __future__ import annotations

import gzip
import io
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from PIL import Image

from deskpod.errors import DataError, NotFoundError
from deskpod.train.data import FASHION_MNIST_CLASSES, FASHION_MNIST_DIR, describe
from deskpod.web import datasets
from deskpod.web.datasets import FASHION_CELL, FOLDER_CELL, GAP, SAMPLES_PER_CLASS, explore, samples_png

needs_fashion = pytest.mark.skipif(
    not (FASHION_MNIST_DIR / "train-labels-idx1-ubyte.gz").exists(), reason="Fashion-MNIST is not installed"
)
COLOURS = {"cat": (200, 30, 30), "dog": (30, 200, 30), "emu": (30, 30, 200)}


def _idx(path: Path) -> np.ndarray:
    """An IDX file read here with numpy, independently of the trainer's reader."""
    raw = gzip.decompress(path.read_bytes())
    ndim = raw[3]
    dims = [int.from_bytes(raw[4 + 4 * i : 8 + 4 * i], "big") for i in range(ndim)]
    return np.frombuffer(raw, dtype=np.uint8, offset=4 + 4 * ndim).reshape(dims)


def _png(data: bytes) -> np.ndarray:
    with Image.open(io.BytesIO(data)) as im:
        assert im.format == "PNG"
        return np.asarray(im.convert("RGBA"))


def _folder(root: Path, counts: dict[str, int], size: tuple[int, int] = (40, 30)) -> Path:
    for name, n in counts.items():
        (root / name).mkdir(parents=True, exist_ok=True)
        for i in range(n):
            Image.new("RGB", size, COLOURS[name]).save(root / name / f"{i:03d}.png")
    return root


@needs_fashion
def test_fashion_mnist_summary_counts_every_label() -> None:
    cache: dict[Any, Any] = {}
    got = explore("fashion-mnist", cache, FASHION_MNIST_DIR)
    train = np.bincount(_idx(FASHION_MNIST_DIR / "train-labels-idx1-ubyte.gz"), minlength=10)
    val = np.bincount(_idx(FASHION_MNIST_DIR / "t10k-labels-idx1-ubyte.gz"), minlength=10)
    assert (got["title"], got["num_classes"], got["input_shape"]) == ("Fashion-MNIST", 10, [1, 28, 28])
    assert [c["name"] for c in got["classes"]] == list(FASHION_MNIST_CLASSES)
    assert [c["train"] for c in got["classes"]] == train.tolist()
    assert [c["val"] for c in got["classes"]] == val.tolist()
    assert (got["train_size"], got["val_size"]) == (int(train.sum()), int(val.sum()))
    assert got["samples"] is True
    assert explore("fashion-mnist", cache, FASHION_MNIST_DIR) is got  # cached until the label files change


@needs_fashion
def test_fashion_mnist_samples_are_the_first_images_of_the_class() -> None:
    cache: dict[Any, Any] = {}
    images = _idx(FASHION_MNIST_DIR / "train-images-idx3-ubyte.gz")
    labels = _idx(FASHION_MNIST_DIR / "train-labels-idx1-ubyte.gz")
    strip = _png(samples_png("fashion-mnist", 3, cache, FASHION_MNIST_DIR))
    assert strip.shape == (FASHION_CELL, SAMPLES_PER_CLASS * FASHION_CELL + (SAMPLES_PER_CLASS - 1) * GAP, 4)
    firsts = np.flatnonzero(labels == 3)[:SAMPLES_PER_CLASS]
    scale = FASHION_CELL // 28
    for i, idx in enumerate(firsts):
        x = i * (FASHION_CELL + GAP)
        cell = strip[:, x : x + FASHION_CELL, 0]
        assert np.array_equal(cell[::scale, ::scale], images[idx]), f"sample {i} of class 3 is not image {idx}"
    grid = _png(samples_png("fashion-mnist", None, cache, FASHION_MNIST_DIR))
    assert grid.shape[0] == 10 * FASHION_CELL + 9 * GAP  # one strip per class
    assert np.array_equal(grid[3 * (FASHION_CELL + GAP) : 3 * (FASHION_CELL + GAP) + FASHION_CELL], strip)
    with pytest.raises(NotFoundError, match="class 10"):
        samples_png("fashion-mnist", 10, cache, FASHION_MNIST_DIR)


def test_image_folder_summary_and_thumbnails(tmp_path: Path) -> None:
    root = _folder(tmp_path / "pets", {"dog": 3, "cat": 5})
    (root / "cat" / "broken.jpg").write_bytes(b"not a jpeg")  # counted like the trainer counts it, never drawn
    (root / "cat" / "notes.txt").write_text("not an image")
    cache: dict[Any, Any] = {}
    got = explore(f"imagefolder:{root}", cache, FASHION_MNIST_DIR)
    assert [c["name"] for c in got["classes"]] == ["cat", "dog"]  # sorted, as the trainer labels them
    assert [c["images"] for c in got["classes"]] == [6, 3]
    assert all(c["train"] is None and c["val"] is None for c in got["classes"])  # split at random by the trainer
    assert got["input_shape"] == [3, 224, 224]  # the trainer's default crop
    spec = describe(datasets._request(f"imagefolder:{root}"))
    assert (got["train_size"], got["val_size"]) == (spec.train_size, spec.val_size)
    cat = _png(samples_png(f"imagefolder:{root}", 0, cache, FASHION_MNIST_DIR))
    assert cat.shape[0] == FOLDER_CELL
    centre = cat[FOLDER_CELL // 2, FOLDER_CELL // 2]
    assert tuple(centre[:3]) == COLOURS["cat"] and centre[3] == 255
    assert cat[0, 0, 3] == 0  # a 40×30 image letterboxed on transparency
    filled = [cat[FOLDER_CELL // 2, i * (FOLDER_CELL + GAP) + FOLDER_CELL // 2, 3] for i in range(SAMPLES_PER_CLASS)]
    assert filled == [255] * 5 + [0] * 3  # five good images; the broken one is skipped
    dog = _png(samples_png(f"imagefolder:{root}", 1, cache, FASHION_MNIST_DIR))
    assert tuple(dog[FOLDER_CELL // 2, FOLDER_CELL // 2][:3]) == COLOURS["dog"]


def test_image_folder_with_train_and_val_counts_each_split(tmp_path: Path) -> None:
    root = tmp_path / "split"
    _folder(root / "train", {"cat": 4, "dog": 2, "emu": 3})
    _folder(root / "val", {"cat": 1, "emu": 2})
    got = explore(f"imagefolder:{root}", {}, FASHION_MNIST_DIR)
    assert [(c["name"], c["train"], c["val"]) for c in got["classes"]] == [("cat", 4, 1), ("dog", 2, 0), ("emu", 3, 2)]
    assert (got["train_size"], got["val_size"]) == (9, 3)


def test_a_changed_folder_is_explored_again(tmp_path: Path) -> None:
    root = _folder(tmp_path / "grow", {"cat": 2, "dog": 2})
    cache: dict[Any, Any] = {}
    assert explore(f"imagefolder:{root}", cache, FASHION_MNIST_DIR)["num_classes"] == 2
    _folder(root, {"emu": 2})
    os.utime(root, ns=(1, 10**18))  # a new mtime even on a filesystem with coarse timestamps
    assert explore(f"imagefolder:{root}", cache, FASHION_MNIST_DIR)["num_classes"] == 3


def test_synthetic_has_no_samples() -> None:
    got = explore("synthetic:1x32x32", {}, FASHION_MNIST_DIR)
    assert (got["input_shape"], got["samples"], got["classes"]) == ([1, 32, 32], False, [])
    assert "no samples" in got["note"]
    with pytest.raises(NotFoundError, match="no sample images"):
        samples_png("synthetic:1x32x32", None, {}, FASHION_MNIST_DIR)


@pytest.mark.parametrize("case", ["missing", "one-class", "no-images", "unknown", "bad-shape"])
def test_bad_datasets_get_the_trainers_message(tmp_path: Path, case: str) -> None:
    if case == "one-class":
        _folder(tmp_path / "one", {"cat": 3})
    if case == "no-images":
        (tmp_path / "empty" / "a").mkdir(parents=True)
        (tmp_path / "empty" / "b").mkdir()
    data = {
        "missing": f"imagefolder:{tmp_path / 'nope'}",
        "one-class": f"imagefolder:{tmp_path / 'one'}",
        "no-images": f"imagefolder:{tmp_path / 'empty'}",
        "unknown": "mnist-fashion",
        "bad-shape": "synthetic:3x224",
    }[case]
    with pytest.raises(DataError) as cli:
        describe(datasets._request(data))  # what `deskpod train --data ...` says
    with pytest.raises(DataError) as page:
        explore(data, {}, FASHION_MNIST_DIR)
    assert str(page.value) == str(cli.value)


def test_relative_folders_and_missing_fashion_mnist(tmp_path: Path) -> None:
    with pytest.raises(DataError, match="relative; give an absolute path"):
        explore("imagefolder:photos", {}, FASHION_MNIST_DIR)
    with pytest.raises(DataError, match="Fashion-MNIST not found"):
        explore("fashion-mnist", {}, tmp_path)


def test_a_class_folder_linked_into_another_users_private_photos_shows_nothing_of_them() -> None:
    """An attack through a dataset folder: alice's image folder has a class folder that is a symbolic link into
    bob's private photos (his home is 0700). Read with alice's rights, the dashboard neither counts nor draws
    bob's images, and what it cached for bob is not served to alice."""
    from tests.unix_users import make_users

    base = Path(tempfile.mkdtemp(prefix="deskpod-ds-"))  # pytest's own folder is closed to other accounts
    try:
        base.chmod(0o755)
        with make_users("alice", "bob") as (alice, bob):
            bob_home = base / "bob"
            _folder(bob_home / "photos", {"cat": 3, "dog": 3})
            for p in [bob_home, *bob_home.rglob("*")]:
                os.chown(p, bob.uid, bob.gid)
            bob_home.chmod(0o700)  # the photos inside are 0644: only the closed home keeps others out
            mine = _folder(base / "alice" / "set", {"emu": 3})
            (mine / "cat").symlink_to(bob_home / "photos" / "cat")
            (mine / "dog").symlink_to(bob_home / "photos" / "dog")
            for p in [base / "alice", *(base / "alice").rglob("*")]:
                os.lchown(p, alice.uid, alice.gid)
            cache: dict[Any, Any] = {}
            theirs = explore(f"imagefolder:{bob_home / 'photos'}", cache, FASHION_MNIST_DIR, account=bob)
            assert [c["images"] for c in theirs["classes"]] == [3, 3]
            with pytest.raises(PermissionError):  # as alice, bob's folder is closed (what was cached is bob's)
                explore(f"imagefolder:{bob_home / 'photos'}", cache, FASHION_MNIST_DIR, account=alice)
            for attempt in (
                lambda: explore(f"imagefolder:{mine}", cache, FASHION_MNIST_DIR, account=alice),
                lambda: samples_png(f"imagefolder:{mine}", None, cache, FASHION_MNIST_DIR, account=alice),
            ):
                with pytest.raises(PermissionError) as refused:  # as her jobs would fail on it, she is told
                    attempt()
                assert str(refused.value.filename) in (str(mine / "cat"), str(mine / "dog"))  # the links
            (mine / "cat").unlink()
            (mine / "dog").unlink()
            _folder(mine, {"dog": 2})
            os.lchown(mine / "dog", alice.uid, alice.gid)
            strip = _png(samples_png(f"imagefolder:{mine}", None, cache, FASHION_MNIST_DIR, account=alice))
            colours = {tuple(px[:3]) for px in strip.reshape(-1, 4) if px[3]}
            assert COLOURS["dog"] in colours and COLOURS["emu"] in colours and COLOURS["cat"] not in colours
    finally:
        shutil.rmtree(base, ignore_errors=True)
