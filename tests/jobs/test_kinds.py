"""Each kind of job queued through the CLI, the API and the dashboard is the same job: the pod stores the same spec,
and the spec runs the same command line (`deskpod.jobs.kinds`).

One pod, started by root with its default sandbox. A job holding every device keeps the compared jobs queued, so
nothing here waits for a training; the run a serve job serves is a failed train job's, given a checkpoint.
"""

from __future__ import annotations

import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import tomli_w

from deskpod.errors import ConfigError
from deskpod.jobs.spec import parse_spec
from deskpod.web.calibration import job_spec as calibration_spec
from tests.jobs.pods import SLEEPER, Pod, Pods, python_job, wait_state
from tests.serve.test_deploy import make_run
from tests.web.browser import csrf_of, sign_in


@pytest.fixture(scope="module")
def pod(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Pod]:
    pods = Pods(tmp_path_factory.mktemp("kinds"))
    yield pods(sandbox=True)
    pods.stop_all()


@pytest.fixture(scope="module")
def source_run(pod: Pod) -> tuple[str, Path]:
    """A train job of the admin's (it failed: no such data) whose run folder holds a checkpoint, and that folder."""
    api = pod.client()
    job = api.submit({"name": "k-src", "devices": 1, "train": {"model": "mlp", "data": "imagefolder:/nowhere"}})
    wait_state(api, job["id"], "failed", timeout=180)
    run = pod.home.resolve() / "jobs" / job["id"] / "runs" / "k-src"
    make_run(run, 4)
    return job["id"], run


@pytest.fixture(scope="module")
def held(pod: Pod, source_run: tuple[str, Path]) -> Iterator[None]:
    """Every device held by one job, so that what is compared stays queued."""
    api = pod.client()
    job = api.submit({"name": "k-hold", "command": python_job(SLEEPER), "devices": "all"})
    wait_state(api, job["id"], "running", timeout=60)
    yield
    api.cancel(job["id"])


@pytest.fixture
def admin(pod: Pod, held: None) -> Iterator[httpx.Client]:
    c = sign_in(pod)
    yield c
    c.close()


def cli(pod: Pod, *argv: str, cwd: Path | None = None) -> str:
    """Run ``deskpod ARGV`` as the admin; the id of the job it queued."""
    env = dict(pod.env, DESKPOD_URL=pod.url, DESKPOD_TOKEN_FILE=str(pod.home / "token"))
    done = subprocess.run([sys.executable, "-m", "deskpod", *argv], env=env, cwd=cwd, capture_output=True, text=True,
                          timeout=120)  # fmt: skip
    assert done.returncode == 0, done.stderr
    found = re.search(r"(?:submitted job )?(\d+)\b", done.stdout)
    assert found, done.stdout
    return found.group(1)


def spec_file(folder: Path, spec: dict[str, Any]) -> str:
    path = folder / f"job-{len(list(folder.glob('job-*')))}.toml"
    path.write_text(tomli_w.dumps(spec))
    return str(path)


def same_job(pod: Pod, ids: list[str], tmp_path: Path) -> list[str]:
    """The one stored spec of the jobs ``ids`` (each queued), and the one command line it runs."""
    api = pod.client()
    jobs = [api.job(i) for i in ids]
    assert all(j["state"] == "queued" for j in jobs), [(j["id"], j["state"], j["reason"]) for j in jobs]
    specs = [j["spec"] for j in jobs]
    assert all(s == specs[0] for s in specs), specs
    lines = [parse_spec(s).argv(tmp_path / "job") for s in specs]
    assert all(line == lines[0] for line in lines)
    for j in jobs:
        api.cancel(j["id"])
    return lines[0]


def test_a_command_job(pod: Pod, admin: httpx.Client, tmp_path: Path) -> None:
    spec = calibration_spec()  # what the dashboard's Calibrate button queues
    r = admin.post("/ui/new/calibrate", data={"csrf": csrf_of(admin, "/ui/new"), "next": "/ui/new"},
                   headers={"Accept": "application/json"})  # fmt: skip
    assert r.status_code == 201, r.text
    ids = [cli(pod, "submit", spec_file(tmp_path, spec)), str(pod.client().submit(spec)["id"]), str(r.json()["id"])]
    assert same_job(pod, ids, tmp_path) == [sys.executable, "-m", "deskpod", "plan", "calibrate", "--out", "local.json"]

    argv = [sys.executable, "-c", "print('hi')"]  # deskpod submit -- ARGV: in the folder it was typed in
    ids = [cli(pod, "submit", "--name", "k-cmd", "--", *argv, cwd=tmp_path),
           str(pod.client().submit({"name": "k-cmd", "command": argv, "workdir": str(tmp_path)})["id"])]  # fmt: skip
    assert same_job(pod, ids, tmp_path) == argv


