"""A video job on a real root pod with its default sandbox, run as a real user's OS account over a real clip to its
end; its dashboard page shows its streams and tracks, serves their thumbnails, and finds the man in the clip from
a photo (through the API-like JSON twin and in Chromium); what the account may not open is refused at submission.

The clip (carphone's first 2.5 s) and the photo (a frame from 3.3 s, never analysed) lie in a folder of the
account's own; the pod's Python and the tests' own folders are closed to it, so the job and the search can only
see what their walls show them.
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

import deskpod
from deskpod.envs.accounts import Account
from deskpod.errors import ConflictError
from tests.jobs.pods import Pod, Pods, wait_state
from tests.unix_users import make_users, shared_folder
from tests.video.clips import clip
from tests.video.man import clip_and_photo
from tests.web.browser import csrf_of, launch_chromium, open_signed_in, sign_in

pytestmark = [pytest.mark.slow, pytest.mark.server]

DESKPOD_ROOT = str(Path(deskpod.__file__).resolve().parents[1])
"""The job runs this deskpod (the one under test), not whichever the interpreter would find first."""


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Pod, Account, str, Path]]:
    """A sandboxed root pod, a user mapped to a new OS account, that user's token, and a folder of the account's
    holding ``carphone-start.mp4`` and ``man.png``."""
    with make_users("vidy") as (acct,), shared_folder("deskpod-video-") as shared:
        folder = shared / "cams"
        folder.mkdir(mode=0o700)
        clip_and_photo(folder)
        for p in (folder, *folder.iterdir()):
            os.chown(p, acct.uid, acct.gid)
        pods = Pods(tmp_path_factory.mktemp("videopod"))
        try:
            pod = pods(sandbox=True)
            token = str(pod.client().add_user("vidy", os_user=acct.name)["token"])
            yield pod, acct, token, folder
        finally:
            pods.stop_all()


@pytest.fixture(scope="module")
def done_job(world: tuple[Pod, Account, str, Path]) -> str:
    pod, _, token, folder = world
    api = pod.client(token)
    job = api.submit({"video": {"sources": [str(folder / "carphone-start.mp4")], "detect": ["dlib-hog-face"]},
                      "env": {"PYTHONPATH": DESKPOD_ROOT}})  # fmt: skip
    assert job["name"] == "video-carphone-start.mp4"
    wait_state(api, job["id"], "succeeded", "failed", timeout=240)  # models load in the sandbox; 2 cores shared
    got = api.job(job["id"])
    assert got["state"] == "succeeded", (got["reason"], (pod.home / "jobs" / job["id"] / "output.log").read_text())
    return str(job["id"])


def test_the_job_runs_as_the_account_and_the_page_shows_its_stream(
    world: tuple[Pod, Account, str, Path], done_job: str
) -> None:
    pod, acct, token, _ = world
    job_folder = pod.home / "jobs" / done_job
    assert job_folder.stat().st_uid == acct.uid
    assert (job_folder / "video.db").stat().st_uid == acct.uid  # written by the job, as the account
    c = sign_in(pod, token)
    try:
        page = c.get(f"/ui/jobs/{done_job}/video.json").json()
        (stream,) = page["stats"]["streams"]
        assert stream["name"] == "carphone-start.mp4" and stream["state"] == "done" and not stream["error"]
        assert stream["frames"] >= 10 and stream["tracks"] >= 1 and stream["lag"] == 0
        assert page["stats"]["running"] is False and page["stats"]["tracks"] >= 1
        latest = page["stats"]["latest"]
        assert latest and all(t["label"] == "face" for t in latest)
        thumb = c.get(latest[0]["thumbnail_url"])
        assert thumb.status_code == 200 and thumb.headers["content-type"] == "image/jpeg"
        assert thumb.content[:2] == b"\xff\xd8"
        html = c.get(f"/ui/jobs/{done_job}/video").text
        assert "carphone-start.mp4" in html and 'id="search-form"' in html
        assert f'href="/ui/jobs/{done_job}/video"' in c.get(f"/ui/jobs/{done_job}").text
        assert c.get(f"/ui/jobs/{done_job}/video/thumbs/..%2Fvideo.db").status_code == 404
    finally:
        c.close()


def test_a_photo_finds_the_man_and_bad_photos_are_one_line(
    world: tuple[Pod, Account, str, Path], done_job: str
) -> None:
    pod, _, token, folder = world
    c = sign_in(pod, token)
    try:
        csrf = csrf_of(c, f"/ui/jobs/{done_job}/video")
        url = f"/ui/jobs/{done_job}/video/search"
        headers = {"Accept": "application/json"}
        t0 = time.monotonic()
        r = c.post(url, data={"csrf": csrf}, files={"photo": ("man.png", (folder / "man.png").read_bytes())},
                   headers=headers, timeout=300)  # fmt: skip
        assert r.status_code == 200, r.text
        results = r.json()["results"]
        assert results and results[0]["stream"] == "carphone-start.mp4" and results[0]["similarity"] >= 0.93
        assert results[0]["end"] < 2.5 and results[0]["thumbnail_url"]
        print(f"search as the account, in the sandbox: {time.monotonic() - t0:.1f} s")
        assert c.post(url, data={"csrf": csrf}, files={"photo": ("messi.jpg", clip("messi").read_bytes())},
                      headers=headers, timeout=300).json()["results"] == []  # fmt: skip
        bad = c.post(url, data={"csrf": csrf}, files={"photo": ("notes.txt", b"not an image")}, headers=headers,
                     timeout=300)  # fmt: skip
        assert bad.status_code == 400 and "not an image" in bad.json()["error"] and "\n" not in bad.json()["error"]
        page = c.post(url, data={"csrf": csrf}, files={"photo": ("notes.txt", b"not an image")}, timeout=300)
        assert page.status_code == 400 and 'id="photo-error"' in page.text
    finally:
        c.close()


def test_what_the_account_cannot_open_is_refused(world: tuple[Pod, Account, str, Path], tmp_path: Path) -> None:
    pod, _, token, _ = world
    closed = tmp_path / "root-only.mp4"  # under the tests' own folder, closed to the account
    closed.write_bytes(b"x")
    api = pod.client(token)
    with pytest.raises(ConflictError, match=r"video.sources '.*root-only.mp4' is not a video file or folder you can"):
        api.submit({"video": {"sources": [str(closed)]}})
    with pytest.raises(ConflictError, match=r"video.db '.*/x.db': its folder '.*' is not one you can open"):
        api.submit({"video": {"sources": ["rtsp://127.0.0.1:9/none"], "db": str(tmp_path / "x.db")}})


def test_in_chromium_a_photo_upload_lists_the_matching_track(
    world: tuple[Pod, Account, str, Path], done_job: str
) -> None:
    sync_playwright = pytest.importorskip("playwright.sync_api").sync_playwright
    pod, _, token, folder = world
    with sync_playwright() as p:
        browser = launch_chromium(p)
        try:
            page, errors = open_signed_in(browser, pod, f"/ui/jobs/{done_job}/video", token)
            assert page.locator("#streams tr[data-stream='carphone-start.mp4']").count() == 1
            page.set_input_files("#v-photo", str(folder / "man.png"))
            page.click("#search-form button[type=submit]")
            page.wait_for_selector("#results tr[data-track]", timeout=300_000)
            row = page.locator("#results tr[data-track]").first
            assert "carphone-start.mp4" in row.inner_text()
            assert page.locator("#results img").first.evaluate("i => i.complete && i.naturalWidth > 0")
            assert not errors
        finally:
            browser.close()


def test_an_admin_sees_it_and_another_user_gets_a_404(world: tuple[Pod, Account, str, Path], done_job: str) -> None:
    pod, _, _, _ = world
    other = pod.client().add_user("stranger", os_user="root")["token"]
    with httpx.Client(base_url=pod.url, trust_env=False) as plain:
        assert plain.get(f"/ui/jobs/{done_job}/video.json").status_code == 401
    c = sign_in(pod, str(other))
    try:
        assert c.get(f"/ui/jobs/{done_job}/video.json").status_code == 404
    finally:
        c.close()
    a = sign_in(pod)
    try:
        assert a.get(f"/ui/jobs/{done_job}/video.json").status_code == 200
        assert any(j["id"] == done_job for j in a.get("/ui/video.json").json()["jobs"])
    finally:
        a.close()
