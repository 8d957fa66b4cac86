"""New training against a real pod: the three steps, bad values next to their fields, the live preview
(placement, ring bandwidth, prediction, CLI line, API call), and the job it queues — the CLI's own."""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import sys
from contextlib import closing
from dataclasses import replace
from pathlib import Path
from types import SimpleNamespace
from typing import Any
from urllib.parse import parse_qs, urlsplit

import httpx
import pytest
from markupsafe import escape

from deskpod.comm.rings import build_rings
from deskpod.errors import DeskpodError
from deskpod.hardware.devices import parse_device_spec
from deskpod.hardware.placement import local_topology
from deskpod.plan.local import Measurements, fit_local, save
from deskpod.plan.predict import predict_plan
from deskpod.plan.workload import Workload
from deskpod.train.config import build_config
from deskpod.web import launch
from deskpod.web.networks import count, model_cost
from tests.jobs.pods import Pod, Pods, wait_for, wait_state
from tests.web.browser import csrf_of, hidden, launch_chromium, open_signed_in, sign_in

STEP3 = {"data": "fashion-mnist", "model": "convnet", "steps": "60", "batch_size": "32"}


@pytest.fixture(scope="module")
def pod(web_pod: Pod) -> Pod:
    """This module's pod (conftest's ``web_pod``); the tests write its calibration into its home."""
    return web_pod


def _devices(pod: Pod) -> int:
    return len(pod.client().status()["devices"])


def _job_ids(pod: Pod) -> set[str]:
    return {j["id"] for j in pod.client().jobs()}


def _stop(pod: Pod, job_id: str) -> None:
    c = pod.client()
    c.cancel(job_id)
    wait_state(c, job_id, "cancelled", "failed", "succeeded", timeout=60)


def _field(html: str, name: str) -> str:
    m = re.search(rf'<(?:input|select) id="f-{name}"[^>]*>', html)
    assert m, f"no field {name!r}"
    return m.group(0)


def _error(html: str, name: str) -> str:
    m = re.search(rf'id="{name}-error"[^>]*>([^<]*)<', html)
    assert m, f"no error slot for {name!r}"
    return m.group(1)


# --------------------------------------------------------------------------- the pages
def test_each_step_renders_with_its_controls(admin: httpx.Client) -> None:
    one = admin.get("/ui/new")
    assert one.status_code == 200
    assert 'aria-label="Fashion-MNIST"' in one.text and 'aria-label="Synthetic"' in one.text
    assert 'href="/ui/new?data=fashion-mnist"' in one.text
    assert '<label for="f-data">Other dataset</label>' in one.text

    two = admin.get("/ui/new", params={"data": "fashion-mnist"})
    assert two.status_code == 200
    assert "Dataset: Fashion-MNIST" in two.text and "Ankle boot" in two.text and "6,000" in two.text
    assert 'src="/ui/datasets/samples.png?data=fashion-mnist&amp;class=9"' in two.text
    assert 'aria-label="convnet"' in two.text and 'href="/ui/new?data=fashion-mnist&amp;model=convnet"' in two.text
    assert "needs images of at least 63×63 pixels" in two.text  # alexnet's card: the reason, no link
    assert 'aria-label="alexnet"' not in two.text
    assert "422 k parameters · 8.48 MFLOPs" in two.text

    three = admin.get("/ui/new", params={"data": "fashion-mnist", "model": "convnet"})
    assert three.status_code == 200
    for name, label in launch.LABELS.items():
        assert f'<label for="f-{name}">{label}</label>' in three.text
    assert 'value="start">Start training</button>' in three.text
    defaults = {"devices": "all", "epochs": "4", "batch_size": "128", "lr": "0", "steps": ""}
    for name, value in defaults.items():
        assert f'value="{value}"' in _field(three.text, name)
    assert '<option value="auto" selected>' in three.text
    assert "deskpod train --submit --model convnet --data fashion-mnist --epochs 4" in three.text

    twin = admin.get("/ui/new.json", params={"data": "fashion-mnist", "model": "convnet"}).json()
    assert twin["step"] == 3 and twin["dataset"]["num_classes"] == 10 and twin["network"]["params"] > 0
    assert twin["preview"]["spec"] == {"train": {"model": "convnet", "data": "fashion-mnist", "epochs": 4},
                                       "devices": "all"}  # fmt: skip


