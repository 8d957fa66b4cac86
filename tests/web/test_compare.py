"""The Compare page against a real daemon: overlaid curves, the config difference, final metrics, the
picker and its shareable URL, and bad id lists. The runs' folders are written by the test (no training)."""

from __future__ import annotations

import json
import shlex
import time
from contextlib import closing
from pathlib import Path
from typing import Any

import httpx
import pytest

from deskpod.jobs.auth import ADMIN
from deskpod.jobs.spec import parse_spec
from deskpod.jobs.states import JobState
from deskpod.jobs.store import Store
from tests.jobs.pods import Pod, Pods
from tests.web.browser import sign_in
from tests.web.test_jobpage import hold_every_device, queued_train, run_folder, train_row, write_rows


@pytest.fixture(scope="module")
def blocker(web_pod: Pod) -> dict[str, Any]:
    return hold_every_device(web_pod)


@pytest.fixture(scope="module")
def two_runs(web_pod: Pod, blocker: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    a = queued_train(web_pod, "sweep-a")
    b = queued_train(web_pod, "sweep-b")
    for job, lr, n in ((a, 0.1, 300), (b, 0.05, 200)):
        run = run_folder(web_pod, job)
        write_rows(run / "metrics.jsonl", [train_row(i, lr * 10 / i) for i in range(1, n + 1)])
        write_rows(run / "metrics.jsonl", [{"kind": "val", "step": n, "val_loss": 0.5, "val_accuracy": lr * 5}])
        only = "only_a = 1\n" if job is a else ""
        note = "<script>alert(1)</script>" if job is a else "plain"
        (run / "config.toml").write_text(
            f'model = "convnet"\ndata = "fashion-mnist"\nlr = {lr}\nepochs = {n // 100}\nnote = "{note}"\n{only}'
        )
    summary = {"state": "completed", "steps": 300, "test_accuracy": 0.875, "throughput_images_per_s": 1234.5}
    (run_folder(web_pod, a) / "summary.json").write_text(json.dumps(summary))
    return a, b


def test_two_runs_overlaid_with_their_config_difference(
    web_pod: Pod, admin: httpx.Client, two_runs: tuple[dict[str, Any], dict[str, Any]]
) -> None:
    a, b = two_runs
    got = admin.get("/ui/compare.json", params={"jobs": f"{a['id']},{b['id']}"})
    assert got.status_code == 200, got.text
    data = got.json()
    assert [r["id"] for r in data["runs"]] == [a["id"], b["id"]]
    assert [r["color"] for r in data["runs"]] == ["--s1", "--s2"]
    charts = {c["id"]: c for c in data["charts"]}
    loss = charts["loss-train"]["series"]
    assert [s["label"] for s in loss] == [f"job {a['id']} · sweep-a", f"job {b['id']} · sweep-b"]
    assert [len(s["points"]) for s in loss] == [300, 200]
    assert loss[0]["points"][0] == [1.0, 1.0] and loss[1]["points"][0] == [1.0, 0.5]
    assert [s["points"] for s in charts["accuracy-val"]["series"]] == [[[300.0, 0.5]], [[200.0, 0.25]]]
    differ = {d["key"]: d["values"] for d in data["diff"]["differ"]}
    assert differ == {
        "lr": ["0.1", "0.05"],
        "epochs": ["3", "2"],
        "note": ['"<script>alert(1)</script>"', '"plain"'],
        "only_a": ["1", None],
    }
    assert {d["key"] for d in data["diff"]["same"]} == {"model", "data"}
    assert data["runs"][0]["summary"]["test_accuracy"] == 0.875 and data["runs"][1]["summary"]["steps"] is None
    assert data["runs"][1]["last"]["loss"] == 0.05 / 200 * 10

    page = admin.get("/ui/compare", params={"jobs": f"{a['id']},{b['id']}"})
    assert page.status_code == 200
    html = page.text
    assert html.count('class="differ"') == 4 and 'id="config-same"' in html
    assert "<script>alert(1)</script>" not in html and "&#34;&lt;script&gt;alert(1)&lt;/script&gt;&#34;" in html
    assert f"/ui/compare?jobs={a['id']},{b['id']}" in html  # the link to share
    assert 'id="chart-loss-train"' in html and "/static/compare.js" in html
    assert "87.5%" in html  # the final metrics from summary.json
    assert data["tensorboard"] is None and 'id="tensorboard-command"' not in html  # no events yet

    for job in (a, b):
        (run_folder(web_pod, job) / "tb").mkdir(exist_ok=True)
    both = admin.get("/ui/compare.json", params={"jobs": f"{a['id']},{b['id']}"}).json()["tensorboard"]
    spec = ",".join(f"job{j['id']}:{run_folder(web_pod, j) / 'tb'}" for j in (a, b))
    assert shlex.split(both) == ["tensorboard", "--logdir_spec", spec, "--host", "127.0.0.1", "--port", "6006"]


def test_the_picker_lists_train_jobs_and_makes_a_shareable_url(
    admin: httpx.Client, two_runs: tuple[dict[str, Any], dict[str, Any]], blocker: dict[str, Any]
) -> None:
    a, b = two_runs
    data = admin.get("/ui/compare.json").json()
    picked = {p["id"] for p in data["picker"]}
    assert {a["id"], b["id"]} <= picked and blocker["id"] not in picked  # a command job has no run
    assert data["runs"] == [] and "error" not in data
    form = admin.get("/ui/compare", params=[("jobs", a["id"]), ("jobs", b["id"])])
    assert form.status_code == 303
    assert form.headers["location"] == f"/ui/compare?jobs={a['id']},{b['id']}"


def test_bad_id_lists_say_what_is_wrong(
    admin: httpx.Client, two_runs: tuple[dict[str, Any], dict[str, Any]], blocker: dict[str, Any]
) -> None:
    a, _ = two_runs
    bad = admin.get("/ui/compare.json", params={"jobs": f"{a['id']},x"})
    assert bad.status_code == 400 and "'x' is not a job id" in bad.json()["error"]
    page = admin.get("/ui/compare", params={"jobs": f"{a['id']},x"})
    assert page.status_code == 400 and 'id="compare-error"' in page.text
    command = admin.get("/ui/compare.json", params={"jobs": f"{a['id']},{blocker['id']}"})
    assert command.status_code == 400 and "is a command job" in command.json()["error"]
    many = admin.get("/ui/compare.json", params={"jobs": ",".join(str(i) for i in range(1, 10))})
    assert many.status_code == 400 and "at most 8" in many.json()["error"]
    assert admin.get("/ui/compare.json", params={"jobs": f"{a['id']},99999"}).status_code == 404


def test_old_training_runs_are_found_behind_thousands_of_newer_jobs(tmp_path: Path) -> None:
    """Compare's picker and Models' Deploy form ask the store for training jobs by kind: 2,100 newer jobs of other
    kinds (a real pod's store) hide none of them."""
    pods = Pods(tmp_path)
    pod = pods()
    try:
        hold_every_device(pod)
        train = queued_train(pod, "old-run")
        (run_folder(pod, train) / "checkpoints").mkdir()
        (run_folder(pod, train) / "checkpoints" / "step-00000010.pt").write_bytes(b"0")
        pod.stop()
        store = Store(pod.home / "pod.db")  # the daemon is down: fill its store as 2,100 submissions would
        now = time.time()
        for i in range(2100):
            kind = {"serve": {"run": str(run_folder(pod, train))}} if i % 700 == 0 else {"command": ["true"]}
            job = store.submit(ADMIN, parse_spec({"name": f"later-{i}", **kind}), 1, now)
            store.transition(job.id, JobState.CANCELLED, "cancelled by the test", finished_at=now)
        store.close()
        assert all(j.spec.train is None for j in Store(pod.home / "pod.db").jobs(limit=2000))
        again = pods(home=pod.home)
        with closing(sign_in(again)) as c:
            picker = c.get("/ui/compare.json").json()["picker"]
            assert [p["id"] for p in picker] == [train["id"]]
            models = c.get("/ui/models.json").json()
            assert [r["id"] for r in models["runs"]] == [train["id"]]
            assert len(models["deployments"]) == 3 and {d["status"] for d in models["deployments"]} == {"stopped"}
    finally:
        pods.stop_all()
