"""The red team's findings on a shared pod, replayed: each way an ordinary user became root, and each way a job
stopped the pod.

An outside team attacked a pod the way the box's users meet it — started by root with its default bubblewrap
sandbox, the users local accounts without admin rights — and got root six ways and stalled the daemon three.
Each attack here replays one of them as that user would: a real Unix account talking to the pod over its Unix
socket (identified by the kernel) or through the dashboard with a token of their own, and jobs that plant what
they like in their own folders. An attack answers None when the wall held, or one line saying what got through.

Run it as root; it starts its own pod and its own users, and removes them again::

    .venv/bin/python -m tests.redteam            # one line per attack, "held" or "BROKEN: ..."; exit 1 if any broke

``tests/jobs/test_redteam.py`` runs every attack in the suite.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import shutil
import sys
import tarfile
import tempfile
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
from PIL import Image

from deskpod.envs.accounts import Account
from deskpod.errors import DeskpodError
from tests.jobs.pods import Pod, Pods, as_user, on_socket, wait_for, wait_state
from tests.unix_users import make_users
from tests.web.browser import sign_in

ADMIN_SECRET = ("DESKPOD_REDTEAM_ADMIN_KEY", "the admin's own cloud key")
"""A variable of the admin's shell, which the daemon was started from."""


@dataclass
class Stage:
    """What every attack plays on: a root pod with its default sandbox, two local users, a folder both reach."""

    pod: Pod
    alice: Account
    """The attacker: an ordinary local user."""
    bob: Account
    """Another user, whose files alice must not reach."""
    box: Path
    """A folder every account can reach (outside /tmp, which each sandbox has its own of)."""
    bob_private: Path
    """A readable folder (0755, files 0644) inside bob's closed (0700) home."""
    bob_job: str = ""
    """A job of bob's whose log holds `BOB_SECRET`."""
    cleanup: list[Callable[[], None]] = field(default_factory=list)

    def submit(self, who: Account, spec: dict[str, Any]) -> str:
        """Submit as ``who`` over the Unix socket (the kernel says who they are); the job's id."""
        return str(as_user(who, on_socket(self.pod, lambda c: c.submit(spec)))["id"])

    def refused(self, who: Account, spec: dict[str, Any]) -> str | None:
        """The one-line refusal of ``spec``, or None when the pod took it."""
        try:
            job = self.submit(who, spec)
        except DeskpodError as e:
            return str(e)
        self.pod.client().cancel(job)
        return None

    def token(self, who: Account) -> str:
        """A token of ``who``'s own, made by them over the socket (for the dashboard)."""
        return str(as_user(who, on_socket(self.pod, lambda c: c.new_token(who.name))))

    def finished(self, job: str, timeout: float = 120) -> dict[str, Any]:
        return wait_state(self.pod.client(), job, "succeeded", "failed", "cancelled", timeout=timeout)

    def log(self, job: str) -> str:
        return self.pod.client().log(job)[0].decode(errors="replace")

    def folder(self, job: str) -> Path:
        return self.pod.home / "jobs" / job


BOB_SECRET = "bob's private words"


# -- 1: a loader variable in a job's env ---------------------------------------------------------------------
def loader_variables(s: Stage) -> str | None:
    """``LD_PRELOAD`` in a job's env used to reach the shim, bwrap and setpriv, run as root before the drop."""
    for name in ("LD_PRELOAD", "LD_AUDIT", "LD_LIBRARY_PATH", "GLIBC_TUNABLES", "GCONV_PATH"):
        if s.refused(s.alice, {"command": ["true"], "env": {name: str(s.box / "evil.so")}}) is None:
            return f"a job with {name} in its env was accepted"
    mark = "DESKPOD_REDTEAM_MARK"
    code = f"import os, time; print('MARK', os.environ.get('{mark}'), flush=True); time.sleep(600)"
    job = s.submit(s.alice, {"command": [sys.executable, "-c", code], "env": {mark: "alice's"}})
    try:
        wait_for(lambda: "MARK alice's" in s.log(job), 60, "the job to print its variable")
        tree = _descendants(int((s.folder(job) / "pid.1").read_text()))
        for pid in tree:
            seen = _environ(pid)
            if _uid(pid) == 0 and (mark in seen or "alice's" in seen.values()):
                return f"process {pid} runs as root with the job's variables: {_cmdline(pid)}"
        if not any(_environ(p).get(mark) == "alice's" and _uid(p) == s.alice.uid for p in tree):
            return "the job's own process did not get its variables (the check above proves nothing)"
    finally:
        s.pod.client().cancel(job)
    return None


