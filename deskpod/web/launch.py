"""New training: DIGITS' three steps — dataset, network, train — on the pod service.

::

    /ui/new                      1. dataset cards, and a field for imagefolder:PATH or synthetic:CxHxW
    /ui/new?data=D               2. D's summary (classes, counts, sample images) and the networks, counted for D
    /ui/new?data=D&model=M&...   3. the training form, with what the job would get before it is queued:
                                    the placement the scheduler picks on the devices free now and its ring
                                    bandwidth, the workers × threads the trainer will run it as and the plan's
                                    predicted time for them on this box, and the same job as a
                                    ``deskpod train --submit`` line (naming the pod's socket: it works pasted
                                    on the box) and as an API call
    POST /ui/new/calibrate       queue this box's calibration job (`deskpod.web.calibration`) when there is
                                    no calibration to predict from
    /ui/new/preview.json?...     what step 3 shows for the values in the query (launch.js asks as fields change)
    POST /ui/new                 queue it (303 to the job's page; 201 and the job for a JSON client)
    /ui/datasets/samples.png?data=D[&class=I]   the sample images of a dataset (per class, or all)

Every choice lives in the URL's query, so each step works without JavaScript, a link keeps the whole
form, and sign-in after an expired session comes back to the same values. Every value is checked by
the code that would reject it later — the trainer's `TrainConfig` (`build_config`), the device
parser (`parse_device_spec`), the data sources (`describe`), the model registry, the job spec
(`parse_spec`) — so a bad one gets the CLI's own one-line message, next to its field, and nothing is
queued. The job spec is the one ``deskpod train --submit`` builds from the equivalent command line
shown on the page: ``{"train": {model, data, epochs|steps, and the flags that differ from the
defaults}, "devices": N | "all", "name": ...}``.
"""

from __future__ import annotations

import json
import shlex
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Annotated, Any, TypeVar
from urllib.parse import parse_qsl, urlencode

from fastapi import FastAPI, Query, Request
from fastapi.responses import JSONResponse, RedirectResponse, Response
from starlette.concurrency import run_in_threadpool

from deskpod.envs.accounts import Account
from deskpod.errors import ConfigError, ConflictError, DataError, DeskpodError, UsageError
from deskpod.hardware.topology import Topology
from deskpod.jobs.kinds import train as train_kind
from deskpod.jobs.kinds.train import FLAGS, float_text
from deskpod.jobs.store import JobRecord
from deskpod.web import datasets, networks, render
from deskpod.web.app import Web
from deskpod.web.session import ROOT, Signed, Viewer, form_csrf, safe_next
from deskpod.web.terminal import deskpod_line

T = TypeVar("T")

TRAIN_FIELDS = ("devices", "epochs", "steps", "batch_size", "precision", "optimizer", "lr", "name")
STATE = ("data", "model", *TRAIN_FIELDS)
"""Everything the three steps choose: the query of every step's URL."""
MAX_VALUE = 4096
CALIBRATE_HELP = (
    "It measures the devices' FLOP rate and memory copies, a short training and an all-reduce, a few minutes in "
    "all, and keeps the fit with the pod's state"
)


def defaults() -> dict[str, str]:
    """The form's values when nothing was chosen: the trainer's defaults."""
    from deskpod.train.config import TrainConfig

    d = TrainConfig()
    return {"data": d.data, "model": d.model, "devices": d.devices, "epochs": str(d.epochs), "steps": "",
            "batch_size": str(d.batch_size), "precision": d.precision, "optimizer": d.optimizer,
            "lr": float_text(d.lr), "name": d.name}  # fmt: skip


def read_state(params: Mapping[str, str]) -> dict[str, str]:
    """The choices in a query or a form: ``data`` and ``model`` as given, blank train fields at their default."""
    base = defaults()
    out = {"data": "", "model": ""}
    for key in STATE:
        value = str(params.get(key) or "").strip()[:MAX_VALUE]
        out[key] = value if value or key in ("data", "model", "steps", "name") else base[key]
    return out


