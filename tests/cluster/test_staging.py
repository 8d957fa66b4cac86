"""Data staging on real files: checksummed copies, one copy for concurrent stagers, leases, LRU eviction."""

from __future__ import annotations

import hashlib
import json
import multiprocessing as mp
import os
import subprocess
from pathlib import Path
from typing import Any

import pytest

from deskpod.cluster.staging import (
    Lease,
    StagedSources,
    release,
    resolve_data_path,
    rewrite_data,
    stage,
    staged_list,
    verify,
)
from deskpod.cluster.staging import (
    evict as evict_copies,
)
from deskpod.errors import ConfigError, DataError

FMNIST = Path(os.environ.get("DESKPOD_FASHION_MNIST", "/usr/share/datasets/fashion-mnist"))


def make_folder(root: Path, tag: str = "", size: int = 300) -> Path:
    """An image-folder-shaped dataset: two classes with files, one empty class folder, a nested folder."""
    for rel in ("cats/1.png", "cats/2.png", "dogs/deep/3.png"):
        p = root / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        body = (f"{tag}{rel}".encode() * size)[: size // 3]
        p.write_bytes(body)
    (root / "empty_class").mkdir(exist_ok=True)
    return root


def make_blob(path: Path, size: int) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(hashlib.sha256(path.name.encode()).digest() * (size // 32) + b"x" * (size % 32))
    return path


def dead_pid() -> int:
    proc = subprocess.Popen(["true"])
    proc.wait()
    return proc.pid


def files_of(root: Path) -> dict[str, bytes]:
    return {p.relative_to(root).as_posix(): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


# --------------------------------------------------------------------------- copying
def test_a_folder_is_copied_with_checksums_and_a_hit_copies_nothing(tmp_path: Path) -> None:
    src = make_folder(tmp_path / "photos")
    scratch = tmp_path / "scratch"
    first = stage(src, scratch)
    assert first.copied and first.path == scratch / first.key / "data" and first.key.startswith("photos-")
    assert files_of(first.path) == files_of(src)
    assert (first.path / "empty_class").is_dir()  # a class folder without images still counts as a class
    assert first.size == sum(len(b) for b in files_of(src).values())
    manifest = json.loads((first.root / "manifest.json").read_text())
    assert {rel: digest for rel, _, _, digest in manifest["files"]} == {
        rel: hashlib.sha256(body).hexdigest() for rel, body in files_of(src).items()
    }
    assert not os.stat(first.path / "cats/1.png").st_mode & 0o222  # read-only: no job changes what others read
    assert verify(first) == []

    info_inode = (first.root / "info.json").stat().st_ino
    again = stage(src, scratch)
    assert not again.copied and again.key == first.key and again.path == first.path
    assert (first.root / "info.json").stat().st_ino == info_inode
    assert [c.key for c in staged_list(scratch)] == [first.key]


def test_a_single_file_is_staged_under_its_own_name(tmp_path: Path) -> None:
    blob = make_blob(tmp_path / "src" / "train-images-idx3-ubyte.gz", 5000)
    got = stage(blob, tmp_path / "scratch")
    assert got.path.name == blob.name and got.path.read_bytes() == blob.read_bytes()
    assert staged_list(tmp_path / "scratch")[0].path == got.path


def _stage_in_child(src: str, scratch: str, barrier: Any, out: Any, n: int) -> None:
    barrier.wait()
    got = stage(Path(src), Path(scratch), lease=f"rank{n}")
    out.put((got.copied, got.key, (got.root / "info.json").stat().st_ino))


def test_concurrent_stagers_of_one_source_copy_it_once(tmp_path: Path) -> None:
    src = make_folder(tmp_path / "photos", size=30_000)
    for i in range(40):  # enough files that the copy is still running when the others ask for it
        make_blob(src / "more" / f"{i}.bin", 20_000)
    ctx = mp.get_context("spawn")
    barrier, out = ctx.Barrier(3), ctx.Queue()
    procs = [
        ctx.Process(target=_stage_in_child, args=(str(src), str(tmp_path / "s"), barrier, out, n)) for n in range(3)
    ]
    for p in procs:
        p.start()
    for p in procs:
        p.join(timeout=120)
    assert [p.exitcode for p in procs] == [0, 0, 0]  # a stager that failed shows here, not as a wait
    results = [out.get(timeout=10) for _ in procs]
    assert sorted(r[0] for r in results) == [False, False, True]  # one copied, two waited and reused it
    assert len({(r[1], r[2]) for r in results}) == 1
    assert [c.key for c in staged_list(tmp_path / "s")] == [results[0][1]]
    assert not [p for p in (tmp_path / "s").iterdir() if p.name.startswith(".tmp-")]


# --------------------------------------------------------------------------- trust
def test_verify_finds_a_flipped_byte_and_stage_with_verify_repairs_it(tmp_path: Path) -> None:
    src = make_folder(tmp_path / "photos")
    got = stage(src, tmp_path / "scratch")
    bad = got.path / "dogs/deep/3.png"
    bad.chmod(0o644)
    body = bytearray(bad.read_bytes())
    body[7] ^= 0x01
    bad.write_bytes(bytes(body))
    (got.path / "cats" / "stray.txt").write_text("not in the source")
    (got.path / "empty_class").rmdir()
    assert verify(got) == ["cats/stray.txt", "dogs/deep/3.png", "empty_class"]

    assert stage(src, tmp_path / "scratch").repaired == ()  # without verify, a hit is trusted as it is
    fixed = stage(src, tmp_path / "scratch", verify=True)
    assert not fixed.copied and fixed.repaired == ("cats/stray.txt", "dogs/deep/3.png", "empty_class")
    assert verify(fixed) == [] and files_of(fixed.path) == files_of(src)


def test_a_changed_source_gets_a_new_key_and_a_new_copy(tmp_path: Path) -> None:
    src = make_folder(tmp_path / "photos")
    scratch = tmp_path / "scratch"
    keys = [stage(src, scratch).key]
    (src / "cats/1.png").write_bytes(b"longer than before" * 100)  # size changes
    keys.append(stage(src, scratch).key)
    st = (src / "cats/2.png").stat()
    os.utime(src / "cats/2.png", ns=(st.st_atime_ns, st.st_mtime_ns + 1_000_000))  # only the mtime changes
    keys.append(stage(src, scratch).key)
    (src / "cats/4.png").write_bytes(b"new")  # a file added
    keys.append(stage(src, scratch).key)
    (src / "dogs/new_empty").mkdir()  # even an empty folder (an imagefolder class) matters
    newest = stage(src, scratch)
    keys.append(newest.key)
    assert len(set(keys)) == 5 and newest.copied
    assert files_of(newest.path) == files_of(src)


# --------------------------------------------------------------------------- room
def test_eviction_takes_the_least_recently_used_copy(tmp_path: Path) -> None:
    scratch = tmp_path / "scratch"
    a, b, c, d = (make_blob(tmp_path / "src" / f"{n}.bin", 1000) for n in "abcd")
    ka, kb, kc = (stage(p, scratch, limit_bytes=3500).key for p in (a, b, c))
    stage(a, scratch, limit_bytes=3500)  # a hit: a is now the most recently used
    assert [x.key for x in staged_list(scratch)] == [kb, kc, ka]
    kd = stage(d, scratch, limit_bytes=3500).key
    assert [x.key for x in staged_list(scratch)] == [kc, ka, kd]  # b, the least recently used, made room
    assert not (scratch / kb).exists()

    kb2 = stage(b, scratch, limit_bytes=2500).key  # a smaller limit: the two oldest go
    assert kb2 == kb and [x.key for x in staged_list(scratch)] == [kd, kb]


def test_a_leased_copy_is_not_evicted_until_released(tmp_path: Path) -> None:
    scratch = tmp_path / "scratch"
    a, b, c = (make_blob(tmp_path / "src" / f"{n}.bin", 1000) for n in "abc")
    held = stage(a, scratch, lease="job-17")
    stage(b, scratch)
    assert staged_list(scratch)[0].leases == (Lease("job-17", os.getpid()),)
    kc = stage(c, scratch, limit_bytes=2000).key
    assert [x.key for x in staged_list(scratch)] == [held.key, kc]  # a is older but leased: b went

    with pytest.raises(DataError, match=r"does not fit in .*1000 bytes are held by copies in use"):
        stage(b, scratch, limit_bytes=1500, lease="job-18")
    assert [x.key for x in staged_list(scratch)] == [held.key, kc]  # nothing evicted for a copy that cannot fit

    release(held)
    assert staged_list(scratch)[-1].key == held.key and staged_list(scratch)[-1].leases == ()
    assert evict_copies(scratch, 0) == [kc, held.key]
    assert staged_list(scratch) == []


def test_a_lease_whose_process_died_holds_nothing(tmp_path: Path) -> None:
    scratch = tmp_path / "scratch"
    holder = subprocess.Popen(["sleep", "60"])
    try:
        got = stage(make_blob(tmp_path / "a.bin", 100), scratch, lease="4242", lease_pid=holder.pid)
        assert staged_list(scratch)[0].leases == (Lease("4242", holder.pid),)
        assert evict_copies(scratch, 0) == []
    finally:
        holder.kill()
        holder.wait()
    assert staged_list(scratch)[0].leases == ()
    assert evict_copies(scratch, 0) == [got.key]


def test_a_dataset_larger_than_the_limit_is_refused_by_name(tmp_path: Path) -> None:
    scratch = tmp_path / "scratch"
    small = stage(make_blob(tmp_path / "small.bin", 100), scratch).key
    with pytest.raises(DataError, match=r"big.bin' \(2.0 KiB\) is larger than the staging limit of 1000 bytes"):
        stage(make_blob(tmp_path / "big.bin", 2048), scratch, limit_bytes=1000)
    assert [x.key for x in staged_list(scratch)] == [small]


def test_an_interrupted_copy_is_cleaned_up_and_never_used(tmp_path: Path) -> None:
    src = make_folder(tmp_path / "photos")
    scratch = tmp_path / "scratch"
    key = stage(src, scratch).key
    assert evict_copies(scratch, 0) == [key]
    pid = dead_pid()
    half = scratch / f".tmp-{key}-{pid}"  # what a stager killed mid-copy leaves
    (half / "data" / "cats").mkdir(parents=True)
    (half / "data" / "cats" / "1.png").write_bytes(b"half")
    (half / "owner.json").write_text(json.dumps({"pid": pid, "start": 1, "bytes": 300}))
    gone = scratch / f".evict-other-1-{pid}"
    gone.mkdir()
    live = scratch / f".tmp-other-{os.getpid()}"  # a copy in progress by a live process stays
    live.mkdir()
    got = stage(src, scratch)
    assert got.copied and files_of(got.path) == files_of(src)
    assert not half.exists() and not gone.exists() and live.exists()

    evict_copies(scratch, 0)
    (scratch / key / "data").mkdir(parents=True)  # a folder under the key that `stage` did not finish
    (scratch / key / "data" / "junk").write_text("x")
    assert staged_list(scratch) == []
    got = stage(src, scratch)
    assert got.copied and files_of(got.path) == files_of(src)


# --------------------------------------------------------------------------- bad input
def test_bad_input_is_named(tmp_path: Path) -> None:
    src = make_folder(tmp_path / "photos")
    a_file = make_blob(tmp_path / "plain", 10)
    cases: list[tuple[dict[str, Any], type[Exception], str]] = [
        ({"source": tmp_path / "nope"}, DataError, f"dataset '{tmp_path / 'nope'}' to stage does not exist"),
        ({"scratch": a_file / "scratch"}, ConfigError, f"scratch folder '{a_file / 'scratch'}' is not writable"),
        ({"scratch": a_file}, ConfigError, f"scratch folder '{a_file}' is not a folder"),
        ({"scratch": src / "cache"}, ConfigError, "overlap: keep them apart"),
        ({"limit_bytes": 0}, ConfigError, "staging limit 0 bytes is not valid: give a positive number"),
        ({"limit_bytes": -5}, ConfigError, "staging limit -5 bytes is not valid"),
        ({"lease": "../etc"}, ConfigError, "lease name '../etc' is not valid"),
        ({"lease": "j1", "lease_pid": dead_pid()}, ConfigError, "is not a running process"),
    ]
    for kwargs, kind, message in cases:
        args = {"source": src, "scratch": tmp_path / "scratch", **kwargs}
        with pytest.raises(kind) as info:
            stage(args.pop("source"), args.pop("scratch"), **args)
        assert message in str(info.value) and "\n" not in str(info.value), (kwargs, str(info.value))
    with pytest.raises(ConfigError, match="eviction limit -1 bytes is not valid"):
        evict_copies(tmp_path / "scratch", -1)
    with pytest.raises(ConfigError, match="does not exist"):
        evict_copies(tmp_path / "no-scratch", 0)


# --------------------------------------------------------------------------- deskpod's data names
def test_data_names_map_to_what_is_staged_and_back(tmp_path: Path) -> None:
    assert resolve_data_path("synthetic:3x32x32") is None and resolve_data_path("synthetic") is None
    assert resolve_data_path("fashion-mnist", {"DESKPOD_FASHION_MNIST": "/data/fm"}) == Path("/data/fm")
    assert resolve_data_path("imagefolder:~/photos") == Path.home() / "photos"
    for bad, message in (("cifar10", "unknown dataset 'cifar10'"), ("fashion-mnist:x", "unknown dataset"),
                         ("imagefolder:", "imagefolder path '' is empty")):  # fmt: skip
        with pytest.raises(DataError, match=message):
            resolve_data_path(bad)
    staged = tmp_path / "scratch/k/data"
    assert rewrite_data("imagefolder:/shared/photos", staged) == (f"imagefolder:{staged}", {})
    assert rewrite_data("fashion-mnist", staged) == ("fashion-mnist", {"DESKPOD_FASHION_MNIST": str(staged)})
    assert rewrite_data("synthetic:3x8x8", staged) == ("synthetic:3x8x8", {})


def test_a_staged_image_folder_reads_like_its_source(tmp_path: Path) -> None:
    from deskpod.train.data import DataRequest, describe

    src = make_folder(tmp_path / "photos")
    (src / "empty_class").rmdir()  # an image folder refuses a class with no images (`describe`)
    for i in range(8):
        (src / "dogs" / f"{i}.jpg").write_bytes(b"jpeg")
    data = f"imagefolder:{src}"
    got = stage(resolve_data_path(data) or Path("/"), tmp_path / "scratch")
    staged_data, env = rewrite_data(data, got.path)
    req = DataRequest(data, 10, 64, 32, 0.25, 0, 0)
    before, after = describe(req), describe(DataRequest(staged_data, 10, 64, 32, 0.25, 0, 0))
    assert env == {} and after.name == f"imagefolder:{got.path}"
    assert (after.num_classes, after.class_names, after.train_size, after.val_size) == (
        before.num_classes, before.class_names, before.train_size, before.val_size,
    )  # fmt: skip


@pytest.mark.skipif(not (FMNIST / "train-labels-idx1-ubyte.gz").exists(), reason="Fashion-MNIST is not installed")
def test_staged_fashion_mnist_is_found_through_its_variable(tmp_path: Path) -> None:
    from deskpod.environment import Environment
    from deskpod.train.data import fashion_mnist_files, read_idx

    src = resolve_data_path("fashion-mnist", {"DESKPOD_FASHION_MNIST": str(FMNIST)})
    assert src == FMNIST
    got = stage(src, tmp_path / "scratch", lease="fm")
    data, env = rewrite_data("fashion-mnist", got.path)
    root = Environment.read(env).fashion_mnist_dir
    assert data == "fashion-mnist" and root == got.path
    labels = read_idx(fashion_mnist_files(root)["test_labels"])
    assert labels.shape == (10_000,) and labels.equal(read_idx(fashion_mnist_files(FMNIST)["test_labels"]))
    release(got)


def test_a_clusters_status_lists_what_its_scratch_has_staged_cached_a_few_seconds(tmp_path: Path) -> None:
    scratch = tmp_path / "scratch"
    assert StagedSources(scratch).sources() == []  # no scratch folder yet: nothing staged
    src = make_folder(tmp_path / "imagenet")
    stage(src, scratch)
    view = StagedSources(scratch, ttl=3600.0)
    assert view.sources() == [str(src.resolve())]
    second = make_folder(tmp_path / "coco", "c")
    stage(second, scratch)
    assert view.sources() == [str(src.resolve())]  # read again only once the ttl is over
    assert StagedSources(scratch, ttl=0.0).sources() == sorted([str(src.resolve()), str(second.resolve())])
    (scratch / "not-a-copy").mkdir()  # a folder without info.json is not a staged copy
    stage(src, scratch)  # a hit: still listed once
    assert StagedSources(scratch, ttl=0.0).sources() == sorted([str(src.resolve()), str(second.resolve())])
    evict_copies(scratch, 0)
    assert StagedSources(scratch, ttl=0.0).sources() == []
