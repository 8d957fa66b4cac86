"""The Models page: deployments from the port file, deploy through the form, try a model, who may see what.

Fast tests check the pure parts (image to tensor, top-5, the port file's states) without a daemon; the rest drive
a real pod. Serve jobs there serve a hand-made run (a tiny registry MLP, `tests.serve.test_deploy.make_run`), so
they are ready in seconds; one slow test trains a real (5-step) Fashion-MNIST run and deploys it through the form.
"""

from __future__ import annotations

import io
import json
import os
import re
import shlex
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import httpx
import numpy as np
import pytest
from PIL import Image

from deskpod.errors import ConfigError, ConflictError, NotFoundError
from deskpod.jobs.states import JobState
from deskpod.web import images, models, render
from tests.jobs.pods import SLEEPER, Pod, free_port, python_job, wait_for, wait_state
from tests.serve.test_deploy import LABELS, make_run
from tests.web.browser import csrf_of, new_user, sign_in


def png(im: Image.Image) -> bytes:
    buf = io.BytesIO()
    im.save(buf, format="PNG")
    return buf.getvalue()


# ------------------------------------------------------------------------------------------ pure parts
def test_to_input_converts_resizes_and_scales() -> None:
    rgba = Image.new("RGBA", (40, 20), (255, 255, 255, 255))
    rgba.paste((255, 255, 255, 0), (0, 0, 20, 20))  # left half transparent: over black
    x, seen = images.to_input(images.decode_image(png(rgba)), 1, 8, 8)
    assert x.shape == (1, 1, 8, 8) and x.dtype == np.float32 and seen.size == (8, 8)
    assert x[0, 0, :, 0].max() == 0.0 and x[0, 0, :, -1].min() == 1.0
    x3, _ = images.to_input(Image.new("RGB", (5, 7), (255, 0, 51)), 3, 0, 0)  # -1 dims: keep the image's size
    assert x3.shape == (1, 3, 7, 5)
    np.testing.assert_allclose(x3[0, :, 0, 0], [1.0, 0.0, 0.2], atol=1e-6)


def test_decode_image_refuses_what_is_not_a_small_image() -> None:
    with pytest.raises(ConfigError, match="not an image"):
        images.decode_image(b"hello, I am text\n")
    with pytest.raises(ConfigError, match="empty"):
        images.decode_image(b"")
    with pytest.raises(ConfigError, match="damaged"):
        images.decode_image(png(Image.new("L", (64, 64), 3))[:-40])
    with pytest.raises(ConfigError, match="pixels"):
        images.decode_image(png(Image.new("1", (8000, 6000))))  # a few KiB of file, 48 million pixels


def test_top_k_is_softmax_ordered_with_labels() -> None:
    top = models.top_k(np.array([1.0, 3.0, 2.0, -1.0, 0.0, 0.5]), ["a", "b", "c", "d", "e"])
    assert [t["index"] for t in top] == [1, 2, 0, 5, 4] and [t["label"] for t in top] == ["b", "c", "a", "5", "e"]
    p = np.exp([1.0, 3.0, 2.0, -1.0, 0.0, 0.5])
    assert top[0]["score"] == pytest.approx(p[1] / p.sum())
    assert len(models.top_k(np.array([0.0, 1.0]), [])) == 2


def test_loopback_url_only() -> None:
    assert models.loopback_url("http://127.0.0.1:8123") == "http://127.0.0.1:8123"
    for bad in ("http://10.0.0.1:80", "https://127.0.0.1:1", "http://127.0.0.1", "http://127.0.0.1:1/x",
                "http://127.0.0.1:99999", "http://evil@127.0.0.1.example:80", None, 5):  # fmt: skip
        assert models.loopback_url(bad) is None, bad


def test_input_spec_refuses_what_this_page_cannot_feed() -> None:
    ok = {"inputs": [{"name": "input", "datatype": "FP32", "shape": [-1, 3, 32, 32]}]}
    assert models.input_spec(ok) == ("input", 3, 32, 32)
    with pytest.raises(ConflictError, match="FP32"):
        models.input_spec({"inputs": [{"name": "t", "datatype": "INT64", "shape": [-1, 10]}]})
    with pytest.raises(ConflictError, match="2 inputs"):
        models.input_spec({"inputs": [ok["inputs"][0], ok["inputs"][0]]})