def state_query(state: Mapping[str, str], **changes: str | None) -> str:
    """The query that rebuilds ``state`` (with ``changes``): only what differs from the defaults."""
    base = defaults()
    merged = {**state, **changes}
    keep = {}
    for key in (*STATE, "step"):
        value = merged.get(key)
        if value and (key in ("data", "model", "step") or value != base[key]):
            keep[key] = value
    return urlencode(keep)


def href(state: Mapping[str, str], **changes: str | None) -> str:
    return f"{ROOT}/new?{state_query(state, **changes)}"


def step_of(state: Mapping[str, str], asked: str | None) -> int:
    """1 without a dataset, 2 without a network, else 3; ``?step=N`` goes back to an earlier one."""
    step = 1 if not state["data"] else 2 if not state["model"] else 3
    if asked in ("1", "2"):
        step = min(step, int(asked))
    return step


# --------------------------------------------------------------------------- checking the train fields
def _number(raw: str, kind: type) -> int | float | str:
    """The value as the CLI's argparse would read it; text that is no number stays text (its message comes from
    `TrainConfig`'s coercion: ``batch_size = 'x' is not valid: use a whole number``)."""
    try:
        return int(raw) if kind is int else float(raw)
    except ValueError:
        return raw


def check_train(
    web: Web, state: Mapping[str, str], summary: Mapping[str, Any]
) -> tuple[dict[str, Any], dict[str, str]]:
    """The train fields as typed values, and a message per bad field (the trainer's and the device parser's)."""
    from deskpod.hardware.devices import parse_device_spec
    from deskpod.train.config import build_config

    errors: dict[str, str] = {}
    values: dict[str, Any] = {}
    try:
        indices = parse_device_spec(state["devices"], web.pod.device_count, web.pod.device_kind)
        values["indices"] = indices
        text = state["devices"].strip().lower()
        values["devices"] = "all" if text in ("all", "") else len(indices)
        values["named"] = indices if "," in text else None
    except DeskpodError as e:
        errors["devices"] = str(e)
    raw: dict[str, Any] = {
        "epochs": _number(state["epochs"], int),
        "steps": _number(state["steps"], int) if state["steps"] else 0,
        "batch_size": _number(state["batch_size"], int),
        "precision": state["precision"],
        "optimizer": state["optimizer"],
        "lr": _number(state["lr"], float),
        "name": state["name"],
    }
    for key, value in raw.items():
        if key == "epochs" and raw["steps"] not in (0, "0"):
            values[key] = None  # steps replace epochs, as in the trainer
            continue
        try:
            build_config(None, {key: value})  # every other key at its default: only this one can be wrong
            values[key] = value
        except ConfigError as e:
            errors[key] = str(e)
    if "batch_size" in values and "indices" in values:
        n, per_device = len(values["indices"]), values["batch_size"]
        if per_device * n > summary["train_size"]:  # the launcher's check, before anything is queued
            errors["batch_size"] = (
                f"batch size {per_device} × {n} devices = {per_device * n} samples per step, more than the "
                f"{summary['train_size']} training samples of {summary['name']}; use a smaller --batch-size"
            )
    return values, errors


def job_spec(state: Mapping[str, str], values: Mapping[str, Any]) -> dict[str, Any]:
    """The job ``deskpod train --submit`` queues for the equivalent command line (`cli_line`)."""
    train: dict[str, Any] = {"model": state["model"], "data": state["data"]}
    if values["steps"]:
        train["steps"] = values["steps"]
    else:
        train["epochs"] = values["epochs"]
    from deskpod.train.config import TrainConfig

    d = TrainConfig()
    train.update({key: values[key] for key in FLAGS if values[key] != getattr(d, key)})
    return train_kind.spec(train, devices=values["devices"], name=values["name"] or None)


def cli_line(spec: Mapping[str, Any]) -> str:
    """``deskpod train --submit ...`` with the flags that queue exactly ``spec`` (`train_kind.submit_argv`)."""
    return shlex.join(train_kind.submit_argv(spec))


