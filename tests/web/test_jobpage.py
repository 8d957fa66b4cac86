"""The Job page against a real daemon: page and twin, the live stream (deltas, resume, end), log search,
py-spy stacks, escaping, and another user's job (404 everywhere).

No training runs: a command job holds every device slot, so the train jobs stay queued and the tests
write their run folders (metrics.jsonl, logs, checkpoints, config.toml) themselves.
"""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.jobs.pods import SLEEPER, Pod, Pods, python_job, wait_state
from tests.web.browser import csrf_of, launch_chromium, new_user, open_signed_in, sign_in

BLOCKER = """
import time
def waiting_for_the_test():
    print("blocker up", flush=True)
    time.sleep(600)
waiting_for_the_test()
"""
"""Holds every device slot, so train jobs stay queued; py-spy finds it in waiting_for_the_test."""


def hold_every_device(pod: Pod) -> dict[str, Any]:
    client = pod.client()
    job = client.submit({"name": "blocker", "command": python_job(BLOCKER), "devices": "all", "priority": 10})
    wait_state(client, job["id"], "running")
    return job


def queued_train(pod: Pod, name: str, **spec: Any) -> dict[str, Any]:
    """A train job that waits behind the blocker; its run folder exists, empty."""
    train = spec.pop("train", {"model": "mlp", "data": "synthetic:1x8x8", "steps": 10})
    job = pod.client().submit({"name": name, "train": train, "devices": 1, **spec})
    assert job["state"] == "queued"
    run_folder(pod, job).mkdir(parents=True, exist_ok=True)
    return job


def run_folder(pod: Pod, job: dict[str, Any]) -> Path:
    return pod.home / "jobs" / str(job["id"]) / "runs" / str(job["name"])


def output_log(pod: Pod, job: dict[str, Any]) -> Path:
    return pod.home / "jobs" / str(job["id"]) / "output.log"


