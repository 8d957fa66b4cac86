"""Shell and TensorBoard sessions through the pod, the way users deploy: a root pod with its default sandbox, real
Unix users.

ann's shell runs as ann in her sandbox, on the devices it holds; its terminal (terminado's WebSocket) is forwarded
for ann alone, and its exit status is the job's. ``deskpod shell``, run as ann on the pod's socket, attaches a piped
terminal and exits with the shell's status. ann's TensorBoard, queued with ``deskpod tensorboard``, serves the
scalars a real run wrote (torch's SummaryWriter), holding no device; ben gets 404, and TensorBoard over ann's run,
which he cannot read, is refused at submission naming it.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
import tempfile
from pathlib import Path

import httpx
import pytest
from websockets.asyncio.client import connect

from deskpod.envs.accounts import Account
from deskpod.errors import ConflictError
from tests.jobs.pods import Pod, as_user, wait_for, wait_state
from tests.web import session_pods

pytestmark = [
    pytest.mark.server,
    pytest.mark.skipif(os.geteuid() != 0, reason="sessions run as their users only on a pod started by root"),
]
box, users, pod, tokens = session_pods.box, session_pods.users, session_pods.pod, session_pods.tokens
"""The module's pod, users and tokens (`tests.web.session_pods`)."""

LOSSES = [2.5, 1.25, 0.75, 0.5]


@pytest.fixture(scope="module")
def ann_folder(box: Path, users: tuple[Account, Account]) -> Path:
    """ann's own folder (0700): where her shell starts and her run lies."""
    ann, _ = users
    folder = box / "ann"
    folder.mkdir(mode=0o700)
    os.chown(folder, ann.uid, ann.gid)
    return folder


def bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


def as_account(account: Account, argv: list[str], box: Path, home: Path, stdin: str) -> tuple[int, str, str]:
    """``deskpod ARGV`` run as ``account`` (in its ``home``) on the pod's socket (the kernel tells the pod who asks),
    ``stdin`` piped in: its exit status, stdout and stderr. In a child that became the account (`as_user`): this
    interpreter lies in a folder closed to it, so what the command imports is imported first."""
    import websockets.asyncio.client  # noqa: F401 - imported before the fork, see above

    import deskpod.cli.pod
    import deskpod.jobs.attach
    import deskpod.jobs.kinds.shell  # noqa: F401
    from deskpod.cli import build_parser, main

    build_parser()

    def run() -> list[object]:
        r, w = os.pipe()
        os.write(w, stdin.encode())
        os.close(w)
        os.dup2(r, 0)
        os.environ.update({"DESKPOD_SOCKET": str(box / "pod.sock"), "HOME": str(home)})
        with tempfile.TemporaryFile("w+", dir=home) as out, tempfile.TemporaryFile("w+", dir=home) as err:
            sys.stdout, sys.stderr = out, err
            os.dup2(out.fileno(), 1)
            code = main(argv)
            out.flush()
            err.flush()
            out.seek(0)
            err.seek(0)
            return [code, out.read(), err.read()]

    code, out, err = as_user(account, run)
    return int(code), str(out), str(err)


async def converse(url: str, headers: dict[str, str], typed: str) -> str:
    """Type ``typed`` into the terminal behind ``url``; everything it wrote until the shell ended."""
    async with connect(url, additional_headers=headers, max_size=None) as ws:
        await ws.send(json.dumps(["set_size", 40, 132]))
        await ws.send(json.dumps(["stdin", typed]))
        out = ""
        while True:
            msg = json.loads(await asyncio.wait_for(ws.recv(), 60))
            if msg[0] == "stdout":
                out += msg[1]
            elif msg[0] == "disconnect":
                return out


def test_a_shell_runs_as_its_owner_on_its_devices_and_its_exit_ends_the_job(
    pod: Pod, tokens: dict[str, str], users: tuple[Account, Account], ann_folder: Path
) -> None:
    ann, ben = users
    c = pod.client(tokens[ann.name])
    job = str(c.submit({"shell": {}, "devices": 2, "workdir": str(ann_folder)})["id"])
    wait_state(c, job, "running", timeout=60)
    wait_for(lambda: c.probe(f"/sessions/{job}/") == 200, 60, "the shell to answer through the pod")
    held = ",".join(map(str, wait_state(c, job, "running")["assigned"]))
    url = f"ws://127.0.0.1:{pod.port}/sessions/{job}/terminal"
    for headers in (bearer(tokens[ben.name]), bearer(pod.token), {}):  # another user, the admin, anonymous
        assert asyncio.run(session_pods.refused(url, headers)) in (4404, 403), headers
    with httpx.Client(base_url=pod.url, trust_env=False, timeout=30) as http:
        assert http.get(f"/sessions/{job}/", headers=bearer(tokens[ben.name])).status_code == 404
    typed = 'echo "WHO=$(id -un) AT=$(pwd) SLOTS=$DESKPOD_CPU_SLOTS SIZE=$(stty size | tr " " x)"; exit 3\r'
    out = asyncio.run(converse(url, bearer(tokens[ann.name]), typed))
    line = next(x for x in out.splitlines() if x.startswith("WHO="))
    assert line.split() == [f"WHO={ann.name}", f"AT={ann_folder}", f"SLOTS={held}", "SIZE=40x132"], out
    ended = wait_state(c, job, "failed", timeout=30)
    assert ended["exit_code"] == 3