def curl_line(spec: Mapping[str, Any], url: str) -> str:
    """The same job through the REST API (the token from the environment, so it is not on the page)."""
    body = shlex.quote(json.dumps(spec))
    return (
        f'curl -X POST -H "Authorization: Bearer $DESKPOD_TOKEN" -H "Content-Type: application/json" '
        f"-d {body} {shlex.quote(url + '/v1/jobs')}"
    )


# --------------------------------------------------------------------------- placement and prediction
@dataclass
class Ring:
    """The all-reduce rings between the placed devices (`deskpod.comm.rings`)."""

    bandwidth: float
    """GB/s per direction."""
    kind: str
    rings: int


@dataclass
class Placement:
    """Which devices the scheduler would give this job now, and the ring bandwidth between them."""

    k: int
    free: list[int]
    text: str = ""
    devices: list[int] | None = None
    """None: it would wait."""
    reason: str = ""
    ever: bool = True
    """False: the job can never fit this box."""
    ring: Ring | None = None
    ring_text: str = ""
    note: str = ""


def placement(web: Web, values: Mapping[str, Any]) -> Placement:
    from deskpod.hardware.placement import Unplaceable

    k = len(values["indices"])
    status = web.pod.status()
    held = {d["index"] for d in status["devices"] if d["job"] is not None}
    out = Placement(k, [d for d in range(web.pod.device_count) if d not in held])
    what = "GPU" if web.pod.device_kind == "cuda" else "CPU worker slot"
    got = web.pod.place(out.free, k, "best")
    if isinstance(got, Unplaceable):
        out.reason, out.ever, out.text = got.reason, got.ever, f"It would wait: {got.reason}."
    else:
        out.devices, out.reason = list(got.devices), got.reason
        shown = ", ".join(map(str, got.devices))
        out.text = f"{what}{'s' if k != 1 else ''} {shown} — {got.reason}"
        out.ring, out.ring_text = _ring(web.pod.topology, got.devices)
    named = values.get("named")
    if named:
        out.note = (
            f"A job asks the pod for a count: you named {', '.join(map(str, named))}, so it asks for {k} and the "
            "scheduler picks which (above: its pick now)."
        )
    queued = status["queued"]
    if queued:
        out.note = (out.note + f" {queued} job{'s are' if queued != 1 else ' is'} queued now.").strip()
    return out


def _ring(topology: Topology | None, devices: tuple[int, ...]) -> tuple[Ring | None, str]:
    from deskpod.comm.rings import build_rings

    if topology is None:
        return None, ""
    if len(devices) < 2:
        return Ring(0.0, "none", 0), "One device: no all-reduce, so no ring."
    rings = build_rings(topology, devices)
    n = len(rings.rings)
    return (
        Ring(rings.bandwidth, rings.kind, n),
        f"Ring bandwidth {rings.bandwidth:g} GB/s per direction ({n} {rings.kind} ring{'s' if n != 1 else ''}).",
    )


def _plan_precision(precision: str, kind: str, machine: str | None) -> str:
    """The planner's precision for the trainer's: ``auto`` is fp32 on CPUs, bf16 on GPUs that have it, else fp16."""
    if precision != "auto":
        return precision
    if kind == "cpu":
        return "fp32"
    if machine is not None:
        from deskpod.hardware.catalog import find_machine

        return "bf16" if find_machine(machine).peak_tflops("bf16") else "fp16"
    return "bf16"


@dataclass
class Layout:
    """Workers × threads per worker of a job, and that said in words."""

    workers: int
    threads: int | None
    """None: the trainer's default (one worker per GPU)."""
    text: str