def append(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a") as f:
        f.write(text)


def train_row(step: int, loss: float, **more: Any) -> dict[str, Any]:
    return {"kind": "train", "step": step, "loss": loss, "lr": 0.1, "images_per_s": 100.0, **more}


def write_rows(path: Path, recs: list[dict[str, Any]]) -> None:
    append(path, "".join(json.dumps(r) + "\n" for r in recs))


def sse(response: httpx.Response) -> Iterator[dict[str, Any]]:
    """The events of a text/event-stream response: {"event", "id", "data" (parsed JSON)}."""
    ev: dict[str, Any] = {}
    for line in response.iter_lines():
        if not line:
            if "data" in ev:
                ev["data"] = json.loads(ev["data"])
                yield ev
            ev = {}
            continue
        if line.startswith(":"):
            continue
        name, _, value = line.partition(":")
        value = value[1:] if value.startswith(" ") else value
        ev[name] = ev["data"] + "\n" + value if name == "data" and "data" in ev else value


def next_event(
    events: Iterator[dict[str, Any]], name: str, timeout: float = 30
) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """The next event called ``name``, and the ones skipped on the way."""
    deadline = time.monotonic() + timeout
    skipped: list[dict[str, Any]] = []
    for ev in events:
        if ev.get("event") == name:
            return ev, skipped
        skipped.append(ev)
        if time.monotonic() > deadline:
            break
    raise AssertionError(f"no {name!r} event; got {skipped}")


def stream(client: httpx.Client, job_id: str, cursor: str | None = None, last: str | None = None) -> Any:
    headers = {"Accept": "text/event-stream"}
    if last:
        headers["Last-Event-ID"] = last
    params = {"cursor": cursor} if cursor else {}
    return client.stream("GET", f"/ui/jobs/{job_id}/events", params=params, headers=headers)


@pytest.fixture(scope="module")
def blocker(web_pod: Pod) -> dict[str, Any]:
    return hold_every_device(web_pod)


def test_page_and_twin_show_the_run(web_pod: Pod, admin: httpx.Client, blocker: dict[str, Any]) -> None:
    job = queued_train(web_pod, "page-run")
    run = run_folder(web_pod, job)
    rows = [train_row(i, 3.0 - i / 5000, data_wait_fraction=0.1) for i in range(1, 10_001)]
    rows[4321]["loss"] = 99.0  # a spike the downsampling must keep
    vals = [{"kind": "val", "step": s, "val_loss": 1.0, "val_accuracy": s / 20_000} for s in (2500, 5000, 7500)]
    write_rows(run / "metrics.jsonl", rows[:5000] + vals[:2] + rows[5000:] + vals[2:])
    (run / "checkpoints").mkdir()
    for step in (3000, 7500):
        (run / "checkpoints" / f"step-{step:08d}.pt").write_bytes(b"0" * 1000)
    (run / "config.toml").write_text('model = "mlp"\nlr = 0.1\n[extra]\nseed = 3\n')
    (run / "summary.json").write_text(json.dumps({"state": "completed", "wall_time_s": 79.3}))
    (run / "tb").mkdir()

    twin = admin.get(f"/ui/jobs/{job['id']}.json")
    assert twin.status_code == 200, twin.text
    data = twin.json()
    assert data["job"]["name"] == "page-run" and data["live"]["state"] == "queued"
    assert data["live"]["can_cancel"] and not data["live"]["active"]
    charts = {c["id"]: c for c in data["charts"]}
    assert set(charts) == {"loss", "accuracy", "lr", "throughput", "data_wait"}
    loss = charts["loss"]["series"][0]["points"]
    assert 1000 < len(loss) <= 2000  # downsampled on the server
    assert loss[0] == [1.0, rows[0]["loss"]] and loss[-1] == [10_000.0, rows[-1]["loss"]]
    assert [4322.0, 99.0] in loss
    assert charts["accuracy"]["series"][0]["points"] == [[2500.0, 0.125], [5000.0, 0.25], [7500.0, 0.375]]
    ckpts = {c["step"]: c for c in data["checkpoints"]}
    assert ckpts[3000]["loss"] == rows[2999]["loss"] and ckpts[3000]["val_step"] == 2500
    assert ckpts[7500]["val_accuracy"] == 0.375 and ckpts[7500]["size"] == 1000
    assert data["config"]["source"] == "config.toml"
    assert data["config"]["values"] == {"model": "mlp", "lr": 0.1, "extra.seed": 3}
    assert [e["to"] for e in data["live"]["events"]] == ["queued"]
    assert data["cursor"].split(".")[1:3] == ["10000", "3"]

    page = admin.get(f"/ui/jobs/{job['id']}")
    assert page.status_code == 200
    html = page.text
    assert 'id="chart-loss"' in html and "step-00007500.pt" in html and "extra.seed" in html
    assert 'id="job-data"' in html and "/static/charts.js" in html
    assert 'id="act-stacks" hidden' in html  # queued: nothing to look at
    assert '<span class="v" title="79.3 s">1m 19s</span>' in html  # a 79 s run is not "1m"
    tb = ["tensorboard", "--logdir", str(run / "tb"), "--host", "127.0.0.1", "--port", "6006"]
    assert data["commands"]["tensorboard"] == shlex.join(tb) and 'id="tensorboard-command"' in html

    # a tb/ that is a link is not offered (the run's folder is its user's to arrange)
    (run / "tb").rmdir()
    (run / "tb").symlink_to(web_pod.home)
    assert admin.get(f"/ui/jobs/{job['id']}.json").json()["commands"]["tensorboard"] is None


def test_the_logs_command_works_when_pasted(web_pod: Pod, admin: httpx.Client, blocker: dict[str, Any]) -> None:
    line = admin.get(f"/ui/jobs/{blocker['id']}.json").json()["commands"]["logs"]
    assert line == f"DESKPOD_SOCKET={web_pod.home / 'pod.sock'} deskpod logs {blocker['id']}"
    env = {k: v for k, v in os.environ.items() if not k.startswith("DESKPOD_")}
    env.update(HOME="/nonexistent", PATH=f"{Path(sys.executable).parent}:{env.get('PATH', '/usr/bin:/bin')}")
    done = subprocess.run(["sh", "-c", line], env=env, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0 and "blocker up" in done.stdout, done.stderr


def test_a_new_row_arrives_as_a_delta_and_a_reconnect_resumes(
    web_pod: Pod, admin: httpx.Client, blocker: dict[str, Any]
) -> None:
    job = queued_train(web_pod, "live-run")
    metrics = run_folder(web_pod, job) / "metrics.jsonl"
    write_rows(metrics, [train_row(i, 1.0 / i) for i in range(1, 6)])
    cursor = admin.get(f"/ui/jobs/{job['id']}.json").json()["cursor"]
    with stream(admin, job["id"], cursor) as r:
        assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
        events = sse(r)
        state, _ = next_event(events, "state")
        assert state["data"]["state"] == "queued"
        write_rows(metrics, [train_row(6, 0.125)])
        delta, skipped = next_event(events, "metrics")
        assert not [e for e in skipped if e["event"] == "reset"]  # the page's cursor was current
        assert delta["data"]["series"]["train/loss"] == [[6.0, 0.125]]
        assert delta["data"]["series"]["train/lr"] == [[6.0, 0.1]]
        append(output_log(web_pod, job), "hello from the job <b>not bold</b>\n")
        log, _ = next_event(events, "log")
        assert log["data"]["text"] == "hello from the job <b>not bold</b>\n" and not log["data"].get("reset")
        last_id = log["id"]
    write_rows(metrics, [train_row(7, 0.0625)])
    append(output_log(web_pod, job), "second line\n")
    with stream(admin, job["id"], cursor, last=last_id) as r:  # Last-Event-ID wins over the old cursor
        events = sse(r)
        delta, skipped = next_event(events, "metrics")
        assert delta["data"]["series"]["train/loss"] == [[7.0, 0.0625]]
        assert not [e for e in skipped if e["event"] in ("reset", "log")]
        log, _ = next_event(events, "log")
        assert log["data"]["text"] == "second line\n"
    with stream(admin, job["id"]) as r:  # no cursor at all: everything afresh
        events = sse(r)
        reset, _ = next_event(events, "reset")
        assert [p[0] for p in reset["data"]["series"]["train/loss"]] == [1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0]
        log, _ = next_event(events, "log")
        assert log["data"]["reset"] and log["data"]["text"].endswith("second line\n")


def test_a_rewritten_file_resets_the_charts(web_pod: Pod, admin: httpx.Client, blocker: dict[str, Any]) -> None:
    job = queued_train(web_pod, "resumed-run")
    metrics = run_folder(web_pod, job) / "metrics.jsonl"
    write_rows(metrics, [train_row(i, 1.0) for i in range(1, 21)])
    cursor = admin.get(f"/ui/jobs/{job['id']}.json").json()["cursor"]
    with stream(admin, job["id"], cursor) as r:
        events = sse(r)
        next_event(events, "state")
        tmp = metrics.with_suffix(".tmp")  # what a resumed run does: keep the rows up to its checkpoint
        write_rows(tmp, [train_row(i, 1.0) for i in range(1, 11)] + [train_row(11, 0.5)])
        os.replace(tmp, metrics)
        reset, _ = next_event(events, "reset")
        assert [p[0] for p in reset["data"]["series"]["train/loss"]] == [float(i) for i in range(1, 12)]
        write_rows(metrics, [train_row(12, 0.25)])
        delta, _ = next_event(events, "metrics")
        assert delta["data"]["series"]["train/loss"] == [[12.0, 0.25]]


def test_the_stream_follows_the_state_and_ends_when_final(
    web_pod: Pod, admin: httpx.Client, blocker: dict[str, Any]
) -> None:
    job = queued_train(web_pod, "ending-run")
    with stream(admin, job["id"]) as r:
        events = sse(r)
        state, _ = next_event(events, "state")
        assert state["data"]["state"] == "queued" and state["data"]["can_cancel"]
        web_pod.client().cancel(job["id"])
        state, _ = next_event(events, "state")
        while state["data"]["state"] == "queued":  # the scheduler may have rewritten its wait reason first
            state, _ = next_event(events, "state")
        assert state["data"]["state"] == "cancelled" and state["data"]["final"]
        assert [e["to"] for e in state["data"]["events"]] == ["queued", "cancelled"]
        assert state["data"]["can_requeue"] and not state["data"]["can_cancel"]
        end, _ = next_event(events, "end")
        assert end["data"]["state"] == "cancelled"
        assert list(events) == []  # the server closed the stream
    with stream(admin, job["id"]) as r:  # a final job's stream: what there is, then the end
        names = [e["event"] for e in sse(r)]
        assert names[0] == "state" and names[-1] == "end"


def test_streams_end_when_the_daemon_stops(tmp_path: Path) -> None:
    pods = Pods(tmp_path)
    try:
        pod = pods()
        client = pod.client()
        job = client.submit({"name": "sleeper", "command": python_job(SLEEPER)})
        wait_state(client, job["id"], "running")
        browser = sign_in(pod)
        stopped: list[float] = []

        def shutdown() -> None:
            stopped.append(time.monotonic())
            client.shutdown(stop_jobs=True)

        with stream(browser, job["id"]) as r:
            events = sse(r)
            next_event(events, "state")
            threading.Timer(0.3, shutdown).start()
            rest = list(events)  # returns once the server ends the stream
            ended = time.monotonic()
        browser.close()
        assert stopped and ended - stopped[0] < 4.0, f"the stream outlived the shutdown by {ended - stopped[0]:.1f} s"
        assert not [e for e in rest if e["event"] == "end"]  # cut short, not finished: the job did not end
    finally:
        pods.stop_all()


def test_search_across_every_rank_log(web_pod: Pod, admin: httpx.Client, blocker: dict[str, Any]) -> None:
    job = queued_train(web_pod, "search-run")
    logs = run_folder(web_pod, job) / "logs"
    append(logs / "rank0.attempt0.stderr", "rank 0 ok\n")
    append(
        logs / "rank1.attempt0.stderr",
        "".join(f"line {i}\n" for i in range(1, 9)) + "RuntimeError: NCCL watchdog\nafter 1\nafter 2\nafter 3\n",
    )
    append(output_log(web_pod, job), "".join(f"step {i}: loss nan\n" for i in range(300)))
    got = admin.get(f"/ui/jobs/{job['id']}/search.json", params={"q": "nccl WATCHDOG", "context": 2})
    assert got.status_code == 200, got.text
    data = got.json()
    assert data["files"] == ["output.log", "logs/rank0.attempt0.stderr", "logs/rank1.attempt0.stderr"]
    assert data["hits"] == 1 and not data["capped"]
    (block,) = data["blocks"]
    assert block["file"] == "logs/rank1.attempt0.stderr"
    assert [(ln["line"], ln["match"]) for ln in block["lines"]] == [
        (7, False),
        (8, False),
        (9, True),
        (10, False),
        (11, False),
    ]

    capped = admin.get(f"/ui/jobs/{job['id']}/search.json", params={"q": "loss NaN"}).json()
    assert capped["capped"] and capped["hits"] == capped["max_hits"] < 300
    page = admin.get(f"/ui/jobs/{job['id']}/search", params={"q": "loss nan"})
    assert page.status_code == 200 and "there are more" in page.text

    bad = admin.get(f"/ui/jobs/{job['id']}/search.json", params={"q": "loss (", "regex": "true"})
    assert bad.status_code == 400 and "not a valid regular expression" in bad.json()["error"]
    bad_page = admin.get(f"/ui/jobs/{job['id']}/search", params={"q": "loss (", "regex": "true"})
    assert bad_page.status_code == 400 and 'id="q-error"' in bad_page.text
    regex = admin.get(f"/ui/jobs/{job['id']}/search.json", params={"q": r"^step 29\d:", "regex": "true"}).json()
    assert regex["hits"] == 10


def test_what_a_job_wrote_is_escaped(web_pod: Pod, admin: httpx.Client, blocker: dict[str, Any]) -> None:
    job = queued_train(
        web_pod, "x.y_z-1",
        env={"NOTE": "<script>alert(1)</script>"},
        train={"model": "mlp", "data": "synthetic:1x8x8", "note": "<img src=x onerror=alert(2)>"},
    )  # fmt: skip
    append(output_log(web_pod, job), "<script>alert(1)</script>\n")
    append(run_folder(web_pod, job) / "logs" / "rank0.attempt0.stderr", "warning: <b>slow</b> disk\n")
    html = admin.get(f"/ui/jobs/{job['id']}").text
    assert "<script>alert(1)</script>" not in html and "<img src=x" not in html
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in html  # the log line and the spec, as text
    assert "&lt;img src=x onerror=alert(2)&gt;" in html  # the config table
    found = admin.get(f"/ui/jobs/{job['id']}/search", params={"q": "<b>"}).text
    assert "<mark>&lt;b&gt;</mark>slow&lt;/b&gt; disk" in found


def test_stacks_of_a_running_job(web_pod: Pod, admin: httpx.Client, blocker: dict[str, Any]) -> None:
    csrf = csrf_of(admin)
    url = f"/ui/jobs/{blocker['id']}/stacks"
    got = admin.post(url, headers={"X-CSRF-Token": csrf, "Accept": "application/json"})
    assert got.status_code == 200, got.text
    data = got.json()
    assert data["targets"] and all(t["pid"] for t in data["targets"])
    assert any(t["ok"] and "waiting_for_the_test" in t["text"] for t in data["targets"]), data
    page = admin.post(url, data={"csrf": csrf})  # the form without JavaScript: the page with the stacks
    assert page.status_code == 200 and "waiting_for_the_test" in page.text and 'id="stacks" hidden' not in page.text
    assert admin.post(url, headers={"Accept": "application/json"}).status_code == 403  # no CSRF token
    queued = queued_train(web_pod, "not-running")
    refused = admin.post(
        f"/ui/jobs/{queued['id']}/stacks", headers={"X-CSRF-Token": csrf, "Accept": "application/json"}
    )
    assert refused.status_code == 409 and "no running process" in refused.json()["error"]
    assert 'id="act-stacks" hidden' not in admin.get(f"/ui/jobs/{blocker['id']}").text  # running: the button shows


def test_another_users_job_is_a_404_everywhere(web_pod: Pod, admin: httpx.Client, blocker: dict[str, Any]) -> None:
    job = queued_train(web_pod, "private-run")
    bob = sign_in(web_pod, new_user(web_pod, "bob"))
    try:
        jid = job["id"]
        for path in (f"/ui/jobs/{jid}", f"/ui/jobs/{jid}.json", f"/ui/jobs/{jid}/search?q=x",
                     f"/ui/jobs/{jid}/search.json?q=x", f"/ui/compare?jobs={jid}", f"/ui/compare.json?jobs={jid}"):  # fmt: skip
            r = bob.get(path)
            assert r.status_code == 404, (path, r.status_code)
            assert "private-run" not in r.text
            assert admin.get(path).status_code == 200, path  # the owner sees it
        events = bob.get(f"/ui/jobs/{jid}/events", headers={"Accept": "text/event-stream"})
        assert events.status_code == 404 and "error" in events.json()
        stacks = bob.post(
            f"/ui/jobs/{blocker['id']}/stacks", headers={"X-CSRF-Token": csrf_of(bob), "Accept": "application/json"}
        )
        assert stacks.status_code == 404
        anonymous = httpx.get(f"{web_pod.url}/ui/jobs/{jid}/events", headers={"Accept": "text/event-stream"})
        assert anonymous.status_code == 401
    finally:
        bob.close()


@pytest.mark.slow
def test_the_chart_gains_a_point_in_chromium(web_pod: Pod, blocker: dict[str, Any]) -> None:
    from playwright.sync_api import sync_playwright

    job = queued_train(web_pod, "browser-run")
    metrics = run_folder(web_pod, job) / "metrics.jsonl"
    write_rows(metrics, [train_row(i, 2.0 / i) for i in range(1, 101)])
    append(output_log(web_pod, job), "first line\n")

    def until(page: Any, script: str, timeout: float = 15) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:  # polled from here: the page's CSP forbids wait_for_function's eval
            if page.evaluate(script):
                return
            time.sleep(0.05)
        raise AssertionError(f"timed out waiting for {script}")

    with sync_playwright() as p:
        browser = launch_chromium(p)
        try:
            page, errors = open_signed_in(browser, web_pod, f"/ui/jobs/{job['id']}")
            until(page, "performance.getEntriesByName('deskpod:first-chart').length > 0")
            until(page, "document.getElementById('live-status').textContent === 'live'")
            assert page.get_attribute("#chart-loss", "data-points") == "100"
            write_rows(metrics, [train_row(101, 0.01)])
            until(page, "document.querySelector('#chart-loss').dataset.points === '101'")
            append(output_log(web_pod, job), "<script>window.pwned = 1</script>\n")
            until(page, "document.getElementById('log').textContent.includes('<script>window.pwned = 1</script>')")
            assert page.evaluate("document.querySelectorAll('#log *').length === 0 && !window.pwned")
            summary = page.text_content("#chart-loss-summary") or ""
            assert "101 points" in summary
            page.focus("#chart-loss canvas")
            page.keyboard.press("End")
            until(page, "document.querySelector('#chart-loss .readout').textContent.startsWith('step 101')")
            web_pod.client().cancel(job["id"])  # the header follows without a reload, and the stream ends
            until(page, "document.getElementById('st-state').textContent === 'cancelled'")
            until(page, "document.getElementById('live-status').textContent.startsWith('finished')")
            assert page.evaluate("document.getElementById('act-cancel').hidden")
            assert page.evaluate("!document.getElementById('act-requeue').hidden")
            assert page.evaluate("document.querySelectorAll('#history-rows tr').length") == 2
            assert errors == []
        finally:
            browser.close()
