"""The lean install, as a user makes it: ``pip install .`` (no extras) into a fresh virtual environment, torch
pinned as the Makefile pins it. No library of an extra is installed; every module outside the extras' packages
imports; ``deskpod train`` trains and ``deskpod up`` serves a pod; the commands of an extra, and a serve job on
that pod, say in one line which extra to install.

The environment is built by uv (a core dependency; deskpod's job environments are built with it too) from the
package sources pip is configured with here (`deskpod.envs.index`): the same resolution of the same metadata as
``pip install .`` (checked: the same 75 distributions at the same versions), with pip seeded into it for ``pip
list`` and ``pip check``. uv unpacks into its cache (one under the environment's folder, removed with it), hardlinks
from there and compiles the bytecode in parallel (as pip does, one file at a time: without it the first imports of
torch compile it, and the tests below pay): 33.5 s on the 2-core box where pip took 108.6 s (docs/benchmarks.md).

Slow (a virtual environment of torch), so not in ``make check``.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest

from deskpod.envs.cache import find_uv
from deskpod.envs.index import package_sources
from deskpod.errors import EXTRAS
from tests.jobs.pods import kill_leftover_jobs, wait_for
from tests.test_extras import extras

pytestmark = [pytest.mark.slow, pytest.mark.timeout(1800)]  # the install alone takes minutes on a loaded box

REPO = Path(__file__).resolve().parents[1]
TORCH_PINS = re.search(r"^TORCH_PINS := (.+)$", (REPO / "Makefile").read_text(), re.M)[1].split()  # type: ignore[index]


@dataclass
class Lean:
    root: Path
    bin: Path
    env: dict[str, str]

    def run(self, *argv: str, timeout: float = 300, **env: str) -> subprocess.CompletedProcess[str]:
        """``argv[0]`` from the environment's ``bin/``, in its own folder: neither this checkout nor the tests'
        PYTHONPATH is where its imports come from."""
        return subprocess.run([str(self.bin / argv[0]), *argv[1:]], cwd=self.root, env={**self.env, **env},
                              capture_output=True, text=True, timeout=timeout)  # fmt: skip


def copy_source(dest: Path) -> None:
    """What ``pip install .`` reads, without this checkout's caches or builds."""
    shutil.copytree(REPO / "deskpod", dest / "deskpod", ignore=shutil.ignore_patterns("__pycache__"))
    for name in ("pyproject.toml", "README.md"):
        shutil.copy2(REPO / name, dest / name)


@pytest.fixture(scope="module")
def lean() -> Iterator[Lean]:
    # Under /var/tmp: the pod's sandboxed jobs see a /tmp of their own, and they run the pod's Python.
    root = Path(tempfile.mkdtemp(prefix="deskpod-lean-", dir="/var/tmp"))
    try:
        root.chmod(0o755)
        copy_source(root / "src")
        env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV", "DESKPOD_URL")}
        uv = find_uv()
        assert uv, "uv is a core dependency of deskpod: pip install uv"
        build = {**package_sources().uv_environment(), **env, "UV_CACHE_DIR": str(root / "uv-cache"),
                 "UV_LINK_MODE": "hardlink", "UV_PYTHON_DOWNLOADS": "never", "UV_NO_PROGRESS": "1"}  # fmt: skip
        for step in (
            [uv, "venv", "-q", "--seed", "--no-project", "--python", sys.executable, str(root / "venv")],
            [uv, "pip", "install", "-q", "--compile-bytecode", "--python", str(root / "venv" / "bin" / "python"),
             *TORCH_PINS, str(root / "src")],
        ):  # fmt: skip
            done = subprocess.run(step, cwd=root, env=build, capture_output=True, text=True, timeout=1200)
            assert done.returncode == 0, done.stderr
        yield Lean(root, root / "venv" / "bin", env)
    finally:
        shutil.rmtree(root, ignore_errors=True)


def test_the_core_installs_no_library_of_an_extra(lean: Lean) -> None:
    listed = lean.run("python", "-m", "pip", "list", "--format", "json")
    installed = {d["name"].lower().replace("_", "-") for d in json.loads(listed.stdout)}
    forbidden = {d for dists in extras().values() for d in dists}
    assert {"monai", "simpleitk", "pydicom", "pyradiomics-bhklab", "onnxruntime", "tritonclient"} <= forbidden
    assert installed & forbidden == set()
    assert {"torch", "torchvision", "deskpod", "fastapi"} <= installed
    check = lean.run("python", "-m", "pip", "check")
    assert check.returncode == 0, check.stdout


