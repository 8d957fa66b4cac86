"""Notebook sessions through the pod, the way users deploy: a root pod with its default sandbox, real Unix users.

ann's notebook runs as ann in her sandbox; the pod forwards ``/sessions/<id>/`` (HTTP and WebSocket) to it for ann
alone. Chromium opens it and runs a cell; ben and the admin get 404, anonymous gets the sign-in page; a link ann
plants where her session's socket should be never takes a request anywhere else.
"""

from __future__ import annotations

import asyncio
import html
import json
import os
import uuid
from pathlib import Path

import httpx
import pytest
from websockets.asyncio.client import connect

from deskpod.envs.accounts import Account
from tests.jobs.pods import Pod, wait_for, wait_state
from tests.web import session_pods
from tests.web.browser import CHROMIUM, launch_chromium, open_signed_in

pytestmark = [
    pytest.mark.server,
    pytest.mark.skipif(os.geteuid() != 0, reason="sessions run as their users only on a pod started by root"),
]
box, users, pod, tokens = session_pods.box, session_pods.users, session_pods.pod, session_pods.tokens
"""The module's pod, users and tokens (`tests.web.session_pods`)."""

CELL = ("import os, getpass, torch; print('SEEN', getpass.getuser(), os.environ.get('DESKPOD_CPU_SLOTS'), "
        "repr(os.environ.get('CUDA_VISIBLE_DEVICES')), torch.cuda.device_count())")  # fmt: skip


@pytest.fixture(scope="module")
def notebook(pod: Pod, users: tuple[Account, Account], tokens: dict[str, str], box: Path) -> str:
    """ann's notebook on 2 CPU slots, its files in her own folder; its id once it answers."""
    ann, _ = users
    files = box / "ann-notebooks"
    files.mkdir()
    os.chown(files, ann.uid, ann.gid)
    c = pod.client(tokens[ann.name])
    job = str(c.submit({"notebook": {}, "devices": 2, "workdir": str(files)})["id"])
    wait_state(c, job, "running", timeout=60)
    wait_for(lambda: c.probe(f"/sessions/{job}/api/status") == 200, 60, "the notebook to answer through the pod")
    return job


def bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


def test_only_the_owner_reaches_the_session(pod: Pod, notebook: str, tokens: dict[str, str],
                                            users: tuple[Account, Account]) -> None:  # fmt: skip
    ann, ben = users
    with httpx.Client(base_url=pod.url, trust_env=False, timeout=30) as http:
        mine = http.get(f"/sessions/{notebook}/api/status", headers=bearer(tokens[ann.name]))
        assert mine.status_code == 200 and "kernels" in mine.json()
        for who in (tokens[ben.name], pod.token):  # another user, and the pod's admin
            r = http.get(f"/sessions/{notebook}/api/contents", headers=bearer(who))
            assert r.status_code == 404, r.text
            assert "no session" in r.text
        anonymous = http.get(f"/sessions/{notebook}/lab")
        assert anonymous.status_code == 303
        assert anonymous.headers["location"] == f"/ui/login?next=/sessions/{notebook}/lab"
        assert http.get(f"/sessions/{notebook}/api/status", headers={"Accept": "application/json"}).status_code == 401
        assert http.get("/sessions/999999/api/status", headers=bearer(tokens[ann.name])).status_code == 404


def _ws_url(pod: Pod, notebook: str, kernel: str) -> str:
    return f"ws://127.0.0.1:{pod.port}/sessions/{notebook}/api/kernels/{kernel}/channels"


async def _execute(url: str, headers: dict[str, str], code: str) -> str:
    """Run ``code`` on the kernel behind ``url`` (Jupyter's messaging over its WebSocket); its stdout."""
    async with connect(url, additional_headers=headers, max_size=None) as ws:
        msg_id = uuid.uuid4().hex
        await ws.send(json.dumps({
            "header": {"msg_id": msg_id, "msg_type": "execute_request", "username": "", "session": uuid.uuid4().hex,
                       "version": "5.3", "date": ""},
            "parent_header": {}, "metadata": {}, "channel": "shell", "buffers": [],
            "content": {"code": code, "silent": False, "store_history": False, "user_expressions": {},
                        "allow_stdin": False, "stop_on_error": True},
        }))  # fmt: skip
        out, replied, idle = "", False, False
        while not (replied and idle):  # iopub's output may come after the shell's reply: wait for its idle too
            m = json.loads(await asyncio.wait_for(ws.recv(), 120))
            if m.get("parent_header", {}).get("msg_id") != msg_id:
                continue
            if m["msg_type"] == "stream":
                out += m["content"]["text"]
            replied = replied or m["msg_type"] == "execute_reply"
            idle = idle or (m["msg_type"] == "status" and m["content"]["execution_state"] == "idle")
        return out


