"""The Models page: deploy a run's checkpoint as a served model, list the deployments, try one on an image.

A deployment is a pod job of kind ``serve`` (`deskpod.jobs.spec`): it exports the run's latest checkpoint into
the job's own model repository and runs ``deskpod serve`` on a free loopback port, holding its devices until it
is stopped (cancelled). The server writes where it listens to the job folder's ``serve.json`` — ``{"url",
"pid", "models", "ready"}``, atomically, once listening and again when the models are loaded — and this page
reads that file, then asks the server itself (``GET <url>/v2/models/<name>``, 127.0.0.1 only) for the
model's inputs, outputs and labels.

"Try it" sends one image to the deployment (a v2 infer request, binary tensor data) and shows the top-5
classes with softmax probabilities, the round trip measured here and the server's own queue and compute
time (the change in its statistics across the request, when no other request ran meanwhile). A model
exported with ``--image-input`` takes encoded images (one ``BYTES`` input of shape ``[-1]``): the page sends
the uploaded file as it is and the server decodes it with the run's own transform (`deskpod.serve.images`);
"what the model sees" is that transform applied here too, from the ``preprocess`` the metadata reports. Older
exports take FP32 ``[C, H, W]`` tensors in [0, 1] (the exported graph applies the run's normalisation, see
`deskpod.serve.export`), so for them the page does the preprocessing itself: PIL decodes the upload, converts
it to grayscale or RGB (transparency over black, the Fashion-MNIST background), resizes it to H×W and scales
it to [0, 1]. A run trained on Fashion-MNIST can also be tried on a sample of its test set (t10k), shown with
its true label.

::

    GET  /ui/models               deployments (the viewer's; an admin's: all) and the Deploy form
    POST /ui/models/deploy        submit a serve job for one of the viewer's train jobs with a checkpoint
    GET  /ui/models/<id>/try      upload an image or pick a test sample
    POST /ui/models/<id>/try      predict: top-5 and latency (JSON with Accept: application/json)

Only a deployment's owner (or an admin) sees, tries or stops it; anyone else gets a 404, as for a job that
does not exist. The list shows every queued or active deployment and the latest `STOPPED_SHOWN` stopped ones,
and the Deploy form the runs with a checkpoint among the newest `SCAN_RUNS` training jobs: the store selects jobs
by kind, so any number of other jobs after them hides none, and the page costs the same with 10,000 jobs.
"""

from __future__ import annotations

import contextlib
import io
import json
import time
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import httpx
import numpy as np
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, RedirectResponse, Response
from starlette.concurrency import run_in_threadpool
from starlette.datastructures import UploadFile

from deskpod.envs.userfiles import read_path, stat_path
from deskpod.errors import ConfigError, ConflictError, DeskpodError, NotFoundError, TooLargeError
from deskpod.jobs.api import status_of
from deskpod.jobs.kinds.serve import FORMATS, LIMITS
from deskpod.jobs.states import JobState
from deskpod.jobs.store import JobRecord
from deskpod.serve.images import ImagePreprocess, prepared_image
from deskpod.train.runs import RunPaths
from deskpod.web import render
from deskpod.web.app import Web
from deskpod.web.failures import failure
from deskpod.web.images import data_url, decode_image, test_sample, to_input
from deskpod.web.runinfo import has_checkpoint
from deskpod.web.session import ROOT, Signed, Viewer, form_csrf

SCAN_RUNS = 500
"""How many of the newest training jobs are looked through for runs to deploy (those with a checkpoint)."""
STOPPED_SHOWN = 20
MAX_UPLOAD_BYTES = 10 << 20
"""The largest image accepted for "try it"."""
TEST_SAMPLES = 10_000
"""Fashion-MNIST's test set (t10k) has this many images."""
TOP_K = 5
METADATA_TIMEOUT_S = 2.0
INFER_TIMEOUT_S = 30.0
FAILED_METADATA_RETRY_S = 5.0
"""A server that did not answer is asked again after this long (the page stays fast meanwhile)."""
ACTIVE = (JobState.QUEUED, JobState.STARTING, JobState.BUILDING, JobState.RUNNING)


