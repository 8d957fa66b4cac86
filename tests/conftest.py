"""The ``server`` marker, set here on every test that starts a server: a pod (`tests.jobs.pods`), an inference
server (`tests.serve.conftest`, ``deskpod serve``), a Slurm cluster (`tests.cluster.slurm`) or Chromium on a
pod's dashboard. ``make check`` runs the others (``-m "not server"``); ``make test`` runs them all.

A test is marked when its code, a fixture it uses (directly or through other fixtures) or a function of the
tests that either calls (``redteam.stage()``) starts one, so a new test, fixture or helper that calls
``Pods(...)`` is marked without anyone remembering to.

Also the fixture the test packages share: a real Slurm cluster (slurmctld + two slurmd on 127.0.0.1), started once
for the session (the cluster tests and the executor tests of tests/jobs use the same one).
"""

from __future__ import annotations

import ast
import functools
import inspect
import os
import re
import textwrap
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from tests.cluster.slurm import SlurmCluster, missing

STARTS = re.compile(
    r"\b(Pods|SlurmCluster|start_server|sync_playwright)\("
    r"""|"-m", "deskpod", "(up|serve)"|deskpod_cmd\("(up|serve)"|\["up", """
)
"""What starts a server in the tests' code: the pods helper, the Slurm cluster, the inference server's starter,
Playwright (a browser on a pod), or ``deskpod up``/``deskpod serve`` run as a process (or their arguments)."""


def called(fn: Callable[..., Any], tree: ast.AST) -> Iterator[object]:
    """What ``fn`` calls by a name or a module's attribute (``helper(...)``, ``redteam.stage(...)``)."""
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call):
            continue
        f = node.func
        if isinstance(f, ast.Name):
            yield fn.__globals__.get(f.id)
        elif isinstance(f, ast.Attribute) and isinstance(f.value, ast.Name):
            yield getattr(fn.__globals__.get(f.value.id), f.attr, None)


@functools.cache
def starts_server(fn: Callable[..., Any]) -> bool:
    try:
        source = textwrap.dedent(inspect.getsource(fn))
    except (OSError, TypeError):  # pytest's own fixtures (tmp_path, ...) and builtins
        return False
    if STARTS.search(source):
        return True
    return any(
        inspect.isfunction(g) and g.__module__.startswith("tests") and g is not fn and starts_server(g)
        for g in called(fn, ast.parse(source))
    )


CLUSTER_SIDE = ("cluster", "fleet", "video", "lung")
"""The test packages of `--stream cluster` besides every test that uses the Slurm cluster (see `in_stream`)."""


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--stream", choices=("cluster", "box"), default=None,
        help="only one half of the tests, so that make test can run the two halves of its serial tier at once: "
        "'cluster', every test that uses the Slurm cluster (one a box: its daemons are the box's) and the tests "
        f"of tests/{{{','.join(CLUSTER_SIDE)}}}; 'box', the others",
    )  # fmt: skip


def in_stream(item: pytest.Item, stream: str) -> bool:
    """Whether ``item`` is in the half of the tests named ``stream`` (`--stream`)."""
    package = item.path.relative_to(item.config.rootpath).parts[1:2]
    params = getattr(item, "callspec", None)  # a test run once per executor: its Slurm one (tests/jobs/test_executors)
    slurm = "slurm" in item.fixturenames or (
        params is not None and any(isinstance(v, str) and v == "slurm" for v in params.params.values())
    )  # type: ignore[attr-defined]
    cluster = slurm or (bool(package) and package[0] in CLUSTER_SIDE)
    return cluster == (stream == "cluster")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        fixtures = [d.func for defs in item._fixtureinfo.name2fixturedefs.values() for d in defs]  # type: ignore[attr-defined]
        if any(starts_server(fn) for fn in [item.function, *fixtures]):  # type: ignore[attr-defined]
            item.add_marker(pytest.mark.server)
    stream = config.getoption("--stream")
    if stream:
        left = [item for item in items if not in_stream(item, stream)]
        if left:
            config.hook.pytest_deselected(items=left)
            items[:] = [item for item in items if in_stream(item, stream)]


@pytest.fixture(scope="session")
def slurm(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SlurmCluster]:
    """The cluster; ``SLURM_CONF`` points at it for the whole session (deskpod's code reads it like any client)."""
    why = missing()
    if why:
        pytest.fail(f"the Slurm tests need a real Slurm here: {why}")
    cluster = SlurmCluster(tmp_path_factory.mktemp("slurm")).start()
    saved = os.environ.get("SLURM_CONF")
    os.environ["SLURM_CONF"] = str(cluster.conf)
    yield cluster
    cluster.stop()
    if saved is None:
        os.environ.pop("SLURM_CONF", None)
    else:
        os.environ["SLURM_CONF"] = saved
