"""Who a caller is and which OS account their jobs run as.

Two ways in: an HTTP client shows a token (`deskpod.jobs.auth`); a local process on the pod's Unix
socket is identified by the kernel (``SO_PEERCRED``: its uid), with no token to copy. Each deskpod
user maps to one OS account (``os_user``):

- A pod started by **root** runs every job as its user's account, like slurmd: ``os_user`` when an
  admin set it, else the account of the user's own name when the box has one, else the pod's
  *unmapped* account (``deskpod up --unmapped-user``, default ``nobody``) — never root, unless the user
  is mapped to root. A local caller on the socket is the deskpod user mapped to its account; one seen
  for the first time gets a user of its account's name (root's is the admin).
- A pod started by an **ordinary user** serves that user alone (it could not switch accounts anyway):
  every job runs as that account, and a socket caller of any other uid is refused.
"""

from __future__ import annotations

import socket
import struct
from dataclasses import dataclass

from deskpod.envs.accounts import Account, account_by_name, account_by_uid, current_account
from deskpod.errors import AccessError, ConfigError
from deskpod.jobs.auth import ADMIN, USER_RE
from deskpod.jobs.store import Store, User


@dataclass(frozen=True, slots=True)
class Peer:
    """A process on the other end of the Unix socket, as the kernel reports it."""

    pid: int
    uid: int
    gid: int


def peer_of(sock: socket.socket) -> Peer | None:
    """``SO_PEERCRED`` of a connected Unix socket; None for any other kind of socket."""
    if sock.family != socket.AF_UNIX:
        return None
    raw = sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
    pid, uid, gid = struct.unpack("3i", raw)
    return Peer(pid, uid, gid)


class Accounts:
    """The pod's mapping from deskpod users to OS accounts (see the module docstring)."""

    def __init__(self, store: Store, *, unmapped: str | None = "nobody", daemon: Account | None = None) -> None:
        self.store = store
        self.daemon = daemon or current_account()
        self.root = self.daemon.uid == 0
        self.unmapped = unmapped
        if self.root and unmapped is not None:
            account_by_name(unmapped)  # refuse a pod whose fallback account does not exist, at start

    def describe(self) -> str:
        """One line for the daemon's start: how jobs are run."""
        if not self.root:
            return (
                f"running as {self.daemon.name} (not root): every job runs as {self.daemon.name}, "
                f"and only {self.daemon.name} may use this pod"
            )
        fallback = f"users without an account run as {self.unmapped}" if self.unmapped else "unmapped users are refused"
        return f"running as root: each job runs as its user's OS account ({fallback})"

    def check_os_user(self, name: object) -> str | None:
        """An ``os_user`` given for a new user: an account of this box (a non-root pod has only its own)."""
        if name is None:
            return None
        if not isinstance(name, str) or not name or len(name) > 64:
            raise ConfigError(f"os_user = {name!r}: expected the name of an OS account of this box, e.g. alice")
        account = account_by_name(name)
        if not self.root and account.uid != self.daemon.uid:
            raise AccessError(f"this pod service runs as {self.daemon.name} and runs jobs as {self.daemon.name} only")
        return name

    def account_for(self, user: User) -> Account:
        """The OS account ``user``'s jobs run as; `ConfigError` when there is none."""
        if not self.root:
            return self.daemon
        if user.os_user is not None:
            return account_by_name(user.os_user)
        try:
            return account_by_name(user.name)
        except ConfigError:
            if self.unmapped is None:
                raise ConfigError(
                    f"user {user.name!r} has no OS account on this box; an admin maps one: "
                    f"deskpod user add {user.name} --os-user ACCOUNT"
                ) from None
            return account_by_name(self.unmapped)

    def user_of(self, peer: Peer) -> User:
        """The deskpod user of a process on the Unix socket (created on its first visit)."""
        if not self.root and peer.uid != self.daemon.uid:
            raise AccessError(
                f"this pod service runs as {self.daemon.name} and serves {self.daemon.name} alone "
                f"(you are uid {peer.uid}); start your own with deskpod up"
            )
        account = account_by_uid(peer.uid)
        user = self.store.user_by_os_user(account.name)
        if user is not None:
            return user
        if peer.uid == self.daemon.uid:  # the pod's own account: its admin, mapped on first use
            admin = self.store.user(ADMIN)
            if admin is not None and admin.os_user is None:
                self.store.set_os_user(ADMIN, account.name)
                return User(admin.name, admin.admin, account.name)
        if self.store.user(account.name) is not None:
            raise AccessError(
                f"OS account {account.name!r} is not mapped to a deskpod user, and the user {account.name!r} "
                f"is mapped elsewhere; an admin maps it: deskpod user add NAME --os-user {account.name}"
            )
        if not USER_RE.match(account.name):
            raise AccessError(
                f"OS account {account.name!r} is not a valid deskpod user name; an admin maps it: "
                f"deskpod user add NAME --os-user {account.name}"
            )
        self.store.add_user(account.name, admin=peer.uid == 0, os_user=account.name)
        return User(account.name, peer.uid == 0, account.name)
