"""What the pod answers to requests that a careless client or an attacker sends (among them what
schemathesis found), on a pod started by root with its default sandbox:

- JSON nested 1,000 deep and a number of more than 4,300 digits (Python's ``RecursionError`` and its limit on
  int conversion) are 400s naming the problem, never 500s;
- a job id written in other digits (``"¹"``, which ``str.isdigit`` accepts and ``int`` refuses; ``"١"``, which
  ``int`` reads as 1) is no job on every route with an id, on ``/v1`` and ``/ui``: 404, and nothing done;
- a 405's ``Allow`` names every method of the path;
- a field given as null is refused where the document says no field takes null;
- an empty file name in an environment is refused, and the document says so;
- revoking a user, or signing out, ends the live streams already open for them.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from deskpod.envs.accounts import Account
from tests.jobs.pods import Pod, Pods, job_schema, wait_for, wait_state
from tests.unix_users import make_users
from tests.web.browser import csrf_of, sign_in

jsonschema_rs = pytest.importorskip("jsonschema_rs")

TICKER = ["sh", "-c", "while true; do echo tick; sleep 0.5; done"]
"""A job that writes to its log all the time: every open stream of its page keeps getting ``log`` events."""


@pytest.fixture(scope="module")
def accounts() -> Iterator[tuple[Account, Account]]:
    with make_users("eve", "rob") as (eve, rob):
        yield eve, rob


@pytest.fixture(scope="module")
def pod(tmp_path_factory: pytest.TempPathFactory, accounts: tuple[Account, Account]) -> Iterator[Pod]:
    pods = Pods(tmp_path_factory.mktemp("requests"))
    try:
        yield pods(sandbox=True)
    finally:
        pods.stop_all()


@pytest.fixture(scope="module")
def eve(pod: Pod, accounts: tuple[Account, Account]) -> str:
    """The token of an ordinary user, eve."""
    return str(pod.client().add_user("eve", os_user=accounts[0].name)["token"])


@pytest.fixture(scope="module")
def eve_job(pod: Pod, eve: str) -> str:
    """A job of eve's that runs until the pod stops."""
    job = pod.client(eve).submit({"name": "ticker", "command": TICKER})
    wait_state(pod.client(eve), job["id"], "running", timeout=60)
    return str(job["id"])


def caller(pod: Pod, token: str) -> httpx.Client:
    headers = {"Authorization": f"Bearer {token}", "Accept": "application/json"}
    return httpx.Client(base_url=pod.url, headers=headers, timeout=60, trust_env=False)


# ---------------------------------------------------------------------------------------------- bodies
DEEP = [b"[" * n + b"]" * n for n in (40, 1000, 100_000)]
"""Past the pod's 32 levels; at Python's recursion limit; far past it."""
HUGE = b"1" * 5000
"""A number of more digits than Python converts to an int (4,300)."""


@pytest.mark.parametrize("path", ["/v1/jobs", "/v1/users", "/v1/shutdown"])
def test_deep_json_and_huge_numbers_are_400s_that_say_so(pod: Pod, eve: str, path: str) -> None:
    for token in (pod.token, eve) if path == "/v1/jobs" else (pod.token,):  # the others read no user's body
        with caller(pod, token) as c:
            for body in [*DEEP, b'{"command": ["true"], "train": ' + DEEP[1] + b"}"]:
                r = c.post(path, content=body, headers={"Content-Type": "application/json"})
                assert r.status_code == 400 and "nested too deeply" in r.json()["error"], (path, len(body), r.text)
            for body in (HUGE, b'{"command": ["true"], "priority": ' + HUGE + b"}", b'{"name": "x", "admin": ' + HUGE
                         + b"}", b'{"stop_jobs": ' + HUGE + b"}"):  # fmt: skip
                r = c.post(path, content=body, headers={"Content-Type": "application/json"})
                assert r.status_code == 400 and "more than 4300 digits" in r.json()["error"], (path, r.text)
    assert pod.client().health()["status"] == "ok"  # and no shutdown came of it


def test_a_count_of_thousands_of_digits_in_a_string_is_a_400(pod: Pod, eve: str) -> None:
    with caller(pod, eve) as c:
        r = c.post("/v1/jobs", json={"command": ["true"], "devices": "1" * 5000})
        assert r.status_code == 400 and "job spec: devices" in r.json()["error"]


# ---------------------------------------------------------------------------------------------- job ids
SUPERSCRIPT = str.maketrans("0123456789", "⁰¹²³⁴⁵⁶⁷⁸⁹")
"""Digits to ``str.isdigit`` that ``int`` refuses: they answered 500."""
ARABIC_INDIC = str.maketrans("0123456789", "٠١٢٣٤٥٦٧٨٩")
FULLWIDTH = str.maketrans("0123456789", "０１２３４５６７８９")
"""Digits that ``int`` reads as the ASCII ones: the same job under a name it does not have."""


