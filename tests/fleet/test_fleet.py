"""A fleet and its members, for real: pods on 127.0.0.1 (their own homes and ports; box-a schedules as a DGX-1's
8 devices, box-b has this box's own CPU slots), started as root with the default sandbox, and a fleet pod
(``deskpod fleet up``) they trust. The fleet's users ann and ben are users of the members too, each with a real OS
account there. One set of pods serves the module; the last test SIGKILLs box-a and starts it again."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from deskpod.envs.accounts import Account
from deskpod.errors import AuthError, NotFoundError
from deskpod.jobs.client import PodClient
from tests.fleet.members import start_fleet
from tests.jobs.pods import Pod, Pods, wait_for, wait_state
from tests.unix_users import make_users, shared_folder

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="members run jobs as their users' accounts only as root")


@dataclass
class Fleet:
    fleet: Pod
    a: Pod
    b: Pod
    untrusting: Pod
    accounts: dict[str, Account]
    tokens: dict[str, Path]
    """Each fleet user's token file (0600)."""
    box: Path
    """A folder the users' sandboxes reach (under /var/tmp)."""

    def workdir(self, user: str) -> Path:
        """A new folder in `box` that ``user``'s account owns, for a job's workdir."""
        folder = Path(tempfile.mkdtemp(dir=self.box))
        folder.chmod(0o755)
        os.chown(folder, self.accounts[user].uid, self.accounts[user].gid)
        return folder

    def client(self, user: str) -> PodClient:
        return self.fleet.client(self.tokens[user].read_text().strip())

    def cli(self, user: str, *argv: str) -> subprocess.CompletedProcess[str]:
        """``deskpod COMMAND --fleet URL ARGS`` as ``user`` (the flag before any ``--``)."""
        at = 2 if argv[0] == "fleet" else 1
        return self.fleet.cli(*argv[:at], "--fleet", self.fleet.url, *argv[at:], token_file=self.tokens[user])


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Fleet]:
    pods = Pods(tmp_path_factory.mktemp("fleet"))
    with make_users("ann", "ben") as (ann, ben), shared_folder("deskpod-fleet-") as box:
        try:
            boxes = {"box-a": (("--machine", "dgx1-v100"), {}), "box-b": ((), {})}
            fleet, members, tokens = start_fleet(pods, ("--lease", "4"), boxes, {"ann": ann, "ben": ben})
            untrusting = pods("--name", "box-c", sandbox=True)
            yield Fleet(fleet, members["box-a"], members["box-b"], untrusting, {"ann": ann, "ben": ben}, tokens, box)
        finally:
            pods.stop_all()


def added(f: Fleet) -> None:
    """box-a and box-b are members (added once, by the first test that needs them)."""
    names = {m["name"] for m in f.client("admin").request("GET", "/v1/fleet/members").json()["members"]}
    for name, pod in (("box-a", f.a), ("box-b", f.b)):
        if name not in names:
            done = f.cli("admin", "fleet", "add", name, pod.url)
            assert done.returncode == 0, done.stderr


def one_line(done: subprocess.CompletedProcess[str]) -> str:
    assert done.returncode == 2, (done.returncode, done.stdout, done.stderr)
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1, done.stderr
    return lines[0]


def test_members_are_checked_when_added_listed_in_one_view_and_removed(fleet: Fleet) -> None:
    f = fleet
    added(f)
    listed = f.client("admin").request("GET", "/v1/fleet/members", params={"fresh": True}).json()["members"]
    by_name = {m["name"]: m for m in listed}
    assert set(by_name) == {"box-a", "box-b"}
    assert all(m["reachable"] for m in listed), listed
    assert len(by_name["box-a"]["devices"]) == 8 and by_name["box-a"]["machine"] == "dgx1-v100"
    assert by_name["box-b"]["software"]["deskpod"] and by_name["box-b"]["software"]["torch"]
    shown = f.cli("ann", "fleet", "members")
    assert shown.returncode == 0 and "box-a" in shown.stdout and "8 CPU slots" in shown.stdout, shown.stderr

    # bad input: one line each, and nothing stored
    assert "does not trust this fleet" in one_line(f.cli("admin", "fleet", "add", "box-c", f.untrusting.url))
    assert "no pod service answers" in one_line(f.cli("admin", "fleet", "add", "box-d", "http://127.0.0.1:9"))
    assert "exists already" in one_line(f.cli("admin", "fleet", "add", "box-a", f.a.url))
    assert "member name" in one_line(f.cli("admin", "fleet", "add", "Box A", f.a.url))
    assert "no member 'box-z'" in one_line(f.cli("admin", "fleet", "remove", "box-z"))
    assert "not an admin" in one_line(f.cli("ann", "fleet", "add", "box-e", f.b.url))
    names = [m["name"] for m in f.client("admin").request("GET", "/v1/fleet/members").json()["members"]]
    assert names == ["box-a", "box-b"]

    # a member without fleet jobs goes at once; it comes back by being added again
    gone = f.cli("admin", "fleet", "remove", "box-b")
    assert gone.returncode == 0 and "removed" in gone.stdout, gone.stderr
    assert [m["name"] for m in f.client("admin").request("GET", "/v1/fleet/members").json()["members"]] == ["box-a"]
    added(f)