def test_server_times_only_when_our_request_was_alone() -> None:
    def stats(n: int, ns: int) -> dict[str, Any]:
        keys = ("success", "queue", "compute_input", "compute_infer", "compute_output")
        return {"model_stats": [{"version": "1", "inference_stats": {k: {"count": n, "ns": ns} for k in keys}}]}

    got = models._server_times(stats(3, 1_000_000), stats(4, 3_000_000))
    assert got == {"queue_ms": 2.0, "compute_ms": 6.0, "server_ms": 2.0}
    assert models._server_times(stats(3, 0), stats(5, 9)) is None  # another request ran meanwhile
    assert models._server_times(None, stats(1, 1)) is None


def fake_job(state: JobState, **over: Any) -> Any:
    base = dict(id=7, user="ann", name="serve-m", state=state, reason="", devices=1, assigned=(0,), submitted_at=1.0,
                started_at=time.time() - 5, finished_at=None, stop_reason=None,
                spec=SimpleNamespace(serve={"run": "/nowhere/runs/r", "model": "m", "format": "onnx",
                                            "max_batch_size": 8}))  # fmt: skip
    job = SimpleNamespace(**{**base, **over})
    job.to_json = lambda: {**vars(job), "id": str(job.id), "state": job.state.value, "assigned": list(job.assigned)}
    return job


def test_deployment_status_follows_job_state_and_port_file(tmp_path: Path) -> None:
    def no_job(who: Any, job_id: str) -> Any:
        raise NotFoundError(job_id)

    web = SimpleNamespace(home=tmp_path, pod=SimpleNamespace(job_folder=lambda job: tmp_path), job=no_job, cache={})
    who = SimpleNamespace(user=SimpleNamespace(name="ann", admin=False))
    port_file = tmp_path / "serve.json"

    def status(job: Any, doc: dict[str, Any] | None = None, age: float = 0.0) -> tuple[str, str, bool]:
        if doc is not None:
            port_file.write_text(json.dumps(doc))
            t = time.time() - age
            os.utime(port_file, (t, t))
        row = models.deployment(web, who, job, with_metadata=False)  # type: ignore[arg-type]
        return row.status, row.detail, row.ready

    url = "http://127.0.0.1:5"
    assert status(fake_job(JobState.QUEUED, started_at=None))[0] == "queued"
    assert status(fake_job(JobState.RUNNING))[:2] == ("starting", "exporting the run's latest checkpoint")
    assert status(fake_job(JobState.RUNNING), {"url": url, "ready": False})[:2] == ("starting", "loading the model")
    ready = {"url": url, "ready": True, "models": ["m"], "unavailable": {}}
    assert status(fake_job(JobState.RUNNING), ready) == ("ready", "serving", True)
    assert status(fake_job(JobState.RUNNING), ready, age=60)[0] == "starting"  # an earlier attempt's file
    assert status(fake_job(JobState.RUNNING), {**ready, "url": "http://10.1.1.1:5"})[0] == "starting"
    broken = {**ready, "models": [], "unavailable": {"m": "failed to load: bad onnx"}}
    assert status(fake_job(JobState.RUNNING), broken)[:2] == (
        "error",
        "the model did not load: failed to load: bad onnx",
    )
    assert status(fake_job(JobState.RUNNING, stop_reason="cancel"), ready)[0] == "stopping"
    assert status(fake_job(JobState.CANCELLED, reason="cancelled"), ready) == ("stopped", "not serving", False)


def test_try_page_of_a_starting_deployment_says_so() -> None:
    row = {"id": "7", "model": "m", "status": "starting", "detail": "loading the model", "url": None, "train_job": None,
           "run_name": "r", "metadata": None, "ready": False}  # fmt: skip
    data = {"deployment": row, "samples": 0, "max_upload_bytes": 1, "form": {"sample": ""}, "result": None,
            "errors": {}}  # fmt: skip
    viewer = SimpleNamespace(user=SimpleNamespace(name="ann", admin=False), csrf="t")
    html = render.TEMPLATES.get_template("try.html").render(
        data=data, viewer=viewer, title="x", path="/ui/models/7/try", twin="", query="", shown=None, seen=None
    )
    assert "starting" in html and "loading the model" in html
    assert 'type="file"' not in html  # nothing to send it to yet