# ----------------------------------------------------------------------------------------- deployments
def read_port_file(path: Path, started_at: float | None) -> dict[str, Any] | None:
    """The server's ``serve.json``, or None when missing, unreadable or left by an earlier attempt."""
    st = stat_path(path)  # the job's user may have put a link or a FIFO there
    if st is None:
        return None
    try:
        doc = json.loads(read_path(path, limit=1 << 20))
    except (OSError, ValueError, RecursionError):
        return None
    if not isinstance(doc, dict) or (started_at is not None and st.st_mtime < started_at - 1.0):
        return None
    return doc


def loopback_url(url: object) -> str | None:
    """``url`` if it is ``http://127.0.0.1:PORT`` (the only place a deployment is called), else None."""
    if not isinstance(url, str):
        return None
    parts = urlsplit(url)
    try:
        port = parts.port
    except ValueError:
        return None
    if parts.scheme != "http" or parts.hostname != "127.0.0.1" or not port or parts.path not in ("", "/"):
        return None
    return f"http://127.0.0.1:{port}"


def loopback_address(address: object) -> str | None:
    """A gRPC ``address`` if it is ``127.0.0.1:PORT``, else None (a deployment listens on loopback only)."""
    if not isinstance(address, str):
        return None
    host, _, port = address.partition(":")
    if host != "127.0.0.1" or not (port.isascii() and port.isdigit() and len(port) <= 5) or not 0 < int(port) < 65536:
        return None
    return f"127.0.0.1:{int(port)}"


def train_job_of(web: Web, who: Viewer, run: str) -> str | None:
    """The id of the train job whose run folder ``run`` is, if it is one and the viewer may see it."""
    try:
        rel = Path(run).relative_to(web.home / "jobs").parts
    except ValueError:
        return None
    if len(rel) != 3 or rel[1] != "runs" or not (rel[0].isascii() and rel[0].isdigit()):
        return None
    try:
        job = web.job(who, rel[0])
    except NotFoundError:
        return None
    return str(job.id) if web.run_dir(job) == Path(run) else None


def fashion_run(run: str) -> bool:
    """Whether the run was trained on Fashion-MNIST (its resolved ``config.toml`` says so)."""
    try:
        config = tomllib.loads(read_path(RunPaths(Path(run)).config, limit=1 << 20).decode())
    except (OSError, ValueError, RecursionError):
        return False
    return config.get("data") == "fashion-mnist"


def metadata(web: Web, job: JobRecord, url: str, model: str, pid: object) -> tuple[dict[str, Any] | None, str]:
    """The model's metadata from its server (cached while the server lives), or None and why not."""
    cache: dict[tuple[int, str, object], tuple[float, dict[str, Any] | None, str]] = web.cache.setdefault(
        "models.metadata", {}
    )
    key = (job.id, url, pid)
    hit = cache.get(key)
    if hit is not None and (hit[1] is not None or time.monotonic() - hit[0] < FAILED_METADATA_RETRY_S):
        return hit[1], hit[2]
    got: dict[str, Any] | None = None
    error = ""
    try:
        with httpx.Client(trust_env=False, timeout=METADATA_TIMEOUT_S) as c:
            r = c.get(f"{url}/v2/models/{model}")
        doc = r.json()
        if r.status_code != 200 or not isinstance(doc, dict):
            error = str(doc.get("error") if isinstance(doc, dict) else r.status_code)
        else:
            got = doc
    except (httpx.HTTPError, ValueError, RecursionError) as e:  # the user's server: its JSON may be anything
        error = f"the server does not answer ({type(e).__name__})"
    if len(cache) > 256:
        cache.clear()
    cache[key] = (time.monotonic(), got, error)
    return got, error


@dataclass
class Tensor:
    name: str
    datatype: str
    shape: list[int]


