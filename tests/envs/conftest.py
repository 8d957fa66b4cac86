"""Fixtures for the environment and sandbox tests: real Unix users, removed at teardown."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from deskpod.envs.accounts import Account
from tests.unix_users import make_users


@pytest.fixture(scope="module")
def two_users() -> Iterator[tuple[Account, Account]]:
    """Two real accounts, alice-like and bob-like (``dpt<random>alice``, ``dpt<random>bob``)."""
    with make_users("alice", "bob") as (alice, bob):
        yield alice, bob
