"""Finding specific objects: track crops → sorted into classes → ``deskpod train`` → ``video search --classifier``.

The fast tests check the parts on real clips and the errors; `test_crop_train_search_loop` runs the whole loop on
vtest.avi (a street: people) and cockatoo.mp4 (a bird: HOG's person detector fires on a few bits of it). A person
would sort the crops by eye; the test stands in for them by sorting by the stream each crop came from (the manifest
says), which is the truth a person would see: street pedestrians against bits of a bird.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest

from deskpod.cli import main
from deskpod.errors import DataError, UsageError
from deskpod.train.data import DataRequest, describe, scan_classes
from deskpod.video.classify import search_classifier
from deskpod.video.crops import MANIFEST, MARGIN, CropConfig, cut, file_crops, pick, track_of, write_crops
from deskpod.video.sources import Source, read_file
from deskpod.video.store import Store, TrackRow
from tests.video.clips import clip


def test_pick_spreads_boxes_along_the_track_and_drops_small_ones() -> None:
    boxes = [[t / 5, 0, 0, 10 + t, 20 + t, 1.0] for t in range(10)]
    assert [b[0] for b in pick(boxes, 4)] == [0.0, 0.6, 1.2, 1.8]
    assert pick(boxes, 20) == boxes
    assert [b[0] for b in pick(boxes, 2, min_size=15)] == [1.0, 1.8]  # shorter side (width) 15 and up
    assert pick(boxes, 3, min_size=100) == []


def test_cut_keeps_a_margin_and_clips_at_the_edges() -> None:
    image = np.arange(100 * 80 * 3, dtype=np.uint8).reshape(100, 80, 3)
    inside = cut(image, (20, 30, 40, 70))
    assert inside is not None and inside.shape == (48, 24, 3)  # 40 + 2*4 tall, 20 + 2*2 wide
    np.testing.assert_array_equal(inside, image[26:74, 18:42])
    edge = cut(image, (-10, -10, 10, 10))
    assert edge is not None and edge.shape == (12, 12, 3)
    assert cut(image, (200, 200, 220, 220)) is None


def test_file_crops_cut_the_frames_the_indexer_saw() -> None:
    """Boxes at the sampled frames' times (as `read_file` stamps them) are cut out of exactly those frames."""
    path = clip("carphone")
    source = Source(path.name, str(path), live=False)
    frames = list(read_file(source, fps=5))
    box = [30.0, 20.0, 90.0, 100.0]
    wanted = {7: [[f.pts, *box, 1.0] for f in frames[1:4]], 9: [[frames[-1].pts, *box, 1.0]]}
    got = dict(file_crops(source, wanted))
    assert sorted(got) == [7, 9] and len(got[7]) == 3 and len(got[9]) == 1
    for crop, frame in zip([*got[7], *got[9]], [*frames[1:4], frames[-1]], strict=True):
        expected = cut(frame.image, box, MARGIN)
        assert crop.t == frame.pts and expected is not None
        np.testing.assert_array_equal(crop.image, expected)


def test_unsorted_is_not_a_class_and_an_empty_class_folder_is_an_error(tmp_path: Path) -> None:
    import cv2

    image = np.full((40, 30, 3), 128, np.uint8)
    for folder in ("unsorted", "a", "b"):
        (tmp_path / folder).mkdir()
    for i in range(3):
        cv2.imwrite(str(tmp_path / "unsorted" / f"t{i:06d}-0.jpg"), image)
        cv2.imwrite(str(tmp_path / "a" / f"t{i + 10:06d}-0.jpg"), image)
    assert scan_classes(tmp_path)[0] == ["a", "b"]
    req = DataRequest(f"imagefolder:{tmp_path}", 2, 0, 28, 0.25, 0, 0)
    with pytest.raises(DataError, match="class folder\\(s\\) b hold no images"):
        describe(req)
    cv2.imwrite(str(tmp_path / "b" / "x.jpg"), image)
    assert describe(req).class_names == ("a", "b")
    assert track_of("t000012-3.jpg") == 12 and track_of("x.jpg") is None