# ------------------------------------------------------------------------------------------ a real pod
def deployment_of(client: httpx.Client, job_id: str) -> dict[str, Any] | None:
    r = client.get("/ui/models.json")
    assert r.status_code == 200, r.text
    return next((d for d in r.json()["deployments"] if d["id"] == job_id), None)


def wait_ready(client: httpx.Client, job_id: str, timeout: float = 120) -> dict[str, Any]:
    def ready() -> dict[str, Any] | None:
        d = deployment_of(client, job_id)
        assert d is not None and d["status"] not in ("stopped", "error"), d
        return d if d["ready"] else None

    got = wait_for(ready, timeout, f"deployment {job_id} to be ready")
    assert isinstance(got, dict)
    return got


@pytest.fixture(scope="module")
def tiny_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_run(tmp_path_factory.mktemp("runs") / "tiny", 4)


@pytest.fixture(scope="module")
def served(web_pod: Pod, tiny_run: Path) -> Iterator[str]:
    """A serve job of the admin's on the tiny run, submitted through the API, ready."""
    api = web_pod.client()
    job_id = str(
        api.submit({"name": "serve-tiny", "devices": 1, "serve": {"run": str(tiny_run), "model": "tiny"}})["id"]
    )
    c = sign_in(web_pod)
    try:
        wait_ready(c, job_id)
        yield job_id
    finally:
        c.close()
        if api.job(job_id)["state"] in ("queued", "starting", "running"):
            api.cancel(job_id)
            wait_state(api, job_id, "cancelled", "succeeded", "failed")


def test_deploy_without_csrf_is_refused(web_pod: Pod, admin: httpx.Client) -> None:
    before = len(web_pod.client().jobs())
    r = admin.post("/ui/models/deploy", data={"job": "1", "devices": "1"})
    assert r.status_code == 403 and "CSRF" in r.text
    assert len(web_pod.client().jobs()) == before  # nothing submitted


BAD_DEPLOY = {"devices": "many", "format": "tensorrt", "max_batch_size": "0"}
BAD_DEPLOY_MESSAGES = {
    "devices": "devices 'many' is not a whole number",
    "format": "format 'tensorrt' is not one of onnx, torch",
    "max_batch_size": "max batch size 0 is out of range",
}


def test_deploy_bad_values_are_named_and_nothing_is_submitted(web_pod: Pod, admin: httpx.Client) -> None:
    api = web_pod.client()
    job = api.submit({"name": "not-a-run", "command": python_job(SLEEPER), "devices": 1})
    try:
        token = csrf_of(admin, "/ui/models")
        before = len(api.jobs())
        r = admin.post("/ui/models/deploy", data={"csrf": token, "job": job["id"], **BAD_DEPLOY},
                       headers={"Accept": "application/json"})  # fmt: skip
        assert r.status_code == 400
        errors = r.json()["errors"]
        assert "is not a training job" in errors.pop("job")
        assert {k: v.split(";")[0] for k, v in errors.items()} == BAD_DEPLOY_MESSAGES
        r = admin.post("/ui/models/deploy", data={"csrf": token, "job": job["id"], "devices": "1"})
        assert r.status_code == 400 and "is not a training job" in r.text  # no run to deploy: said on the page
        assert len(api.jobs()) == before  # nothing was submitted
    finally:
        api.cancel(job["id"])