def test_sample_images_route(pod: Pod, admin: httpx.Client) -> None:
    r = admin.get("/ui/datasets/samples.png", params={"data": "fashion-mnist", "class": "0"})
    assert r.status_code == 200 and r.headers["content-type"] == "image/png" and r.content[:4] == b"\x89PNG"
    assert admin.get("/ui/datasets/samples.png", params={"data": "synthetic"}).status_code == 404
    anonymous = httpx.get(f"{pod.url}/ui/datasets/samples.png?data=fashion-mnist", follow_redirects=False)
    assert anonymous.status_code == 303 and "/ui/login" in anonymous.headers["location"]


# --------------------------------------------------------------------------- bad values
def _expected(pod: Pod, name: str, value: str) -> str:
    """The message the trainer's own checks give for this value."""
    try:
        if name == "devices":
            parse_device_spec(value, _devices(pod), "cpu")
        elif name == "lr":
            build_config(None, {name: float(value)})
        else:
            build_config(None, {name: int(value) if value.lstrip("-").isdigit() else value})
    except DeskpodError as e:
        return str(e)
    raise AssertionError(f"{name}={value!r} is valid")


@pytest.mark.parametrize(
    ("name", "value"),
    [("batch_size", "0"), ("steps", "-5"), ("epochs", "many"), ("devices", "64"), ("precision", "fp8"),
     ("name", "my run"), ("lr", "-1")],
)  # fmt: skip
def test_a_bad_value_is_shown_next_to_its_field_and_nothing_is_queued(
    pod: Pod, admin: httpx.Client, name: str, value: str
) -> None:
    query = {"data": "fashion-mnist", "model": "convnet", name: value}
    message = _expected(pod, name, value)
    page = admin.get("/ui/new", params=query)
    assert page.status_code == 400
    assert _error(page.text, name) == escape(message)
    field = _field(page.text, name)
    assert 'aria-invalid="true"' in field and f'aria-describedby="{name}-hint {name}-error"' in field
    assert "Fix the values marked above to see the command." in page.text
    preview = admin.get("/ui/new/preview.json", params=query).json()
    assert preview["errors"] == {name: message} and preview["spec"] is None and preview["cli"] == ""
    before = _job_ids(pod)
    csrf = hidden(page.text, "csrf")
    posted = admin.post("/ui/new", data={**query, "csrf": csrf, "action": "start"})
    assert posted.status_code == 400 and _error(posted.text, name) == escape(message)
    kept = f'<option value="{value}" selected>' if name == "precision" else f'value="{escape(value)}"'
    assert kept in (posted.text if name == "precision" else _field(posted.text, name))  # the form keeps the value
    assert _job_ids(pod) == before


def test_the_message_is_the_clis(pod: Pod, admin: httpx.Client) -> None:
    done = pod.cli("train", "--submit", "--batch-size", "0")
    assert done.returncode == 2
    page = admin.get("/ui/new", params={"data": "fashion-mnist", "model": "convnet", "batch_size": "0"})
    assert done.stderr.strip() == f"deskpod: {_error(page.text, 'batch_size')}"


def test_a_bad_dataset_or_network_stops_at_its_step(tmp_path: Path, admin: httpx.Client) -> None:
    missing = admin.get("/ui/new", params={"data": f"imagefolder:{tmp_path / 'nope'}", "model": "convnet"})
    assert missing.status_code == 400
    assert "does not exist or is not a folder" in _error(missing.text, "data")
    assert 'aria-current="step">1. Dataset' in missing.text and 'id="train-form"' not in missing.text
    (tmp_path / "one" / "cat").mkdir(parents=True)
    one = admin.get("/ui/new", params={"data": f"imagefolder:{tmp_path / 'one'}"})
    assert "found 1 class folders; need at least 2" in _error(one.text, "data")
    small = admin.get("/ui/new", params={"data": "fashion-mnist", "model": "alexnet", "steps": "60"})
    assert small.status_code == 400 and 'id="train-form"' not in small.text
    assert "needs images of at least 63×63 pixels" in _error(small.text, "model")
    assert 'name="steps" value="60"' in small.text  # the other choices ride along in the form
    big = admin.get("/ui/new", params={"data": "fashion-mnist", "model": "convnet", "batch_size": "40000"})
    assert "more than the 60000 training samples of fashion-mnist" in _error(big.text, "batch_size")


