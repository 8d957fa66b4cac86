"""A video job with watch rules on a real sandboxed root pod, run as a real user's OS account over a real clip: the
watcher runs beside the indexer in the job's one process, an enter rule fires on the people crossing vtest's
street, the alert reaches a webhook on 127.0.0.1, and the job's dashboard page (and its JSON twin) lists it with the
run's events; in Chromium the page refreshes itself until the alert row appears. A watch-list photo the account
cannot open is refused at submission, as a source is.

The clip (vtest from 48 s, 8 s: a person walks up through the region at about 3 s) and the watch-list photo lie in
a folder of the account's own; the tests' own folders are closed to it.
"""

from __future__ import annotations

import os
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

import deskpod
from deskpod.envs.accounts import Account
from deskpod.errors import ConflictError
from tests.jobs.pods import Pod, Pods, wait_state
from tests.unix_users import make_users, shared_folder
from tests.video.clips import clip
from tests.video.man import clip_and_photo
from tests.video.test_watch import Receiver
from tests.web.browser import launch_chromium, open_signed_in, sign_in

pytestmark = [pytest.mark.slow, pytest.mark.server]

DESKPOD_ROOT = str(Path(deskpod.__file__).resolve().parents[1])
CROSSING = [[440, 280], [560, 280], [560, 340], [440, 340]]
"""Where people walk up vtest's street (tests/video/test_watch.py)."""


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Pod, Account, str, Path, Receiver]]:
    """A sandboxed root pod, a user mapped to a new OS account and that user's token, a folder of the account's
    holding ``street.avi`` and ``man.png``, and a webhook receiver on 127.0.0.1."""
    with make_users("vidw") as (acct,), shared_folder("deskpod-video-") as shared, Receiver() as hook:
        folder = shared / "cams"
        folder.mkdir(mode=0o700)
        subprocess.run(["ffmpeg", "-v", "error", "-y", "-ss", "48", "-i", str(clip("vtest")), "-t", "8", "-c:v",
                        "mpeg4", "-q:v", "2", str(folder / "street.avi")], check=True)  # fmt: skip
        clip_and_photo(folder)
        for p in (folder, *folder.iterdir()):
            os.chown(p, acct.uid, acct.gid)
        pods = Pods(tmp_path_factory.mktemp("videowatchpod"))
        try:
            pod = pods(sandbox=True)
            token = str(pod.client().add_user("vidw", os_user=acct.name)["token"])
            yield pod, acct, token, folder, hook
        finally:
            pods.stop_all()


@pytest.fixture(scope="module")
def job(world: tuple[Pod, Account, str, Path, Receiver]) -> str:
    """The video job, submitted (not waited for)."""
    pod, _, token, folder, hook = world
    rules = [{"name": "crossing", "kind": "enter", "region": CROSSING},
             {"name": "suspect", "kind": "face", "photos": [str(folder / "man.png")]}]  # fmt: skip
    spec = {"video": {"sources": [str(folder / "street.avi")], "detect": ["hog-people"], "rules": rules,
                      "webhook": hook.url}, "env": {"PYTHONPATH": DESKPOD_ROOT}}  # fmt: skip
    return str(pod.client(token).submit(spec)["id"])


def test_in_chromium_the_page_refreshes_until_the_alert_appears(
    world: tuple[Pod, Account, str, Path, Receiver], job: str
) -> None:
    sync_playwright = pytest.importorskip("playwright.sync_api").sync_playwright
    pod, _, token, _, _ = world
    with sync_playwright() as p:
        browser = launch_chromium(p)
        try:
            page, errors = open_signed_in(browser, pod, f"/ui/jobs/{job}/video", token)
            at_load = page.locator("#alerts tr[data-alert]").count()
            print(f"alert rows when the page loaded: {at_load}")
            assert page.locator("#alerts").count() == 1 and "crossing" in page.inner_text("#alerts-h + p")
            page.wait_for_selector("#alerts tr[data-alert]", timeout=300_000)  # models load in the sandbox
            row = page.locator("#alerts tr[data-alert]").first
            assert "crossing" in row.inner_text() and "street.avi" in row.inner_text()
            if at_load == 0:  # it came without a reload: the page's script fetched its JSON twin
                assert page.evaluate("document.body.dataset.videoRefreshed") is not None
            page.wait_for_selector("#streams tr[data-stream='street.avi']", timeout=60_000)
            assert not errors
        finally:
            browser.close()


def test_the_alert_is_listed_on_the_page_and_reaches_the_webhook(
    world: tuple[Pod, Account, str, Path, Receiver], job: str
) -> None:
    pod, acct, token, _, hook = world
    api = pod.client(token)
    wait_state(api, job, "succeeded", "failed", timeout=300)
    got = api.job(job)
    assert got["state"] == "succeeded", (got["reason"], (pod.home / "jobs" / job / "output.log").read_text())
    assert (pod.home / "jobs" / job / "video.db").stat().st_uid == acct.uid
    c = sign_in(pod, token)
    try:
        t0 = time.monotonic()
        page = c.get(f"/ui/jobs/{job}/video.json").json()
        print(f"the page with its alerts (a process as the account, in the sandbox): {time.monotonic() - t0:.2f} s")
        assert page["alerts_error"] is None and page["refresh_s"] is None  # the job has ended
        crossing = [a for a in page["alerts"] if a["rule"] == "crossing"]
        assert crossing and all(a["stream"] == "street.avi" and a["kind"] == "enter" for a in crossing)
        assert {a["rule"] for a in page["alerts"]} == {"crossing"}  # no face in a people-only index
        assert all(a["state"] == "sent" and a["raised"] and a["detail"].startswith("x ") for a in page["alerts"])
        assert sorted(p["id"] for _, p in hook.posts) == sorted(a["id"] for a in page["alerts"])
        assert hook.posts[0][1]["rule"] == "crossing" and hook.posts[0][1]["stream"] == "street.avi"
        thumb = page["alerts"][0]["thumbnail_url"]
        assert thumb and c.get(thumb).content[:2] == b"\xff\xd8"
        texts = [e["text"] for e in page["events"]]  # newest first
        assert any(t.startswith("street.avi: done, ") for t in texts), texts
        assert any(t.startswith("watching with 2 rules: crossing (enter), suspect (face)") for t in texts), texts
        assert (
            texts[0].startswith(f"watch: {len(page['alerts'])} alerts from ")
            and f"{len(page['alerts'])} sent, 0 failed" in texts[0]
        )
        html = c.get(f"/ui/jobs/{job}/video").text
        assert 'id="alerts"' in html and f'data-alert="{crossing[0]["id"]}"' in html and 'id="events"' in html
        assert "static/video.js" not in html  # an ended job's page does not poll
        assert hook.url not in html  # the webhook's URL may hold a token: not shown
    finally:
        c.close()


def test_a_watch_list_photo_the_account_cannot_open_is_refused(
    world: tuple[Pod, Account, str, Path, Receiver], tmp_path: Path
) -> None:
    pod, _, token, folder, _ = world
    closed = tmp_path / "root-only.jpg"  # under the tests' own folder, closed to the account
    closed.write_bytes(b"x")
    rules = [{"kind": "face", "photos": [str(closed)]}]
    with pytest.raises(ConflictError, match=r"video.rules photo '.*root-only.jpg' is not a file you can open"):
        pod.client(token).submit({"video": {"sources": [str(folder / "street.avi")], "rules": rules}})