def small_db(tmp_path: Path) -> Path:
    """A database with one person track of cockatoo.mp4 (a real clip) at a known box."""
    db = tmp_path / "db.sqlite"
    path = clip("cockatoo")
    with Store(db) as store:
        store.resume(path.name, str(path), live=False)
        with store.transaction():
            boxes = [[4.8, 125.0, 192.5, 247.5, 436.2, 0.9], [5.0, 130.0, 190.0, 250.0, 430.0, 0.8]]
            store.new_track(TrackRow(0, path.name, "person", 4.8, 5.0, boxes, "", None))
        store.finish(path.name)
    return db


def tiny_model(repo: Path, labels: tuple[str, ...] = ("bird", "street")) -> Path:
    """A real (untrained) two-class image model, exported as ``deskpod export`` writes one."""
    import torch

    from deskpod.serve.export import ExportOptions, export_model

    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.AdaptiveAvgPool2d(1), torch.nn.Flatten(), torch.nn.Linear(3, len(labels)))
    export_model(net, (3, 16, 16), ExportOptions(repo=repo, name="tiny"), class_names=labels)
    return repo / "tiny"


def test_crops_cli_writes_unsorted_class_folders_and_a_manifest(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    db, out = small_db(tmp_path), tmp_path / "crops"
    assert main(["video", "crops", str(db), "--out", str(out), "--classes", "bird,street"]) == 0
    assert "2 crops of 1 tracks" in capsys.readouterr().out
    assert sorted(p.name for p in out.iterdir()) == ["bird", MANIFEST, "street", "unsorted"]
    names = sorted(p.name for p in (out / "unsorted").iterdir())
    assert names == ["t000001-0.jpg", "t000001-1.jpg"]
    manifest = json.loads((out / MANIFEST).read_text())["crops"]
    assert manifest["t000001-0.jpg"]["track"] == 1 and manifest["t000001-0.jpg"]["stream"] == "cockatoo.mp4"
    # Sorted crops stay where the user put them: a rerun writes nothing again.
    shutil.move(out / "unsorted" / names[0], out / "bird" / names[0])
    r = write_crops(db, out, CropConfig())
    assert (r.written, r.existing) == (0, 2) and not (out / "unsorted" / names[0]).exists()
    # --min-size above every box: nothing to cut
    assert write_crops(db, tmp_path / "big", CropConfig(min_size=1000)).too_small == 1


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--label", "car"], "--label car: "),
        (["--classes", "a,.b"], "'.b' is not a class folder name"),
        (["--classes", "a,a"], "a class is named twice"),
        (["--per-track", "0"], "--per-track 0: give a positive number"),
        (["--min-size", "-1"], "--min-size -1"),
    ],
)
def test_crops_bad_input_is_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], argv: list[str], message: str
) -> None:
    db = small_db(tmp_path)
    assert main(["video", "crops", str(db), "--out", str(tmp_path / "out"), *argv]) == 2
    err = capsys.readouterr().err.strip()
    assert message in err, err
    if argv[0] == "--label":
        assert "(its labels: person)" in err
    assert len(err.splitlines()) == 1