def start_kernel(http: httpx.Client, notebook: str, headers: dict[str, str]) -> str:
    """A kernel of the session, started through the pod (Jupyter's own cross-site check: its _xsrf cookie)."""
    http.get(f"/sessions/{notebook}/lab", headers=headers)
    xsrf = http.cookies.get("_xsrf")
    assert xsrf, "JupyterLab set no _xsrf cookie through the pod"
    r = http.post(f"/sessions/{notebook}/api/kernels", headers={**headers, "X-XSRFToken": xsrf}, json={})
    assert r.status_code == 201, r.text
    return str(r.json()["id"])


def test_a_kernel_runs_as_the_owner_on_its_devices_over_the_websocket(
    pod: Pod, notebook: str, tokens: dict[str, str], users: tuple[Account, Account]
) -> None:
    ann, ben = users
    with httpx.Client(base_url=pod.url, trust_env=False, timeout=60) as http:
        kernel = start_kernel(http, notebook, bearer(tokens[ann.name]))
    url = _ws_url(pod, notebook, kernel)
    out = asyncio.run(_execute(url, bearer(tokens[ann.name]), CELL))
    held = wait_state(pod.client(), notebook, "running")["assigned"]
    assert out.split() == ["SEEN", ann.name, ",".join(map(str, held)), "''", "0"], out

    for headers in (bearer(tokens[ben.name]), bearer(pod.token), {}):
        assert asyncio.run(session_pods.refused(url, headers)) in (4404, 403), headers


def test_chromium_opens_the_notebook_and_runs_a_cell(
    pod: Pod, notebook: str, tokens: dict[str, str], users: tuple[Account, Account], box: Path, tmp_path: Path
) -> None:
    """ann's browser runs a cell in a new notebook through the pod; the notebook is in her folder, cell and output
    included, without her saving it: the server holds the document (jupyter-collaboration) and writes it itself."""
    if not Path(CHROMIUM).exists():
        pytest.fail(f"{CHROMIUM} is missing: `make browser` installs Debian's chromium for these tests")
    from playwright.sync_api import TimeoutError as PlaywrightTimeout
    from playwright.sync_api import sync_playwright

    ann, _ = users
    with sync_playwright() as p:
        browser = launch_chromium(p)
        try:
            page, _ = open_signed_in(browser, pod, f"/sessions/{notebook}/lab", tokens[ann.name])
            tile = page.locator('.jp-LauncherCard[data-category="Notebook"]', has_text="Python 3 (job)").first
            tile.click(timeout=120_000)  # the launcher's notebook tile: the job's kernel
            # the notebook's kernel is up and its shared document ready before anything is typed into it
            page.locator(".jp-Notebook-ExecutionIndicator[data-status='idle']").first.wait_for(timeout=120_000)
            cell = page.locator(".jp-Notebook .jp-Cell .cm-content").first
            output = page.locator(".jp-OutputArea-output", has_text="SEEN").first
            seen: list[str] = []
            for _ in range(3):
                # Keystrokes sent while the editor is still being joined to the server's shared document may be
                # dropped, or the document's first sync may replace them: type (again) until the cell runs.
                cell.click(timeout=60_000)
                page.keyboard.press("ControlOrMeta+a")
                page.keyboard.type(CELL)
                page.keyboard.press("Shift+Enter")
                try:
                    output.wait_for(timeout=60_000)
                    break
                except PlaywrightTimeout:
                    status = page.locator(".jp-Notebook-ExecutionIndicator").first.get_attribute("data-status")
                    seen.append(f"kernel {status}: {page.locator('.jp-Notebook').first.inner_text()}")
            else:
                page.screenshot(path=str(tmp_path / "notebook.png"))
                log = pod.client(tokens[ann.name]).log(notebook)[0].decode(errors="replace")[-3000:]
                pytest.fail(
                    f"the cell never printed SEEN; the notebook read, after each try: {seen!r} "
                    f"(screenshot: {tmp_path / 'notebook.png'}); the session's log ends:\n{log}"
                )
            assert f"SEEN {ann.name}" in output.inner_text()

            def written() -> bool:
                found = [json.loads(f.read_text()) for f in (box / "ann-notebooks").glob("*.ipynb")]
                return any("SEEN" in json.dumps(c.get("outputs", [])) and "getpass" in "".join(c.get("source", []))
                           for nb in found for c in nb.get("cells", []))  # fmt: skip

            wait_for(written, 60, "the notebook, its cell and output, in ann's folder unsaved by her")
        finally:
            browser.close()