def test_a_train_job(pod: Pod, admin: httpx.Client, tmp_path: Path) -> None:
    form = {"data": "fashion-mnist", "model": "mlp", "steps": "3", "devices": "1", "name": "k-train"}
    r = admin.post("/ui/new", data={**form, "csrf": csrf_of(admin, "/ui/new"), "action": "start"},
                   headers={"Accept": "application/json"})  # fmt: skip
    assert r.status_code == 201, r.text
    flags = [w for k, v in form.items() for w in (f"--{k}", v)]
    api = pod.client().submit({"name": "k-train", "devices": 1,
                               "train": {"model": "mlp", "data": "fashion-mnist", "steps": 3}})  # fmt: skip
    ids = [cli(pod, "train", "--submit", *flags), str(api["id"]), str(r.json()["id"])]
    argv = same_job(pod, ids, tmp_path)
    folder = tmp_path / "job"
    assert argv == [sys.executable, "-m", "deskpod", "train", "--config", str(folder / "train.toml"),
                    "--out", str(folder / "runs"), "--name", "k-train", "--devices", "all"]  # fmt: skip
    assert (folder / "train.toml").read_text() == 'model = "mlp"\ndata = "fashion-mnist"\nsteps = 3\n'


def test_a_run_job(pod: Pod, held: None, tmp_path: Path) -> None:
    """``deskpod run --submit`` (the dashboard has no form for a script of one's own)."""
    script = tmp_path / "my_train.py"
    script.write_text("print('rank')\n")
    command = [sys.executable, "-m", "deskpod", "run", "--devices", "1", "--max-restarts", "0", "--name", "k-run",
               "--stall-after", "300.0", str(script), "--lr", "0.1"]  # fmt: skip
    api = pod.client().submit({"name": "k-run", "command": command, "devices": 1, "workdir": str(tmp_path)})
    ids = [cli(pod, "run", "--submit", "--devices", "1", "--name", "k-run", script.name, "--lr", "0.1", cwd=tmp_path),
           str(api["id"])]  # fmt: skip
    assert same_job(pod, ids, tmp_path) == command


def test_a_serve_job(pod: Pod, admin: httpx.Client, source_run: tuple[str, Path], tmp_path: Path) -> None:
    train_id, run = source_run
    r = admin.post("/ui/models/deploy", data={"csrf": csrf_of(admin, "/ui/models"), "job": train_id, "devices": "1",
                                              "format": "torch", "max_batch_size": "4"},
                   headers={"Accept": "application/json"})  # fmt: skip
    assert r.status_code == 201, r.text
    spec = {"devices": 1, "serve": {"run": str(run), "model": "k-src", "format": "torch", "max_batch_size": 4}}
    ids = [cli(pod, "submit", spec_file(tmp_path, spec)), str(pod.client().submit(spec)["id"]), str(r.json()["id"])]
    argv = same_job(pod, ids, tmp_path)
    folder = tmp_path / "job"
    assert argv == [sys.executable, "-m", "deskpod", "serve", str(folder / "models"), "--export", str(run),
                    "--name", "k-src", "--format", "torch", "--max-batch-size", "4", "--max-queue-delay-us", "2000",
                    "--instances", "1", "--port", "0", "--port-file", str(folder / "serve.json")]  # fmt: skip
    assert pod.client().job(ids[0])["name"] == "serve-k-src"


def test_a_video_job(pod: Pod, admin: httpx.Client, tmp_path: Path) -> None:
    """``deskpod submit`` of a ``[video]`` table, the API, and the dashboard's New video job form."""
    source = str(Path("/usr/share/doc/opencv-doc/examples/data/vtest.avi"))
    if not Path(source).is_file():
        pytest.skip("vtest.avi is missing: Debian package opencv-doc (apt-get install -y opencv-doc)")
    form = {"sources": f"{source}\nrtsp://127.0.0.1:8554/gate", "db": "", "fps": "2.5", "detect": "hog-people",
            "batch": "8", "devices": "1", "name": ""}  # fmt: skip
    r = admin.post("/ui/video/new", data={**form, "csrf": csrf_of(admin, "/ui/video")},
                   headers={"Accept": "application/json"})  # fmt: skip
    assert r.status_code == 201, r.text
    spec = {"devices": 1, "video": {"sources": [source, "rtsp://127.0.0.1:8554/gate"], "fps": 2.5,
                                    "detect": ["hog-people"], "batch": 8}}  # fmt: skip
    ids = [cli(pod, "submit", spec_file(tmp_path, spec)), str(pod.client().submit(spec)["id"]), str(r.json()["id"])]
    argv = same_job(pod, ids, tmp_path)
    folder = tmp_path / "job"
    assert argv == [sys.executable, "-m", "deskpod", "video", "index", source, "rtsp://127.0.0.1:8554/gate",
                    "--db", str(folder / "video.db"), "--fps", "2.5", "--detect", "hog-people", "--batch", "8",
                    "--stats", str(folder / "video-stats.json")]  # fmt: skip
    assert pod.client().job(ids[0])["name"] == "video-vtest.avi"


def test_a_kind_refuses_bad_input_the_same_way_everywhere(pod: Pod, tmp_path: Path) -> None:
    """The kind's own message, through the API and the CLI alike."""
    bad = {"serve": {"run": "/r/a", "format": "tensorrt"}}
    with pytest.raises(ConfigError, match=r"serve.format = 'tensorrt' is not valid; use one of onnx, torch"):
        pod.client().submit(bad)
    env = dict(pod.env, DESKPOD_URL=pod.url, DESKPOD_TOKEN_FILE=str(pod.home / "token"))
    done = subprocess.run([sys.executable, "-m", "deskpod", "submit", spec_file(tmp_path, bad)], env=env,
                          capture_output=True, text=True, timeout=60)  # fmt: skip
    assert done.returncode == 2
    assert "serve.format = 'tensorrt' is not valid; use one of onnx, torch" in done.stderr
