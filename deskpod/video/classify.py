"""Search the index with a classifier you trained: the tracks it recognises as one of its classes, best first.

``deskpod video search --classifier RUN_OR_MODEL --label NAME --db DB`` is the last step of the loop that
`deskpod.video.crops` starts (crops → sorted by a person → ``deskpod train --data imagefolder:DIR``). The classifier
is one of:

- a training run folder (``runs/NAME``): its latest checkpoint is exported as ``deskpod serve --export`` and a serve
  job do it (`deskpod.jobs.kinds.serve.export_if_new`: ONNX, taking encoded images with the run's own evaluation
  transform) into a model repository beside the database, ``DB.models/``; a later search with the same checkpoint
  reuses that export;
- a model folder of a repository (``models/NAME``, ``deskpod export`` or a Triton ``config.pbtxt``), or a
  repository holding one model. A model that takes tensors is shown each crop resized to its input's size.

The model is loaded by the server's own `ModelRegistry` and every crop goes through its dynamic batcher
(`deskpod.serve.batcher`): one request per track (its crops are the rows), merged with other tracks' requests
into batches of up to the model's ``max_batch_size`` while the next stream is decoded on another thread. A track's
score for NAME is the mean, over its crops, of the softmax probability of NAME; it is recognised when that is at
least ``min_score``. The crops are cut exactly as ``deskpod video crops`` cut the training pictures (same boxes
spread along the track, margin and JPEG quality), so the classifier sees what it was trained on.
"""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np

from deskpod.errors import UsageError, require_extra
from deskpod.video.crops import PER_TRACK, encode, track_crops
from deskpod.video.store import Store, TrackRow

MIN_SCORE = 0.5
"""Least mean probability of the label for a track to count as recognised (above every other class of a two-class
model)."""
RUN_MARKERS = ("launch.json", "checkpoints", "metrics.jsonl", "summary.json")
"""Files and folders only a training run folder has (a run's ``config.toml`` alone would look like a model's)."""


@dataclasses.dataclass(frozen=True, slots=True)
class Recognised:
    """A track the classifier recognises."""

    track: int
    stream: str
    kind: str
    """The track's label in the index (``person``, ``face``)."""
    start: float
    end: float
    score: float
    """Mean probability of the label over its crops."""
    crops: int
    """Crops the classifier was shown."""
    thumbnail: Path | None


@dataclasses.dataclass(frozen=True, slots=True)
class Classifier:
    """A model in a repository, ready to load."""

    repo: Path
    name: str
    origin: str
    """What it came from, for the user: the run and checkpoint exported, or the model folder."""


def is_run(path: Path) -> bool:
    return path.is_dir() and any((path / m).exists() for m in RUN_MARKERS)


def resolve(spec: Path, db: Path) -> Classifier:
    """The model ``spec`` names (a run folder, exported first; a model folder; a one-model repository)."""
    from deskpod.serve.repository import is_model_folder, model_names

    spec = Path(spec)
    if is_run(spec):
        return _export(spec, db)
    if is_model_folder(spec):
        return Classifier(spec.parent, spec.name, f"model {spec}")
    if spec.is_dir():
        names = model_names(spec)
        if len(names) == 1:
            return Classifier(spec, names[0], f"model {spec / names[0]}")
        if names:
            raise UsageError(f"--classifier {spec}: a repository of {len(names)} models ({', '.join(names)}); "
                             f"give one, e.g. --classifier {spec / names[0]}")  # fmt: skip
    raise UsageError(
        f"--classifier {spec}: not a training run folder (runs/NAME) nor a model folder (models/NAME with config.toml)"
    )


def _export(run: Path, db: Path) -> Classifier:
    from deskpod.jobs.kinds.serve import export_if_new, model_name
    from deskpod.serve.export import ExportOptions
    from deskpod.train.runs import has_checkpoint

    if not has_checkpoint(run):
        raise UsageError(
            f"--classifier {run}: the run has no checkpoint yet; train it first (deskpod train --data imagefolder:DIR) "
            "or wait for its first checkpoint"
        )
    repo = db.with_name(db.name + ".models")
    options = ExportOptions(repo=repo, name=model_name(run) or "classifier", image_input=True)
    version, exported = export_if_new(run, options)
    return Classifier(repo, options.name, f"run {run} ({'exported to' if exported else 'as exported in'} {version})")


