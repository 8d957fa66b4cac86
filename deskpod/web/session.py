"""Who is looking: the session cookie (or a bearer token), and the CSRF token every form carries.

A browser signs in at ``/ui/login`` with one of the pod's tokens and gets a server-side session
(`deskpod.jobs.auth.new_session`) in a cookie that scripts cannot read (HttpOnly) and that no other
site's page can send (SameSite=Strict). Each session has its own CSRF token; every form posts it as
``csrf`` and every script sends it as ``X-CSRF-Token``, and a cookie-authenticated POST without it is
refused. Scripts may also use the JSON twins with ``Authorization: Bearer <token>``, like the REST
API; a request that carries no cookie needs no CSRF token.

The sign-in form itself carries a token too: a random value set in a short-lived cookie and repeated
in the form (double submit), so another site cannot sign a browser in as someone else.
"""

from __future__ import annotations

import hmac
import math
import secrets
import time
from dataclasses import dataclass
from typing import Annotated
from urllib.parse import quote, urlsplit

from fastapi import Depends, Request
from fastapi.responses import Response
from starlette.concurrency import run_in_threadpool

from deskpod.errors import AccessError, AuthError, DeskpodError
from deskpod.jobs import auth
from deskpod.jobs.store import Store, User

COOKIE = "deskpod_session"
LOGIN_COOKIE = "deskpod_login"
ROOT = "/ui"
"""Where the dashboard is mounted; every page's URL starts with it."""


class SignInRequired(AuthError):
    """No session, an expired one, or no token: pages answer with the sign-in page, JSON with 401."""


class CsrfError(AccessError):
    """A cookie-authenticated POST without the session's CSRF token (HTTP 403)."""


@dataclass(frozen=True, slots=True)
class Viewer:
    """The signed-in user of a request, and how they signed in."""

    user: User
    csrf: str
    """The session's CSRF token ('' for a bearer-token request, which needs none)."""
    session: str | None
    """The session id from the cookie; None for a bearer-token request."""
    checked: int = 0
    """The store's `Store.revocations` when this viewer was read: a long-lived answer looks again once it moved."""
    expires: float = math.inf
    """When the session ends (seconds since the epoch); a bearer token does not expire."""

    def owner_filter(self) -> str | None:
        """The ``user`` to filter jobs by: None for an admin (every job), else the user's own name."""
        return None if self.user.admin else self.user.name


SESSION_CACHE_S = 5.0
"""A session read from the store answers from memory this long: a page's polls and streams then cost no
store read (and no wait for the store's lock, which the scheduler holds while it works)."""


async def viewer(request: Request) -> Viewer:
    """The signed-in user, from the session cookie or a bearer token; `SignInRequired` otherwise.

    A session seen in the last `SESSION_CACHE_S` answers from memory, on the event loop; anything else
    reads the store in a worker thread (the store's lock may be busy with the scheduler)."""
    known = _remembered(request)
    if known is not None:
        return known
    return await run_in_threadpool(_look_up, request)


Signed = Annotated[Viewer, Depends(viewer)]
"""A route parameter that is the signed-in viewer (`viewer`)."""


def _remembered(request: Request) -> Viewer | None:
    cookie = request.cookies.get(COOKIE)
    if not cookie:
        return None
    hit = _sessions(request).get(cookie)
    now = time.time()
    revocations = request.app.state.web.store.revocations
    if hit is not None and now < hit[2] and now - hit[3] < SESSION_CACHE_S and hit[4] == revocations:
        return Viewer(hit[0], hit[1], cookie, hit[4], hit[2])
    return None


def _sessions(request: Request) -> dict[str, tuple[User, str, float, float, int]]:
    """Sessions read lately: cookie -> (user, CSRF token, expiry, when read, `Store.revocations` before the read);
    a revocation since the read makes the next request read the store again."""
    cache: dict[str, tuple[User, str, float, float, int]] = request.app.state.web.cache.setdefault("sessions", {})
    return cache