# -- 2: a build backend, or a requirement that is a path ---------------------------------------------------
PROBE_BACKEND = """
import base64, hashlib, os, zipfile

def get_requires_for_build_wheel(config_settings=None):
    return []

def build_wheel(wheel_directory, config_settings=None, metadata_directory=None):
    with open("/etc/deskpod-redteam-owned", "a") as f:  # root could; the user cannot
        f.write("built as root\\n")
    return "never.whl"
"""
"""An sdist whose build backend writes where only root may, then (as the user) fails: built as root, it leaves
/etc/deskpod-redteam-owned behind."""


def probe_sdist(folder: Path, name: str, backend: str) -> None:
    """An sdist of package ``name`` 1.0 in ``folder`` whose build backend is the module text ``backend`` (an
    in-tree backend that needs nothing from an index), readable by every account."""
    stem = name.replace("-", "_") + "-1.0"
    files = {
        "pyproject.toml": '[build-system]\nrequires = []\nbuild-backend = "probe_backend"\nbackend-path = ["."]\n'
        f'[project]\nname = "{name}"\nversion = "1.0"\n',
        "PKG-INFO": f"Metadata-Version: 2.1\nName: {name}\nVersion: 1.0\n",
        "probe_backend.py": backend,
    }
    with tarfile.open(folder / f"{stem}.tar.gz", "w:gz") as tar:
        for file, text in files.items():
            data = text.encode()
            info = tarfile.TarInfo(f"{stem}/{file}")
            info.size, info.mode = len(data), 0o644
            tar.addfile(info, io.BytesIO(data))
    (folder / f"{stem}.tar.gz").chmod(0o644)


def build_as_root(s: Stage) -> str | None:
    """A requirement that is a path passed the ``file:`` check, and the build ran as root outside the sandbox."""
    evil = s.box / "evil"
    for req in (f"evil @ {evil}", f"evil @ file://{evil}", f"evil @ git+file://{evil}"):
        if s.refused(s.alice, {"command": ["true"], "environment": {"packages": [req]}}) is None:
            return f"a requirement {req!r} was accepted"
    lock = (
        'version = 1\nrequires-python = ">=3.8"\n[[package]]\nname = "app"\nversion = "0"\nsource = { virtual = "." }\n'
        'dependencies = [{ name = "evil" }]\n[[package]]\nname = "evil"\nversion = "0"\n'
        f'source = {{ directory = "{evil}" }}\n'
    )
    project = '[project]\nname = "app"\nversion = "0"\ndependencies = ["evil"]\n'
    spec = {"command": ["true"], "environment": {"lock": {"file": "uv.lock", "text": lock},
                                                  "pyproject": {"file": "pyproject.toml", "text": project}}}  # fmt: skip
    if s.refused(s.alice, spec) is None:
        return "a uv.lock with a directory source was accepted"
    Path("/etc/deskpod-redteam-owned").unlink(missing_ok=True)
    job = s.submit(s.alice, {"command": ["true"], "environment": {"packages": ["deskpod-redteam-probe==1.0"]}})
    s.finished(job, timeout=300)
    if Path("/etc/deskpod-redteam-owned").exists():
        Path("/etc/deskpod-redteam-owned").unlink()
        return "the build backend of alice's package wrote /etc/deskpod-redteam-owned: it ran as root"
    return None


# -- 3: a job's output.log linked to the admin token --------------------------------------------------------
def linked_log(s: Stage) -> str | None:
    """A job made its ``output.log`` a link to the admin token; the root daemon read it back through the API."""
    targets = {"the admin token": s.pod.home / "token", "/etc/shadow": Path("/etc/shadow"),
               "bob's log": s.folder(s.bob_job) / "output.log"}  # fmt: skip
    secrets = {"the admin token": s.pod.token, "/etc/shadow": "root:", "bob's log": BOB_SECRET}
    token = s.token(s.alice)
    for what, target in targets.items():
        code = f"import os; os.remove('output.log'); os.symlink({str(target)!r}, 'output.log')"
        job = s.submit(s.alice, {"command": [sys.executable, "-c", code]})
        s.finished(job)
        seen = _as_alice_everywhere(s, token, job)
        for where, text in seen.items():
            if secrets[what] in text:
                return f"{what} came back through {where}"
    return None