@dataclass
class ModelInfo:
    """What the page shows of a model's metadata (KServe v2): its tensors and how many labels it has."""

    platform: str | None
    versions: list[str]
    inputs: list[Tensor]
    outputs: list[Tensor]
    labels: int


def summarize(meta: dict[str, Any]) -> ModelInfo:
    labels = (meta.get("parameters") or {}).get("labels") or []

    def tensors(key: str) -> list[Tensor]:
        return [
            Tensor(str(t.get("name")), str(t.get("datatype")), list(t.get("shape") or []))
            for t in meta.get(key) or []
            if isinstance(t, dict)
        ]

    platform, versions = meta.get("platform"), list(meta.get("versions") or [])
    return ModelInfo(platform, versions, tensors("inputs"), tensors("outputs"), len(labels))


@dataclass
class Deployment:
    """One serve job as the Models page shows it: state, status, URL, readiness, the model's metadata."""

    id: str
    name: str
    user: str
    state: str
    reason: str
    devices: int
    assigned: list[int]
    submitted_at: float
    started_at: float | None
    finished_at: float | None
    model: str | None
    format: str | None
    max_batch_size: int | None
    run: str | None
    run_name: str
    train_job: str | None
    """The id of the train job whose run this serves, if the viewer may see it."""
    image_input: bool
    can_stop: bool
    url: str | None = None
    grpc: str | None = None
    pid: int | None = None
    ready: bool = False
    status: str = "queued"
    """queued, starting, ready, error, stopping, stopped or failed."""
    detail: str = ""
    metadata: ModelInfo | None = None
    """`summarize` of the model's metadata, once it is ready."""


def deployment(web: Web, who: Viewer, job: JobRecord, *, with_metadata: bool = True) -> Deployment:
    s = dict(job.spec.serve or {})
    row = render.fields_from(
        Deployment,
        job.to_json(),
        model=s.get("model"),
        format=s.get("format"),
        max_batch_size=s.get("max_batch_size"),
        run=s.get("run"),
        run_name=Path(str(s.get("run", ""))).name,
        train_job=train_job_of(web, who, str(s.get("run", ""))),
        image_input=bool(s.get("image_input")),
        can_stop=job.state in ACTIVE and not job.stop_reason,
        detail=job.reason,
        pid=None,  # the server's, from serve.json below (not the serve job's own)
    )
    if job.state is JobState.FAILED:  # why, as the serve job's deskpod said it; not just its exit code
        row.status, row.detail = "failed", failure(web, job) or job.reason or "failed"
        return row
    if job.state not in ACTIVE:
        row.status, row.detail = "stopped", job.reason if job.reason not in ("", job.state.value) else "not serving"
        return row
    if job.stop_reason:
        row.status, row.detail = "stopping", f"stopping ({job.stop_reason})"
        return row
    if job.state is JobState.QUEUED:
        return row
    doc = read_port_file(web.pod.job_folder(job) / "serve.json", job.started_at)
    url = loopback_url(doc.get("url")) if doc else None
    row.status, row.detail = "starting", "exporting the run's latest checkpoint"
    if doc is None or url is None:
        return row
    row.url, row.pid, row.grpc = url, doc.get("pid"), loopback_address(doc.get("grpc"))
    if not doc.get("ready"):
        row.detail = "loading the model"
        return row
    model = str(row.model)
    if model not in (doc.get("models") or []):
        why = (doc.get("unavailable") or {}).get(model, "it is not among the server's models")
        row.status, row.detail = "error", f"the model did not load: {why}"
        return row
    row.status, row.ready, row.detail = "ready", True, "serving"
    if with_metadata:
        meta, error = metadata(web, job, url, model, doc.get("pid"))
        if meta is None:
            row.status, row.ready = "error", False
            row.detail = f"the server does not give the model's metadata: {error}"
        else:
            row.metadata = summarize(meta)
    return row


def serve_job(web: Web, who: Viewer, job_id: str) -> JobRecord:
    """The viewer's deployment ``job_id``; a foreign, unknown or non-serve job is a 404."""
    job: JobRecord = web.job(who, job_id)
    if job.spec.serve is None:
        raise NotFoundError(f"job {job.id} is not a deployment (a serve job); see {ROOT}/models")
    return job