def job_layout(web: Web, k: int) -> Layout:
    """How the trainer lays out a job of ``k`` of the pod's devices: workers × threads per worker, decided by the
    trainer's own function (`deskpod.train.launcher.pod_job_devices`), so that the prediction assumes the layout
    the job then runs (on a CPU box of one NUMA node, 2 slots are 1 worker of 2 threads, not 2 workers)."""
    if web.pod.config.machine is not None:  # a catalog machine's GPUs: one worker each
        return Layout(k, None, f"{k} worker{'s' if k != 1 else ''}, one per GPU")
    from deskpod.train.launcher import pod_job_devices

    kind = web.pod.device_kind
    confinement = web.pod.confinement
    limits = confinement.limits(tuple(range(k))) if confinement is not None and kind == "cpu" else None
    if limits is not None and limits.cpus is not None:  # a pinned job sees only its cores, its slots from 0
        from deskpod.environment import Environment

        env = replace(Environment.read(), cpu_count=len(limits.cpus))
        devices = pod_job_devices(kind, range(k), env=env, affinity=limits.cpus)
    else:
        devices = pod_job_devices(kind, range(k))
    workers = len(devices)
    if kind != "cpu":
        return Layout(workers, None, f"{workers} worker{'s' if workers != 1 else ''}, one per GPU")
    threads = devices[0].threads
    text = (f"{k} CPU slot{'s' if k != 1 else ''} run as {workers} worker{'s' if workers != 1 else ''} of "
            f"{threads} thread{'s' if threads != 1 else ''}")  # fmt: skip
    return Layout(workers, threads, text)


@dataclass
class Prediction:
    """The plan's time for a job; the plan's figures (the fields after ``can_calibrate``) only when it has one."""

    machine: str
    calibrated: bool = False
    message: str = ""
    rows: list[list[str]] = field(default_factory=list)
    """``[label, figure as text]``."""
    layout: Layout | None = None
    calibration_job: dict[str, Any] | None = None
    """`calibration.collect`: the calibration job awaited, if any."""
    can_calibrate: bool = False
    when: str | None = render.unless_none()
    precision: str | None = render.unless_none()
    epochs: float | None = render.unless_none()
    global_batch: int | None = render.unless_none()
    time_to_train_s: float | None = render.unless_none()
    images_per_s: float | None = render.unless_none()
    step_s: float | None = render.unless_none()
    compute_s: float | None = render.unless_none()
    comm_s: float | None = render.unless_none()
    scaling_efficiency: float | None = render.unless_none()


def prediction(web: Web, info: Mapping[str, Any], summary: Mapping[str, Any], values: Mapping[str, Any]) -> Prediction:
    """The plan's time for this job on this box: calibrated (machine ``local``), or the catalog machine the pod
    runs as; otherwise a plain "not calibrated" and how to calibrate (a calibration job, `deskpod.web.calibration`),
    with no number. The plan assumes the workers and threads the trainer will run (`job_layout`)."""
    from deskpod.plan import local
    from deskpod.plan.predict import predict_plan
    from deskpod.plan.workload import Workload
    from deskpod.web import calibration

    k = len(values["indices"])
    machine = web.pod.config.machine
    out = Prediction(machine or local.LOCAL)
    try:
        layout = out.layout = job_layout(web, k)
    except DeskpodError as e:
        out.message = f"No prediction: {e}."
        return out
    workers = layout.workers
    batch = int(values["batch_size"])
    steps = int(values["steps"] or 0)
    try:
        epochs = steps * batch * workers / summary["train_size"] if steps else float(values["epochs"])
    except OverflowError:  # a count of hundreds of digits (a field holds up to MAX_VALUE characters)
        out.message = "No prediction: a run this long is past what a float can count."
        return out
    home = Path(web.home).resolve()
    factors = None
    if machine is None:
        if not local.calibration_path(home).exists():
            out.calibration_job = calibration.collect(web)  # a finished calibration job's fit is stored here
        try:
            cal = local.load(home)
        except UsageError as e:
            job = out.calibration_job
            out.can_calibrate = job is None or job["state"] not in ("queued", "starting", "building", "running")
            if job is not None:
                out.message = job["message"]
            elif local.calibration_path(home).exists():
                out.message = f"No predicted time: {e}."  # a damaged file: its own message
            else:
                out.message = (
                    "This box is not calibrated, so there is no predicted time. Calibrate it with the button below "
                    f"(a job on every device of the pod), or as the pod's admin with: "
                    f"DESKPOD_HOME={shlex.quote(str(home))} deskpod plan calibrate. {CALIBRATE_HELP}."
                )
            return out
        factors, kind, out.when = cal.factors, cal.measurements.kind, cal.when
    else:
        from deskpod.hardware.catalog import find_machine

        kind = find_machine(machine).kind
    precision = _plan_precision(str(values["precision"]), kind, machine)
    try:
        w = Workload(
            networks.model_cost(dict(info), summary["input_shape"]), batch=batch, precision=precision,  # type: ignore[arg-type]
            dataset_images=int(summary["train_size"]), epochs=epochs,
            data="real" if summary["kind"] == "imagefolder" else "synthetic",  # in-memory data decodes nothing
        )  # fmt: skip
        plan = predict_plan(w, machine or local.LOCAL, devices_per_node=workers, factors=factors, home=home,
                            threads=layout.threads)  # fmt: skip
    except UsageError as e:
        out.message = f"No prediction: {e}."
        return out
    out = replace(
        out, calibrated=True, precision=precision, epochs=epochs, global_batch=batch * workers,
        time_to_train_s=plan.time_to_train_s, images_per_s=plan.images_per_s, step_s=plan.step_s,
        compute_s=plan.compute_s, comm_s=plan.exposed_comm_s, scaling_efficiency=plan.scaling_efficiency,
    )  # fmt: skip
    out.rows = [
        ["Time to train", render.duration(plan.time_to_train_s)],
        ["Images/s", render.number(plan.images_per_s)],
        ["Step time", f"{render.number(plan.step_s * 1e3)} ms"],
    ]
    where = f"machine {machine} (the pod runs as it)" if machine else f"this box as calibrated on {cal.when}"
    out.message = (
        f"{render.number(epochs)} epoch{'s' if epochs != 1 else ''} of {summary['train_size']:,} images at "
        f"{precision}, {layout.text} × batch {batch}: the plan for {where}. Starting the workers "
        "and loading the data come on top."
    )
    return out


