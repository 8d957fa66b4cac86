"""The Jobs page: who sees what, filters, keyset pages, queue positions and starts, cancel and requeue."""

from __future__ import annotations

import re
from contextlib import closing

import httpx
import pytest

from tests.jobs.pods import Pod, Pods, wait_state
from tests.web.browser import csrf_of, new_user, sign_in


def page_ids(html: str) -> list[str]:
    return re.findall(r'<tr data-job="(\d+)">', html)


def test_users_see_their_own_jobs_and_admins_everyones(web_pod: Pod, admin: httpx.Client) -> None:
    dora, eve = new_user(web_pod, "dora"), new_user(web_pod, "eve")
    dora_job = web_pod.client(dora).submit({"name": "doras-job", "command": ["sleep", "60"], "max_runtime": 120})
    eve_job = web_pod.client(eve).submit({"name": "eves-job", "command": ["sleep", "60"]})
    with closing(sign_in(web_pod, eve)) as c:
        html = c.get("/ui/jobs").text
        assert "eves-job" in html and "doras-job" not in html and dora_job["id"] not in page_ids(html)
        twin = c.get("/ui/jobs.json").json()
        assert {j["user"] for j in twin["jobs"]} == {"eve"} and twin["counts"] is None  # no pod-wide counts
        r = c.get("/ui/jobs", params={"user": "dora"})
        assert r.status_code == 400 and "only their own" in r.text and "doras-job" not in r.text
        assert c.get("/ui/jobs.json", params={"user": "dora"}).json()["jobs"] == []
    html = admin.get("/ui/jobs").text
    assert "doras-job" in html and "eves-job" in html
    only = admin.get("/ui/jobs.json", params={"user": "dora"}).json()
    assert [j["id"] for j in only["jobs"]] == [dora_job["id"]]
    for job in (dora_job, eve_job):
        web_pod.client().cancel(job["id"])


def test_filters_report_bad_values_next_to_the_field_and_escape_what_was_typed(admin: httpx.Client) -> None:
    r = admin.get("/ui/jobs", params={"state": "sleeping"})
    assert r.status_code == 400
    assert re.search(r'id="f-state" name="state" aria-invalid="true" aria-describedby="state-error"', r.text)
    assert "state &#39;sleeping&#39; is not a job state; valid: queued" in r.text
    r = admin.get("/ui/jobs", params={"name": '"><script>alert(1)</script>'})
    assert r.status_code == 200 and "<script>alert(1)" not in r.text
    assert "&#34;&gt;&lt;script&gt;alert(1)&lt;/script&gt;" in r.text
    assert admin.get("/ui/jobs", params={"limit": 0}).status_code == 400


def test_pages_are_keyset_pages(web_pod: Pod, admin: httpx.Client) -> None:
    c = web_pod.client()
    ids = [c.submit({"name": f"pager-{i}", "command": ["true"]})["id"] for i in range(7)]
    seen: list[str] = []
    url = "/ui/jobs?name=pager-&limit=3"
    while url:
        html = admin.get(url).text
        seen += page_ids(html)
        m = re.search(r'<a href="(/ui/jobs\?[^"]+)" rel="next">', html)
        url = m.group(1).replace("&amp;", "&") if m else ""
    assert seen == ids[::-1]
    assert admin.get("/ui/jobs.json", params={"name": "pager-"}).json()["total"] == 7


def test_queued_jobs_show_their_position_reason_and_estimated_start(tmp_path: pytest.TempPathFactory) -> None:
    pods = Pods(tmp_path)  # type: ignore[arg-type]
    pod = pods("--no-preemption")
    try:
        c = pod.client()
        n = len(c.status()["devices"])
        blocker = c.submit({"name": "blocker", "command": ["sleep", "300"], "devices": n, "max_runtime": 600})
        running = wait_state(c, blocker["id"], "running")
        first = c.submit({"name": "next", "command": ["true"], "devices": n, "max_runtime": 100})
        second = c.submit({"name": "after", "command": ["true"], "devices": 1})
        with closing(sign_in(pod)) as web:
            rows = {j["id"]: j for j in web.get("/ui/jobs.json").json()["jobs"]}
            assert rows[first["id"]]["position"] == 1 and rows[second["id"]]["position"] == 2
            assert rows[first["id"]]["estimated_start"] == pytest.approx(running["started_at"] + 600, abs=2)
            assert rows[second["id"]]["estimated_start"] == pytest.approx(running["started_at"] + 700, abs=2)
            assert rows[second["id"]]["reason"].startswith("waiting behind job")
            html = web.get("/ui/jobs").text
            assert "#1 in queue" in html and "estimated start in" in html
            c.cancel(blocker["id"])
    finally:
        pods.stop_all()


def test_cancel_asks_first_and_needs_the_csrf_token(web_pod: Pod, admin: httpx.Client) -> None:
    c = web_pod.client()
    job = c.submit({"name": "to-cancel", "command": ["sleep", "60"]})
    wait_state(c, job["id"], "running")
    html = admin.get("/ui/jobs").text
    assert f'data-confirm="Cancel job {job["id"]} (to-cancel)?"' in html
    assert admin.post(f"/ui/jobs/{job['id']}/cancel", data={}).status_code == 403
    token = csrf_of(admin)
    r = admin.post(f"/ui/jobs/{job['id']}/cancel", data={"csrf": token})
    assert r.status_code == 200 and f"Cancel job {job['id']}?" in r.text  # the confirmation page
    assert c.job(job["id"])["state"] == "running"
    r = admin.post(f"/ui/jobs/{job['id']}/cancel", data={"csrf": token, "confirmed": "1"})
    assert r.status_code == 303 and r.headers["location"] == f"/ui/jobs/{job['id']}"
    wait_state(c, job["id"], "cancelled")
    r = admin.post(f"/ui/jobs/{job['id']}/requeue", data={"csrf": token, "next": "/ui/jobs?state=queued"})
    assert r.status_code == 303 and r.headers["location"] == "/ui/jobs?state=queued"  # back to the list it was on
    assert c.job(job["id"])["state"] in ("queued", "starting", "running")
    c.cancel(job["id"])


def test_a_foreign_job_is_not_found(web_pod: Pod) -> None:
    owner = new_user(web_pod, "frank")
    job = web_pod.client(owner).submit({"command": ["sleep", "60"]})
    with closing(sign_in(web_pod, new_user(web_pod, "grace"))) as c:
        token = csrf_of(c)
        for action in ("cancel", "requeue"):
            r = c.post(f"/ui/jobs/{job['id']}/{action}", data={"csrf": token, "confirmed": "1"})
            assert r.status_code == 404 and "no job" in r.text
    assert web_pod.client(owner).job(job["id"])["state"] in ("queued", "starting", "running")
    web_pod.client(owner).cancel(job["id"])
