"""The face index: which stored tracks have a face like this one, best first, at millions of faces.

Vectors are face embeddings (dlib's 128-d ResNet descriptors), each under an ``int64`` id — the track's id in the
video store. They are L2-normalised on the way in, query included, so the inner product FAISS ranks by is the
cosine similarity that `search` returns (dlib's own threshold, Euclidean 0.6 between raw descriptors of norm ~1,
is about cosine 0.82).

Two layouts, switched by size (measured in ``benchmarks/bench_video_search.py``, figures in docs/benchmarks.md):

- below `EXACT_BELOW` vectors, ``IndexIDMap(IndexFlatIP)``: every vector compared, exact; its cost grows with the
  vectors (a query over 100,000 took 24 ms at the median on the shared 2-core box, against 3 ms for IVF at 1M), so
  the index stops being exact at 50,000;
- from `EXACT_BELOW` up, ``IndexIVFFlat`` (inner product): k-means cells, `nlist_for` of them, and a query visits
  the `nprobe_for` cells nearest it. The vectors are kept whole (no quantisation), so a found face's similarity is
  exact and only a face in an unvisited cell can be missed. It is trained from the vectors it holds when it
  first crosses the threshold, and trained again from all of them each time the number of cells it should have
  doubles (about 4x the vectors), so the cells follow the faces as the index grows.

HNSW was the other candidate. At 1,000,000 face-like vectors (2026-12-04, same run as IVF) it took 364 s to build
(IVF: 33 s, training included) and reached recall@10 of only 0.43, 0.59 and 0.74 at efSearch 32, 64 and 128 (p95
4.5, 8.6 and 14.5 ms): dlib's descriptors lie in a narrow cone where many faces are nearly tied, which a graph walk
handles badly and scanning whole cells does not.

A saved index is one FAISS file (``faiss.serialize_index``) written whole or not at all.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import faiss
import numpy as np

from deskpod.environment.files import write_bytes
from deskpod.errors import DataError, UsageError

EXACT_BELOW = 50_000
"""Vectors below which the index is exact (IndexFlatIP); from here on it is IVF (see the module docstring)."""

TRAIN_PER_CELL = 64
"""k-means training samples per cell (FAISS warns under 39): 64 keeps the retraining at 1M vectors to seconds."""

MIN_NPROBE = 16
"""Cells a query visits at the least; `nprobe_for` raises it with the number of cells."""


def nlist_for(n: int) -> int:
    """Cells of an IVF index over ``n`` vectors: the power of two at or above sqrt(n) (512 at 100,000, 1024 at 1M),
    FAISS's rule of thumb of O(sqrt(n)) cells, as a power of two so that it changes only when n grows ~4x."""
    return 1 << max(0, math.ceil(math.log2(math.sqrt(max(n, 1)))))