def _as_alice_everywhere(s: Stage, token: str, job: str) -> dict[str, str]:
    """What alice reads of her job's log through every door: the API, the job page, its live stream, search."""
    out: dict[str, str] = {}
    with httpx.Client(base_url=s.pod.url, headers={"Authorization": f"Bearer {token}"}, timeout=30) as api:
        out["the API's log"] = api.get(f"/v1/jobs/{job}/log").text
    page = sign_in(s.pod, token)
    try:
        out["the job page"] = page.get(f"/ui/jobs/{job}").text
        for q in ("root", "bob", s.pod.token[:8]):
            out[f"the log search for {q!r}"] = page.get(f"/ui/jobs/{job}/search.json", params={"q": q}).text
        out["the live stream"] = _stream_start(page, f"/ui/jobs/{job}/events")
    finally:
        page.close()
    return out


def _stream_start(client: httpx.Client, path: str, *, events: int = 64) -> str:
    """The first ``events`` events of a Server-Sent Events stream, or all of it when it ends sooner (it ends by
    itself for a finished job; a running job's goes on)."""
    got = b""
    with client.stream("GET", path, timeout=30) as r:
        for chunk in r.iter_bytes():
            got += chunk
            if got.count(b"\n\n") >= events or b"event: end" in got:
                break
    return got.decode(errors="replace")


# -- 4: reading the pod's database --------------------------------------------------------------------------
def database(s: Stage) -> str | None:
    """``pod.db`` and its WAL were 0644: any local user read every job's ``env`` (other users' API keys)."""
    secret = "bob's-api-key"
    job = s.submit(s.bob, {"command": ["true"], "env": {"API_KEY": secret}})
    s.finished(job)
    home = s.pod.home

    def peek() -> str | None:
        for name in ("pod.db", "pod.db-wal", "pod.db-shm", "daemon.lock", "token"):
            try:
                with open(home / name, "rb") as f:
                    read = f.read()
            except (FileNotFoundError, PermissionError):
                continue
            return f"alice read {name}" + (" and bob's API key in it" if secret.encode() in read else "")
        return None

    return as_user(s.alice, peek)  # type: ignore[no-any-return]


# -- 5: a work directory behind a closed parent --------------------------------------------------------------
def closed_workdir(s: Stage) -> str | None:
    """A ``workdir`` inside bob's 0700 home was bound into alice's sandbox by root: she read it."""
    read = [sys.executable, "-c", "print(open('secret.txt').read(), flush=True)"]
    answers = [s.refused(s.alice, {"command": read, "workdir": w}) for w in (str(s.bob_private), str(s.box / "nope"))]
    if answers[0] is None:
        return "a job of alice's with its work directory in bob's closed home was accepted"
    if answers[1] is None or answers[0].replace(str(s.bob_private), "X") != answers[1].replace(
        str(s.box / "nope"), "X"
    ):
        return f"the answers tell a closed folder from a missing one: {answers}"
    # the same folder reached by a link alice swaps in while the job waits in the queue
    work = s.box / "alice-work"
    work.mkdir()
    os.chown(work, s.alice.uid, s.alice.gid)
    admin = s.pod.client()
    blocker = admin.submit({"command": ["sleep", "600"], "devices": len(admin.status()["devices"]), "priority": 1000})
    wait_state(admin, blocker["id"], "running")
    job = s.submit(s.alice, {"command": read, "workdir": str(work)})
    work.rmdir()
    work.symlink_to(s.bob_private)
    os.lchown(work, s.alice.uid, s.alice.gid)
    admin.cancel(blocker["id"])
    s.finished(job)
    if BOB_SECRET in s.log(job):
        return "a work directory swapped for a link after submission showed bob's folder"
    return None


# -- 6: an image folder linking into another user's photos ---------------------------------------------------
COLOURS = {"mine": (30, 30, 200), "bobs": (200, 30, 30)}


