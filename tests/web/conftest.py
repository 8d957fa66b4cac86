"""Fixtures: a real pod service (with its dashboard) on 127.0.0.1, and clients signed in to it."""

from __future__ import annotations

from collections.abc import Iterator

import httpx
import pytest

from tests.jobs.pods import Pod, Pods
from tests.web.browser import sign_in


@pytest.fixture(scope="module")
def web_pod(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Pod]:
    """One pod (dashboard included) for the tests of a module."""
    pods = Pods(tmp_path_factory.mktemp("web"))
    yield pods()
    pods.stop_all()


@pytest.fixture
def admin(web_pod: Pod) -> Iterator[httpx.Client]:
    """A dashboard session of the pod's admin."""
    c = sign_in(web_pod)
    yield c
    c.close()