# --------------------------------------------------------------------------- the preview
def test_preview_has_placement_ring_cli_and_curl(pod: Pod, admin: httpx.Client) -> None:
    n = _devices(pod)
    doc = admin.get("/ui/new/preview.json", params={**STEP3, "devices": "1", "optimizer": "adamw"}).json()
    assert doc["errors"] == {}
    place = doc["placement"]
    assert len(place["devices"]) == 1 and set(place["devices"]) <= set(place["free"])
    assert place["ring"]["bandwidth"] == 0.0 and "no ring" in place["ring_text"]
    assert doc["cli"] == (f"DESKPOD_SOCKET={pod.home / 'pod.sock'} deskpod train --submit --model convnet "
                          "--data fashion-mnist --steps 60 --batch-size 32 --optimizer adamw --devices 1")  # fmt: skip
    words = shlex.split(doc["curl"])
    assert words[:3] == ["curl", "-X", "POST"] and words[-1] == f"{pod.url}/v1/jobs"
    assert "Authorization: Bearer $DESKPOD_TOKEN" in words
    assert json.loads(words[words.index("-d") + 1]) == doc["spec"]
    assert doc["spec"] == {"train": {"model": "convnet", "data": "fashion-mnist", "steps": 60, "batch_size": 32,
                                     "optimizer": "adamw"}, "devices": 1}  # fmt: skip
    if n < 2:
        return
    api = pod.client()
    wait_for(lambda: all(d["job"] is None for d in api.status()["devices"]), 30, "every device to be free")
    every = admin.get("/ui/new/preview.json", params={**STEP3, "devices": "all"}).json()["placement"]
    assert every["ring"]["bandwidth"] == build_rings(local_topology(), every["devices"]).bandwidth > 0
    named = admin.get("/ui/new/preview.json", params={**STEP3, "devices": "1,0"}).json()
    assert named["spec"]["devices"] == 2 and "you named 1, 0, so it asks for 2" in named["placement"]["note"]


def test_prediction_when_calibrated_and_a_plain_message_when_not(pod: Pod, admin: httpx.Client) -> None:
    query = {**STEP3, "devices": "1"}
    cal_file = pod.home / "plan" / "local.json"
    assert not cal_file.exists()
    before = admin.get("/ui/new/preview.json", params=query).json()["prediction"]
    assert before["calibrated"] is False and before["rows"] == []
    assert "not calibrated" in before["message"] and "deskpod plan calibrate" in before["message"]
    page = admin.get("/ui/new", params=query).text
    assert "This box is not calibrated" in page and "Time to train" not in page

    topology = local_topology()
    measured = Measurements(kind="cpu", devices=topology.device_count, cores=2, peak_tflops=0.1,
                            memory_bandwidth_gbs=20.0, model="resnet18", batch=8, shape=(3, 112, 112),
                            images_per_s=30.0 * topology.device_count, comm_busbw_gbs=2.0)  # fmt: skip
    cal = fit_local(measured, topology)
    save(cal, pod.home)
    try:
        got = admin.get("/ui/new/preview.json", params=query).json()["prediction"]
        counted = {"model": "convnet", **count("convnet", (1, 28, 28), 10)}
        w = Workload(model_cost(counted, (1, 28, 28)), batch=32, precision="fp32", dataset_images=60_000,
                     epochs=60 * 32 / 60_000, data="synthetic")  # fmt: skip
        plan = predict_plan(w, "local", devices_per_node=1, factors=cal.factors, home=pod.home)
        assert got["calibrated"] is True and got["precision"] == "fp32"
        assert got["images_per_s"] == pytest.approx(plan.images_per_s, rel=1e-9)
        assert got["time_to_train_s"] == pytest.approx(plan.time_to_train_s, rel=1e-9)
        assert got["step_s"] == pytest.approx(plan.step_s, rel=1e-9)
        assert [r[0] for r in got["rows"]] == ["Time to train", "Images/s", "Step time"]
        slower = admin.get("/ui/new/preview.json", params={**query, "steps": "600"}).json()["prediction"]
        assert slower["time_to_train_s"] == pytest.approx(10 * got["time_to_train_s"], rel=1e-9)
        # every device: the plan is for the workers and threads the trainer will run, not one worker per slot
        every = admin.get("/ui/new/preview.json", params={**query, "devices": "all"}).json()["prediction"]
        layout = every["layout"]
        w = Workload(model_cost(counted, (1, 28, 28)), batch=32, precision="fp32", dataset_images=60_000,
                     epochs=60 * 32 * layout["workers"] / 60_000, data="synthetic")  # fmt: skip
        plan = predict_plan(w, "local", devices_per_node=layout["workers"], factors=cal.factors, home=pod.home,
                            threads=layout["threads"])  # fmt: skip
        assert every["images_per_s"] == pytest.approx(plan.images_per_s, rel=1e-9)
        assert every["global_batch"] == 32 * layout["workers"] and layout["text"] in every["message"]
        shown = admin.get("/ui/new", params=query).text
        assert "Time to train" in shown and "not calibrated" not in shown
    finally:
        cal_file.unlink()