def test_a_failed_deployment_says_why(web_pod: Pod, admin: httpx.Client, tiny_run: Path) -> None:
    """A deploy that cannot start (here: the run's only checkpoint is damaged) shows what its ``deskpod serve``
    said, on the Models page and on the job's page, not only its exit code."""
    api = web_pod.client()
    train = api.submit({"name": "damaged", "devices": 1, "train": {"model": "mlp", "data": "imagefolder:/nowhere"}})
    wait_state(api, train["id"], "failed", timeout=120)  # the trainer refuses the data: it said so too
    job_page = admin.get(f"/ui/jobs/{train['id']}.json").json()
    assert "imagefolder path '/nowhere' does not exist" in job_page["failure"]
    run = web_pod.home / "jobs" / train["id"] / "runs" / "damaged"
    (run / "checkpoints").mkdir(parents=True)
    good = next((tiny_run / "checkpoints").iterdir())
    (run / "checkpoints" / good.name).write_bytes(good.read_bytes()[:100])  # cut short: no zip directory
    r = admin.post("/ui/models/deploy", data={"csrf": csrf_of(admin, "/ui/models"), "job": train["id"], "devices": "1",
                                              "format": "onnx", "max_batch_size": "4"})  # fmt: skip
    assert r.status_code == 303, r.text
    job_id = r.headers["location"].rsplit("-", 1)[1]
    done = wait_state(api, job_id, "failed", timeout=120)
    assert done["reason"] == "exit code 2"  # all the pod itself knows
    d = deployment_of(admin, job_id)
    assert d is not None and d["status"] == "failed", d
    said = f"run {run}: no loadable checkpoint in {run / 'checkpoints'}: checkpoint {run / 'checkpoints' / good.name} "
    assert d["detail"].startswith(said) and "is corrupt and was not loaded" in d["detail"]
    assert d["detail"] in admin.get("/ui/models").text.replace("&#39;", "'")
    page = admin.get(f"/ui/jobs/{job_id}")
    assert 'id="st-failure"' in page.text and admin.get(f"/ui/jobs/{job_id}.json").json()["failure"] == d["detail"]


def test_a_job_cannot_make_the_page_read_a_file_through_its_log(
    web_pod: Pod, admin: httpx.Client, tmp_path: Path
) -> None:
    """A job that swaps its output.log for a link to a file it names gets no line of that file shown as its failure."""
    secret = tmp_path / "secret"
    secret.write_text("deskpod: the secret in a file the job links to\n")
    code = ("import os, sys; log = os.path.join(os.environ['DESKPOD_JOB_DIR'], 'output.log'); os.remove(log); "
            f"os.symlink({str(secret)!r}, log); sys.exit(2)")  # fmt: skip
    api = web_pod.client()
    job = api.submit({"name": "linker", "command": python_job(code), "devices": 1})
    wait_state(api, job["id"], "failed", timeout=60)
    assert (web_pod.home / "jobs" / job["id"] / "output.log").is_symlink()
    doc = admin.get(f"/ui/jobs/{job['id']}.json").json()
    assert doc["failure"] is None and 'id="st-failure"' not in admin.get(f"/ui/jobs/{job['id']}").text


def test_deploy_of_a_run_you_may_not_see_is_404(web_pod: Pod, admin: httpx.Client) -> None:
    api = web_pod.client()
    job = api.submit({"name": "admins", "command": python_job("pass"), "devices": 1})
    bob = sign_in(web_pod, new_user(web_pod, "bob-deploy"))
    try:
        r = bob.post("/ui/models/deploy", data={"csrf": csrf_of(bob, "/ui/models"), "job": job["id"], "devices": "1"})
        assert r.status_code == 404
        r = bob.post("/ui/models/deploy", data={"csrf": csrf_of(bob, "/ui/models"), "job": "999999", "devices": "1"})
        assert r.status_code == 404
    finally:
        bob.close()


def test_try_page_of_a_job_that_is_not_a_deployment_is_404(web_pod: Pod, admin: httpx.Client) -> None:
    job = web_pod.client().submit({"name": "plain", "command": python_job("pass"), "devices": 1})
    assert admin.get(f"/ui/models/{job['id']}/try").status_code == 404
    assert admin.get("/ui/models/nope/try.json").status_code == 404