# --------------------------------------------------------------------------- the view
def _fashion_root() -> Path:
    from deskpod.environment import Environment

    return Environment.read().fashion_mnist_dir


def _cache(web: Web, name: str) -> dict[Any, Any]:
    return web.cache.setdefault(name, {})  # type: ignore[no-any-return]


def reader(web: Web, who: Viewer) -> Account | None:
    """Whose rights the signed-in user's image folders are read with: on a root pod, their OS account (the one
    their jobs run as), so the dashboard shows them what their jobs could read and nothing more; else the
    dashboard's own."""
    accounts = web.pod.accounts
    return accounts.account_for(who.user) if accounts is not None and accounts.root else None


def _reading(data: str, account: Account | None, read: Callable[[], T]) -> T:
    try:
        return read()
    except OSError as e:  # a folder (or a class folder in it) the account may not read
        who = f"your OS account {account.name!r}" if account is not None else "the pod service"
        raise DataError(
            f"{datasets.normalize(data)}: {who} cannot read this folder ({e.filename or 'it'}: {e.strerror}), so "
            "your jobs could not either; give a folder it may read"
        ) from None


def explore(web: Web, who: Viewer, data: str) -> dict[str, Any]:
    account = reader(web, who)
    return _reading(data, account, lambda: datasets.explore(data, _cache(web, "datasets"), _fashion_root(), account))


def network(web: Web, model: str, summary: Mapping[str, Any]) -> dict[str, Any]:
    return networks.network(model, summary["input_shape"], summary["num_classes"], _cache(web, "networks"),
                            cwd=Path(web.home))  # fmt: skip


@dataclass
class Preview:
    """Step 3's live part (twin ``/ui/new/preview.json``): errors per field, placement, prediction, the job spec
    and its CLI and API forms."""

    errors: dict[str, str]
    query: str
    error: str = ""
    placement: Placement | None = None
    prediction: Prediction | None = None
    spec: dict[str, Any] | None = None
    cli: str = ""
    curl: str = ""


