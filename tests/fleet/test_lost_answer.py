"""A forward whose answer is lost: a real fleet and a real member (root, default sandbox), the member reached through
a relay on 127.0.0.1 that passes every request and answer except the one it is told to lose — the member's answer to
a forward (the member took the job; the fleet's client sees the connection close) or the forward itself (it never
reaches the member). The fleet asks the member by the forward's key: the job it took is adopted, not sent again; the
one that never arrived is sent again with a new key. Either way it runs once."""

from __future__ import annotations

import http.client
import os
import sys
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import urlsplit

import pytest

from deskpod.errors import ConflictError
from deskpod.fleet.client import MemberClient
from deskpod.fleet.keys import FleetKey
from deskpod.fleet.members import Member
from tests.fleet.members import start_fleet
from tests.jobs.pods import Pod, Pods, wait_state
from tests.unix_users import make_users

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="members run jobs as their users' accounts only as root")


class Relay(ThreadingHTTPServer):
    """Passes HTTP requests to ``target`` and its answers back; ``lose`` ("answer" or "request") loses the next
    forward's (``POST /v1/jobs?...key=``) answer or the forward itself, once."""

    daemon_threads = True

    def __init__(self, target: str) -> None:
        super().__init__(("127.0.0.1", 0), Handler)
        self.target = urlsplit(target).netloc
        self.lose: str | None = None
        self.lost: list[str] = []
        """What was lost, for the test to see it happened."""
        self.lock = threading.Lock()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}"

    def take(self, path: str) -> str | None:
        """Whether to lose this request or its answer (once)."""
        if not (path.startswith("/v1/jobs?") and "key=" in path):
            return None
        with self.lock:
            lose, self.lose = self.lose, None
            if lose is not None:
                self.lost.append(f"{lose} of {path}")
            return lose


class Handler(BaseHTTPRequestHandler):
    server: Relay
    protocol_version = "HTTP/1.1"

    def log_message(self, format: str, *args: object) -> None:
        pass

    def relay(self) -> None:
        body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
        lose = self.server.take(self.path)
        if lose == "request":  # it never reaches the member: the connection just closes
            self.close_connection = True
            return
        conn = http.client.HTTPConnection(self.server.target, timeout=60)
        try:
            headers = {k: v for k, v in self.headers.items() if k.lower() not in ("host", "connection")}
            conn.request(self.command, self.path, body=body, headers=headers)
            answer = conn.getresponse()
            data = answer.read()
        finally:
            conn.close()
        if lose == "answer":  # the member took it; its answer never comes back
            self.close_connection = True
            return
        self.send_response(answer.status)
        for k, v in answer.getheaders():
            if k.lower() not in ("transfer-encoding", "connection", "content-length"):
                self.send_header(k, v)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    do_GET = do_POST = relay


@dataclass
class Lossy:
    fleet: Pod
    box: Pod
    relay: Relay
    token: Path


@pytest.fixture(scope="module")
def lossy(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Lossy]:
    pods = Pods(tmp_path_factory.mktemp("lossy"))
    with make_users("ann") as (ann,):
        relay: Relay | None = None
        try:
            fleet, made, tokens = start_fleet(pods, ("--lease", "4", "--no-dashboard"), {"box": ((), {})},
                                              {"ann": ann})  # fmt: skip
            relay = Relay(made["box"].url)
            threading.Thread(target=relay.serve_forever, daemon=True).start()
            done = fleet.cli("fleet", "add", "box", relay.url, token_file=tokens["admin"])
            assert done.returncode == 0, done.stderr
            yield Lossy(fleet, made["box"], relay, tokens["ann"])
        finally:
            if relay is not None:
                relay.shutdown()
                relay.server_close()
            pods.stop_all()


def runs_once(f: Lossy, name: str) -> tuple[dict[str, object], list[str]]:
    """Submit a short job through the fleet; when it succeeded there: the fleet's job and its history notes, after
    checking the member made exactly one job of it, which ran."""
    ann = f.fleet.client(f.token.read_text().strip())
    job = ann.submit({"name": name, "command": [sys.executable, "-c", "print('once')"]})
    done = wait_state(ann, job["id"], "succeeded", "failed", "lost", timeout=90)
    assert done["state"] == "succeeded", done
    copies = f.box.client().jobs(name=name)
    assert len(copies) == 1, copies  # one job on the member, not two
    assert done["external"] == f"box:{copies[0]['id']}" and copies[0]["state"] == "succeeded"
    assert b"once" in ann.log(job["id"])[0]
    return done, [str(e["note"]) for e in done["events"]]


def test_a_forward_whose_answer_was_lost_is_adopted_by_its_key_not_sent_again(lossy: Lossy) -> None:
    lossy.relay.lose = "answer"
    _, notes = runs_once(lossy, "answer-lost")
    assert lossy.relay.lost and lossy.relay.lost[-1].startswith("answer of"), lossy.relay.lost
    assert any("answer did not come" in n for n in notes), notes
    assert any("has the forward whose answer was lost" in n for n in notes), notes
    assert sum(n.startswith("routed to box") for n in notes) == 0, notes  # adopted, never routed a second time


def test_a_forward_that_never_arrived_is_looked_up_then_sent_again_with_a_new_key(lossy: Lossy) -> None:
    lossy.relay.lose = "request"
    done, notes = runs_once(lossy, "request-lost")
    assert lossy.relay.lost and lossy.relay.lost[-1].startswith("request of"), lossy.relay.lost
    assert any("never arrived there (looked up by its key)" in n for n in notes), notes
    assert sum(n.startswith("routed to box") for n in notes) == 1, notes
    # the lost forward's key is closed on the member: the same forward, sent now, is refused there
    key = lossy.relay.lost[-1].split("key=")[1].split("&")[0]
    assert key.startswith(f"{done['id']}.1.")
    as_fleet = MemberClient(Member("box", lossy.box.url, "box", 0.0), FleetKey.in_home(lossy.fleet.home))
    try:
        with pytest.raises(ConflictError, match="looked this forward up before it arrived"):
            as_fleet.submit("ann", {"name": "request-lost", "command": ["/bin/true"]}, 4, key)
        assert as_fleet.lookup([key]) == {}
    finally:
        as_fleet.close()
    assert len(lossy.box.client().jobs(name="request-lost")) == 1