def deployments(web: Web, who: Viewer) -> list[Deployment]:
    """Every queued or active deployment, and the latest stopped ones (the store picks serve jobs by kind, so
    any number of other jobs after them hides none)."""
    owner = who.owner_filter()
    active = web.store.jobs(user=owner, states=ACTIVE, kind="serve", limit=10_000)
    stopped = web.store.jobs(user=owner, states=[s for s in JobState if s not in ACTIVE], kind="serve",
                             limit=STOPPED_SHOWN)  # fmt: skip
    return [deployment(web, who, j) for j in sorted(active + stopped, key=lambda j: -j.id)]


def deployable(web: Web, who: Viewer) -> list[dict[str, Any]]:
    """The viewer's train jobs (an admin's: anyone's) whose run has a checkpoint, newest first, among their newest
    `SCAN_RUNS` training jobs."""
    out = []
    for j in web.store.jobs(user=who.owner_filter(), kind="train", limit=SCAN_RUNS):
        run = web.run_dir(j)
        if run is not None and has_checkpoint(run):
            out.append({"id": str(j.id), "name": j.name, "user": j.user, "state": j.state.value, "run": str(run)})
    return out


@dataclass
class ModelsPage:
    """The Models page's data (twin ``/ui/models.json``): the deployments, the runs that can be deployed, the Deploy
    form's values and the errors by field."""

    deployments: list[Deployment]
    runs: list[dict[str, Any]]
    formats: list[str]
    device_count: int
    device_kind: str
    form: dict[str, Any]
    errors: dict[str, str]
    error: str | None = render.unless_none()


def models_data(
    web: Web, who: Viewer, form: dict[str, str] | None = None, errors: dict[str, str] | None = None
) -> ModelsPage:
    runs = deployable(web, who)
    values: dict[str, Any] = {"job": runs[0]["id"] if runs else "", "devices": "1", "format": FORMATS[0],
                              "max_batch_size": "32", "image_input": False, "grpc": False}  # fmt: skip
    values.update({k: v for k, v in (form or {}).items() if k in values})
    for flag in ("image_input", "grpc"):  # a checkbox sends "true" when ticked and nothing when not
        values[flag] = values[flag] in (True, "true")
    return ModelsPage(
        deployments(web, who), runs, list(FORMATS), web.pod.device_count, web.pod.device_kind, values, errors or {},
        error=next(iter(errors.values())) if errors else None,
    )  # fmt: skip


def _int_field(fields: dict[str, str], key: str, label: str, low: int, high: int, errors: dict[str, str]) -> int:
    text = fields.get(key, "").strip()
    try:
        value = int(text)
    except ValueError:
        errors[key] = f"{label} {text!r} is not a whole number; use {low}..{high}"
        return low
    if not low <= value <= high:
        errors[key] = f"{label} {value} is out of range; use {low}..{high}"
    return value


def deploy(web: Web, who: Viewer, fields: dict[str, str]) -> tuple[JobRecord | None, dict[str, str]]:
    """Submit a serve job for the train job ``fields["job"]``; the errors, by field, when the form is bad."""
    errors: dict[str, str] = {}
    job_id = fields.get("job", "").strip()
    if not job_id:
        return None, {"job": "pick a training run to deploy (one with a checkpoint)"}
    train = web.job(who, job_id)  # another user's run: 404, as if it did not exist
    run = web.run_dir(train)
    if run is None:
        errors["job"] = f"job {train.id} ({train.name}) is not a training job; pick a training run"
    elif not has_checkpoint(run):
        errors["job"] = f"job {train.id} ({train.name}) has no checkpoint yet; wait for one, then deploy it"
    devices = _int_field(fields, "devices", "devices", 1, max(1, web.pod.device_count), errors)
    _, low, high = LIMITS["max_batch_size"]
    batch = _int_field(fields, "max_batch_size", "max batch size", low, high, errors)
    fmt = fields.get("format", FORMATS[0])
    if fmt not in FORMATS:
        errors["format"] = f"format {fmt!r} is not one of {', '.join(FORMATS)}"
    if errors or run is None:
        return None, errors
    spec = {
        "devices": devices,  # named serve-<model> (`deskpod.jobs.kinds.serve.default_name`)
        "serve": {"run": str(run), "model": train.name, "format": fmt, "max_batch_size": batch,
                  "image_input": fields.get("image_input") == "true", "grpc": fields.get("grpc") == "true"},
    }  # fmt: skip
    try:
        return web.pod.submit(who.user, spec), {}
    except DeskpodError as e:
        message = str(e)
        field = next((k for k in ("devices", "format", "max_batch_size") if k in message), "job")
        return None, {field: message}