def dataset_link(s: Stage) -> str | None:
    """A class folder that is a link into bob's private photos: the dashboard (root) served their thumbnails."""
    photos = s.bob_private / "photos"
    if not photos.exists():
        photos.mkdir()
        for i in range(3):
            Image.new("RGB", (16, 16), COLOURS["bobs"]).save(photos / f"{i}.png")
        for p in (photos, *photos.iterdir()):
            os.chown(p, s.bob.uid, s.bob.gid)
    mine = s.box / "alice-set"
    (mine / "mine").mkdir(parents=True)
    for i in range(3):
        Image.new("RGB", (16, 16), COLOURS["mine"]).save(mine / "mine" / f"{i}.png")
    (mine / "bobs").symlink_to(photos)
    for p in (mine, mine / "mine", *(mine / "mine").iterdir(), mine / "bobs"):
        os.lchown(p, s.alice.uid, s.alice.gid)
    page = sign_in(s.pod, s.token(s.alice))
    try:
        data = f"imagefolder:{mine}"
        explore = page.get("/ui/new", params={"data": data})
        if explore.status_code == 200 and "bobs" in explore.text and "3" in explore.text.split("bobs", 1)[1][:400]:
            return "the dashboard counted bob's photos for alice"
        png = page.get("/ui/datasets/samples.png", params={"data": data})
        if png.status_code == 200 and png.headers.get("content-type") == "image/png":
            with Image.open(io.BytesIO(png.content)) as im:
                if COLOURS["bobs"] in {px[:3] for px in im.convert("RGBA").getdata() if px[3]}:
                    return "the dashboard drew bob's photos for alice"
    finally:
        page.close()
    return None


def admin_environment(s: Stage) -> str | None:
    """The admin's own variables (the daemon's environment) were passed into every user's job."""
    name, value = ADMIN_SECRET
    job = s.submit(s.alice, {"command": [sys.executable, "-c", "import os; print(sorted(os.environ.items()))"]})
    s.finished(job)
    return f"alice's job saw {name}" if value in s.log(job) or name in s.log(job) else None


# -- 7: stalls ------------------------------------------------------------------------------------------------
def phase_fifo(s: Stage) -> str | None:
    """A job replaced its ``phase`` file with a FIFO: the scheduler loop, reading it when the job ended, blocked."""
    code = "import os, sys; os.remove('phase.1'); os.mkfifo('phase.1'); sys.exit(3)"
    job = s.submit(s.alice, {"command": [sys.executable, "-c", code]})
    try:
        ended = s.finished(job)
        after = s.submit(s.bob, {"command": ["true"]})
        state = s.finished(after)["state"]
    except AssertionError as e:
        return f"the pod stopped scheduling after the FIFO: {e}"
    if ended["state"] != "failed" or state != "succeeded":
        return f"the FIFO's job ended {ended['state']}, the next one {state}"
    return None


def log_fifo(s: Stage) -> str | None:
    """A job made its ``output.log`` a FIFO, then its page was viewed: every API thread hung, /health too."""
    code = "import os, time; os.remove('output.log'); os.mkfifo('output.log'); time.sleep(600)"
    job = s.submit(s.alice, {"command": [sys.executable, "-c", code]})
    token = s.token(s.alice)
    auth = {"Authorization": f"Bearer {token}"}
    try:
        wait_for(lambda: (s.folder(job) / "output.log").is_fifo(), 60, "the FIFO to be planted")
        page = sign_in(s.pod, token)
        doors: dict[str, Callable[[], object]] = {
            "the job page": lambda: page.get(f"/ui/jobs/{job}", timeout=60),
            "its JSON": lambda: page.get(f"/ui/jobs/{job}.json", timeout=60),
            "its live stream": lambda: _stream_start(page, f"/ui/jobs/{job}/events", events=2),
            "the log search": lambda: page.get(f"/ui/jobs/{job}/search.json", params={"q": "x"}, timeout=60),
            "the API's log": lambda: httpx.get(f"{s.pod.url}/v1/jobs/{job}/log", headers=auth, timeout=60),
        }
        answered: dict[str, object] = {}
        threads = [threading.Thread(target=_call, args=(fn, name, answered), daemon=True) for name, fn in doors.items()]
        for t in threads:
            t.start()
        for t in threads:
            t.join(120)
        hung = [name for name in doors if name not in answered]
        if hung:
            return f"{', '.join(hung)} never answered"
        if httpx.get(f"{s.pod.url}/health", timeout=30).status_code != 200:
            return "/health did not answer"
        page.close()
    finally:
        with contextlib.suppress(Exception):
            s.pod.client().cancel(job)
    return None