def test_models_page_lists_a_ready_deployment(web_pod: Pod, admin: httpx.Client, served: str, tiny_run: Path) -> None:
    d = deployment_of(admin, served)
    assert d is not None and d["ready"] and d["status"] == "ready" and d["can_stop"]
    assert d["url"].startswith("http://127.0.0.1:") and d["run"] == str(tiny_run) and d["train_job"] is None
    assert d["metadata"]["inputs"] == [{"name": "input", "datatype": "FP32", "shape": [-1, 1, 8, 8]}]
    assert d["metadata"]["labels"] == len(LABELS)
    html = admin.get("/ui/models").text
    row = html[html.index(f'id="deployment-{served}"') :].split("</tr>")[0]
    assert f'href="/ui/models/{served}/try" data-try >' in row and f'action="/ui/jobs/{served}/cancel"' in row
    assert "data-confirm=" in row and "ready" in row


def test_try_an_upload_gives_the_models_own_probabilities(admin: httpx.Client, served: str, tiny_run: Path) -> None:
    """An 8x8 grayscale PNG needs no resizing: the page's probabilities must be the model's own."""
    import torch

    from deskpod.train.checkpoint import load_model

    pixels = (np.arange(64, dtype=np.uint8).reshape(8, 8) * 4).astype(np.uint8)
    token = csrf_of(admin, f"/ui/models/{served}/try")
    r = admin.post(f"/ui/models/{served}/try", data={"csrf": token}, headers={"Accept": "application/json"},
                   files={"image": ("ramp.png", png(Image.fromarray(pixels, mode="L")), "image/png")})  # fmt: skip
    assert r.status_code == 200, r.text
    got = r.json()
    m = load_model(tiny_run)
    x = torch.from_numpy(pixels.astype(np.float32) / 255).view(1, 1, 8, 8)
    with torch.no_grad():
        p = torch.softmax(m.model((x - 0.5) / 0.25), 1)[0].numpy()
    order = np.argsort(-p)
    assert [t["index"] for t in got["top"]] == order.tolist() and [t["label"] for t in got["top"]] == [
        LABELS[i] for i in order
    ]
    np.testing.assert_allclose([t["score"] for t in got["top"]], p[order], rtol=1e-4)
    assert got["latency_ms"] > 0 and got["input"] == {"source": "upload", "filename": "ramp.png", "width": 8,
                                                      "height": 8, "shape": [1, 1, 8, 8]}  # fmt: skip
    assert got["server"] is None or got["server"]["compute_ms"] >= 0

    # The page: the classes, the latency, the image shown back as a data: URL.
    r = admin.post(f"/ui/models/{served}/try", data={"csrf": token},
                   files={"image": ("ramp.png", png(Image.fromarray(pixels, mode="L")), "image/png")})  # fmt: skip
    assert r.status_code == 200
    assert f"<td>{LABELS[order[0]]}</td>" in r.text and "Latency:" in r.text and 'src="data:image/png;base64,' in r.text


def test_try_refuses_bad_uploads_clearly(admin: httpx.Client, served: str) -> None:
    token = csrf_of(admin, f"/ui/models/{served}/try")
    url = f"/ui/models/{served}/try"
    r = admin.post(url, data={"csrf": token}, files={"image": ("notes.txt", b"not a picture\n", "text/plain")})
    assert r.status_code == 400
    assert re.search(r'id="image-error" role="alert">the uploaded file is not an image', r.text)
    r = admin.post(url, data={"csrf": token}, files={"image": ("a.txt", b"x", "text/plain")},
                   headers={"Accept": "application/json"})  # fmt: skip
    assert r.status_code == 400 and "not an image" in r.json()["error"]
    big = b"\x89PNG" + bytes(models.MAX_UPLOAD_BYTES)
    r = admin.post(url, data={"csrf": token}, files={"image": ("big.png", big, "image/png")})
    assert r.status_code == 413 and re.search(
        r'id="image-error" role="alert">the image is over the limit of 10 MiB', r.text
    )
    r = admin.post(url, data={"csrf": token}, files={"image": ("big.png", big + bytes(1 << 20), "image/png")},
                   headers={"Accept": "application/json"})  # fmt: skip
    assert r.status_code == 413 and "over the limit of 10 MiB" in r.json()["error"]  # refused before it is read
    r = admin.post(url, data={"csrf": token, "sample": "3"}, headers={"Accept": "application/json"})
    assert r.status_code == 400 and "not trained on Fashion-MNIST" in r.json()["error"]
    r = admin.post(url, data={"csrf": token}, headers={"Accept": "application/json"})
    assert r.status_code == 400 and "choose an image" in r.json()["error"]
    r = admin.post(url, files={"image": ("a.png", b"x", "image/png")})
    assert r.status_code == 403  # no CSRF token