# ----------------------------------------------------------------------------------------- try it
def image_input(meta: dict[str, Any]) -> str | None:
    """The name of the model's encoded-image input (one BYTES input, one image per row), or None: tensors."""
    inputs = meta.get("inputs") or []
    if len(inputs) == 1 and inputs[0].get("datatype") == "BYTES" and list(inputs[0].get("shape") or []) == [-1]:
        return str(inputs[0].get("name"))
    return None


def as_sent(raw: bytes, meta: dict[str, Any]) -> tuple[np.ndarray, Any]:
    """An encoded image as an image model's input — the bytes as they are, one row — and what the network sees
    (a PIL image, when the metadata says how the server prepares it; else None)."""
    doc = (meta.get("parameters") or {}).get("preprocess")
    seen = None
    if isinstance(doc, dict):
        with contextlib.suppress(DeskpodError):  # the server will say what is wrong with the image
            seen = prepared_image(raw, ImagePreprocess.from_dict(doc))
    return np.array([raw], dtype=object), seen


def input_spec(meta: dict[str, Any]) -> tuple[str, int, int, int]:
    """The model's image input: (name, C, H, W) from its metadata; a model that takes no image is refused.

    H or W given as -1 (any size) is returned as 0: the image keeps its own size on that axis."""
    inputs = meta.get("inputs") or []
    if len(inputs) != 1:
        raise ConflictError(f"this page tries models with one image input; this one has {len(inputs)} inputs")
    t = inputs[0]
    shape = list(t.get("shape") or [])
    if shape and shape[0] == -1 and len(shape) == 4:
        shape = shape[1:]
    if t.get("datatype") != "FP32" or len(shape) != 3 or shape[0] not in (1, 3):
        raise ConflictError(
            f"this page tries models whose input is FP32 [C, H, W] with C = 1 or 3; input {t.get('name')!r} is "
            f"{t.get('datatype')} {shape}"
        )
    c, h, w = (int(x) for x in shape)
    return str(t.get("name")), c, max(0, h), max(0, w)


def top_k(logits: np.ndarray, labels: list[str], k: int = TOP_K) -> list[dict[str, Any]]:
    """The ``k`` most likely classes of one row of logits, with softmax probabilities."""
    z = np.asarray(logits, dtype=np.float64).reshape(-1)
    p = np.exp(z - z.max())
    p /= p.sum()
    order = np.argsort(-p, kind="stable")[:k]
    return [{"label": labels[i] if i < len(labels) else str(i), "index": int(i), "score": float(p[i])} for i in order]


def _server_times(before: dict[str, Any] | None, after: dict[str, Any] | None) -> dict[str, float] | None:
    """Queue and compute time of our request from the server's counters, if ours was the only one between."""

    def stats(doc: dict[str, Any] | None) -> dict[str, Any] | None:
        rows = (doc or {}).get("model_stats") or []
        if not rows:
            return None
        return max(rows, key=lambda r: int(r.get("version", 0) or 0)).get("inference_stats")  # type: ignore[no-any-return]

    a, b = stats(before), stats(after)
    if a is None or b is None or b["success"]["count"] - a["success"]["count"] != 1:
        return None

    def ms(key: str) -> float:
        return float(b[key]["ns"] - a[key]["ns"]) / 1e6

    return {
        "queue_ms": ms("queue"),
        "compute_ms": ms("compute_input") + ms("compute_infer") + ms("compute_output"),
        "server_ms": ms("success"),
    }


