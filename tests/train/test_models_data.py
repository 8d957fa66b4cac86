from __future__ import annotations

import gzip
import struct
from pathlib import Path

import pytest
import torch

from deskpod.errors import ConfigError, DataError
from deskpod.train.data import DataRequest, describe, open_sources, read_idx
from deskpod.train.models import ModelSpec, build_model, check_forward

from .conftest import FMNIST, needs_fashion_mnist


def req(data: str, **kw: object) -> DataRequest:
    base = {
        "num_classes": 10,
        "synthetic_samples": 100,
        "image_size": 32,
        "val_fraction": 0.2,
        "seed": 0,
        "loader_workers": 0,
    }
    base.update(kw)
    return DataRequest(data, **base)  # type: ignore[arg-type]


@pytest.mark.parametrize("name", ["convnet", "mlp", "resnet18", "alexnet"])
def test_builtin_models_accept_their_data(name: str) -> None:
    spec = ModelSpec(10, 3, (64, 64))
    check_forward(build_model(name, spec), spec, name)


def test_grey_images_rebuild_the_stem() -> None:
    spec = ModelSpec(10, 1, (28, 28))
    model = build_model("resnet18", spec)
    check_forward(model, spec, "resnet18")
    assert model.conv1.in_channels == 1


def test_unknown_model_suggests() -> None:
    with pytest.raises(ConfigError, match="did you mean 'resnet50'") as e:
        build_model("resnet05", ModelSpec(10, 3, (32, 32)))
    assert "convnet, mlp, alexnet, resnet18, resnet50" in str(e.value)


def test_alexnet_on_small_images_is_refused() -> None:
    with pytest.raises(ConfigError, match="at least 63×63"):
        build_model("alexnet", ModelSpec(10, 1, (28, 28)))


def test_user_factory() -> None:
    spec = ModelSpec(5, 1, (28, 28))
    model = build_model("tests.train.models_for_tests:tiny", spec)
    assert model(torch.zeros(2, 1, 28, 28)).shape == (2, 5)
    with pytest.raises(ConfigError, match=r"not a torch\.nn\.Module"):
        build_model("tests.train.models_for_tests:not_a_module", spec)
    with pytest.raises(ConfigError, match="cannot import module"):
        build_model("no_such_pkg.models:f", spec)
    with pytest.raises(ConfigError, match="has no callable 'nope'"):
        build_model("tests.train.models_for_tests:nope", spec)


def test_model_that_does_not_fit_the_data() -> None:
    spec = ModelSpec(10, 3, (64, 64))
    model = build_model("tests.train.models_for_tests:tiny", ModelSpec(10, 1, (28, 28)))
    with pytest.raises(ConfigError, match="does not accept this data's images"):
        check_forward(model, spec, "tiny")


def test_unknown_and_missing_datasets(tmp_path: Path) -> None:
    with pytest.raises(DataError, match="unknown dataset 'cifar10'"):
        describe(req("cifar10"))
    with pytest.raises(DataError, match="does not exist"):
        describe(req(f"imagefolder:{tmp_path}/nope"))
    with pytest.raises(DataError, match="apt-get install dataset-fashion-mnist"):
        describe(req("fashion-mnist"), tmp_path)
    with pytest.raises(DataError, match="use CxHxW"):
        describe(req("synthetic:3x224"))


def test_idx_reader(tmp_path: Path) -> None:
    p = tmp_path / "x.gz"
    with gzip.open(p, "wb") as f:
        f.write(struct.pack(">HBBIII", 0, 8, 3, 2, 2, 3) + bytes(range(12)))
    t = read_idx(p)
    assert t.shape == (2, 2, 3) and int(t[1, 1, 2]) == 11
    with gzip.open(p, "wb") as f:
        f.write(struct.pack(">HBBIII", 0, 8, 3, 2, 2, 3) + bytes(5))
    with pytest.raises(DataError, match="truncated"):
        read_idx(p)


@needs_fashion_mnist
def test_fashion_mnist_batches_are_normalised_and_deterministic() -> None:
    r = req("fashion-mnist")
    spec = describe(r, FMNIST)
    train, val = open_sources(r, spec, torch.device("cpu"), FMNIST)
    assert len(train) == 60_000 and len(val) == 10_000
    a = next(iter(train.batches(iter([[0, 1, 2, 3]]), epoch=0)))
    b = next(iter(train.batches(iter([[0, 1, 2, 3]]), epoch=0)))
    assert torch.equal(a.images, b.images) and a.images.shape == (4, 1, 28, 28)
    assert -1.0 < float(a.images.mean()) < 1.0


def make_imagefolder(root: Path, per_class: int = 6, corrupt: int = 1) -> Path:
    from PIL import Image

    for ci, cls in enumerate(["cat", "dog"]):
        d = root / cls
        d.mkdir(parents=True)
        for i in range(per_class):
            color = (200 * ci, 10 * i, 100)
            Image.new("RGB", (40, 36), color).save(d / f"{i}.png" if i % 2 else d / f"{i}.jpg")
    for i in range(corrupt):
        (root / "cat" / f"broken{i}.jpg").write_bytes(b"\xff\xd8\xff\xe0 not really a jpeg")
    return root


def test_imagefolder_skips_and_counts_corrupt_images(tmp_path: Path) -> None:
    root = make_imagefolder(tmp_path / "imgs", per_class=6, corrupt=1)
    r = req(f"imagefolder:{root}", val_fraction=0.25)
    spec = describe(r)
    assert spec.num_classes == 2 and spec.class_names == ("cat", "dog") and spec.train_size + spec.val_size == 13
    train, _ = open_sources(r, spec, torch.device("cpu"))
    batches = list(train.batches(iter([list(range(len(train)))]), epoch=0))
    assert sum(b.bad for b in batches) <= 1 and batches[0].images.shape[1:] == (3, 32, 32)
    assert sum(b.bad + int(b.labels.shape[0]) for b in batches) == len(train)