def test_the_predicted_layout_is_the_one_the_trainer_runs(pod: Pod, admin: httpx.Client) -> None:
    """The preview's workers × threads for a job are what its trainer then starts (its run's launch.json)."""
    api = pod.client()
    for devices in ("1", "all"):
        wait_for(lambda: all(d["job"] is None for d in api.status()["devices"]), 60, "every device to be free")
        choices = {**STEP3, "devices": devices, "name": f"layout-{devices}"}
        layout = admin.get("/ui/new/preview.json", params=choices).json()["prediction"]["layout"]
        r = admin.post("/ui/new", data={**choices, "csrf": csrf_of(admin, "/ui/new"), "action": "start"},
                       headers={"Accept": "application/json"})  # fmt: skip
        assert r.status_code == 201, r.text
        job = r.json()
        launched = pod.home / "jobs" / job["id"] / "runs" / job["name"] / "launch.json"
        try:
            wait_for(launched.is_file, 120, f"job {job['id']} to write its launch.json")
            ran = json.loads(launched.read_text())
        finally:
            _stop(pod, job["id"])
        assert (len(ran["devices"]), ran["threads"]) == (layout["workers"], layout["threads"]), (devices, layout)


def test_a_calibration_job_fits_the_measurements_not_the_file(tmp_path: Path) -> None:
    """The calibration job's file is its user's: the pod takes the measured figures from it and fits them itself."""
    from deskpod.jobs.spec import parse_spec
    from deskpod.jobs.states import JobState
    from deskpod.jobs.store import Store
    from deskpod.plan.local import Calibration, calibration_path, load
    from deskpod.web import calibration

    store = Store(tmp_path / "pod.db")
    store.add_user("ann", False)
    job = store.submit("ann", parse_spec(calibration.job_spec()), 1, 0.0)
    for state in (JobState.STARTING, JobState.RUNNING, JobState.SUCCEEDED):
        store.transition(job.id, state, "by the test")
    folder = tmp_path / "jobs" / str(job.id)
    folder.mkdir(parents=True)
    web = SimpleNamespace(home=tmp_path, store=store, pod=SimpleNamespace(job_folder=lambda j: folder))
    assert calibration.collect(web) is None  # nothing awaited
    calibration._remember(web, store.job(job.id))
    topology = local_topology()
    measured = Measurements(kind="cpu", devices=topology.device_count, cores=2, peak_tflops=0.1,
                            memory_bandwidth_gbs=20.0, model="resnet18", batch=8, shape=(3, 112, 112),
                            images_per_s=30.0 * topology.device_count, comm_busbw_gbs=2.0)  # fmt: skip
    honest = fit_local(measured, topology)
    forged = Calibration(measured, replace(honest.factors, cpu_compute_efficiency=1e6), 1.0, honest.when)
    (folder / "local.json").symlink_to(tmp_path / "elsewhere.json")  # a link is not read
    (tmp_path / "elsewhere.json").write_text(forged.to_json())
    assert "left no calibration" in calibration.collect(web)["message"]  # type: ignore[index]
    assert not calibration_path(tmp_path).exists()
    (folder / "local.json").unlink()
    (folder / "local.json").write_text(forged.to_json())
    assert calibration.collect(web) is None
    assert load(tmp_path).factors == honest.factors and calibration.waiting_job(web) is None