def id_routes(job_id: str) -> list[tuple[str, str]]:
    return [
        ("GET", f"/v1/jobs/{job_id}"), ("GET", f"/v1/jobs/{job_id}/log"), ("POST", f"/v1/jobs/{job_id}/cancel"),
        ("POST", f"/v1/jobs/{job_id}/requeue"), ("GET", f"/ui/jobs/{job_id}"), ("GET", f"/ui/jobs/{job_id}.json"),
        ("GET", f"/ui/jobs/{job_id}/events"), ("GET", f"/ui/jobs/{job_id}/search.json"),
        ("POST", f"/ui/jobs/{job_id}/cancel"), ("POST", f"/ui/jobs/{job_id}/requeue"),
        ("POST", f"/ui/jobs/{job_id}/stacks"), ("GET", f"/ui/models/{job_id}/try.json"),
        ("POST", f"/ui/models/{job_id}/try"),
    ]  # fmt: skip


def test_a_job_id_in_other_digits_is_no_job_on_any_route(pod: Pod, eve: str, eve_job: str) -> None:
    for token in (pod.token, eve):
        with caller(pod, token) as c:
            assert c.get(f"/v1/jobs/{eve_job}").status_code == 200
            for digits in (SUPERSCRIPT, ARABIC_INDIC, FULLWIDTH):
                other = eve_job.translate(digits)
                for method, path in id_routes(other):
                    r = c.request(method, path, data={"sample": "1"} if method == "POST" else None)
                    assert r.status_code == 404, (method, path, r.status_code, r.text[:300])
                    assert "no job" in r.json()["error"], (method, path, r.text[:300])
                r = c.get("/ui/compare.json", params={"jobs": f"{eve_job},{other}"})
                assert r.status_code == 400 and "is not a job id" in r.json()["error"]
    job = pod.client(eve).job(eve_job)
    assert job["state"] == "running" and job["stopping"] is None  # no cancel or requeue reached the real job


def test_counts_and_shapes_in_other_digits_are_field_errors_on_the_new_training_page(pod: Pod, eve: str) -> None:
    """The dashboard's form reads device lists and synthetic shapes with the same parsers as the CLI: ``"¹"``
    passed ``str.isdigit`` there too, and ``int`` raised out of them (500)."""
    cases = [({"devices": "¹"}, "devices"), ({"devices": "0,¹"}, "devices"), ({"data": "synthetic:¹x2x2"}, "data"),
             ({"data": "synthetic:3x٣x2"}, "data")]  # fmt: skip
    with caller(pod, eve) as c:
        for given, field in cases:
            form = {"data": "fashion-mnist", "model": "mlp", **given}
            r = c.get("/ui/new/preview.json", params=form)
            assert r.status_code in (200, 400) and field in r.json()["errors"], (given, r.text[:300])
            r = c.post("/ui/new", data=form)
            assert r.status_code == 400 and field in r.json()["errors"], (given, r.text[:300])


# ---------------------------------------------------------------------------------------------- 405
def test_a_405_names_every_method_of_its_path(pod: Pod, eve_job: str) -> None:
    expect = {
        "/v1/jobs": {"GET", "POST"},
        "/v1/users": {"GET", "POST"},
        f"/v1/jobs/{eve_job}": {"GET"},
        f"/v1/jobs/{eve_job}/cancel": {"POST"},
        f"/ui/jobs/{eve_job}": {"GET"},
        f"/ui/jobs/{eve_job}/cancel": {"POST"},
    }
    with caller(pod, pod.token) as c:
        for path, methods in expect.items():
            for method in ("OPTIONS", "PUT", "DELETE", "PATCH", *({"GET", "POST"} - methods)):
                r = c.request(method, path)
                assert r.status_code == 405, (method, path, r.status_code)
                assert {m.strip() for m in r.headers["allow"].split(",")} == methods, (method, path, r.headers)


# ---------------------------------------------------------------------------------------------- nulls
NULL_SPECS: list[tuple[dict[str, Any], str]] = [
    ({"command": ["true"], "slurm": {"env_cache": None}}, "slurm.env_cache = null"),
    ({"command": ["true"], "slurm": {"partition": None}}, "slurm.partition = null"),
    ({"command": ["true"], "slurm": {"scratch_limit_gb": None}}, "slurm.scratch_limit_gb = null"),
    ({"command": ["true"], "max_runtime": None}, "max_runtime = null"),
    ({"command": ["true"], "workdir": None}, "workdir = null"),
    ({"command": ["true"], "environment": None}, "environment = null"),
    ({"command": ["true"], "environment": {"packages": ["six"], "python": None}}, "environment.python = null"),
    ({"serve": {"run": "/nonexistent", "model": None}}, "serve.model = null"),
]


