"""The face index (`deskpod.video.vectors.FaceIndex`): exact while small, IVF with high recall once large,
saved and loaded whole, and one clear error for each kind of bad input."""

from __future__ import annotations

from pathlib import Path

import faiss
import numpy as np
import pytest

from deskpod.errors import DataError, UsageError
from deskpod.video import vectors
from deskpod.video.vectors import FaceIndex, nlist_for, nprobe_for


def faces(n: int, people: int, seed: int = 0, sightings: int = 0, dim: int = 128) -> np.ndarray:
    """``n`` face-like vectors: ``people`` identities (drawn by ``seed``), each seen many times with noise, as the
    tracks of one person are; another ``sightings`` seed gives new sightings of the same people."""
    centres = np.random.default_rng(seed).standard_normal((people, dim))
    centres /= np.linalg.norm(centres, axis=1, keepdims=True)
    rng = np.random.default_rng([seed, sightings])
    noise = rng.standard_normal((n, dim)) * (0.35 / np.sqrt(dim))
    out = centres[rng.integers(0, people, n)] + noise
    return (out / np.linalg.norm(out, axis=1, keepdims=True)).astype(np.float32)


def exact_top(base: np.ndarray, ids: np.ndarray, q: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    sims = base @ q
    order = np.argsort(-sims, kind="stable")[:k]
    return ids[order], sims[order]


def test_exact_below_the_threshold_matches_brute_force() -> None:
    rng = np.random.default_rng(1)
    raw = rng.standard_normal((2000, 128)) * 3.0  # not normalised: the index normalises
    ids = rng.permutation(10_000)[:2000].astype(np.int64)
    index = FaceIndex()
    index.add(ids[:1500], raw[:1500])
    index.add(ids[1500:], raw[1500:])
    assert len(index) == 2000 and index.exact
    base = raw / np.linalg.norm(raw, axis=1, keepdims=True)
    for q in raw[:20] * 0.5 + rng.standard_normal((20, 128)):
        got = index.search(q, 10)
        want_ids, want_sims = exact_top(base, ids, q / np.linalg.norm(q), 10)
        assert [i for i, _ in got] == want_ids.tolist()
        np.testing.assert_allclose([s for _, s in got], want_sims, atol=1e-5)
    # the vector itself is its own best match, similarity 1
    best_id, best_sim = index.search(raw[7], 1)[0]
    assert best_id == ids[7] and best_sim == pytest.approx(1.0, abs=1e-5)


def test_fewer_results_than_k_and_empty_index() -> None:
    index = FaceIndex(dim=4)
    assert index.search(np.ones(4), 5) == []
    index.add(np.array([3, 9]), np.eye(4)[:2])
    got = index.search(np.array([[1.0, 0.1, 0, 0]]), 5)
    assert [i for i, _ in got] == [3, 9]
    assert got[0][1] > got[1][1]


def test_approximate_index_recall_against_exact(monkeypatch: pytest.MonkeyPatch) -> None:
    """Crossing the threshold trains an IVF index; its top 10 agree with exact search (recall@10 >= 0.95), and it
    is trained again when it has grown enough to want twice the cells."""
    monkeypatch.setattr(vectors, "EXACT_BELOW", 20_000)
    base = faces(70_000, people=3000, seed=2, dim=32)  # 32-d: the same mechanics as 128-d, in a quarter of the time
    ids = np.arange(70_000, dtype=np.int64) * 7 + 5
    index = FaceIndex(dim=32)
    index.add(ids[:19_000], base[:19_000])
    assert index.exact
    index.add(ids[19_000:30_000], base[19_000:30_000])
    assert not index.exact and index._index.nlist == nlist_for(30_000) == 256
    index.add(ids[30_000:], base[30_000:])  # 70,000 wants 512 cells: trained again
    assert index._index.nlist == 512 and index._index.nprobe == nprobe_for(512) and len(index) == 70_000

    exact = faiss.IndexFlatIP(32)
    exact.add(base)
    queries = faces(200, people=3000, seed=2, sightings=1, dim=32)  # the same people, seen again
    _, want = exact.search(queries, 10)
    hits = 0
    for q, w in zip(queries, want, strict=True):
        got = {i for i, _ in index.search(q, 10)}
        hits += len(got & set(ids[w].tolist()))
    assert hits / (10 * len(queries)) >= 0.95


def test_save_load_round_trip(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    small = FaceIndex(dim=16)
    rng = np.random.default_rng(3)
    data = rng.standard_normal((50, 16))
    small.add(np.arange(50) + 100, data)
    small.save(tmp_path / "small.faiss")
    again = FaceIndex.load(tmp_path / "small.faiss")
    assert again.dim == 16 and len(again) == 50 and again.exact
    assert again.search(data[4], 3) == small.search(data[4], 3)
    with pytest.raises(UsageError, match="id 120 is already in the index"):
        again.add(np.array([120]), data[:1])
    assert not list(tmp_path.glob(".*.tmp"))

    monkeypatch.setattr(vectors, "EXACT_BELOW", 5000)
    big = FaceIndex()
    base = faces(8000, people=400, seed=4)
    big.add(np.arange(8000), base)
    assert not big.exact
    big.save(tmp_path / "big.faiss")
    loaded = FaceIndex.load(tmp_path / "big.faiss")
    assert not loaded.exact and len(loaded) == 8000
    for q in base[:10]:
        assert loaded.search(q, 10) == big.search(q, 10)
    loaded.add(np.array([8000]), base[:1])
    assert len(loaded) == 8001


def test_bad_dims_and_ids_are_usage_errors() -> None:
    with pytest.raises(UsageError, match=r"dim must be a positive integer .* not 0"):
        FaceIndex(dim=0)
    index = FaceIndex()
    ok = np.ones((2, 128))
    with pytest.raises(UsageError, match=r"vectors must have shape \(n, 128\), not \(2, 64\)"):
        index.add(np.array([1, 2]), np.ones((2, 64)))
    with pytest.raises(UsageError, match="2 ids for 3 vectors"):
        index.add(np.array([1, 2]), np.ones((3, 128)))
    with pytest.raises(UsageError, match="ids must be >= 0"):
        index.add(np.array([1, -1]), ok)
    with pytest.raises(UsageError, match="ids must be integers"):
        index.add(np.array([1.5, 2.0]), ok)
    with pytest.raises(UsageError, match="id 4 given twice"):
        index.add(np.array([4, 4]), ok)
    with pytest.raises(UsageError, match="row 1 is all zeros"):
        index.add(np.array([1, 2]), np.vstack([np.ones(128), np.zeros(128)]))
    with pytest.raises(UsageError, match="NaN or infinite"):
        index.add(np.array([1, 2]), np.vstack([np.ones(128), np.full(128, np.nan)]))
    assert len(index) == 0  # nothing half-added
    index.add(np.array([1, 2]), ok)
    with pytest.raises(UsageError, match=r"query must have shape \(n, 128\), not \(1, 3\)"):
        index.search(np.ones(3), 5)
    with pytest.raises(UsageError, match="k must be a positive integer"):
        index.search(np.ones(128), 0)
    with pytest.raises(UsageError, match="one vector of 128 values"):
        index.search(np.ones((2, 128)), 5)


def test_load_refuses_what_is_not_a_face_index(tmp_path: Path) -> None:
    with pytest.raises(DataError, match="cannot read it"):
        FaceIndex.load(tmp_path / "missing.faiss")
    (tmp_path / "junk.faiss").write_bytes(b"not faiss at all")
    with pytest.raises(DataError, match="not a FAISS index"):
        FaceIndex.load(tmp_path / "junk.faiss")
    faiss.write_index(faiss.IndexFlatL2(8), str(tmp_path / "l2.faiss"))
    with pytest.raises(DataError, match="IndexFlatL2, not the inner-product"):
        FaceIndex.load(tmp_path / "l2.faiss")