def _call(fn: Callable[[], object], name: str, answered: dict[str, object]) -> None:
    """Record that the door answered: a response, or an error other than waiting in vain (a timeout is a hang)."""
    try:
        answered[name] = fn()
    except httpx.TimeoutException:
        return
    except Exception as e:
        answered[name] = e


def daemon_lock(s: Stage) -> str | None:
    """A user took ``flock -x`` on ``daemon.lock``: the pod could not restart."""

    def grab() -> str | None:
        import fcntl

        try:
            fd = os.open(s.pod.home / "daemon.lock", os.O_RDONLY)
        except OSError:
            return None
        try:
            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
            return "alice could open and lock daemon.lock"
        except OSError:
            return "alice could open daemon.lock"
        finally:
            os.close(fd)

    return as_user(s.alice, grab)  # type: ignore[no-any-return]


# -- 8: no limits ----------------------------------------------------------------------------------------------
LIMITS = ("--job-tasks", "64", "--job-memory", "256M", "--job-disk", "64M")
"""The red team's pod is started with small limits, so that each is reached quickly."""

FORKS = """
import os, time
made = refused = 0
for _ in range(300):
    try:
        if os.fork() == 0:
            time.sleep(30)
            os._exit(0)
        made += 1
    except BlockingIOError:
        refused += 1
print("FORKS", made, refused, flush=True)
"""
HOG = "b = bytearray(600 << 20); [b.__setitem__(i, 1) for i in range(0, len(b), 4096)]; print('HELD 600 MiB')"
BIG = """
try:
    with open("big.bin", "wb") as f:
        for _ in range(200):
            f.write(b"x" * (1 << 20))
    print("WROTE 200 MiB", flush=True)
except OSError as e:
    print("REFUSED", e.strerror, flush=True)
"""
MANY = "import time\nfor i in range(200):\n    open(f'part{i}.bin', 'wb').write(b'x' * (1 << 20))\ntime.sleep(600)"


def no_limits(s: Stage) -> str | None:
    """A job forked 3,000 processes, held 2 GiB of memory, wrote a 2 GiB file, and was not pinned to its slot."""
    py = sys.executable
    forks = s.submit(s.alice, {"command": [py, "-c", FORKS]})
    done, log = s.finished(forks), s.log(forks)
    made = next((line.split()[1:] for line in log.splitlines() if line.startswith("FORKS")), None)
    if made is None or int(made[0]) >= 64 or int(made[1]) == 0:
        return f"the fork bomb was not stopped at 64 tasks ({made or log[-300:]})"
    if "task limit reached" not in done["reason"] + log:
        return f"the job was not told of its task limit: {done['reason']!r}"
    hog = s.submit(s.alice, {"command": [py, "-c", HOG]})
    done = s.finished(hog)
    if "HELD 600 MiB" in s.log(hog) or "killed: out of memory (limit 256.0 MiB)" not in done["reason"]:
        return f"a job held 600 MiB past its 256 MiB limit, or was not told: {done['reason']!r}"
    big = s.submit(s.alice, {"command": [py, "-c", BIG]})
    s.finished(big)
    if "WROTE 200 MiB" in s.log(big) or "REFUSED File too large" not in s.log(big):
        return f"a job wrote a 200 MiB file past its 64 MiB limit: {s.log(big)[-300:]!r}"
    many = s.submit(s.alice, {"command": [py, "-c", MANY]})
    done = s.finished(many, timeout=180)
    if done["state"] != "failed" or "over the pod's job disk limit of 64.0 MiB" not in done["reason"]:
        return f"a job whose folder grew past 64 MiB ran on: {done['state']} {done['reason']!r}"
    code = "import os; print('CORES', sorted(os.sched_getaffinity(0)), os.environ['DESKPOD_CPU_SLOTS'], flush=True)"
    pinned = s.submit(s.alice, {"command": [py, "-c", code]})
    s.finished(pinned)
    slot = int(next(e["note"] for e in s.pod.client().job(pinned)["events"] if e["to"] == "starting").split()[1][:-1])
    cores = sorted(os.sched_getaffinity(0))
    line = next((x for x in s.log(pinned).splitlines() if x.startswith("CORES")), "")
    want = f"CORES [{cores[slot * len(cores) // max(2, len(cores))]}] 0"
    if line != want:
        return f"a one-slot job on slot {slot} was not pinned to its core: {line!r}, expected {want!r}"
    return None


