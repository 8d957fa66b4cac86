"""Fixtures: real pod services on 127.0.0.1, stopped (with their jobs) at teardown."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.jobs.pods import Pod, Pods


@pytest.fixture
def pod_factory(tmp_path: Path) -> Iterator[Pods]:
    """Start pods with ``pod_factory(*extra_up_args)``; all are stopped at teardown."""
    pods = Pods(tmp_path)
    yield pods
    pods.stop_all()


@pytest.fixture(scope="module")
def shared_pod(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Pod]:
    """One pod for the tests of a module that do not restart or fill it."""
    pods = Pods(tmp_path_factory.mktemp("shared"))
    yield pods()
    pods.stop_all()
