"""The pod every session test module starts (import its fixtures): a root pod with its default sandbox, its Unix
socket in a folder other accounts can reach, and two real Unix users, ann and ben, with their tokens."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from deskpod.envs.accounts import Account
from tests.jobs.pods import Pod, Pods
from tests.unix_users import make_users, shared_folder


@pytest.fixture(scope="module")
def box() -> Iterator[Path]:
    with shared_folder("deskpod-sessions-") as base:
        yield base


@pytest.fixture(scope="module")
def users() -> Iterator[tuple[Account, Account]]:
    with make_users("ann", "ben") as (ann, ben):
        yield ann, ben


@pytest.fixture(scope="module")
def pod(tmp_path_factory: pytest.TempPathFactory, box: Path) -> Iterator[Pod]:
    pods = Pods(tmp_path_factory.mktemp("sessions"))
    try:
        yield pods("--socket", str(box / "pod.sock"), sandbox=True)
    finally:
        pods.stop_all()


@pytest.fixture(scope="module")
def tokens(pod: Pod, users: tuple[Account, Account]) -> dict[str, str]:
    admin = pod.client()
    return {a.name: str(admin.add_user(a.name, os_user=a.name)["token"]) for a in users}