async def infer(url: str, model: str, meta: dict[str, Any], x: np.ndarray, input_name: str) -> dict[str, Any]:
    """One v2 infer request (binary input, JSON output): the top-5 and the latencies."""
    from deskpod.serve.protocol import decode_response, encode_request

    outputs = meta.get("outputs") or []
    if not outputs:
        raise ConflictError(f"model {model!r} declares no outputs")
    out_name = str(outputs[0].get("name"))
    body, hl = encode_request({input_name: x}, binary=True, outputs=[out_name], binary_outputs=False)
    headers = {"Content-Type": "application/octet-stream"}
    if hl is not None:
        headers["Inference-Header-Content-Length"] = str(hl)
    async with httpx.AsyncClient(base_url=url, trust_env=False, timeout=INFER_TIMEOUT_S) as c:
        stats_url = f"/v2/models/{model}/stats"
        before = await _json_or_none(c, stats_url)
        t0 = time.perf_counter()
        try:
            r = await c.post(f"/v2/models/{model}/infer", content=body, headers=headers)
        except httpx.HTTPError as e:
            raise ConflictError(f"the deployment did not answer the request ({type(e).__name__}: {e})") from None
        latency_ms = (time.perf_counter() - t0) * 1000
        after = await _json_or_none(c, stats_url)
    if r.status_code != 200:
        try:
            doc = r.json()
        except (ValueError, RecursionError):  # the user's own server: its answer may be anything
            doc = None
        why = doc.get("error") if isinstance(doc, dict) else None
        raise ConflictError(f"the deployment refused the request (HTTP {r.status_code}): "
                            f"{why if isinstance(why, str) else r.text[:200]}")  # fmt: skip
    rhl = r.headers.get("inference-header-content-length", "")
    try:
        got = decode_response(r.content, int(rhl) if rhl.isascii() and rhl.isdigit() and len(rhl) < 19 else None)
        logits = got[out_name]
    except (KeyError, TypeError, ValueError, IndexError, RecursionError) as e:
        raise ConflictError(f"the deployment's answer is not a v2 inference response ({type(e).__name__})") from None
    labels = [str(x) for x in (meta.get("parameters") or {}).get("labels") or []]
    return {
        "top": top_k(logits[0], labels),
        "classes": int(logits[0].size),
        "latency_ms": latency_ms,
        "server": _server_times(before, after),
    }


async def _json_or_none(c: httpx.AsyncClient, path: str) -> dict[str, Any] | None:
    with contextlib.suppress(httpx.HTTPError, ValueError, RecursionError):
        r = await c.get(path)
        if r.status_code == 200:
            doc = r.json()
            return doc if isinstance(doc, dict) else None
    return None


@dataclass
class TryPage:
    """The try page's data: the deployment, whether it has test samples, and (after a POST) the result."""

    deployment: Deployment
    samples: int
    """How many Fashion-MNIST test samples can be picked (0: the run was not trained on it)."""
    max_upload_bytes: int
    form: dict[str, str] = field(default_factory=lambda: {"sample": ""})
    result: dict[str, Any] | None = None
    errors: dict[str, str] = field(default_factory=dict)
    error: str | None = render.unless_none()


def try_data(web: Web, who: Viewer, job: JobRecord) -> TryPage:
    row = deployment(web, who, job)
    return TryPage(row, TEST_SAMPLES if fashion_run(str(row.run or "")) else 0, MAX_UPLOAD_BYTES)


async def _read_upload(upload: UploadFile) -> bytes:
    data = await upload.read(MAX_UPLOAD_BYTES + 1)
    if len(data) > MAX_UPLOAD_BYTES:
        raise TooLargeError(f"the image is over the limit of {MAX_UPLOAD_BYTES >> 20} MiB; choose a smaller one")
    return data