def test_search_classifier_errors(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    db, model = small_db(tmp_path), tiny_model(tmp_path / "models")

    def fails(*argv: str) -> str:
        assert main(["video", "search", "--db", str(db), *argv]) == 2
        err = capsys.readouterr().err.strip()
        assert len(err.splitlines()) == 1, err
        return err

    assert "its labels are bird, street" in fails("--classifier", str(model), "--label", "cat")
    run = tmp_path / "runs" / "fresh"
    (run / "checkpoints").mkdir(parents=True)
    (run / "launch.json").write_text("{}")
    assert "the run has no checkpoint yet; train it first" in fails("--classifier", str(run), "--label", "bird")
    assert "not a training run folder" in fails("--classifier", str(tmp_path), "--label", "bird")
    assert "--classifier needs --label" in fails("--classifier", str(model))
    assert "go with --classifier" in fails("--face", str(tmp_path / "x.jpg"), "--label", "bird")
    with pytest.raises(UsageError, match="--min-score 2"):
        search_classifier(db, model, "bird", min_score=2)


def test_search_classifier_runs_the_crops_through_the_model(tmp_path: Path) -> None:
    """The tiny model's scores for a track are the mean softmax of its crops, as the model gives them."""
    db, model = small_db(tmp_path), tiny_model(tmp_path / "models")
    found = search_classifier(db, tmp_path / "models", "bird", min_score=0.0)  # a one-model repository
    assert len(found) == 1 and found[0].crops == 2 and 0.0 < found[0].score < 1.0
    other = search_classifier(db, model, "street", min_score=0.0)
    assert other[0].score == pytest.approx(1 - found[0].score, abs=1e-5)
    assert search_classifier(db, model, "bird", min_score=max(found[0].score, other[0].score) + 1e-3) == []


# --------------------------------------------------------------------------- the whole loop on the real clips
TRAIN_TOML = """
model = "convnet"
image_size = 28          # the convnet's 7x7 pooling exports to ONNX from 28x28
batch_size = 16
steps = 100
devices = "1"
loader_workers = 0
val_fraction = 0.2
checkpoint_every_minutes = 0.0
"""
STREET_SAMPLE = 8
"""The stand-in sorter files every 8th street crop (and every bird crop), leaving the rest in unsorted/."""


@pytest.mark.slow
def test_crop_train_search_loop(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    vtest, cockatoo = clip("vtest"), clip("cockatoo")
    db, out, runs = tmp_path / "db.sqlite", tmp_path / "crops", tmp_path / "runs"
    assert main(["video", "index", str(vtest), str(cockatoo), "--db", str(db), "--detect", "hog-people"]) == 0
    assert main(["video", "crops", str(db), "--out", str(out), "--classes", "street,bird"]) == 0

    # The stand-in for a person sorting by eye: by the stream each crop came from.
    manifest = json.loads((out / MANIFEST).read_text())["crops"]
    streams = {c["track"]: c["stream"] for c in manifest.values()}
    bird_tracks = {t for t, s in streams.items() if s == cockatoo.name}
    street_names = sorted(n for n, c in manifest.items() if c["stream"] == vtest.name)
    assert bird_tracks and len(street_names) > 100
    sorted_street = street_names[::STREET_SAMPLE]
    for name in sorted_street:
        shutil.move(out / "unsorted" / name, out / "street" / name)
    for name, c in manifest.items():
        if c["stream"] == cockatoo.name:
            shutil.move(out / "unsorted" / name, out / "bird" / name)
    trained_tracks = {manifest[n]["track"] for n in sorted_street}

    (tmp_path / "run.toml").write_text(TRAIN_TOML)
    train = ["train", "--config", str(tmp_path / "run.toml"), "--data", f"imagefolder:{out}", "--out", str(runs)]
    assert main([*train, "--name", "crops", "--quiet"]) == 0
    run = runs / "crops"
    assert json.loads((run / "summary.json").read_text())["data_spec"]["class_names"] == ["bird", "street"]
    capsys.readouterr()

    # Every track, ranked by the classifier's probability of "bird".
    ranked = search_classifier(db, run, "bird", top=10_000, min_score=0.0)
    assert len(ranked) == len(streams)
    k = len(bird_tracks)
    precision_at_k = sum(r.track in bird_tracks for r in ranked[:k]) / k
    assert precision_at_k == 1.0, [(r.track, r.stream, round(r.score, 3)) for r in ranked[: k + 3]]
    # The street tracks it never saw in training rank below every bird track too.
    unseen = [i for i, r in enumerate(ranked) if r.stream == vtest.name and r.track not in trained_tracks]
    assert len(unseen) > 50 and min(unseen) >= k

    # The CLI, with the default --min-score: the street label finds street tracks, best first, from the same export.
    assert main(["video", "search", "--classifier", str(run), "--label", "street", "--db", str(db), "--top", "20",
                 "--json"]) == 0  # fmt: skip
    street = json.loads(capsys.readouterr().out)
    assert len(street) == 20 and {s["stream"] for s in street} == {vtest.name}
    assert [s["score"] for s in street] == sorted((s["score"] for s in street), reverse=True)
    assert street[-1]["score"] >= 0.5
    models = db.with_name(db.name + ".models") / "crops"
    assert [p.name for p in models.iterdir() if p.is_dir()] == ["1"]  # exported once, reused