@pytest.mark.slow
def test_the_page_calibrates_the_box_in_the_background(tmp_path: Path) -> None:
    """A fresh pod has no calibration: the page offers a calibration job, says while it runs, then predicts (root's
    pod with its sandbox: the job measures inside its walls and hands its figures over through its folder)."""
    pods = Pods(tmp_path)
    pod = pods(sandbox=True)
    try:
        with closing(sign_in(pod)) as c:
            query = {**STEP3, "devices": "1"}
            before = c.get("/ui/new/preview.json", params=query).json()["prediction"]
            assert before["calibrated"] is False and before["can_calibrate"] and before["calibration_job"] is None
            assert 'id="calibrate-form" hidden' not in c.get("/ui/new", params=query).text
            token = csrf_of(c, "/ui/new")
            r = c.post("/ui/new/calibrate", data={"csrf": token, "next": "/ui/new?data=fashion-mnist"})
            assert r.status_code == 303 and r.headers["location"] == "/ui/new?data=fashion-mnist"
            job = pod.client().jobs(name="calibrate")[0]
            again = c.post("/ui/new/calibrate", data={"csrf": token}, headers={"Accept": "application/json"})
            assert again.status_code == 201 and again.json()["id"] == job["id"]  # one at a time
            waiting = c.get("/ui/new/preview.json", params=query).json()["prediction"]
            assert waiting["calibration_job"]["job"] == job["id"] and not waiting["can_calibrate"]
            assert f"Calibration job {job['id']}" in waiting["message"]
            wait_state(pod.client(), job["id"], "succeeded", timeout=600)
            after = c.get("/ui/new/preview.json", params=query).json()["prediction"]
            assert after["calibrated"] is True and after["rows"][0][0] == "Time to train", after
            assert (pod.home / "plan" / "local.json").is_file()
            assert 'id="calibrate-form" hidden' in c.get("/ui/new", params=query).text
    finally:
        pods.stop_all()