async def predict(
    web: Web, request: Request, job: JobRecord, data: TryPage, fields: dict[str, str]
) -> tuple[dict[str, Any], Prepared]:
    """Run the try form: the uploaded image or the chosen test sample through the deployment; the result, and the
    input as sent."""
    row = data.deployment
    if row.status != "ready" or row.url is None:
        raise ConflictError(
            f"deployment {row.id} is {row.status} ({row.detail}); "
            + ("try it once it is ready" if row.status in ("queued", "starting") else "deploy the run again")
        )
    full, error = metadata(web, job, row.url, str(row.model), row.pid)
    if full is None:
        raise ConflictError(f"deployment {row.id} does not give its model's metadata: {error}")
    encoded = image_input(full)
    name, c, h, w = (encoded, 0, 0, 0) if encoded else input_spec(full)
    as_image = full if encoded else None
    form = await request.form()
    upload = form.get("image")
    if isinstance(upload, UploadFile) and upload.filename:
        try:
            raw = await _read_upload(upload)
        except TooLargeError as e:
            raise _FieldError("image", e) from None
        got = await run_in_threadpool(_prepare_upload, raw, str(upload.filename), c, h, w, as_image)
    elif fields.get("sample", "").strip():
        if not data.samples:
            raise _FieldError(
                "sample", ConfigError("this run was not trained on Fashion-MNIST: it has no test samples")
            )
        errors: dict[str, str] = {}
        index = _int_field(fields, "sample", "test sample", 0, TEST_SAMPLES - 1, errors)
        if errors:
            raise _FieldError("sample", ConfigError(errors["sample"]))
        got = await run_in_threadpool(_prepare_sample, web, index, c, h, w, as_image)
    else:
        raise _FieldError("image", ConfigError("choose an image file to upload, or a test sample number"))
    result = await infer(row.url, str(row.model), full, got.x, name)
    result["input"] = {**got.source, "shape": got.shape}
    if got.source["source"] == "sample":
        result["correct"] = bool(result["top"] and result["top"][0]["index"] == got.source["true_index"])
    return result, got


def _model_input(
    raw: bytes, im: Any, c: int, h: int, w: int, as_image: dict[str, Any] | None
) -> tuple[np.ndarray, Any, list[int]]:
    """The request's input, the picture the network sees (or None) and the shape shown for it: the file as it is
    for an image model (``as_image``: its metadata), else the page's own FP32 tensor."""
    if as_image is not None:
        x, seen = as_sent(raw, as_image)
        shape = [len(seen.getbands()), seen.height, seen.width] if seen is not None else list(x.shape)
        return x, seen, shape
    x, seen = to_input(im, c, h, w)
    return x, seen, list(x.shape)


@dataclass
class Prepared:
    """An input of the try form, ready to send: the request's tensor, where it came from, and pictures of it."""

    x: np.ndarray
    source: dict[str, Any]
    """``{"source": "upload", "filename", "width", "height"}`` or ``{"source": "sample", "sample", "true_label",
    "true_index"}``."""
    shape: list[int]
    shown: str
    seen: str | None
    """What the network sees, where that differs (resized, grey)."""


def _prepare_upload(
    raw: bytes, filename: str, c: int, h: int, w: int, as_image: dict[str, Any] | None = None
) -> Prepared:
    """Decode an upload and make the model's input of it (a worker thread: PIL work blocks)."""
    try:
        im = decode_image(raw)  # refused here, next to the field, before anything is sent
    except DeskpodError as e:
        raise _FieldError("image", e) from None
    x, seen, shape = _model_input(raw, im, c, h, w, as_image)
    source = {"source": "upload", "filename": filename, "width": im.width, "height": im.height}
    shown = data_url(im, 112, upscale=True) if max(im.size) < 112 else data_url(im)
    return Prepared(x, source, shape, shown, None if seen is None else data_url(seen, 112, upscale=True))