def test_routing_picks_the_member_that_fits_says_why_and_runs_the_job_as_its_user(fleet: Fleet) -> None:
    f = fleet
    added(f)
    done = f.cli("ann", "submit", "--devices", "4", "--name", "four", "--", "/bin/sh", "-c", "id -u; echo four-done")
    assert done.returncode == 0, done.stderr
    job_id = done.stdout.strip()
    assert "routed to box-a" in done.stderr and "box-a: 4 CPU slots free now" in done.stderr, done.stderr
    assert "box-b: has 2 CPU slots, the job needs 4" in done.stderr, done.stderr
    ann = f.client("ann")
    job = wait_state(ann, job_id, "succeeded", "failed", timeout=60)
    assert job["state"] == "succeeded", job
    assert job["external"].startswith("box-a:")
    notes = [e["note"] for e in job["events"]]
    assert any(n.startswith("routed to box-a") and "box-b: has 2 CPU slots" in n for n in notes), notes
    assert [e["to"] for e in job["events"] if e["from"] != e["to"]] == ["queued", "starting", "running", "succeeded"]
    log = ann.log(job_id)[0].decode()  # read through the fleet from box-a
    assert "four-done" in log and str(f.accounts["ann"].uid) in log.split(), log
    on_a = f.a.client().job(job["external"].split(":")[1])
    assert on_a["user"] == "ann" and on_a["lease"]["confirmed"], on_a


def test_another_users_jobs_are_invisible_at_the_fleet_and_on_the_members(fleet: Fleet) -> None:
    f = fleet
    added(f)
    ann, ben = f.client("ann"), f.client("ben")
    mine = ann.submit({"name": "private", "command": ["/bin/true"]})
    wait_state(ann, mine["id"], "succeeded", timeout=60)
    assert all(j["user"] == "ben" for j in ben.jobs())
    with pytest.raises(NotFoundError):
        ben.job(mine["id"])
    with pytest.raises(NotFoundError):
        ben.log(mine["id"])
    member, member_id = ann.job(mine["id"])["external"].split(":")
    pod = f.a if member == "box-a" else f.b
    ben_there = pod.client(pod.client().new_token("ben"))  # ben's own token on that member
    with pytest.raises(NotFoundError):
        ben_there.job(member_id)
    assert all(j["user"] == "ben" for j in ben_there.jobs())


def test_revoking_a_user_at_the_fleet_ends_their_live_log_stream(fleet: Fleet) -> None:
    f = fleet
    added(f)
    ann = f.client("ann")
    code = "import time\nfor i in range(600):\n    print('tick', i, flush=True)\n    time.sleep(0.2)"
    job = ann.submit({"name": "talker", "command": [sys.executable, "-c", code]})
    wait_state(ann, job["id"], "running", timeout=60)
    env = dict(f.fleet.env, DESKPOD_TOKEN_FILE=str(f.tokens["ann"]))
    argv = [sys.executable, "-m", "deskpod", "logs", "-f", job["id"], "--fleet", f.fleet.url]
    with subprocess.Popen(argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) as follow:
        try:
            assert follow.stdout is not None and follow.stderr is not None
            assert "tick" in follow.stdout.readline() + follow.stdout.readline()  # the member's output, live
            f.client("admin").revoke("ann")
            t0 = time.monotonic()
            code_out = follow.wait(timeout=30)
            assert time.monotonic() - t0 < 5
            assert code_out == 2 and "unknown token" in follow.stderr.read(), code_out
        finally:
            if follow.poll() is None:
                follow.send_signal(signal.SIGKILL)
                follow.wait()
    with pytest.raises(AuthError):
        ann.job(job["id"])
    f.tokens["ann"].write_text(f.client("admin").new_token("ann"))
    ann = f.client("ann")
    ann.cancel(job["id"])  # forwarded to the member: its copy is stopped there too
    assert wait_state(ann, job["id"], "cancelled", timeout=60)["state"] == "cancelled"
    member, member_id = ann.job(job["id"])["external"].split(":")
    pod = f.a if member == "box-a" else f.b
    assert wait_state(pod.client(), member_id, "cancelled", timeout=30)["state"] == "cancelled"