def nprobe_for(nlist: int) -> int:
    """Cells a query visits: 3/16 of them, at least `MIN_NPROBE` (192 of 1024 at 1M). Measured at 1M face-like
    vectors (benchmarks/bench_video_search.py, 2026-12-04, idle box): recall@10 0.91 at 1/16, 0.9498 at 1/8 (just
    under the 0.95 aimed at), 0.98 at 1/4, the time per query doubling with each step (p95 3.2, 5.7, 11.4 ms)."""
    return min(nlist, max(MIN_NPROBE, nlist * 3 // 16))


class FaceIndex:
    """Face vectors under track ids, searched by cosine similarity; exact while small, IVF once large."""

    def __init__(self, dim: int = 128) -> None:
        if isinstance(dim, bool) or not isinstance(dim, int) or dim < 1:
            raise UsageError(f"face index: dim must be a positive integer (128 for dlib faces), not {dim!r}")
        self.dim = dim
        """Length of every vector (dlib's face descriptors: 128)."""
        self._index: Any = faiss.IndexIDMap(faiss.IndexFlatIP(dim))
        """IndexIDMap(IndexFlatIP) while exact, IndexIVFFlat once large (FAISS's SWIG classes)."""
        self._ids: set[int] = set()

    def __len__(self) -> int:
        return int(self._index.ntotal)

    @property
    def exact(self) -> bool:
        """Whether every vector is compared (flat) rather than the nearest cells only (IVF)."""
        return not isinstance(self._index, faiss.IndexIVF)

    def __repr__(self) -> str:
        layout = "exact" if self.exact else f"IVF {self._index.nlist} cells, nprobe {self._index.nprobe}"
        return f"FaceIndex(dim={self.dim}, {len(self)} vectors, {layout})"

    def add(self, ids: np.ndarray, vectors: np.ndarray) -> None:
        """Add ``vectors`` (n x dim, any float dtype) under ``ids`` (n distinct integers >= 0, none already here)."""
        ids_arr = self._check_ids(ids)
        vecs = self._rows(vectors, "vectors")
        if len(vecs) != len(ids_arr):
            raise UsageError(f"face index: {len(ids_arr)} ids for {len(vecs)} vectors; give one id per vector")
        if len(vecs) == 0:
            return
        if isinstance(self._index, faiss.IndexIVF):
            self._index.add_with_ids(vecs, ids_arr)
            if nlist_for(len(self)) > self._index.nlist:
                self._rebuild()
        elif len(self) + len(vecs) >= EXACT_BELOW:
            self._index.add_with_ids(vecs, ids_arr)
            self._rebuild()
        else:
            self._index.add_with_ids(vecs, ids_arr)
        self._ids.update(ids_arr.tolist())

    def search(self, query: np.ndarray, k: int) -> list[tuple[int, float]]:
        """The ``k`` ids whose vectors are most like ``query`` (dim values), with the cosine similarity, best first;
        fewer when the index holds fewer."""
        if isinstance(k, bool) or not isinstance(k, int | np.integer) or k < 1:
            raise UsageError(f"face index: k must be a positive integer (e.g. 10), not {k!r}")
        q = np.asarray(query)
        if q.ndim == 2 and q.shape[0] == 1:
            q = q[0]
        if q.ndim != 1:
            raise UsageError(f"face index: a query is one vector of {self.dim} values, not an array of shape {q.shape}")
        if len(self) == 0:
            return []
        scores, found = self._index.search(self._rows(q[None, :], "query"), min(int(k), len(self)))
        return [(int(i), float(s)) for i, s in zip(found[0], scores[0], strict=True) if i >= 0]

    def save(self, path: Path) -> None:
        """Write the index to ``path`` (one FAISS file), whole or not at all."""
        write_bytes(Path(path), faiss.serialize_index(self._index).tobytes())

    @classmethod
    def load(cls, path: Path) -> FaceIndex:
        """The index `save` wrote to ``path``."""
        path = Path(path)
        try:
            data = np.fromfile(path, dtype=np.uint8)
        except OSError as err:
            raise DataError(f"face index {path}: cannot read it ({err.strerror or err})") from err
        try:
            index = faiss.deserialize_index(data)
        except RuntimeError as err:
            raise DataError(f"face index {path}: not a FAISS index written by FaceIndex.save ({err})") from err
        if (
            not isinstance(index, faiss.IndexIDMap | faiss.IndexIVFFlat)
            or index.metric_type != faiss.METRIC_INNER_PRODUCT
        ):
            raise DataError(
                f"face index {path}: a {type(index).__name__}, not the inner-product IndexIDMap or IndexIVFFlat "
                "that FaceIndex.save writes"
            )
        face = cls(int(index.d))
        face._index = index
        if isinstance(index, faiss.IndexIVF):
            index.nprobe = nprobe_for(index.nlist)
        face._ids = set(face._contents()[0].tolist())
        return face

    def _check_ids(self, ids: np.ndarray) -> np.ndarray:
        arr = np.asarray(ids)
        if arr.ndim != 1:
            raise UsageError(f"face index: ids must be one integer per vector (shape (n,)), not shape {arr.shape}")
        if arr.size and arr.dtype.kind not in "iu":
            raise UsageError(f"face index: ids must be integers (track ids), not {arr.dtype} values like {arr[0]!r}")
        arr = arr.astype(np.int64)
        if arr.size and int(arr.min()) < 0:
            raise UsageError(f"face index: ids must be >= 0 (track ids), not {int(arr.min())}")
        unique, counts = np.unique(arr, return_counts=True)
        if (counts > 1).any():
            raise UsageError(
                f"face index: id {int(unique[counts > 1][0])} given twice in one add; ids are track ids, one vector each"
            )
        if self._ids:
            taken = [i for i in unique.tolist() if i in self._ids]
            if taken:
                raise UsageError(f"face index: id {taken[0]} is already in the index ({len(taken)} of these ids are)")
        return arr

    def _rows(self, vectors: np.ndarray, what: str) -> np.ndarray:
        """``vectors`` as contiguous float32 rows of unit length, checked."""
        arr = np.asarray(vectors)
        if arr.ndim != 2 or arr.shape[1] != self.dim:
            raise UsageError(f"face index: {what} must have shape (n, {self.dim}), not {arr.shape}")
        if arr.size and arr.dtype.kind not in "fiu":
            raise UsageError(f"face index: {what} must be numbers, not {arr.dtype}")
        out = np.ascontiguousarray(arr, dtype=np.float32)
        if not np.isfinite(out).all():
            raise UsageError(
                f"face index: {what} hold NaN or infinite values (row {int(np.where(~np.isfinite(out).all(axis=1))[0][0])})"
            )
        norms = np.linalg.norm(out, axis=1)
        if (norms == 0).any():
            raise UsageError(
                f"face index: {what} row {int(np.argmin(norms))} is all zeros; a face vector has a direction"
            )
        if not np.allclose(norms, 1.0, atol=1e-6):
            out = out / norms[:, None]
        return out

    def _contents(self) -> tuple[np.ndarray, np.ndarray]:
        """Every (id, vector) held, in no particular order."""
        index = self._index
        if isinstance(index, faiss.IndexIDMap):
            ids = faiss.vector_to_array(index.id_map).astype(np.int64)
            return ids, index.index.reconstruct_n(0, index.ntotal)
        invlists = index.invlists
        ids_parts, vec_parts = [], []
        for cell in range(index.nlist):
            n = invlists.list_size(cell)
            if n:
                ids_parts.append(faiss.rev_swig_ptr(invlists.get_ids(cell), n).copy())
                codes = faiss.rev_swig_ptr(invlists.get_codes(cell), n * invlists.code_size).copy()
                vec_parts.append(codes.view(np.float32).reshape(n, self.dim))
        if not ids_parts:
            return np.zeros(0, np.int64), np.zeros((0, self.dim), np.float32)
        return np.concatenate(ids_parts).astype(np.int64), np.concatenate(vec_parts)

    def _rebuild(self) -> None:
        """Train a new IVF index of `nlist_for` cells on (a sample of) the vectors held, and move them all into it."""
        ids, vecs = self._contents()
        nlist = nlist_for(len(ids))
        quantizer = faiss.IndexFlatIP(self.dim)
        index = faiss.IndexIVFFlat(quantizer, self.dim, nlist, faiss.METRIC_INNER_PRODUCT)
        index.cp.max_points_per_centroid = TRAIN_PER_CELL
        # a fixed sample (seeded), so the same vectors give the same cells
        sample = np.random.default_rng(0).choice(len(vecs), min(len(vecs), nlist * TRAIN_PER_CELL), replace=False)
        index.train(vecs[np.sort(sample)])
        index.add_with_ids(vecs, ids)
        index.nprobe = nprobe_for(nlist)
        self._index = index
