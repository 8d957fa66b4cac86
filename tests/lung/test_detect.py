"""The lung detector as a training task: LUNA16 layout, crops, options, LUNA16's hit rule, the trainer's task hooks."""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pytest
import torch

from deskpod.errors import ConfigError, DataError
from deskpod.lung.detect import DetectorModel, Options, hits, load_detector, luna16, scans_to_detect
from deskpod.lung.images import read_scan, world_to_voxel
from deskpod.lung.luna16 import (
    HU_MAX,
    HU_MIN,
    PatchSource,
    cache_folder,
    ensure_cache,
    load_volume,
    read_layout,
    samples_of,
    split,
)
from deskpod.lung.phantom import write_phantom
from deskpod.train.data import DataRequest
from deskpod.train.tasks import load_task, parse_options

SPACING = (2.0, 2.0, 4.0)
PATCH = (32, 32, 16)


@pytest.fixture(scope="module")
def phantom(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("luna16") / "data"
    return write_phantom(out, 4, seed=3, subsets=2, shape=(40, 112, 112), spacing=SPACING, nodules=(1, 2))


@pytest.fixture(scope="module")
def cached(phantom: Path, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    layout = read_layout(phantom)
    folder = cache_folder(phantom, SPACING, str(tmp_path_factory.mktemp("cache")))
    ensure_cache(layout, sorted(layout.scans), SPACING, folder)
    return phantom, folder


def request(data: str) -> DataRequest:
    return DataRequest(data, 2, 1, 224, 0.1, 0, 0)


# --------------------------------------------------------------------------- layout
def test_the_layout_is_read_with_its_folds(phantom: Path) -> None:
    layout = read_layout(phantom)
    assert layout.subsets == [0, 1]
    train, val = split(layout, -1)
    assert train and val and not set(train) & set(val)
    assert all(layout.subset_of[u] == 1 for u in val)
    assert split(layout, 0)[1] == layout.uids([0])
    annotated = sum(len(v) for v in layout.nodules.values())
    assert annotated == len((phantom / "annotations.csv").read_text().splitlines()) - 1
    assert any(layout.negatives.values())


def test_a_fold_that_is_not_a_subset_is_refused(phantom: Path) -> None:
    with pytest.raises(ConfigError, match=r"fold 7: not a subset .* valid: 0, 1"):
        split(read_layout(phantom), 7)


@pytest.mark.parametrize("remove", ["annotations.csv", "candidates", "subsets", "one-subset"])
def test_a_broken_layout_names_what_is_missing(phantom: Path, tmp_path: Path, remove: str) -> None:
    copy = tmp_path / "copy"
    shutil.copytree(phantom, copy)
    if remove == "annotations.csv":
        (copy / "annotations.csv").unlink()
        want = "no annotations.csv"
    elif remove == "candidates":
        (copy / "candidates.csv").unlink()
        (copy / "candidates_V2.csv").unlink()
        want = "no candidates.csv or candidates_V2.csv"
    elif remove == "subsets":
        for d in copy.glob("subset*"):
            shutil.rmtree(d)
        want = r"no subset\*/\*.mhd scans"
    else:
        shutil.rmtree(copy / "subset1")
        with pytest.raises(DataError, match="needs at least two"):
            split(read_layout(copy), -1)
        return
    with pytest.raises(DataError, match=want):
        read_layout(copy)


# --------------------------------------------------------------------------- crops
def test_a_positive_crop_holds_its_whole_nodule_where_the_annotation_says(cached: tuple[Path, Path]) -> None:
    root, folder = cached
    layout = read_layout(root)
    uids = sorted(layout.scans)
    samples = samples_of(layout, uids, 1)
    source = PatchSource(layout, samples, folder, PATCH, seed=0, augment=True)
    positives = [i for i, s in enumerate(samples) if s.radius_mm > 0]
    assert len(positives) == sum(len(layout.nodules[u]) for u in uids)
    for i in positives:
        s = samples[i]
        image, boxes = source.crop(i, epoch=0)
        assert image.shape == (1, *PATCH) and image.dtype == np.float32
        assert float(image.min()) >= 0.0 and float(image.max()) <= 1.0
        vol = load_volume(folder, s.uid)
        radius = s.radius_mm / np.array(vol.spacing)
        # The nodule's own box: centre ± radius, wholly inside the crop.
        sizes = boxes[:, 3:] - boxes[:, :3]
        own = np.flatnonzero(np.all(np.abs(sizes - 2 * radius) < 1e-3, axis=1))
        assert own.size >= 1
        box = boxes[own[0]]
        assert np.all(box[:3] >= 0) and np.all(box[3:] <= np.array(PATCH))
        # Its centre is bright in the crop (a nodule is tissue, ≥ -300 HU, in air-filled lung).
        c = np.round((box[:3] + box[3:]) / 2).astype(int)
        hu = image[0, c[0], c[1], c[2]] * (HU_MAX - HU_MIN) + HU_MIN
        assert hu > -300, f"crop {i}: centre {c} is {hu:.0f} HU"


def test_crops_depend_on_seed_epoch_and_index_only(cached: tuple[Path, Path]) -> None:
    root, folder = cached
    layout = read_layout(root)
    samples = samples_of(layout, sorted(layout.scans), 1)
    a = PatchSource(layout, samples, folder, PATCH, seed=0, augment=True)
    b = PatchSource(layout, samples, folder, PATCH, seed=0, augment=True)
    assert np.array_equal(a.crop(0, 3)[0], b.crop(0, 3)[0])  # resumed or on another rank: the same crop
    assert not np.array_equal(a.crop(0, 3)[0], a.crop(0, 4)[0])  # a new epoch moves it
    val = PatchSource(layout, samples, folder, PATCH, seed=0, augment=False)
    assert np.array_equal(val.crop(0, 3)[0], val.crop(0, 4)[0])  # validation crops stay put


def test_repeats_multiply_the_nodule_crops(phantom: Path) -> None:
    layout = read_layout(phantom)
    uids = sorted(layout.scans)
    nodules = sum(len(layout.nodules[u]) for u in uids)
    samples = samples_of(layout, uids, 2, repeats=3)
    assert sum(s.radius_mm > 0 for s in samples) == 3 * nodules
    assert sum(s.radius_mm == 0 for s in samples) == 2 * 3 * nodules


def test_the_cache_keeps_the_world_geometry(cached: tuple[Path, Path]) -> None:
    root, folder = cached
    layout = read_layout(root)
    uid = sorted(layout.scans)[0]
    scan = read_scan(layout.scans[uid])
    vol = load_volume(folder, uid)
    n = layout.nodules[uid][0] if layout.nodules[uid] else None
    point = n.xyz if n else scan.origin
    ix, iy, iz = np.round(vol.voxel(point)).astype(int)
    jx, jy, jz = np.round(world_to_voxel(scan, point)).astype(int)
    assert abs(int(vol.hu[ix, iy, iz]) - float(scan.hu[jz, jy, jx])) < 150  # the same tissue at the same point


# --------------------------------------------------------------------------- options and the rule
def test_task_options_name_the_valid_keys() -> None:
    with pytest.raises(ConfigError, match=r"'flod' is not an option of task lung detection; valid: fold"):
        Options.parse("flod=1")
    with pytest.raises(ConfigError, match=r"patch='64x64' is not valid: give three positive numbers"):
        Options.parse("patch=64x64")
    with pytest.raises(ConfigError, match="at least 16 voxels"):
        Options.parse("patch=8x64x64")
    with pytest.raises(ConfigError, match="write key=value"):
        parse_options("fold", {"fold": ""}, "t")
    o = Options.parse("spacing=1x1x2, patch=64x64x32,repeats=4")
    assert o.spacing == (1.0, 1.0, 2.0) and o.patch == (64, 64, 32) and o.repeats == 4 and o.fold == -1


def test_the_trainer_loads_tasks_by_name() -> None:
    assert load_task("classify", "") is None
    with pytest.raises(ConfigError, match="the classify task takes none"):
        load_task("classify", "fold=1")
    with pytest.raises(ConfigError, match="cannot import module 'no_such_module'"):
        load_task("no_such_module:task", "")
    assert load_task("deskpod.lung.detect:luna16", "fold=0") is not None


def test_a_hit_is_a_centre_closer_than_the_radius() -> None:
    truth = torch.tensor([[10.0, 10.0, 10.0, 20.0, 20.0, 20.0]])  # centre 15, radius 5
    inside = torch.tensor([[13.0, 13.0, 13.0, 19.0, 19.0, 19.0]])  # centre 16: distance 1.7
    edge = torch.tensor([[18.0, 13.0, 13.0, 22.0, 17.0, 17.0]])  # centre (20, 15, 15): distance 5, not < 5
    assert hits(inside, truth) == (1, 0)
    assert hits(edge, truth) == (0, 1)
    assert hits(torch.cat([inside, inside]), truth) == (1, 0)  # two on one nodule count once
    assert hits(inside, torch.zeros(0, 6)) == (0, 1)
    assert hits(torch.zeros(0, 6), truth) == (0, 0)


def test_describe_counts_the_crops_of_an_epoch(phantom: Path) -> None:
    task = luna16("repeats=5,negatives=2")
    spec = task.describe(request(f"luna16:{phantom}"))
    layout = read_layout(phantom)
    train, _ = split(layout, -1)
    assert spec.train_size == sum(len(layout.nodules[u]) for u in train) * 5 * 3
    with pytest.raises(ConfigError, match="trains on luna16:PATH"):
        task.describe(request("fashion-mnist"))


def test_a_crop_without_nodules_still_gives_every_head_a_gradient() -> None:
    # DDP needs every parameter's gradient on every rank, even when no anchor matched a nodule.
    model = DetectorModel("retinanet3d-small", SPACING)
    model.train()
    loss = model(torch.rand(1, 1, *PATCH), [{"boxes": torch.zeros(0, 6), "labels": torch.zeros(0, dtype=torch.long)}])
    loss.backward()
    missing = [n for n, p in model.named_parameters() if p.requires_grad and p.grad is None]
    assert not missing, missing[:5]


def test_load_detector_refuses_what_is_not_a_detector_run(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="not a run folder"):
        load_detector(tmp_path)
    (tmp_path / "config.toml").write_text('model = "convnet"\n')
    with pytest.raises(ConfigError, match="a classify run, not a lung detector"):
        load_detector(tmp_path)


def test_scans_to_detect_a_subset_or_files_and_refuse_what_is_neither(phantom: Path) -> None:
    layout = read_layout(phantom)
    held_out = scans_to_detect(f"luna16:{phantom}", fold=-1)  # the detector's fold -1: the last subset
    assert held_out == [(uid, layout.scans[uid]) for uid in layout.uids([layout.subsets[-1]])] and held_out
    assert scans_to_detect(f"luna16:{phantom}", subset=0, fold=1) == [(u, layout.scans[u]) for u in layout.uids([0])]
    assert scans_to_detect(None, ["/x/a.nii.gz", "b.mhd"]) == [("a", Path("/x/a.nii.gz")), ("b", Path("b.mhd"))]
    for data, subset, said in [("luna:/x", None, "give a LUNA16 folder as luna16:PATH"),
                               (f"luna16:{phantom}", 9, "--subset 9: not in"),
                               (None, 0, "--subset goes with --data luna16:PATH")]:  # fmt: skip
        with pytest.raises(ConfigError, match=said):
            scans_to_detect(data, ["a.mhd"], subset=subset)
