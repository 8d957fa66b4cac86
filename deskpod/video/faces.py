"""Face embeddings: dlib's 5-point landmarks and its 128-d ResNet descriptor, L2-normalised.

dlib's descriptor (``dlib_face_recognition_resnet_model_v1.dat``, face_recognition_models) puts two photos of one
person within Euclidean distance 0.6 of each other (dlib's own threshold, 99.38% on LFW). The vectors here are
scaled to unit length, so search is by cosine similarity (inner product, what `deskpod.video.vectors` indexes).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import cv2
import dlib
import numpy as np

from deskpod.errors import DataError
from deskpod.video.detectors import DlibHogFace, models_dir

DIM = 128
"""Length of a face vector."""


class FaceEmbedder:
    """Embeds faces given as boxes in a BGR frame."""

    def __init__(self) -> None:
        models = models_dir()
        self._shape = dlib.shape_predictor(str(models / "shape_predictor_5_face_landmarks.dat"))
        self._net = dlib.face_recognition_model_v1(str(models / "dlib_face_recognition_resnet_model_v1.dat"))

    def embed(self, frame: np.ndarray, boxes: Sequence[tuple[float, float, float, float]]) -> np.ndarray:
        """One unit vector per box (float32, ``len(boxes)`` x 128), in the order of the boxes."""
        if not boxes:
            return np.zeros((0, DIM), np.float32)
        rgb = np.ascontiguousarray(frame[:, :, ::-1])
        shapes = dlib.full_object_detections()
        for x1, y1, x2, y2 in boxes:
            shapes.append(self._shape(rgb, dlib.rectangle(int(x1), int(y1), int(x2), int(y2))))
        vectors: np.ndarray = np.asarray(self._net.compute_face_descriptor(rgb, shapes), dtype=np.float32)
        return normalise(vectors.reshape(-1, DIM))


def normalise(vectors: np.ndarray) -> np.ndarray:
    """Rows scaled to unit length (float32)."""
    v = np.asarray(vectors, dtype=np.float32)
    out: np.ndarray = (v / np.maximum(np.linalg.norm(v, axis=-1, keepdims=True), 1e-12)).astype(np.float32)
    return out


def read_image(path: Path) -> np.ndarray:
    """A photo as BGR pixels; `DataError` naming the file when it is missing or not an image."""
    if not path.is_file():
        raise DataError(f"{path}: no such photo")
    data = np.fromfile(path, dtype=np.uint8)
    image = cv2.imdecode(data, cv2.IMREAD_COLOR) if data.size else None
    if image is None:
        raise DataError(f"{path}: not an image OpenCV can read (give a JPEG, PNG, BMP, TIFF or WebP photo of one face)")
    return image


def embed_photo(path: Path, embedder: FaceEmbedder | None = None) -> np.ndarray:
    """The unit face vector of a photo of exactly one face; `DataError` for no face or several."""
    image = read_image(path)
    # Upsampled once: a face in a photo may be small. A find scoring under a quarter of the best one is a pattern,
    # not a second face (astronaut.png: her face 1.16, a patch on her suit 0.12; carphone's low-resolution face
    # alone scores ~0.4, so no fixed margin serves both).
    faces = DlibHogFace(upsample_below=10**6).detect([image])[0]
    if faces:
        best = max(f.score for f in faces)
        faces = [f for f in faces if f.score >= 0.25 * best]
    if not faces:
        raise DataError(f"{path}: no face found (give a photo with one face, frontal, at least ~40 px across)")
    if len(faces) > 1:
        where = ", ".join(f"({int(f.box[0])},{int(f.box[1])})-({int(f.box[2])},{int(f.box[3])})" for f in faces)
        raise DataError(f"{path}: {len(faces)} faces found at {where}; crop the photo to the one face to search for")
    vector: np.ndarray = (embedder or FaceEmbedder()).embed(image, [faces[0].box])[0]
    return vector
