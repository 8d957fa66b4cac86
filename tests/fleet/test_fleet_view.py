"""The fleet's one view, for real: a fleet (health checks every 2 s) over two member pods on 127.0.0.1, started as root
with the default sandbox. box-ok has this box's CPU slots; box-sick schedules as a DGX-1's 8 devices and was started
with ``GLOO_SOCKET_IFNAME=nosuch0``, a network setting of no interface of this box: its doctor's all-reduce (Gloo,
as its jobs' would be) fails for real. The fleet's users ann and ben have OS accounts on the members.

One set of pods serves the module, in order: the page in Chromium while box-sick fails, then routing around it, and
last box-sick started again without the bad setting, which heals it."""

from __future__ import annotations

import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from deskpod.errors import AccessError
from deskpod.jobs.client import PodClient
from tests.fleet.members import start_fleet
from tests.jobs.pods import Pod, Pods, wait_for, wait_state
from tests.unix_users import make_users
from tests.web.browser import launch_chromium, open_signed_in, sign_in

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="members run jobs as their users' accounts only as root")
BAD = {"GLOO_SOCKET_IFNAME": "nosuch0"}


@dataclass
class Fleet:
    fleet: Pod
    ok: Pod
    sick: Pod
    tokens: dict[str, Path]

    def client(self, user: str) -> PodClient:
        return self.fleet.client(self.tokens[user].read_text().strip())

    def members(self) -> dict[str, dict[str, Any]]:
        got = self.client("admin").request("GET", "/v1/fleet/members").json()["members"]
        return {m["name"]: m for m in got}


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Fleet]:
    pods = Pods(tmp_path_factory.mktemp("fleetview"))
    with make_users("ann", "ben") as (ann, ben):
        try:
            boxes = {"box-ok": ((), {}), "box-sick": (("--machine", "dgx1-v100"), BAD)}
            fleet, members, tokens = start_fleet(pods, ("--lease", "4", "--health-every", "2"), boxes,
                                                 {"ann": ann, "ben": ben})  # fmt: skip
            for name, pod in members.items():
                fleet.client().request("POST", "/v1/fleet/members", json={"name": name, "url": pod.url})
            f = Fleet(fleet, members["box-ok"], members["box-sick"], tokens)
            checked = lambda: all(m["health"] is not None for m in f.members().values())  # noqa: E731
            wait_for(checked, 120, "both members' first health check")
            yield f
        finally:
            pods.stop_all()


@pytest.mark.slow
def test_the_fleet_page_in_chromium_marks_the_failing_member_and_shows_only_the_viewers_jobs(fleet: Fleet) -> None:
    from playwright.sync_api import expect, sync_playwright

    f = fleet
    ann, ben = f.client("ann"), f.client("ben")
    mine = ann.submit({"name": "anns-job", "command": ["/bin/true"]})
    his = ben.submit({"name": "bens-job", "command": ["/bin/true"]})
    for client, job in ((ann, mine), (ben, his)):
        assert wait_state(client, job["id"], "succeeded", timeout=60)["external"].startswith("box-ok:")
    with sync_playwright() as p:
        browser = launch_chromium(p)
        try:
            page, errors = open_signed_in(browser, f.fleet, "/ui/fleet", f.tokens["ben"].read_text().strip())
            expect(page.locator("nav a[aria-current=page]")).to_have_text("Fleet")
            sick = page.locator('tr[data-member="box-sick"]')
            expect(sick).to_have_attribute("data-state", "unhealthy")
            expect(sick.locator('[data-field="state"]')).to_have_text("unhealthy")
            expect(sick.locator('[data-field="health"]')).to_contain_text("all-reduce")
            expect(sick.locator('[data-field="health"]')).to_contain_text("nosuch0")
            expect(sick.locator('[data-field="devices"]')).to_contain_text("8 CPU slots (dgx1-v100), 8 free")
            ok = page.locator('tr[data-member="box-ok"]')
            expect(ok).to_have_attribute("data-state", "ok")
            expect(ok.locator('[data-field="health"]')).to_contain_text("passed")
            expect(ok.locator('[data-field="software"]')).to_contain_text("torch")
            row = page.locator(f'table.fleet-jobs tr[data-job="{his["id"]}"]')
            expect(row.locator('[data-field="member"]')).to_contain_text("box-ok")
            expect(row.locator('[data-field="routed"]')).to_contain_text("box-sick: failed its health check")
            expect(page.locator(f'table.fleet-jobs tr[data-job="{mine["id"]}"]')).to_have_count(0)
            expect(page.locator("table.fleet-jobs")).not_to_contain_text("anns-job")
            assert not errors, errors
        finally:
            browser.close()
    c = sign_in(f.fleet, f.tokens["ben"].read_text().strip())  # the page's JSON twin holds the same
    try:
        data = c.get("/ui/fleet.json").json()
    finally:
        c.close()
    assert {m["name"]: m["state"] for m in data["members"]} == {"box-ok": "ok", "box-sick": "unhealthy"}
    assert [j["user"] for j in data["jobs"]] == ["ben"] and data["jobs"][0]["member"] == "box-ok"


@pytest.mark.slow
def test_a_member_failing_its_doctor_gets_no_jobs_says_why_and_gets_them_again_once_it_passes(fleet: Fleet) -> None:
    f = fleet
    members = f.members()
    assert members["box-sick"]["health"]["state"] == "failed", members["box-sick"]
    failing = " ".join(members["box-sick"]["health"]["failing"])
    assert "all-reduce" in failing and "nosuch0" in failing, failing
    assert members["box-ok"]["health"]["state"] == "passed", members["box-ok"]
    shown = f.fleet.cli("fleet", "members", "--fleet", f.fleet.url)
    line = next(x for x in shown.stdout.splitlines() if x.startswith("box-sick"))
    assert "UNHEALTHY" in line and "health: FAILED: all all-reduce" in line, shown.stdout
    with pytest.raises(AccessError):  # a member's doctor is its admin's and its fleet's, not a user's
        f.ok.client(f.ok.client().new_token("ann")).request("GET", "/v1/doctor")

    ann = f.client("ann")
    four = ann.submit({"name": "four", "devices": 4, "command": ["/bin/true"]})  # only box-sick has 4 devices
    waiting = wait_state(ann, four["id"], "queued")
    wait_for(lambda: "box-sick: failed its health check" in ann.job(four["id"])["reason"], 30, "the reason")
    reason = ann.job(four["id"])["reason"]
    assert reason.startswith("no member can take it now") and "box-ok: has 2 CPU slots, the job needs 4" in reason
    assert waiting["external"] is None

    f.sick.kill()  # the admin fixes the setting and starts box-sick again
    for key in BAD:
        f.sick.env.pop(key)
    f.sick.start()
    done = wait_state(ann, four["id"], "succeeded", "failed", timeout=120)
    assert done["state"] == "succeeded" and done["external"].startswith("box-sick:"), done
    routed = next(e["note"] for e in done["events"] if e["note"].startswith("routed to box-sick"))
    assert "box-sick: 4 CPU slots free now" in routed, routed  # sent once its doctor passed, not before
    assert f.members()["box-sick"]["health"]["state"] == "passed"