ATTACKS: dict[str, Callable[[Stage], str | None]] = {
    "1 a loader variable in a job's env": loader_variables,
    "2 a build backend, a requirement that is a path": build_as_root,
    "3 a job's output.log linked to the admin token": linked_log,
    "4 reading pod.db and the pod's own files": database,
    "5 a work directory behind a closed parent": closed_workdir,
    "6 an image folder linking into another user's photos": dataset_link,
    "6 the admin's variables in a user's job": admin_environment,
    "7 a FIFO for the phase file": phase_fifo,
    "7 a FIFO for output.log, then its page": log_fifo,
    "7 flock on daemon.lock": daemon_lock,
    "8 no limits on tasks, memory, file size, disk, cores": no_limits,
}
"""Every attack, by the number of the finding it replays."""


# -- the stage ------------------------------------------------------------------------------------------------
def _environ(pid: int) -> dict[str, str]:
    try:
        raw = Path(f"/proc/{pid}/environ").read_bytes()
    except OSError:
        return {}
    return dict(x.split("=", 1) for x in raw.decode(errors="replace").split("\0") if "=" in x)


def _uid(pid: int) -> int | None:
    try:
        return os.stat(f"/proc/{pid}").st_uid
    except OSError:
        return None


def _cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")[:200]
    except OSError:
        return "?"


def _descendants(pid: int) -> list[int]:
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                stat = Path(f"/proc/{entry}/stat").read_text()
            except OSError:
                continue
            children.setdefault(int(stat[stat.rindex(")") + 2 :].split()[1]), []).append(int(entry))
    out, todo = [], [pid]
    while todo:
        p = todo.pop()
        out.append(p)
        todo += children.get(p, [])
    return out


@contextlib.contextmanager
def stage() -> Iterator[Stage]:
    """A root pod with its default sandbox, alice and bob, and a folder both reach; all removed afterwards. The
    pod's home lies where the box's users can reach it (as /var/lib/deskpod would), so that its own modes are
    what keeps them out."""
    if os.geteuid() != 0:
        raise SystemExit("the red team plays local users against a pod started by root: run it as root")
    box = Path(tempfile.mkdtemp(prefix="deskpod-redteam-", dir="/var/tmp"))
    box.chmod(0o755)
    (box / "wheels").mkdir(mode=0o755)
    probe_sdist(box / "wheels", "deskpod-redteam-probe", PROBE_BACKEND)
    saved = {k: os.environ.get(k) for k in (ADMIN_SECRET[0], "PIP_FIND_LINKS")}
    os.environ[ADMIN_SECRET[0]] = ADMIN_SECRET[1]
    os.environ["PIP_FIND_LINKS"] = " ".join(p for p in (saved["PIP_FIND_LINKS"], str(box / "wheels")) if p)
    (box / "pods").mkdir(mode=0o755)
    pods = Pods(box / "pods")
    try:
        with make_users("alice", "bob") as (alice, bob):
            pod = pods("--socket", str(box / "pod.sock"), *LIMITS, sandbox=True)
            private = box / "bob-home" / "shared"
            private.mkdir(parents=True)
            (private / "secret.txt").write_text(BOB_SECRET)
            for p in (private.parent, private, private / "secret.txt"):
                os.chown(p, bob.uid, bob.gid)
            private.parent.chmod(0o700)
            s = Stage(pod, alice, bob, box, private)
            s.bob_job = s.submit(bob, {"command": [sys.executable, "-c", f"print({BOB_SECRET!r})"]})
            s.finished(s.bob_job)
            yield s
    finally:
        pods.stop_all()
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
        shutil.rmtree(box, ignore_errors=True)


def main() -> int:
    broken = 0
    with stage() as s:
        for name, attack in ATTACKS.items():
            try:
                what = attack(s)
            except Exception as e:  # an attack that could not be played is not a wall that held
                what = f"the attack could not be played: {type(e).__name__}: {e}"
            broken += what is not None
            print(f"{name:<58} {'held' if what is None else 'BROKEN: ' + what}", flush=True)
    print(json.dumps({"attacks": len(ATTACKS), "broken": broken}))
    return 1 if broken else 0


if __name__ == "__main__":
    raise SystemExit(main())
