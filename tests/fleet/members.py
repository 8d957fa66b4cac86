"""A fleet with members, for the server tests: a fleet pod (``deskpod fleet up``), member pods that trust it (root,
default sandbox), and fleet users who are users of every member too, each with a real OS account there."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path

from deskpod.envs.accounts import Account
from tests.jobs.pods import Pod, Pods


def start_fleet(
    pods: Pods, fleet_args: Sequence[str], members: Mapping[str, tuple[Sequence[str], Mapping[str, str]]],
    users: Mapping[str, Account],
) -> tuple[Pod, dict[str, Pod], dict[str, Path]]:  # fmt: skip
    """The fleet, each member (``deskpod up --name NAME --trust-fleet ... ARGS`` with ``ENV``, by name) and each user's
    fleet token file (0600, ``admin``'s included). The members are not added: tests add them as they need."""
    fleet = pods(*fleet_args, fleet=True)
    pem = str(fleet.home / "fleet.pub.pem")
    made = {name: pods("--name", name, "--trust-fleet", pem, *args, sandbox=True, env=dict(env))
            for name, (args, env) in members.items()}  # fmt: skip
    admin = fleet.client()
    tokens = {"admin": fleet.home / "token"}
    for name, account in users.items():
        tokens[name] = pods.root / f"{name}.token"
        tokens[name].write_text(admin.add_user(name)["token"])
        tokens[name].chmod(0o600)
        for member in made.values():
            member.client().add_user(name, os_user=account.name)
    return fleet, made, tokens