def _look_up(request: Request) -> Viewer:
    store: Store = request.app.state.web.store
    revocations = store.revocations  # before the read: a revocation during it is seen as one after it
    cookie = request.cookies.get(COOKIE)
    if cookie:
        now = time.time()
        cache = _sessions(request)
        found = auth.session_user(store, cookie, now)
        if found is not None:
            if len(cache) > 10_000:
                cache.clear()
            cache[cookie] = (*found, now, revocations)
            return Viewer(found[0], found[1], cookie, revocations, found[2])
        cache.pop(cookie, None)
    header = request.headers.get("authorization")
    if header:
        return Viewer(auth.authenticate(store, header), "", None, revocations)
    if cookie:
        raise SignInRequired("your session has expired; sign in again")
    raise SignInRequired("sign in with your pod token to see this page")


class SignedIn:
    """Whether the viewer of a long-lived answer (the Job page's live stream) is still signed in.

    Called on every tick of the stream, so it costs one integer compare and a clock read until the store records
    a revocation (`Store.revocations`: a user revoked, a session signed out) or the session's expiry passes; then
    it reads the store once, in a thread, as `viewer` would for a new request."""

    def __init__(self, request: Request, who: Viewer) -> None:
        self.request, self.who = request, who
        self.checked, self.expires = who.checked, who.expires

    async def __call__(self) -> bool:
        if self.request.app.state.web.store.revocations == self.checked and time.time() < self.expires:
            return True
        try:
            again = await run_in_threadpool(_look_up, self.request)
        except DeskpodError:
            return False
        self.checked, self.expires = again.checked, again.expires
        return again.user.name == self.who.user.name and again.session == self.who.session


def forget_session(request: Request, session: str) -> None:
    """Drop a session from the memory of `viewer` (it was signed out)."""
    _sessions(request).pop(session, None)


def check_csrf(viewer: Viewer, sent: str | None) -> None:
    """Refuse a cookie-authenticated state change whose form or header lacks the session's token."""
    if viewer.session is None:
        return  # a bearer token is not sent by browsers on their own: no cross-site forgery
    if not sent or not hmac.compare_digest(sent, viewer.csrf):
        raise CsrfError("this form's CSRF token is missing or out of date; reload the page and try again")


async def form_csrf(request: Request, viewer: Viewer) -> dict[str, str]:
    """The posted form's fields (text only), after checking its CSRF token (header or ``csrf`` field)."""
    form = await request.form()
    fields = {k: v for k, v in form.items() if isinstance(v, str)}
    check_csrf(viewer, request.headers.get("x-csrf-token") or fields.get("csrf"))
    return fields


def set_session_cookie(response: Response, request: Request, session: str) -> None:
    response.set_cookie(
        COOKIE, session, max_age=int(auth.SESSION_HOURS * 3600), path="/", httponly=True, samesite="strict",
        secure=request.url.scheme == "https",
    )  # fmt: skip


def clear_session_cookie(response: Response) -> None:
    response.delete_cookie(COOKIE, path="/", httponly=True, samesite="strict")


def login_token(request: Request) -> str:
    """The sign-in form's token: the one already in the browser's login cookie, or a new one."""
    return request.cookies.get(LOGIN_COOKIE) or secrets.token_urlsafe(24)


def set_login_cookie(response: Response, token: str) -> None:
    response.set_cookie(LOGIN_COOKIE, token, max_age=3600, path=f"{ROOT}/login", httponly=True, samesite="strict")


def check_login_token(request: Request, sent: str | None) -> None:
    expected = request.cookies.get(LOGIN_COOKIE)
    if not expected or not sent or not hmac.compare_digest(expected, sent):
        raise CsrfError("the sign-in form is out of date (its CSRF token is missing); reload it and try again")


def safe_next(target: str | None) -> str:
    """Where to go after signing in: a path of this dashboard or of a session (never another site)."""
    if not target:
        return f"{ROOT}/"
    parts = urlsplit(target)
    if parts.scheme or parts.netloc or not parts.path.startswith((f"{ROOT}/", "/sessions/")) or "\\" in target:
        return f"{ROOT}/"
    return target


def login_url(next_path: str) -> str:
    return f"{ROOT}/login?next={quote(next_path, safe='/')}"