# --------------------------------------------------------------------------- submitting
def pasted(line: str, home: Path) -> subprocess.CompletedProcess[str]:
    """``line`` run by a shell on this box as a user would paste it: ``deskpod`` on the PATH, and nothing in the
    environment that says where a pod is (no DESKPOD_URL, DESKPOD_HOME, token file; a HOME of its own)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("DESKPOD_")}
    env.update(HOME=str(home), PATH=f"{Path(sys.executable).parent}:{env.get('PATH', '/usr/bin:/bin')}")
    return subprocess.run(["sh", "-c", line], env=env, capture_output=True, text=True, timeout=120)


def test_start_queues_the_job_the_cli_line_queues(pod: Pod, admin: httpx.Client, tmp_path: Path) -> None:
    choices = {**STEP3, "devices": "1", "lr": "0.05", "name": "from-the-page"}
    preview = admin.get("/ui/new/preview.json", params=choices).json()
    csrf = hidden(admin.get("/ui/new", params=choices).text, "csrf")
    r = admin.post("/ui/new", data={**choices, "csrf": csrf, "action": "start"})
    assert r.status_code == 303, r.text
    m = re.fullmatch(r"/ui/jobs/(\d+)", r.headers["location"])
    assert m, r.headers["location"]
    page_job = pod.client().job(m.group(1))
    _stop(pod, page_job["id"])
    assert page_job["kind"] == "train" and page_job["name"] == "from-the-page"
    assert page_job["spec"]["train"] == preview["spec"]["train"]

    done = pasted(preview["cli"], tmp_path)  # the very line the page shows, pasted in a shell on the box
    assert done.returncode == 0, done.stderr
    cli_id = re.search(r"submitted job (\d+)", done.stdout)
    assert cli_id, done.stdout
    cli_job = pod.client().job(cli_id.group(1))
    _stop(pod, cli_job["id"])
    assert cli_job["spec"] == page_job["spec"] and cli_job["user"] == page_job["user"]

    words = shlex.split(preview["curl"])
    body = json.loads(words[words.index("-d") + 1])
    api_job = pod.client().submit(body)  # and the API call it shows
    _stop(pod, api_job["id"])
    assert api_job["spec"] == page_job["spec"]


def test_a_script_gets_201_and_the_job(pod: Pod) -> None:
    with httpx.Client(base_url=pod.url, headers={"Authorization": f"Bearer {pod.token}"}, timeout=60) as c:
        r = c.post("/ui/new", data={**STEP3, "name": "scripted"}, headers={"Accept": "application/json"})
        assert r.status_code == 201, r.text
        job = r.json()
        _stop(pod, job["id"])
        assert job["name"] == "scripted" and job["spec"]["train"]["steps"] == 60
        bad = c.post("/ui/new", data={**STEP3, "batch_size": "0"}, headers={"Accept": "application/json"})
        assert bad.status_code == 400 and "batch_size" in bad.json()["errors"]


def test_a_post_without_the_csrf_token_is_refused(pod: Pod, admin: httpx.Client) -> None:
    before = _job_ids(pod)
    r = admin.post("/ui/new", data={**STEP3, "action": "start"})
    assert r.status_code == 403
    assert _job_ids(pod) == before


def test_the_no_javascript_preview_puts_the_form_in_the_url(admin: httpx.Client) -> None:
    csrf = hidden(admin.get("/ui/new", params=STEP3).text, "csrf")
    r = admin.post("/ui/new", data={**STEP3, "precision": "fp32", "epochs": "", "csrf": csrf, "action": "preview"})
    assert r.status_code == 303
    target = r.headers["location"]
    assert parse_qs(urlsplit(target).query) == {k: [v] for k, v in {**STEP3, "precision": "fp32"}.items()}
    again = admin.get(target)
    assert "--precision fp32" in again.text and '<option value="fp32" selected>' in again.text


def test_an_expired_session_comes_back_to_the_same_form(pod: Pod) -> None:
    stale = httpx.Client(base_url=pod.url, follow_redirects=False, timeout=30, cookies={"deskpod_session": "gone"})
    wanted = "/ui/new?data=fashion-mnist&model=convnet&steps=60&batch_size=32&name=kept"
    r = stale.get(wanted)
    assert r.status_code == 303
    assert parse_qs(urlsplit(r.headers["location"]).query)["next"] == [wanted]
    posted = stale.post("/ui/new", data={**STEP3, "action": "start"}, headers={"Referer": pod.url + wanted})
    assert posted.status_code == 303 and parse_qs(urlsplit(posted.headers["location"]).query)["next"] == [wanted]
    stale.close()
    fresh = httpx.Client(base_url=pod.url, follow_redirects=False, timeout=30)
    form = fresh.get("/ui/login", params={"next": wanted})
    back = fresh.post("/ui/login", data={"csrf": hidden(form.text, "csrf"), "next": wanted, "token": pod.token})
    assert back.status_code == 303 and back.headers["location"] == wanted
    page = fresh.get(wanted).text
    assert 'value="60"' in _field(page, "steps") and 'value="kept"' in _field(page, "name")
    assert 'value="32"' in _field(page, "batch_size")
    fresh.close()


# --------------------------------------------------------------------------- pure parts
def test_the_cli_line_parses_back_to_the_same_spec(monkeypatch: pytest.MonkeyPatch) -> None:
    from deskpod.cli import build_parser
    from deskpod.cli import train as cli_train

    state = launch.read_state({"data": "imagefolder:/data/o'neil photos", "model": "mlp", "epochs": "2",
                               "batch_size": "64", "precision": "fp32", "optimizer": "adamw", "lr": "1e-05",
                               "devices": "2", "name": "o'neil"})  # fmt: skip
    web = SimpleNamespace(pod=SimpleNamespace(device_count=4, device_kind="cpu"))
    summary = {"train_size": 1000, "name": "imagefolder:/data/o'neil photos"}
    values, errors = launch.check_train(web, state, summary)
    assert set(errors) == {"name"}  # an apostrophe is no run name
    state["name"] = "oneil-run"
    values, errors = launch.check_train(web, state, summary)
    assert errors == {}
    spec = launch.job_spec(state, values)
    assert spec["train"]["lr"] == 1e-05 and spec["devices"] == 2
    captured: dict[str, Any] = {}

    def fake_submit(train: dict[str, Any], *, devices: int | str, name: str | None) -> str:
        captured.update(train=train, devices=devices, name=name)
        return "1"

    monkeypatch.setattr("deskpod.jobs.client.submit_train", fake_submit)
    args = build_parser().parse_args(shlex.split(launch.cli_line(spec))[1:])
    assert cli_train.submit(args) == 0
    assert {"train": captured["train"], "devices": captured["devices"], "name": captured["name"]} == spec


def test_prediction_on_the_catalog_machine_the_pod_runs_as(tmp_path: Path) -> None:
    web = SimpleNamespace(pod=SimpleNamespace(config=SimpleNamespace(machine="dgx1-v100")), home=tmp_path)
    info = {"model": "resnet50", "forward_flops": 8_178_368_512, "params": 25_557_032, "activations": 32_040_424}
    summary = {"input_shape": [3, 224, 224], "train_size": 50_000, "kind": "synthetic"}
    got = launch.prediction(web, info, summary, {"indices": list(range(8)), "batch_size": 64, "steps": 0,
                                                 "epochs": 3, "precision": "auto"})  # fmt: skip
    w = Workload(model_cost(info, (3, 224, 224)), batch=64, precision="fp16", dataset_images=50_000, epochs=3.0,
                 data="synthetic")  # fmt: skip
    want = predict_plan(w, "dgx1-v100", devices_per_node=8)
    assert got.calibrated is True and got.machine == "dgx1-v100"
    assert got.precision == "fp16"  # auto on a V100: no bf16, so fp16 (the trainer's rule)
    assert got.images_per_s == pytest.approx(want.images_per_s, rel=1e-9)


def _fake_web(tmp_path: Path, place: Any, held: tuple[int, ...] = ()) -> Any:
    status = {"devices": [{"index": d, "job": "7" if d in held else None} for d in range(4)], "queued": 1}
    pod = SimpleNamespace(device_count=4, device_kind="cpu", status=lambda: status, place=place, topology=None,
                          confinement=None, config=SimpleNamespace(machine=None, socket=None))  # fmt: skip
    return SimpleNamespace(pod=pod, home=tmp_path, cache={})


SUMMARY = {"train_size": 60_000, "name": "fashion-mnist", "input_shape": [1, 28, 28], "kind": "fashion-mnist"}
INFO = {"model": "convnet", "forward_flops": 8_482_304, "params": 421_738, "activations": 128_970, "error": None}


def test_a_job_that_must_wait_or_can_never_fit(tmp_path: Path) -> None:
    from deskpod.hardware.placement import Unplaceable

    asked: list[tuple[list[int], int, str]] = []

    def busy(free: Any, k: int, policy: str) -> Unplaceable:
        asked.append((list(free), k, policy))
        return Unplaceable("needs 2 free slots; 1 is free", ever=True)

    state = launch.read_state({**STEP3, "devices": "2"})
    waits = launch.preview(_fake_web(tmp_path, busy, held=(0, 1, 2)), state, SUMMARY, INFO, "http://x")
    assert asked == [([3], 2, "best")]  # the devices free now, the count asked, the pod's default policy
    assert waits.errors == {} and waits.placement is not None
    assert waits.placement.text == "It would wait: needs 2 free slots; 1 is free."
    assert "1 job is queued now" in waits.placement.note and waits.cli

    def never(free: Any, k: int, policy: str) -> Unplaceable:
        return Unplaceable("needs 2 NVLink-connected GPUs; none are linked", ever=False)

    refused = launch.preview(_fake_web(tmp_path, never), state, SUMMARY, INFO, "http://x")
    assert refused.errors == {"devices": "job can never fit this box: needs 2 NVLink-connected GPUs; none are linked"}
    assert refused.spec is None


def test_the_prediction_reads_the_pods_own_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from deskpod.hardware.topology import cpu_topology

    monkeypatch.setenv("DESKPOD_HOME", str(tmp_path / "elsewhere"))
    web = _fake_web(tmp_path / "pod", None)
    values = {"indices": [0], "batch_size": 32, "steps": 0, "epochs": 3, "precision": "auto"}
    plain = launch.prediction(web, INFO, SUMMARY, values)
    assert plain.calibrated is False and f"DESKPOD_HOME={tmp_path / 'pod'} deskpod plan calibrate" in plain.message
    measured = Measurements(kind="cpu", devices=1, cores=2, peak_tflops=0.1, memory_bandwidth_gbs=20.0,
                            model="resnet18", batch=8, shape=(3, 112, 112), images_per_s=30.0, comm_busbw_gbs=0.0)  # fmt: skip
    save(fit_local(measured, cpu_topology(1)), tmp_path / "pod")
    other = launch.prediction(web, INFO, SUMMARY, values)  # DESKPOD_HOME points elsewhere: the pod's home counts
    assert other.calibrated is True and [r[0] for r in other.rows] == ["Time to train", "Images/s", "Step time"]


@pytest.mark.slow
def test_the_preview_follows_the_fields_in_chromium(pod: Pod) -> None:
    """launch.js: a bad value's message appears next to its field as it is typed, the URL keeps the form, and
    "Start training" lands on the job's page."""
    from playwright.sync_api import expect, sync_playwright

    with sync_playwright() as p:
        browser = launch_chromium(p)
        try:
            page, errors = open_signed_in(browser, pod, "/ui/new")
            page.get_by_role("link", name="Fashion-MNIST").click()
            page.get_by_role("link", name="convnet").click()
            expect(page.get_by_role("button", name="Update preview")).to_have_count(0)
            batch = page.get_by_label("Batch size per device")
            batch.fill("0")
            expect(page.locator("#batch_size-error")).to_have_text(
                "batch_size = 0 is not valid: a whole number ≥ 1, e.g. 128"
            )
            expect(batch).to_have_attribute("aria-invalid", "true")
            expect(page.locator("#pv-cli")).to_have_text("Fix the values marked above to see the command.")
            page.get_by_label("Steps").fill("60")
            batch.fill("16")
            expect(page.locator("#pv-cli")).to_have_text(
                f"DESKPOD_SOCKET={pod.home / 'pod.sock'} deskpod train --submit --model convnet --data fashion-mnist "
                "--steps 60 --batch-size 16"
            )
            expect(batch).not_to_have_attribute("aria-invalid", "true")
            assert "steps=60" in page.url and "batch_size=16" in page.url  # a reload keeps the form
            page.reload()
            expect(page.get_by_label("Steps")).to_have_value("60")
            page.get_by_role("button", name="Start training").click()
            page.wait_for_url(re.compile(r".*/ui/jobs/\d+$"))
            _stop(pod, page.url.rsplit("/", 1)[1])
            assert not errors, errors
        finally:
            browser.close()