def test_another_user_cannot_see_try_or_stop_a_deployment(web_pod: Pod, served: str) -> None:
    bob = sign_in(web_pod, new_user(web_pod, "bob-try"))
    try:
        token = csrf_of(bob, "/ui/models")
        assert bob.get(f"/ui/models/{served}/try").status_code == 404
        assert bob.get(f"/ui/models/{served}/try.json").status_code == 404
        r = bob.post(f"/ui/models/{served}/try", data={"csrf": token, "sample": "1"})
        assert r.status_code == 404
        assert bob.post(f"/ui/jobs/{served}/cancel", data={"csrf": token, "confirmed": "1"}).status_code == 404
        assert deployment_of(bob, served) is None
        assert f"deployment-{served}" not in bob.get("/ui/models").text
    finally:
        bob.close()
    assert web_pod.client().job(served)["state"] == "running"


def test_stopped_deployment_is_listed_as_stopped(web_pod: Pod, admin: httpx.Client, served: str) -> None:
    """The last test of the shared deployment: it stops it (so the slow test below has the devices)."""
    api = web_pod.client()
    job_id = served
    token = csrf_of(admin, "/ui/models")
    assert admin.post(f"/ui/jobs/{job_id}/cancel", data={"csrf": token, "confirmed": "1"}).status_code == 303
    wait_state(api, job_id, "cancelled")
    d = deployment_of(admin, job_id)
    assert d is not None and d["status"] == "stopped" and not d["ready"] and not d["can_stop"] and d["url"] is None
    r = admin.post(f"/ui/models/{job_id}/try", data={"csrf": token, "sample": "1"})
    assert r.status_code == 409 and "stopped" in r.text
    assert "This deployment is not serving" in admin.get(f"/ui/models/{job_id}/try").text


def assert_tensorboard_serves(line: str, tag: str) -> None:
    """Run the page's TensorBoard line for real (on a free port instead of 6006) and find the run's ``tag``."""
    argv = shlex.split(line)
    assert argv[0] == "tensorboard" and argv[argv.index("--host") + 1] == "127.0.0.1"
    port = free_port()
    argv[argv.index("--port") + 1] = str(port)
    proc = subprocess.Popen([str(Path(sys.executable).parent / "tensorboard"), *argv[1:]],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)  # fmt: skip
    try:

        def tags() -> dict[str, Any] | None:
            try:
                r = httpx.get(f"http://127.0.0.1:{port}/data/plugin/scalars/tags", timeout=5, trust_env=False)
            except httpx.HTTPError:
                return None
            doc = r.json() if r.status_code == 200 else {}
            return doc if any(tag in t for t in doc.values()) else None

        found = wait_for(tags, 120, f"TensorBoard to serve the run's {tag}")
        assert isinstance(found, dict)
    finally:
        proc.terminate()
        proc.wait(timeout=30)