@pytest.mark.slow
def test_a_killed_members_queued_jobs_go_elsewhere_after_the_lease_and_its_running_ones_are_reconciled(
    fleet: Fleet,
) -> None:
    f = fleet
    workdir = f.workdir("ann")
    added(f)
    ann = f.client("ann")
    sleep = [sys.executable, "-c", "import sys, time; time.sleep(float(sys.argv[1])); print('done', flush=True)"]
    # long-a runs until the test lets it end: a file in its workdir (a folder ann's sandbox reaches)
    release = [sys.executable, "-c", "import os, time\nwhile not os.path.exists('release'): time.sleep(0.2)"]
    # box-a busy for at most 2 min (a promised start), box-b with a job of no time limit: a 2-device job goes to box-a
    long_a = ann.submit({"name": "long-a", "devices": 8, "max_runtime": 120, "command": release,
                         "workdir": str(workdir)})  # fmt: skip
    wait_state(ann, long_a["id"], "running", timeout=60)
    busy_b = ann.submit({"name": "busy-b", "devices": 2, "command": [*sleep, "600"]})
    wait_for(lambda: (ann.job(busy_b["id"])["external"] or "").startswith("box-b:"), 30, "busy-b on box-b")
    wait_state(ann, busy_b["id"], "running", timeout=60)
    queued = ann.submit({"name": "queued-a", "devices": 2, "command": [*sleep, "1"]})
    wait_for(lambda: (ann.job(queued["id"])["external"] or "").startswith("box-a:"), 30, "queued-a sent to box-a")
    first_copy = ann.job(queued["id"])["external"].split(":")[1]
    wait_for(lambda: f.a.client().job(first_copy)["lease"]["confirmed"], 30, "the fleet to confirm its lease")

    f.a.kill()  # SIGKILL the daemon; its running job lives on
    killed = time.monotonic()
    ann.cancel(busy_b["id"])  # box-b frees up: the queued job may go there once its lease on box-a ran out
    moved = wait_for(lambda: (ann.job(queued["id"])["external"] or "").startswith("box-b:"), 60, "queued-a re-routed")
    assert moved and time.monotonic() - killed >= 4  # not before the lease could have run out
    assert wait_state(ann, queued["id"], "succeeded", timeout=60)["state"] == "succeeded"
    assert ann.job(long_a["id"])["state"] == "running"  # shown as it was: box-a does not answer

    f.a.start()  # box-a comes back: its copy of queued-a never started and is cancelled; long-a was re-adopted
    wait_for(lambda: f.a.client().job(ann.job(long_a["id"])["external"].split(":")[1])["state"] == "running", 60,
             "box-a to show long-a running again")  # fmt: skip
    (workdir / "release").touch()
    done = wait_state(ann, long_a["id"], "succeeded", "failed", "lost", timeout=90)
    assert done["state"] == "succeeded" and done["external"].startswith("box-a:"), done
    stale = wait_state(f.a.client(), first_copy, "cancelled", timeout=30)
    assert stale["started_at"] is None and "lease" in stale["reason"], stale
    runs = [j for pod in (f.a, f.b) for j in pod.client().jobs(name="queued-a") if j["started_at"] is not None]
    assert len(runs) == 1, runs  # it ran once, on box-b
    history = [e["to"] for e in ann.job(long_a["id"])["events"] if e["from"] != e["to"]]
    assert history == ["queued", "starting", "running", "succeeded"], history
