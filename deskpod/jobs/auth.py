"""Users and API tokens of the pod service.

A token is 32 random bytes (URL-safe text) shown once when it is made; the store keeps only its
SHA-256. A salted slow hash (bcrypt, scrypt) protects *guessable* passwords; a 256-bit random token
cannot be guessed, so a plain hash is enough and keeps every request's check to one lookup.

A browser signs in once with a token and gets a *session* instead (the dashboard's cookie): 32 random
bytes again, stored hashed beside its user, a CSRF token for the forms it posts, and an expiry.
Signing out, or the expiry, ends it; the token it came from keeps working for the CLI.

Roles: an admin creates users and tokens and sees every job; a user sees and acts on their own
jobs only. The first ``deskpod up`` on an empty home creates the admin ``admin`` and writes its
token to the starting user's token file (mode 0600).
"""

from __future__ import annotations

import hashlib
import re
import secrets
from pathlib import Path

from deskpod.environment.files import write_text
from deskpod.errors import AccessError, AuthError, ConfigError
from deskpod.jobs.store import Store, User
from deskpod.jobs.trust import FLEET_PREFIX, Trust, looks_like_assertion

USER_RE = re.compile(r"^[a-z_][a-z0-9_-]{0,31}$")
ADMIN = "admin"


def hash_token(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


def new_token(store: Store, user: str) -> str:
    """Make a token for ``user``; the only time its text exists outside the caller."""
    token = "dp_" + secrets.token_urlsafe(32)
    store.add_token_hash(user, hash_token(token))
    return token


def authenticate(store: Store, header: str | None, trust: Trust | None = None) -> User:
    """The user an ``Authorization: Bearer <token>`` header names, or `AuthError`; with ``trust``, the bearer may
    also be a trusted fleet's assertion (`deskpod.jobs.trust`): the user of the same name, or the fleet itself."""
    if not header:
        raise AuthError("no token: send 'Authorization: Bearer <token>' (the CLI reads it from its token file)")
    scheme, _, token = header.partition(" ")
    if scheme.lower() != "bearer" or not token.strip():
        raise AuthError("malformed Authorization header; expected 'Bearer <token>'")
    if looks_like_assertion(token.strip()):
        if trust is None:
            raise AuthError(
                "a fleet's assertion, but this pod trusts no fleet (its admin: deskpod up --trust-fleet FILE)"
            )
        return fleet_user(store, trust, token.strip())
    user = store.user_by_token_hash(hash_token(token.strip()))
    if user is None:
        raise AuthError("unknown token; ask an admin for one (deskpod user add NAME)")
    return user


def fleet_user(store: Store, trust: Trust, assertion: str) -> User:
    """Who a trusted fleet's assertion acts for here: this pod's user of the same name, or the fleet itself (a
    user of no job); `AccessError` for a fleet user without a user on this pod. Never an admin: the fleet acts on
    each job as its own user, and this pod's admins are its own."""
    said = trust.verify(assertion)
    if said.fleet_itself:
        return User(said.subject, admin=False, fleet=said.fleet)
    user = store.user(said.subject)
    if user is None:
        raise AccessError(
            f"fleet user {said.subject!r} has no account on this pod ({trust.name}); its admin adds one: "
            f"deskpod user add {said.subject} --os-user ACCOUNT"
        )
    return User(user.name, False, user.os_user, fleet=said.fleet)


def fleet_itself(user: User) -> bool:
    """Whether the caller is a fleet acting as itself (no user of this pod)."""
    return user.fleet is not None and user.name == FLEET_PREFIX + user.fleet


SESSION_HOURS = 12.0
"""How long a dashboard session lasts from sign-in (a working day)."""


def new_session(store: Store, user: User, now: float, hours: float = SESSION_HOURS) -> tuple[str, str]:
    """Start a browser session for ``user``; returns (session id for the cookie, CSRF token for its forms)."""
    session, csrf = secrets.token_urlsafe(32), secrets.token_urlsafe(24)
    store.add_session(hash_token(session), user.name, csrf, now, now + hours * 3600)
    return session, csrf


def session_user(store: Store, session: str | None, now: float) -> tuple[User, str, float] | None:
    """(user, CSRF token, expiry) of a live session cookie, or None (no cookie, unknown, expired)."""
    if not session:
        return None
    return store.session(hash_token(session), now)


def end_session(store: Store, session: str) -> None:
    store.end_session(hash_token(session))


def require_admin(user: User) -> None:
    if not user.admin:
        raise AccessError(f"user {user.name!r} is not an admin; only an admin may do this")


def check_user_name(name: object) -> str:
    if not isinstance(name, str) or not USER_RE.match(name):
        raise ConfigError(
            f"user name {name!r} is not valid; use 1-32 lowercase letters, digits, '_' or '-', e.g. alice"
        )
    return name


def bootstrap(store: Store, os_user: str | None = None) -> str | None:
    """On an empty store, create the admin (its jobs run as ``os_user``) and return its first token; else None.

    A store from before OS accounts gets its admin mapped to ``os_user`` here too.
    """
    if store.users():
        admin = store.user(ADMIN)
        if admin is not None and admin.os_user is None and os_user is not None:
            store.set_os_user(ADMIN, os_user)
        return None
    store.add_user(ADMIN, admin=True, os_user=os_user)
    return new_token(store, ADMIN)


def write_token_file(path: Path, token: str) -> None:
    """Write a token readable only by this user (0600 from the first byte, not chmod-ed after)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    write_text(path, token + "\n", mode=0o600)
