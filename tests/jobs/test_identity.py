"""Who a caller is and which account their jobs run as (`deskpod.jobs.identity`), on a real store and real accounts."""

from __future__ import annotations

import os
import pwd
import socket
from pathlib import Path

import pytest

from deskpod.envs.accounts import account_by_name, current_account
from deskpod.errors import AccessError, ConfigError
from deskpod.jobs import auth
from deskpod.jobs.identity import Accounts, Peer, peer_of
from deskpod.jobs.store import Store, User


def test_the_kernel_names_the_process_on_the_other_end_of_a_unix_socket() -> None:
    a, b = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    with a, b:
        assert peer_of(a) == Peer(os.getpid(), os.getuid(), os.getgid())
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as tcp:
        assert peer_of(tcp) is None  # a TCP client is never identified this way: it shows a token


def test_a_pod_of_an_ordinary_user_serves_that_user_alone(tmp_path: Path) -> None:
    store = Store(tmp_path / "pod.db")
    nobody = account_by_name("nobody")
    accounts = Accounts(store, daemon=nobody)  # as if `deskpod up` ran as nobody
    auth.bootstrap(store, os_user=nobody.name)
    assert "only nobody may use this pod" in accounts.describe()
    assert accounts.user_of(Peer(1, nobody.uid, nobody.gid)).name == auth.ADMIN
    with pytest.raises(AccessError, match=r"serves nobody alone \(you are uid 0\)"):
        accounts.user_of(Peer(1, 0, 0))
    assert accounts.account_for(User("someone", False)) == nobody  # every job runs as the daemon's account
    with pytest.raises(AccessError, match="runs jobs as nobody only"):
        accounts.check_os_user("root")


@pytest.mark.skipif(os.geteuid() != 0, reason="a root pod's mapping")
def test_a_root_pod_maps_users_to_their_accounts_and_never_to_root(tmp_path: Path) -> None:
    store = Store(tmp_path / "pod.db")
    accounts = Accounts(store)
    assert accounts.daemon == current_account() and accounts.root
    auth.bootstrap(store, os_user="root")
    assert accounts.account_for(store.user(auth.ADMIN)).uid == 0  # type: ignore[arg-type]
    assert accounts.account_for(User("nobody", False)).name == "nobody"  # an account of the user's name
    assert accounts.account_for(User("no-such-account", False)).name == "nobody"  # the unmapped account
    with pytest.raises(ConfigError, match="OS account 'no-such-account' does not exist"):
        accounts.check_os_user("no-such-account")
    strict = Accounts(store, unmapped=None)
    with pytest.raises(ConfigError, match="has no OS account on this box; an admin maps one"):
        strict.account_for(User("no-such-account", False))
    # A local caller seen for the first time becomes the user of its account's name.
    nobody = pwd.getpwnam("nobody")
    user = accounts.user_of(Peer(1, nobody.pw_uid, nobody.pw_gid))
    assert (user.name, user.admin, user.os_user) == ("nobody", False, "nobody")
    assert store.user("nobody") == user
    assert accounts.user_of(Peer(1, 0, 0)).name == auth.ADMIN  # root is the admin it is mapped to
    with pytest.raises(ConfigError, match="OS account 'nobody-at-all' does not exist"):
        Accounts(store, unmapped="nobody-at-all")
