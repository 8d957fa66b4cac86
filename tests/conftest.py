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


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        fixtures = [d.func for defs in item._fixtureinfo.name2fixturedefs.values() for d in defs]  # type: ignore[attr-defined]
        if any(starts_server(fn) for fn in [item.function, *fixtures]):  # type: ignore[attr-defined]
            item.add_marker(pytest.mark.server)


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