def test_null_is_refused_where_the_document_takes_none(pod: Pod, eve: str, document: dict[str, Any]) -> None:
    valid = jsonschema_rs.validator_for(job_schema(document)).is_valid
    with caller(pod, pod.token) as c:
        before = len(c.get("/v1/jobs").json()["jobs"])
        for spec, message in NULL_SPECS:
            assert not valid(spec), spec  # the document refuses it: so must the pod
            r = c.post("/v1/jobs", json=spec)
            assert r.status_code == 400 and message in r.json()["error"], (spec, r.text)
        assert len(c.get("/v1/jobs").json()["jobs"]) == before
        for body, field in (
            ({"name": "nully", "os_user": None}, "os_user"),
            ({"name": "nully", "admin": None}, "admin"),
        ):
            r = c.post("/v1/users", json=body)
            assert r.status_code == 400 and f"{field} = null" in r.json()["error"], r.text
        assert "nully" not in {u["name"] for u in c.get("/v1/users").json()["users"]}
        r = c.post("/v1/shutdown", json={"stop_jobs": None})
        assert r.status_code == 400 and "stop_jobs = null" in r.json()["error"]
        r = c.post("/v1/shutdown", content=b"null", headers={"Content-Type": "application/json"})
        assert r.status_code == 400 and "expected a JSON object" in r.json()["error"]  # no body is not a null one
    assert pod.client().health()["status"] == "ok"


# ---------------------------------------------------------------------------------------------- file names
@pytest.fixture(scope="module")
def document(pod: Pod) -> dict[str, Any]:
    doc = httpx.get(f"{pod.url}/openapi.json", timeout=30).json()
    assert isinstance(doc, dict)
    return doc


@pytest.mark.parametrize("kind", ["requirements", "pyproject", "lock"])
def test_an_empty_file_name_is_refused_and_the_document_says_so(
    pod: Pod, eve: str, document: dict[str, Any], kind: str
) -> None:
    valid = jsonschema_rs.validator_for(job_schema(document)).is_valid
    pyproject = {"file": "pyproject.toml", "text": '[project]\nname = "x"\nversion = "1"\ndependencies = []\n'}
    lock = {
        "file": "uv.lock",
        "text": 'version = 1\n[[package]]\nname = "x"\nversion = "1"\nsource = { virtual = "." }\n',
    }
    env = {"requirements": {"requirements": {"file": "requirements.txt", "text": "six==1.17.0\n"}},
           "pyproject": {"pyproject": pyproject}, "lock": {"lock": lock, "pyproject": pyproject}}[kind]  # fmt: skip
    assert valid({"command": ["true"], "environment": env})
    nameless = {**env, kind: {**env[kind], "file": ""}}
    assert not valid({"command": ["true"], "environment": nameless})
    with caller(pod, eve) as c:
        r = c.post("/v1/jobs", json={"command": ["true"], "environment": nameless})
        assert r.status_code == 400 and f"environment.{kind}.file = ''" in r.json()["error"], r.text


# ---------------------------------------------------------------------------------------------- job files
def _deep(n: int) -> str:
    return "[" * n + "]" * n


RUN_FILES = {
    "summary.json": [
        '{"state": ["x"], "test_accuracy": "x", "test_loss": [1], "throughput_images_per_s": {"a": 1}, "wall_time_s":'
        ' "1", "data_wait_fraction": true, "steps": [1], "restarts": "x"}',
        '{"state": "done", "test_accuracy": ' + "9" * 4000 + ', "wall_time_s": 1e308}',
        *('{"x": ' + _deep(n) + "}" for n in (40, 600, 990)), '{"x": ' + "1" * 5000 + "}", "[1]",
    ],
    "config.toml": ["a = " + _deep(n) for n in (40, 600, 2000)],
    "launch.json": ['{"total_steps": "x"}', '{"total_steps": ' + "9" * 4000 + "}", '{"total_steps": ' + "1" * 5000 + "}"],
    "metrics.jsonl": [
        '{"kind": "train", "step": 1, "loss": ' + "1" * 5000 + "}\n",
        '{"kind": "train", "step": 2, "loss": ' + "9" * 4000 + "}\n",
        '{"kind": ' + _deep(1000) + ', "step": 3}\n{"kind": "train", "step": "x", "loss": [1]}\n',
    ],
}  # fmt: skip
"""What a job can write in its run folder, which the dashboard reads: JSON 1,000 deep, numbers of thousands of
digits, values of the wrong type. Each made a page answer 500 (to the admin too, who sees every job)."""


