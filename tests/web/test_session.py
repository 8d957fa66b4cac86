"""Signing in and out of the dashboard: cookies, CSRF, expiry, where a browser lands afterwards."""

from __future__ import annotations

import sqlite3
import time
from contextlib import closing

import httpx

from tests.jobs.pods import Pod
from tests.web.browser import csrf_of, hidden, new_user, sign_in


def anonymous(pod: Pod) -> httpx.Client:
    return httpx.Client(base_url=pod.url, follow_redirects=False, timeout=30, trust_env=False)


def test_anonymous_requests_get_the_sign_in_page_never_data(web_pod: Pod) -> None:
    with anonymous(web_pod) as c:
        for path in ("/ui/", "/ui/jobs", "/ui/jobs/1", "/ui/nonesuch", "/ui/jobs?state=running"):
            r = c.get(path)
            assert r.status_code == 303, (path, r.status_code)
            assert r.headers["location"].startswith("/ui/login?next=/ui/"), r.headers["location"]
        assert c.get("/").headers["location"] == "/ui/"
        for path in ("/ui/jobs.json", "/ui/jobs/1.json"):
            r = c.get(path)
            assert r.status_code == 401 and "sign in" in r.json()["error"]
        r = c.get("/ui/login", params={"next": "/ui/jobs"})
        assert r.status_code == 200 and 'name="token"' in r.text and "Sign out" not in r.text


def test_sign_in_sets_a_strict_http_only_session_and_returns_to_the_page(web_pod: Pod) -> None:
    with anonymous(web_pod) as c:
        form = c.get("/ui/login", params={"next": "/ui/jobs?state=queued"})
        csrf = hidden(form.text, "csrf")
        r = c.post("/ui/login", data={"csrf": csrf, "next": hidden(form.text, "next"), "token": "dp_wrong"})
        assert r.status_code == 401 and "unknown token" in r.text and "deskpod_session" not in c.cookies
        r = c.post("/ui/login", data={"csrf": "forged", "next": "/ui/", "token": web_pod.token})
        assert r.status_code == 403 and "deskpod_session" not in c.cookies  # login CSRF
        r = c.post("/ui/login", data={"csrf": csrf, "next": "/ui/jobs?state=queued", "token": web_pod.token})
        assert r.status_code == 303 and r.headers["location"] == "/ui/jobs?state=queued"
        cookie = r.headers["set-cookie"].lower()
        assert "httponly" in cookie and "samesite=strict" in cookie and "path=/" in cookie
        assert web_pod.token not in r.headers["set-cookie"]  # the session is not the token
        assert c.get("/ui/jobs").status_code == 200


def test_next_never_leaves_the_dashboard(web_pod: Pod) -> None:
    for target in ("https://evil.example/", "//evil.example/ui/", "/v1/jobs", "/ui\\..\\x"):
        with anonymous(web_pod) as c:
            form = c.get("/ui/login")
            r = c.post("/ui/login", data={"csrf": hidden(form.text, "csrf"), "next": target, "token": web_pod.token})
            assert r.headers["location"] == "/ui/", target


def test_sign_out_needs_the_csrf_token_and_ends_the_session(web_pod: Pod) -> None:
    with closing(sign_in(web_pod)) as c:
        assert c.post("/ui/logout", data={}).status_code == 403
        assert c.post("/ui/logout", data={"csrf": "wrong"}).status_code == 403
        assert c.get("/ui/jobs").status_code == 200  # still signed in
        session = c.cookies["deskpod_session"]
        r = c.post("/ui/logout", data={"csrf": csrf_of(c)})
        assert r.status_code == 303 and r.headers["location"] == "/ui/login"
        with anonymous(web_pod) as stale:
            stale.cookies.set("deskpod_session", session)
            assert stale.get("/ui/jobs").status_code == 303  # the old cookie opens nothing


def test_an_expired_session_returns_to_sign_in_then_to_the_page_asked_for(web_pod: Pod) -> None:
    with closing(sign_in(web_pod)) as c:
        con = sqlite3.connect(str(web_pod.home / "pod.db"))
        with con:
            con.execute("UPDATE sessions SET expires = ?", (time.time() - 1,))
        con.close()
        r = c.get("/ui/jobs", params={"state": "queued"})
        assert r.status_code == 303 and r.headers["location"] == "/ui/login?next=/ui/jobs%3Fstate%3Dqueued"
        form = c.get(r.headers["location"])
        assert "expired" in c.get("/ui/jobs.json").json()["error"]
        r = c.post("/ui/login", data={"csrf": hidden(form.text, "csrf"), "next": hidden(form.text, "next"),
                                      "token": web_pod.token})  # fmt: skip
        assert r.headers["location"] == "/ui/jobs?state=queued"


def test_scripts_may_use_a_bearer_token_and_need_no_csrf(web_pod: Pod) -> None:
    token = new_user(web_pod, "scripted")
    with anonymous(web_pod) as c:
        headers = {"Authorization": f"Bearer {token}", "Accept": "application/json"}
        assert c.get("/ui/jobs.json", headers=headers).json()["users"] == ["scripted"]
        job = web_pod.client(token).submit({"command": ["sleep", "30"]})
        r = c.post(f"/ui/jobs/{job['id']}/cancel", headers=headers)
        assert r.status_code == 200 and r.json()["id"] == job["id"]
        assert c.get("/ui/jobs.json", headers={"Authorization": "Bearer dp_nope"}).status_code == 401


def test_revoking_a_user_ends_the_live_stream_they_had_open(web_pod: Pod) -> None:
    """A revoked user's open pages go quiet: the job's event stream, already flowing, ends on its own."""
    import sys
    import threading

    from tests.jobs.pods import wait_state

    token = new_user(web_pod, "revokee")
    user = web_pod.client(token)
    job = user.submit({"command": [sys.executable, "-c", "import time; print('on', flush=True); time.sleep(600)"]})
    wait_state(user, job["id"], "running")
    page = sign_in(web_pod, token)
    got: list[bytes] = []
    ended = threading.Event()

    def follow() -> None:
        try:
            with page.stream("GET", f"/ui/jobs/{job['id']}/events", timeout=120) as r:
                for chunk in r.iter_bytes():
                    got.append(chunk)
        except httpx.HTTPError:
            pass
        ended.set()

    threading.Thread(target=follow, daemon=True).start()
    deadline = time.monotonic() + 60
    while not any(b"event: state" in c for c in got) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert any(b"event: state" in c for c in got), "the stream never started"
    web_pod.client().revoke("revokee")
    assert ended.wait(60), "the revoked user's stream was still open a minute later"
    assert web_pod.client().job(job["id"])["state"] == "running"  # the job itself runs on
    web_pod.client().cancel(job["id"])
    page.close()