def test_every_module_outside_the_extras_imports(lean: Lean) -> None:
    """Core modules import no library of an extra when they are imported (they may inside a function); only
    modules of deskpod.lung, deskpod.serve, deskpod.video and deskpod.fleet may need one, and only one of an extra's."""
    code = (
        "import importlib, json, pkgutil, deskpod\n"
        "missing = {}\n"
        "for m in pkgutil.walk_packages(deskpod.__path__, 'deskpod.'):\n"
        "    if not m.name.endswith('__main__'):\n"
        "        try:\n"
        "            importlib.import_module(m.name)\n"
        "        except ModuleNotFoundError as e:\n"
        "            missing[m.name] = e.name\n"
        "print(json.dumps({'file': deskpod.__file__, 'missing': missing}))\n"
    )
    got = lean.run("python", "-c", code)
    assert got.returncode == 0, got.stderr
    doc = json.loads(got.stdout)
    assert doc["file"].startswith(str(lean.root / "venv")), doc["file"]  # the installed copy, not this checkout
    extra_modules = {m.split(".")[0] for mods in EXTRAS.values() for m in mods}
    apps = ("deskpod.lung.", "deskpod.serve.", "deskpod.video.", "deskpod.fleet.")
    for module, needs in doc["missing"].items():
        assert module.startswith(apps), (module, needs)
        assert needs.split(".")[0] in extra_modules, (module, needs)
    assert any(m.startswith("deskpod.lung.") for m in doc["missing"])  # the extras are really absent


def test_train_runs_on_the_core(lean: Lean) -> None:
    runs = lean.root / "runs"
    got = lean.run("deskpod", "train", "--model", "mlp", "--data", "synthetic:1x8x8", "--steps", "2", "--devices", "1",
                   "--out", str(runs), "--name", "lean", "--quiet", timeout=600)  # fmt: skip
    assert got.returncode == 0, got.stderr
    assert json.loads((runs / "lean" / "summary.json").read_text())


@pytest.mark.parametrize(
    ("argv", "extra", "command"),
    [
        (["lung", "analyze", "scan.mhd"], "lung", "deskpod lung"),
        (["serve", "models"], "serve", "deskpod serve"),
        (["export", "runs/r"], "serve", "deskpod export"),
        (["bench", "serve", "--model", "m"], "serve", "deskpod bench serve"),
        (["video", "index", "clip.mp4", "--db", "v.db"], "video", "deskpod video"),
    ],
)
def test_a_command_of_an_extra_says_which_to_install(lean: Lean, argv: list[str], extra: str, command: str) -> None:
    got = lean.run("deskpod", *argv)
    module = EXTRAS[extra][0]
    assert (got.returncode, got.stdout) == (2, "")
    assert got.stderr == (
        f"deskpod: {command} needs the {extra} extra ({module} is not installed): pip install 'deskpod[{extra}]'\n"
    )


@pytest.mark.server
def test_the_pod_runs_on_the_core_and_refuses_a_serve_job(lean: Lean) -> None:
    """``deskpod up`` as users start it (root, its default sandbox): it answers, its dashboard renders, a command job
    runs, and a serve job is refused at submission naming the extra."""
    home = lean.root / "home"
    home.mkdir()
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    url = f"http://127.0.0.1:{port}"
    env = dict(lean.env, DESKPOD_URL=url, DESKPOD_TOKEN_FILE=str(home / "token"))

    def cli(*argv: str) -> subprocess.CompletedProcess[str]:
        return lean.run("deskpod", *argv, **env)

    with open(home / "daemon.out", "wb") as out:
        daemon = subprocess.Popen([str(lean.bin / "deskpod"), "up", "--port", str(port), "--home", str(home),
                                   "--grace", "2"], cwd=lean.root, env=env, stdout=out, stderr=subprocess.STDOUT)  # fmt: skip

    def healthy() -> bool:
        assert daemon.poll() is None, (home / "daemon.out").read_text()
        try:
            return httpx.get(f"{url}/health", timeout=2).status_code == 200
        except httpx.HTTPError:
            return False

    try:
        wait_for(healthy, 60, "the lean pod to answer /health")
        assert httpx.get(f"{url}/ui/", timeout=10, follow_redirects=True).status_code == 200
        spec = lean.root / "serve.toml"
        spec.write_text(f'[serve]\nrun = "{lean.root / "runs" / "lean"}"\n')
        refused = cli("submit", str(spec))
        assert (refused.returncode, refused.stdout) == (2, "")
        assert refused.stderr == (
            "deskpod: job spec: a serve job needs the serve extra (onnxruntime is not installed): "
            "pip install 'deskpod[serve]'\n"
        )
        job = cli("submit", "--json", "--", "/bin/echo", "lean pod")
        assert job.returncode == 0, job.stderr
        job_id = json.loads(job.stdout)["id"]
        deadline = time.monotonic() + 120
        while (state := json.loads(cli("show", job_id, "--json").stdout)["state"]) not in (
            "succeeded", "failed", "lost"
        ) and time.monotonic() < deadline:  # fmt: skip
            time.sleep(0.5)
        assert state == "succeeded", (home / "daemon.out").read_text()
        assert cli("logs", job_id).stdout.endswith("---\nlean pod\n")  # after the attempt's header
    finally:
        cli("down", "--stop-jobs")
        try:
            daemon.wait(timeout=30)
        except subprocess.TimeoutExpired:
            daemon.kill()
            daemon.wait()
        kill_leftover_jobs(home)