def test_an_image_folder_the_users_account_cannot_read_is_not_shown(pod: Pod) -> None:
    # A root pod runs a user's jobs as their OS account; the dashboard, which reads as root, must not show
    # that user a folder their jobs could not read (its class names, counts and sample images).
    import os
    import shutil
    import tempfile

    from PIL import Image

    from tests.unix_users import make_users
    from tests.web.browser import sign_in

    base = Path(tempfile.mkdtemp(dir="/tmp"))  # pytest's tmp folders are root's alone
    try:
        os.chmod(base, 0o755)
        for cls in ("cat", "dog"):
            (base / "photos" / cls).mkdir(parents=True)
            for i in range(2):
                Image.new("RGB", (8, 8), (40 * i, 90, 200)).save(base / "photos" / cls / f"{i}.png")
        with make_users("carol") as (carol,):
            token = str(pod.client().add_user(carol.name, False, os_user=carol.name)["token"])
            client = sign_in(pod, token)
            try:
                os.chmod(base / "photos", 0o700)
                closed = client.get("/ui/new", params={"data": f"imagefolder:{base / 'photos'}"})
                assert closed.status_code == 400
                assert f"your OS account {escape(repr(carol.name))} cannot read this folder" in _error(
                    closed.text, "data"
                )
                assert "cat" not in _error(closed.text, "data") and "dog" not in closed.text
                png = client.get("/ui/datasets/samples.png", params={"data": f"imagefolder:{base / 'photos'}"})
                assert png.status_code == 400 and png.headers["content-type"] != "image/png"
                os.chmod(base / "photos", 0o755)
                opened = client.get("/ui/new", params={"data": f"imagefolder:{base / 'photos'}"})
                assert opened.status_code == 200 and "dog" in opened.text
            finally:
                client.close()
    finally:
        shutil.rmtree(base)
