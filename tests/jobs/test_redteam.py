"""Every attack of the red team (`tests.redteam`) against one root pod with its default sandbox: each must hold."""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest

from tests import redteam

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="the attacks play local users against a pod run by root")


@pytest.fixture(scope="module")
def stage() -> Iterator[redteam.Stage]:
    with redteam.stage() as s:
        yield s


@pytest.mark.parametrize("name", list(redteam.ATTACKS))
def test_the_attack_no_longer_works(stage: redteam.Stage, name: str) -> None:
    assert redteam.ATTACKS[name](stage) is None