def search_classifier(
    db: Path,
    classifier: Path,
    label: str,
    *,
    top: int = 10,
    min_score: float = MIN_SCORE,
    stream: str | None = None,
    since: float | None = None,
    until: float | None = None,
    per_track: int = PER_TRACK,
) -> list[Recognised]:
    """The tracks of ``db`` that ``classifier`` recognises as ``label``, best first (at most ``top``)."""
    require_extra("serve", "deskpod video search --classifier")
    if top < 1:
        raise UsageError(f"--top {top}: give a positive number of results, e.g. 10")
    if not 0.0 <= min_score <= 1.0:
        raise UsageError(f"--min-score {min_score}: give a probability from 0 to 1, e.g. {MIN_SCORE}")
    db = Path(db)
    with Store(db, create=False) as store:
        if stream is not None and stream not in {s.name for s in store.streams()}:
            names = ", ".join(s.name for s in store.streams()) or "none"
            raise UsageError(f"--stream {stream}: no such stream in {db} (its streams: {names})")
        model = resolve(classifier, db)
        rows = store.tracks(stream=stream, since=since, until=until)
        scores = asyncio.run(_score(store, rows, model, label, per_track))
        by_id = {r.id: r for r in rows}
        ranked = sorted(
            ((s, n, by_id[i]) for i, (s, n) in scores.items() if s >= min_score), key=lambda x: (-x[0], x[2].id)
        )[:top]
        return [Recognised(r.id, r.stream, r.label, r.start, r.end, s, n,
                           store.thumbnails / r.thumbnail if r.thumbnail else None)
                for s, n, r in ranked]  # fmt: skip


async def _score(
    store: Store, rows: list[TrackRow], model: Classifier, label: str, per_track: int
) -> dict[int, tuple[float, int]]:
    """Each track's (mean probability of ``label``, crops shown) by id, through the model's dynamic batcher."""
    from deskpod.serve.images import ImagePreprocess, decode_images, preprocess_of
    from deskpod.serve.registry import ModelRegistry

    registry = ModelRegistry(model.repo)
    await registry.load(model.name)
    try:
        lv = registry.get(model.name)
        config = lv.config
        labels = list(config.labels)
        if not labels:
            raise UsageError(f"--classifier: {model.origin} has no class labels (labels = [...] in its config.toml)")
        if label not in labels:
            raise UsageError(f"--label {label}: not a class of the classifier; its labels are {', '.join(labels)}")
        want = labels.index(label)
        pre = preprocess_of(config)
        if pre is None:  # a tensor model: the crop resized to its input
            dims = config.inputs[0].dims
            if len(dims) != 3 or dims[0] not in (1, 3) or -1 in dims:
                raise UsageError(f"--classifier: {model.origin} takes {list(dims)}, not an image (C×H×W, C 1 or 3)")
            pre = ImagePreprocess(input=config.inputs[0].name, tensor=config.inputs[0].name, channels=dims[0],
                                  height=dims[1], width=dims[2])  # fmt: skip
        chunk = config.max_batch_size or 1
        output = config.outputs[0].name

        def tensors() -> Iterator[tuple[TrackRow, np.ndarray]]:
            for row, crops, _ in track_crops(store, rows, per_track):
                if crops:
                    encoded = np.array([encode(c.image) for c in crops], dtype=object)
                    yield row, decode_images(encoded, pre)

        loop = asyncio.get_running_loop()
        pending: list[tuple[TrackRow, list[asyncio.Future[dict[str, np.ndarray]]]]] = []
        limit = max(1, config.max_queue_size // 2)
        in_flight = 0
        it = tensors()
        with ThreadPoolExecutor(1, thread_name_prefix="deskpod-crops") as pool:
            while (item := await loop.run_in_executor(pool, next, it, None)) is not None:
                row, x = item
                futures = []
                for i in range(0, len(x), chunk):
                    part = x[i : i + chunk] if config.max_batch_size else x[i]
                    futures.append(lv.batcher.submit({pre.tensor: part}, None))
                pending.append((row, futures))
                in_flight += len(futures)
                if in_flight >= limit:  # the batcher's queue is bounded: wait for what was sent before sending more
                    await asyncio.gather(*(f for _, fs in pending for f in fs))
                    in_flight = 0
        scores: dict[int, tuple[float, int]] = {}
        for row, futures in pending:
            outs = [np.asarray((await f)[output], dtype=np.float64) for f in futures]
            logits = np.concatenate([o.reshape(-1, o.shape[-1]) for o in outs])
            p = np.exp(logits - logits.max(axis=1, keepdims=True))
            p /= p.sum(axis=1, keepdims=True)
            scores[row.id] = (float(p[:, want].mean()), int(logits.shape[0]))
        return scores
    finally:
        await registry.close()
