"""The Jobs page: who sees what, filters, keyset pages, queue positions and starts, cancel and requeue."""

from __future__ import annotations

import re
from contextlib import closing
from typing import Any

import httpx
import pytest

from deskpod.jobs.forecast import HORIZON
from tests.jobs.pods import SLEEPER, Pod, Pods, python_job, wait_for, wait_state
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
            assert rows[first["id"]]["estimate_note"] == ""

            # estimates stop after the forecast's horizon, and the jobs behind it say so
            more = [c.submit({"name": f"far-{i}", "command": ["true"], "devices": 1, "max_runtime": 10})["id"]
                    for i in range(HORIZON)]  # fmt: skip

            def placed() -> dict[str, dict[str, Any]] | None:  # the forecast is reused for up to a second
                got = {j["id"]: j for j in web.get("/ui/jobs.json", params={"limit": 500}).json()["jobs"]}
                return got if all(got[i]["position"] for i in more) else None

            rows = wait_for(placed, 30, "every job to have its place in the queue")  # type: ignore[assignment]
            behind = [i for i in more if rows[i]["position"] > HORIZON]
            assert behind and all(rows[i]["position"] <= HORIZON for i in more if i not in behind)
            for i in more:
                assert (rows[i]["estimate_note"] != "") == (i in behind) == (rows[i]["estimated_start"] is None)
            note = f"no estimated start: only the first {HORIZON} jobs of the queue are played forward"
            assert rows[behind[0]]["estimate_note"] == note
            assert note in web.get("/ui/jobs", params={"limit": 5}).text  # the newest: behind the horizon
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


def test_bulk_cancel_and_requeue_touch_only_the_viewers_jobs(web_pod: Pod) -> None:
    hank, ivy = new_user(web_pod, "hank"), new_user(web_pod, "ivy")
    api = web_pod.client(hank)
    mine = [api.submit({"name": f"bulk-{i}", "command": python_job(SLEEPER)})["id"] for i in range(3)]
    theirs = web_pod.client(ivy).submit({"name": "ivys", "command": ["sleep", "60"]})["id"]
    with closing(sign_in(web_pod, hank)) as c:
        html = c.get("/ui/jobs").text
        assert all(f'name="job" value="{i}" form="bulk"' in html for i in mine) and f'value="{theirs}"' not in html
        token = csrf_of(c)
        r = c.post("/ui/jobs/bulk", data={"action": "cancel", "job": mine, "confirmed": "1"})
        assert r.status_code == 403  # no CSRF token: nothing done
        r = c.post("/ui/jobs/bulk", data={"csrf": token, "action": "cancel", "job": mine})
        assert r.status_code == 200 and "Cancel 3 jobs?" in r.text  # without JavaScript: asked first
        assert all(f'name="job" value="{i}"' in r.text for i in mine)
        assert all(api.job(i)["state"] != "cancelled" for i in mine)
        r = c.post("/ui/jobs/bulk", data={"csrf": token, "action": "cancel", "job": [*mine, theirs]})
        assert r.status_code == 404  # another user's job is not there to be asked about

        # confirmed, with another user's job slipped in: it is refused as unknown, the viewer's are cancelled
        r = c.post("/ui/jobs/bulk", data={"csrf": token, "action": "cancel", "job": [theirs, *mine], "confirmed": "1",
                                          "next": "/ui/jobs?state=cancelled"})  # fmt: skip
        assert r.status_code == 200 and f"Job {theirs}: no job" in r.text and "3 done, 1 refused" in r.text
        for i in mine:
            wait_state(api, i, "cancelled")
        assert web_pod.client(ivy).job(theirs)["state"] in ("queued", "starting", "running")
        r = c.post("/ui/jobs/bulk", data={"csrf": token, "action": "cancel", "job": mine, "confirmed": "1",
                                          "next": "/ui/jobs?state=cancelled"})  # fmt: skip
        assert r.status_code == 303 and r.headers["location"] == "/ui/jobs?state=cancelled"  # nothing refused

        # a script gets what became of each job (requeue needs no confirmation)
        r = c.post("/ui/jobs/bulk", data={"action": "requeue", "job": mine, "csrf": token},
                   headers={"Accept": "application/json"})  # fmt: skip
        assert r.status_code == 200, r.text
        doc = r.json()
        assert [j["id"] for j in doc["done"]] == mine and doc["errors"] == {}
        assert all(j["state"] in ("queued", "starting", "running") for j in doc["done"])
        bad = c.post("/ui/jobs/bulk", data={"action": "delete", "job": mine, "csrf": token},
                     headers={"Accept": "application/json"})  # fmt: skip
        assert bad.status_code == 400 and "choose cancel or requeue" in bad.json()["error"]
    for i in mine:
        api.cancel(i)
    web_pod.client(ivy).cancel(theirs)