def test_a_link_planted_for_the_socket_reaches_nothing_else(
    pod: Pod, notebook: str, tokens: dict[str, str], users: tuple[Account, Account], box: Path
) -> None:
    """ann points her session's socket at the pod's own (root's): the pod refuses to forward there; her socket is
    put back afterwards."""
    ann, _ = users
    folder = pod.home / "jobs" / notebook
    sock = folder / "session.sock"
    sock.rename(folder / "session.real")
    try:
        os.symlink(box / "pod.sock", sock)
        os.lchown(sock, ann.uid, ann.gid)
        with httpx.Client(base_url=pod.url, trust_env=False, timeout=30) as http:
            r = http.get(f"/sessions/{notebook}/v1/whoami", headers=bearer(tokens[ann.name]))
            assert r.status_code == 503, r.text
            assert "not served by its own account" in r.text
    finally:
        (folder / "session.real").replace(sock)
    with httpx.Client(base_url=pod.url, trust_env=False, timeout=30) as http:
        assert http.get(f"/sessions/{notebook}/api/status", headers=bearer(tokens[ann.name])).status_code == 200
    # An address written where a cluster node's session says where it listens sends nothing there on this pod: its
    # sessions are reached on their socket alone (here the address is the pod's own API, which would answer whoami).
    for name, text in (("session.json", json.dumps({"host": "127.0.0.1", "port": pod.port})), ("session.secret", "x")):
        (folder / name).write_text(text)
        os.chown(folder / name, ann.uid, ann.gid)
    try:
        with httpx.Client(base_url=pod.url, trust_env=False, timeout=30) as http:
            r = http.get(f"/sessions/{notebook}/api/status", headers=bearer(tokens[ann.name]))
            assert r.status_code == 200 and "kernels" in r.json(), r.text  # JupyterLab's answer, not the pod's
    finally:
        for name in ("session.json", "session.secret"):
            (folder / name).unlink()


def test_new_notebook_from_the_dashboard_waits_then_opens(
    pod: Pod, notebook: str, tokens: dict[str, str], users: tuple[Account, Account]
) -> None:
    """The Sessions page lists ann's notebook with its link; "New notebook" queues one and lands on its waiting
    page (more devices than are free: it waits), which a script sees as 503; a bad time is one line."""
    ann, _ = users
    from tests.web.browser import csrf_of, sign_in

    c = sign_in(pod, tokens[ann.name])
    try:
        listing = c.get("/ui/sessions.json").json()
        assert [s["url"] for s in listing["sessions"] if s["id"] == int(notebook)] == [f"/sessions/{notebook}/lab"]
        csrf = csrf_of(c, "/ui/sessions")
        bad = c.post("/ui/sessions/notebook", data={"csrf": csrf, "devices": "1", "time": "soon"})
        assert bad.status_code == 400 and "time 'soon': expected a duration" in html.unescape(bad.text)
        free = len(pod.client().status()["devices"]) - 2  # ann's first notebook holds 2
        r = c.post("/ui/sessions/notebook", data={"csrf": csrf, "devices": str(free + 1), "time": "1h"})
        assert r.status_code == 303 and r.headers["location"].endswith("/lab"), r.text
        waiting = c.get(r.headers["location"], headers={"Accept": "text/html"})
        assert waiting.status_code == 503 and 'http-equiv="refresh"' in waiting.text and "queued" in waiting.text
        job = r.headers["location"].split("/")[2]
        assert c.get(f"/sessions/{job}/api/status").status_code == 503
        pod.client().cancel(job)
    finally:
        c.close()


def test_bad_input_is_one_line(pod: Pod) -> None:
    """More devices than the box has, a time that is no duration: one line each, exit 2, nothing queued."""
    before = len(pod.client().jobs())
    many = pod.cli("notebook", "--devices", "999")
    assert many.returncode == 2 and many.stderr.strip().count("\n") == 0, many.stderr
    assert "needs 999 devices and this box has" in many.stderr
    soon = pod.cli("notebook", "--time", "soon")
    assert soon.returncode == 2 and "--time 'soon': expected a duration" in soon.stderr
    assert len(pod.client().jobs()) == before


def test_a_restarted_daemon_readopts_the_session_with_its_kernel(
    pod: Pod, notebook: str, tokens: dict[str, str], users: tuple[Account, Account]
) -> None:
    """The daemon SIGKILLed and started again while ann's notebook runs (last: it restarts the module's pod): the job
    is re-adopted (same process), its URL answers her through the new daemon, and her kernel kept its state."""
    ann, ben = users
    me = bearer(tokens[ann.name])
    with httpx.Client(base_url=pod.url, trust_env=False, timeout=60) as http:
        kernel = start_kernel(http, notebook, me)
    url = _ws_url(pod, notebook, kernel)
    mark = uuid.uuid4().hex
    asyncio.run(_execute(url, me, f"MARK = {mark!r}"))
    pid = pod.client().job(notebook)["pid"]

    pod.kill()
    pod.start()
    job = pod.client().job(notebook)
    assert job["state"] == "running" and job["pid"] == pid, job
    assert any("re-adopted" in e["note"] for e in job["events"]), job["events"]
    with httpx.Client(base_url=pod.url, trust_env=False, timeout=60) as http:
        r = http.get(f"/sessions/{notebook}/api/kernels/{kernel}", headers=me)
        assert r.status_code == 200, r.text
        assert http.get(f"/sessions/{notebook}/api/status", headers=bearer(tokens[ben.name])).status_code == 404
    assert asyncio.run(_execute(url, me, "print(MARK)")).strip() == mark