def preview(web: Web, state: Mapping[str, str], summary: Mapping[str, Any], info: Mapping[str, Any],
            url: str) -> Preview:  # fmt: skip
    values, errors = check_train(web, state, summary)
    out = Preview(errors, state_query(state))
    if "devices" not in errors:
        out.placement = place = placement(web, values)
        if not place.ever:
            errors["devices"] = f"job can never fit this box: {place.reason}"  # what the pod's submit says
    if not errors.keys() & {"devices", "epochs", "steps", "batch_size", "precision"}:
        out.prediction = prediction(web, info, summary, values)
    if errors:
        return out
    spec = job_spec(state, values)
    from deskpod.jobs.spec import parse_spec

    try:
        parse_spec(spec, device_count=web.pod.device_count)  # the job spec's own limits (a name of NAME_MAX characters)
    except ConfigError as e:
        field = next((f for f in TRAIN_FIELDS if str(e).startswith(f"job spec: {f} ")), None)
        if field:
            errors[field] = str(e)
        else:
            out.error = str(e)
        return out
    out.spec, out.cli, out.curl = spec, deskpod_line(web, train_kind.submit_argv(spec)), curl_line(spec, url)
    return out


@dataclass
class NewPage:
    """The New training page's data (twin ``/ui/new.json``) for the step the choices reach."""

    step: int
    choices: dict[str, str]
    defaults: dict[str, str]
    errors: dict[str, str]
    datasets: list[dict[str, str]]
    error: str = ""
    dataset: dict[str, Any] | None = None
    """`datasets.explore` of the chosen dataset."""
    networks: list[dict[str, Any]] | None = None
    network: dict[str, Any] | None = None
    preview: Preview | None = None


def view(web: Web, who: Viewer, state: dict[str, str], asked: str | None, url: str) -> tuple[NewPage, int]:
    """The page's data for the step the choices reach, and its HTTP status (400 when a choice is bad)."""
    errors: dict[str, str] = {}
    step = step_of(state, asked)
    out = NewPage(step, state, defaults(), errors, list(datasets.CARDS))
    summary = None
    if state["data"]:
        try:
            summary = explore(web, who, state["data"])
            state["data"] = summary["data"]  # an image folder's path made absolute, as the job gets it
        except DeskpodError as e:
            errors["data"] = str(e)
            step = 1
    if summary is not None and step >= 2:
        out.dataset = summary
    if summary is not None and state["model"]:
        info = network(web, state["model"], summary)
        if info["error"]:
            errors["model"] = info["error"]
            step = min(step, 2)
        elif step == 3:
            out.network = info
            out.preview = pv = preview(web, state, summary, info, url)
            errors.update(pv.errors)
            out.error = pv.error
    if summary is not None and (step == 2 or "model" in errors):
        out.networks = networks.cards(summary["input_shape"], summary["num_classes"], _cache(web, "networks"))
    out.step = step
    return out, 400 if errors or out.error else 200


def _page(web: Web, request: Request, who: Viewer, data: NewPage, status: int, state: dict[str, str]) -> Response:
    """The page (or its twin), with what only the HTML needs: links that keep the choices, and formatting."""
    from deskpod.train.config import OPTIMIZERS, PRECISIONS

    def keep(*skip: str) -> list[tuple[str, str]]:
        query = parse_qsl(state_query(state))
        return [(k, v) for k, v in query if k not in skip]

    def sample_src(data: str, cls: int) -> str:
        return f"{ROOT}/datasets/samples.png?{urlencode({'data': data, 'class': cls})}"

    count = web.pod.device_count
    noun = "GPU" if web.pod.device_kind == "cuda" else "CPU worker slot"
    extra = {"state": state, "href": lambda **changes: href(state, **changes), "keep": keep, "labels": LABELS,
             "sample_src": sample_src, "sample_size": datasets.sample_size, "sample_classes": datasets.SAMPLE_CLASSES,
             "si": si, "device_count": count, "device_noun": noun + ("s" if count != 1 else ""),
             "precisions": PRECISIONS, "optimizers": OPTIMIZERS}  # fmt: skip
    return render.page(request, "new.html", data, who, title="New training", status=status, extra=extra)