def test_what_a_job_writes_in_its_run_folder_makes_no_page_answer_500(pod: Pod, eve: str) -> None:
    job = pod.client(eve).submit({"name": "writer", "command": ["sleep", "600"]})["id"]
    run = pod.home / "jobs" / job / "runs" / "writer"
    run.mkdir(parents=True, exist_ok=True)
    (run / "run.json").write_text("{}")  # a run of a command job (deskpod run makes one so)
    pages = [f"/ui/jobs/{job}.json", f"/ui/jobs/{job}", f"/ui/compare.json?jobs={job}", f"/ui/compare?jobs={job}",
             "/ui/jobs.json", "/ui/jobs", "/ui/models.json", "/ui/models", "/ui/"]  # fmt: skip
    try:
        with caller(pod, pod.token) as admin, caller(pod, eve) as owner:
            for name, texts in RUN_FILES.items():
                for text in texts:
                    (run / name).write_text(text)
                    for c in (admin, owner):
                        for page in pages:
                            r = c.get(page, headers={} if ".json" in page else {"Accept": "text/html"})
                            assert r.status_code < 500, (name, text[:60], page, r.text[-300:])
                    (run / name).unlink()
    finally:
        pod.client().cancel(job)


# ---------------------------------------------------------------------------------------------- revocation
class Watching:
    """One open live stream of a job's page (``/ui/jobs/<id>/events``), read in a thread until the server ends
    it: ``ended`` is set then; ``events`` are what came."""

    def __init__(self, client: httpx.Client, job_id: str) -> None:
        self.client = client
        self._cm = client.stream("GET", f"/ui/jobs/{job_id}/events", headers={"Accept": "text/event-stream"})
        self.response = self._cm.__enter__()
        assert self.response.status_code == 200, self.response.read()
        self.events: list[str] = []
        self.ended = threading.Event()
        lines = self.response.iter_lines()
        for line in lines:  # open: the first event (the job's state) came
            if line.startswith("event: state"):
                break
        self._thread = threading.Thread(target=self._read, args=(lines,), daemon=True)
        self._thread.start()

    def _read(self, lines: Iterator[str]) -> None:
        try:
            for line in lines:
                if line.startswith("event: "):
                    self.events.append(line[7:])
        except Exception:  # closed under it by `close`: the test reads `ended` and `events`
            pass
        finally:
            self.ended.set()

    def more_events(self, than: int) -> bool:
        """Whether events came after the first ``than``: the stream is still open and sending."""
        wait_for(lambda: len(self.events) > than or self.ended.is_set(), 60, "another event or the stream's end")
        return len(self.events) > than

    def close(self) -> None:
        self._cm.__exit__(None, None, None)
        self.client.close()


def test_revoking_a_user_or_signing_out_ends_their_open_live_streams(
    pod: Pod, accounts: tuple[Account, Account]
) -> None:
    admin = pod.client()
    rob_token = str(admin.add_user("rob", os_user=accounts[1].name)["token"])
    job = str(pod.client(rob_token).submit({"name": "ticker", "command": TICKER})["id"])
    wait_state(admin, job, "running", timeout=60)
    bearer = httpx.Client(base_url=pod.url, headers={"Authorization": f"Bearer {rob_token}"}, timeout=60)
    tab, other_tab = sign_in(pod, rob_token), sign_in(pod, rob_token)
    watching = {"tab": Watching(tab, job), "other tab": Watching(other_tab, job),
                "script": Watching(bearer, job), "admin": Watching(sign_in(pod), job)}  # fmt: skip
    try:
        # Signing out in one tab ends that session's stream; the other session's, the token's and the admin's go on.
        r = other_tab.post("/ui/logout", data={"csrf": csrf_of(other_tab)})
        assert r.status_code == 303
        assert watching["other tab"].ended.wait(60), "the signed-out session's stream is still open"
        assert "end" not in watching["other tab"].events  # ended by the sign-out, not by the job
        for name in ("tab", "script", "admin"):
            assert watching[name].more_events(len(watching[name].events)), f"the {name}'s stream ended too"

        # Revoking rob ends every stream of his, by session or by token; the admin's goes on.
        assert admin.revoke("rob")["revoked"] == 1
        for name in ("tab", "script"):
            assert watching[name].ended.wait(60), f"rob's {name} stream is still open after his revocation"
            assert "end" not in watching[name].events
        assert watching["admin"].more_events(len(watching["admin"].events)), "the admin's stream ended too"
        assert tab.get(f"/ui/jobs/{job}/events", headers={"Accept": "text/event-stream"}).status_code == 401
        assert bearer.get(f"/ui/jobs/{job}/events", headers={"Accept": "text/event-stream"}).status_code == 401
    finally:
        admin.cancel(job)  # the job ends: so does every stream still open
        for w in watching.values():
            w.ended.wait(60)
            w.close()