def _prepare_sample(web: Web, index: int, c: int, h: int, w: int, as_image: dict[str, Any] | None = None) -> Prepared:
    """A test sample as the model's input, with its true label (a worker thread: reading t10k blocks); for an image
    model, as a PNG file."""
    im, label, label_name = test_sample(web, index)
    raw = b""
    if as_image is not None:
        buf = io.BytesIO()
        im.save(buf, format="PNG")
        raw = buf.getvalue()
    x, seen, shape = _model_input(raw, im, c, h, w, as_image)
    source = {"source": "sample", "sample": index, "true_label": label_name, "true_index": label}
    shown = data_url(im, 112, upscale=True)
    return Prepared(
        x, source, shape, shown, None if seen is None or seen.size == im.size else data_url(seen, 112, upscale=True)
    )


class _FieldError(Exception):
    """A bad value of one field of the try form: shown next to that field."""

    def __init__(self, field: str, error: DeskpodError) -> None:
        super().__init__(str(error))
        self.field = field
        self.error = error


def _try_page(request: Request, who: Viewer, data: TryPage, *, status: int = 200, extra: Any = None) -> Response:
    return render.page(
        request, "try.html", data, who, title=f"Try {data.deployment.model}", status=status,
        extra={"shown": None, "seen": None, **(extra or {})},
    )  # fmt: skip


def _try_error(request: Request, who: Viewer, data: TryPage, field: str, e: DeskpodError) -> Response:
    """The try page again, with the message next to the field it is about (or above the forms)."""
    data.errors = {field or "form": str(e)}
    data.error = str(e)
    return _try_page(request, who, data, status=status_of(e))


def register(app: FastAPI, web: Web) -> None:
    @app.get("/models.json")
    @app.get("/models")
    def models_page(request: Request, who: Signed) -> Response:
        return render.page(request, "models.html", models_data(web, who), who, title="Models")

    @app.post("/models/deploy")
    async def deploy_form(request: Request, who: Signed) -> Response:
        fields = await form_csrf(request, who)
        job, errors = deploy(web, who, fields)
        if job is None:
            data = await run_in_threadpool(models_data, web, who, fields, errors)  # it may ask servers for metadata
            return render.page(request, "models.html", data, who, title="Models", status=400)
        if render.wants_json(request):
            return render.json_response(deployment(web, who, job, with_metadata=False), 201)
        return RedirectResponse(f"{ROOT}/models#deployment-{job.id}", status_code=303)

    @app.get("/models/{job_id}/try.json")
    @app.get("/models/{job_id}/try")
    def try_page(request: Request, job_id: str, who: Signed) -> Response:
        job = serve_job(web, who, job_id)
        return _try_page(request, who, try_data(web, who, job))

    @app.post("/models/{job_id}/try")
    async def try_post(request: Request, job_id: str, who: Signed) -> Response:
        declared = request.headers.get("content-length", "")
        if not (declared.isascii() and declared.isdigit()):  # browsers send it; else the size is known after reading
            raise ConfigError("the upload must say its size (a Content-Length header); chunked uploads are refused")
        if len(declared) > 12 or int(declared) > MAX_UPLOAD_BYTES + (64 << 10):  # the image, and room for its form
            raise TooLargeError(f"the upload is over the limit of {MAX_UPLOAD_BYTES >> 20} MiB; choose a smaller image")
        fields = await form_csrf(request, who)
        job = serve_job(web, who, job_id)
        data = await run_in_threadpool(try_data, web, who, job)  # it may ask the server for metadata
        data.form = {"sample": fields.get("sample", "")}
        try:
            result, got = await predict(web, request, job, data, fields)
        except _FieldError as e:
            return _try_error(request, who, data, e.field, e.error)
        except DeskpodError as e:
            return _try_error(request, who, data, "", e)
        data.result = result
        if render.wants_json(request):
            return JSONResponse({**result, "deployment": data.deployment.id, "model": data.deployment.model})
        return _try_page(request, who, data, extra={"shown": got.shown, "seen": got.seen})