def si(x: float | None) -> str:
    """``421,738`` as ``422 k``, ``8,482,304`` as ``8.48 M``: three significant digits and an SI prefix."""
    if x is None:
        return "-"
    for factor, prefix in ((1e12, "T"), (1e9, "G"), (1e6, "M"), (1e3, "k")):
        if abs(x) >= factor:
            return f"{x / factor:.3g} {prefix}"
    return f"{x:.3g} "


LABELS = {
    "devices": "Devices", "epochs": "Epochs", "steps": "Steps", "batch_size": "Batch size per device",
    "precision": "Precision", "optimizer": "Optimizer", "lr": "Learning rate", "name": "Run name",
}  # fmt: skip
"""The fields' accessible names (the end-to-end tests find them by these)."""


def _pod_url(request: Request) -> str:
    return f"{request.url.scheme}://{request.url.netloc}"


def start(web: Web, who: Viewer, state: dict[str, str], url: str) -> tuple[NewPage, int, JobRecord | None]:
    """Check every choice, then queue the job: (page data, status, the job or None)."""
    data, status = view(web, who, state, None, url)
    if status != 200 or data.step != 3 or data.preview is None or data.preview.spec is None:
        return data, 400, None
    try:
        job = web.pod.submit(who.user, data.preview.spec)
    except DeskpodError as e:
        from deskpod.jobs.api import status_of

        data.error = str(e)
        return data, status_of(e), None
    return data, 201, job


def register(app: FastAPI, web: Web) -> None:
    @app.get("/new.json")
    @app.get("/new")
    def new_page(request: Request, who: Signed, step: Annotated[str | None, Query(max_length=1)] = None) -> Response:
        state = read_state(request.query_params)
        data, status = view(web, who, state, step, _pod_url(request))
        return _page(web, request, who, data, status, state)

    @app.get("/new/preview.json")
    def preview_json(request: Request, who: Signed) -> Response:
        """Step 3's live part for the query's values (200 with ``errors`` for bad values: it is a check)."""
        state = read_state(request.query_params)
        data, _ = view(web, who, state, None, _pod_url(request))
        if data.preview is not None:
            return render.json_response(data.preview)
        return JSONResponse({"errors": data.errors, "error": "choose a dataset and a network first",
                             "query": state_query(state)}, status_code=400)  # fmt: skip

    @app.post("/new")
    async def submit(request: Request, who: Signed) -> Response:
        fields = await form_csrf(request, who)
        state = read_state(fields)
        if fields.get("action") == "preview":  # the no-JavaScript preview: the form's values into the URL
            return RedirectResponse(href(state), status_code=303)
        data, status, job = await run_in_threadpool(start, web, who, state, _pod_url(request))
        if job is None:
            return _page(web, request, who, data, status, state)
        if render.wants_json(request):
            return JSONResponse(job.to_json(), status_code=201)
        return RedirectResponse(f"{ROOT}/jobs/{job.id}", status_code=303)

    @app.post("/new/calibrate")
    async def calibrate(request: Request, who: Signed) -> Response:
        """Queue this box's calibration job (`deskpod.web.calibration`), then back to the page it was asked from."""
        from deskpod.web import calibration

        fields = await form_csrf(request, who)
        if web.pod.config.machine is not None:
            raise ConflictError(f"this pod predicts for machine {web.pod.config.machine}; it needs no calibration")
        job = await run_in_threadpool(calibration.start, web, who)
        if render.wants_json(request):
            return JSONResponse(job.to_json(), status_code=201)
        return RedirectResponse(safe_next(fields.get("next")), status_code=303)

    @app.get("/datasets/samples.png")
    def samples_png(
        who: Signed,
        data: Annotated[str, Query(max_length=MAX_VALUE)],
        cls: Annotated[int | None, Query(alias="class", ge=0, le=1_000_000)] = None,
    ) -> Response:
        account = reader(web, who)
        png = _reading(
            data, account, lambda: datasets.samples_png(data, cls, _cache(web, "datasets"), _fashion_root(), account)
        )
        return Response(png, media_type="image/png", headers={"Cache-Control": "private, max-age=300"})