def test_deskpod_shell_attaches_a_piped_terminal_and_exits_with_the_shell(
    pod: Pod, tokens: dict[str, str], users: tuple[Account, Account], box: Path, ann_folder: Path
) -> None:
    ann, _ = users
    code, out, err = as_account(
        ann, ["shell", "--devices", "1", "--workdir", str(ann_folder)], box, ann_folder, "id -un\nexit 5\n"
    )
    assert code == 5, err
    assert ann.name in out.split(), out
    assert "queued" in err


def write_run(folder: Path, account: Account) -> Path:
    """A run folder as the trainer leaves it, its scalars in ``tb/`` (torch's SummaryWriter), ``account``'s alone."""
    from torch.utils.tensorboard import SummaryWriter

    run = folder / "resnet-a"
    writer = SummaryWriter(str(run / "tb"))
    for step, loss in enumerate(LOSSES):
        writer.add_scalar("train/loss", loss, step)
    writer.close()
    for path in [run, *run.rglob("*")]:
        os.chown(path, account.uid, account.gid)
    run.chmod(0o700)
    return run


def test_tensorboard_serves_a_runs_scalars_to_its_owner_alone(
    pod: Pod, tokens: dict[str, str], users: tuple[Account, Account], box: Path, ann_folder: Path
) -> None:
    ann, ben = users
    run = write_run(ann_folder, ann)
    code, out, err = as_account(ann, ["tensorboard", str(run)], box, ann_folder, "")
    assert code == 0, err
    url = out.strip()
    job = url.rstrip("/").rsplit("/", 1)[-1]
    assert url.endswith(f"/sessions/{job}/"), url
    c = pod.client(tokens[ann.name])
    record = c.job(job)
    assert record["kind"] == "tensorboard" and record["devices"] == 0 and record["assigned"] == []
    scalars = f"/sessions/{job}/data/plugin/scalars/scalars"
    query = {"run": "resnet-a/.", "tag": "train/loss"}
    with httpx.Client(base_url=pod.url, trust_env=False, timeout=30) as http:

        def loaded() -> bool:  # TensorBoard reads the events on its first pass after it starts
            return http.get(scalars, params=query, headers=bearer(tokens[ann.name])).status_code == 200

        wait_for(loaded, 60, "TensorBoard to load the run's events")
        got = http.get(scalars, params=query, headers=bearer(tokens[ann.name])).json()
        assert [(step, value) for _, step, value in got] == list(enumerate(LOSSES))
        assert "resnet-a/." in http.get(f"/sessions/{job}/data/runs", headers=bearer(tokens[ann.name])).json()
        assert http.get(scalars, params=query, headers=bearer(tokens[ben.name])).status_code == 404
    theirs = pod.client(tokens[ben.name])
    for path in (run, box / "no-such-run"):  # a run ben cannot read, and one that is not there: the same line
        with pytest.raises(ConflictError, match=f"tensorboard.runs '{path}' is not a run folder"):
            theirs.submit({"tensorboard": {"runs": [str(path)]}})
    c.cancel(job)
    wait_state(c, job, "cancelled", "succeeded", "failed", timeout=30)


def test_the_dashboard_terminal_runs_a_command_as_the_owner(
    pod: Pod, users: tuple[Account, Account], tokens: dict[str, str], ann_folder: Path
) -> None:
    """Chromium opens ann's shell on its job page's terminal (xterm.js over the proxied WebSocket), runs ``id -un``
    and sees ann; ``exit`` there ends the job."""
    from tests.web.browser import CHROMIUM, launch_chromium, open_signed_in

    if not Path(CHROMIUM).exists():
        pytest.fail(f"{CHROMIUM} is missing: `make browser` installs Debian's chromium for these tests")
    from playwright.sync_api import sync_playwright

    from deskpod.web.terminal_page import vendor_dir

    assert vendor_dir() is not None, "xterm.js is not installed: `make webvendor` installs it with npm"
    ann, _ = users
    c = pod.client(tokens[ann.name])
    job = str(c.submit({"shell": {}, "devices": 1, "workdir": str(ann_folder)})["id"])
    wait_state(c, job, "running", timeout=60)
    with sync_playwright() as p:
        browser = launch_chromium(p)
        try:
            page, errors = open_signed_in(browser, pod, f"/ui/jobs/{job}/terminal", tokens[ann.name])
            page.locator("#terminal-status", has_text="connected").wait_for(timeout=60_000)
            page.locator("#terminal .xterm-helper-textarea").focus()
            page.keyboard.type("echo WHO=$(id -un)\n")
            page.locator("#terminal .xterm-rows", has_text=f"WHO={ann.name}").wait_for(timeout=60_000)
            page.keyboard.type("exit\n")
            assert wait_state(c, job, "succeeded", "failed", timeout=60)["state"] == "succeeded"
            assert errors == []
        finally:
            browser.close()
