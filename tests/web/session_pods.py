"""The pod every session test module starts (import its fixtures): a root pod with its default sandbox, its Unix
socket in a folder other accounts can reach, and two real Unix users, ann and ben, with their tokens."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
import websockets
from websockets.asyncio.client import connect

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


async def refused(url: str, headers: dict[str, str]) -> int | None:
    """The status (or close code) with which the pod turns a session's WebSocket away; None when it lets it in."""
    try:
        async with connect(url, additional_headers=headers) as ws:
            await ws.recv()
    except websockets.ConnectionClosed as e:
        return e.rcvd.code if e.rcvd else None
    except websockets.InvalidStatus as e:
        return e.response.status_code
    return None