@pytest.mark.slow
def test_train_deploy_try_stop(web_pod: Pod, admin: httpx.Client) -> None:
    """The whole flow on a real (5-step) Fashion-MNIST training: deploy it through the form, try it, stop it."""
    api = web_pod.client()
    train = {"model": "mlp", "data": "fashion-mnist", "steps": 5, "batch_size": 32, "log_every_steps": 1}
    train_id = str(api.submit({"name": "fm", "devices": 1, "train": train})["id"])
    wait_state(api, train_id, "succeeded", timeout=240)
    run_page = admin.get(f"/ui/jobs/{train_id}.json").json()
    config = run_page["config"]["values"]  # what the trainer used, not the defaults Fashion-MNIST ignores
    assert config["data"] == "fashion-mnist" and (config["num_classes"], config["image_size"]) == (10, 28)
    assert_tensorboard_serves(run_page["commands"]["tensorboard"], "train/loss")
    page = admin.get("/ui/models")
    assert f'<option value="{train_id}"' in page.text
    r = admin.post("/ui/models/deploy", data={"csrf": csrf_of(admin, "/ui/models"), "job": train_id, **BAD_DEPLOY})
    assert r.status_code == 400
    html = r.text.replace("&#39;", "'")
    for field, message in BAD_DEPLOY_MESSAGES.items():  # each message next to its field
        assert f'aria-describedby="{field}-error"' in html, field
        assert f'<span class="error" id="{field}-error" role="alert">{message}' in html, field
    assert 'value="many"' in html  # what was typed stays in the form
    # Deployed to take images as they are (the server decodes them) and to speak gRPC as well.
    r = admin.post("/ui/models/deploy", data={"csrf": csrf_of(admin, "/ui/models"), "job": train_id, "devices": "1",
                                              "format": "onnx", "max_batch_size": "4", "image_input": "true",
                                              "grpc": "true"})  # fmt: skip
    assert r.status_code == 303 and r.headers["location"].startswith("/ui/models#deployment-")
    job_id = r.headers["location"].rsplit("-", 1)[1]
    job = api.job(job_id)
    assert job["kind"] == "serve" and job["name"] == "serve-fm"
    assert {k: job["spec"]["serve"][k] for k in ("max_batch_size", "image_input", "grpc")} == {
        "max_batch_size": 4, "image_input": True, "grpc": True}  # fmt: skip
    try:
        d = wait_ready(admin, job_id)
        assert d["train_job"] == train_id and d["metadata"]["labels"] == 10 and d["image_input"]
        assert d["metadata"]["inputs"] == [{"name": "image", "datatype": "BYTES", "shape": [-1]}]
        import tritonclient.grpc as grpcclient

        assert d["grpc"] and d["grpc"].startswith("127.0.0.1:")
        with grpcclient.InferenceServerClient(d["grpc"]) as g:
            assert g.is_model_ready("fm") and g.get_model_metadata("fm").inputs[0].datatype == "BYTES"
        assert f"gRPC <code>{d['grpc']}</code>" in admin.get("/ui/models").text
        assert (web_pod.home / "jobs" / job_id / "serve.json").is_file()
        html = admin.get("/ui/models").text
        assert f'<a href="/ui/jobs/{train_id}">fm</a>' in html

        token = csrf_of(admin, f"/ui/models/{job_id}/try")
        shirt = Image.new("RGB", (120, 90), (30, 30, 30))
        shirt.paste((230, 230, 230), (30, 10, 90, 80))
        r = admin.post(f"/ui/models/{job_id}/try", data={"csrf": token},
                       files={"image": ("shirt.png", png(shirt), "image/png")})  # fmt: skip
        assert r.status_code == 200, r.text
        classes = ("T-shirt/top", "Trouser", "Pullover", "Dress", "Coat", "Sandal", "Shirt", "Sneaker", "Bag",
                   "Ankle boot")  # fmt: skip
        rows = re.findall(r"<td>([^<]+?)(?: <span class=\"tag\">true label</span>)?</td>\s*<td class=\"num\">([\d.]+)%",
                          r.text)  # fmt: skip
        assert len(rows) == 5 and all(label in classes for label, _ in rows), rows
        probs = [float(p) for _, p in rows]
        assert probs == sorted(probs, reverse=True) and sum(probs) <= 100.5, probs
        assert re.search(r"Latency: <strong>[\d.]+ ms</strong>", r.text)

        r = admin.post(f"/ui/models/{job_id}/try", data={"csrf": token, "sample": "0"},
                       headers={"Accept": "application/json"})  # fmt: skip
        got = r.json()
        assert r.status_code == 200 and got["input"]["true_label"] == "Ankle boot" and len(got["top"]) == 5
        assert sum(t["score"] for t in got["top"]) <= 1.0 + 1e-6 and got["latency_ms"] > 0

        assert admin.post(f"/ui/jobs/{job_id}/cancel", data={"csrf": token, "confirmed": "1"}).status_code == 303
        assert wait_state(api, job_id, "cancelled", "succeeded", "failed")["state"] == "cancelled"
        assert deployment_of(admin, job_id)["status"] == "stopped"  # type: ignore[index]
    finally:
        if api.job(job_id)["state"] in ("queued", "starting", "running"):
            api.cancel(job_id)
