"""Helpers for the dashboard's tests: sign a client in through the real sign-in form of a real pod, and
start Debian's Chromium the way these machines allow it."""

from __future__ import annotations

import os
import pwd
import re
from typing import Any

import httpx

from tests.jobs.pods import Pod


def hidden(html: str, name: str) -> str:
    """The value of the hidden form field ``name`` on a page."""
    m = re.search(rf'name="{re.escape(name)}" value="([^"]*)"', html)
    assert m, f"no hidden field {name!r} on the page"
    return m.group(1)


def sign_in(pod: Pod, token: str | None = None) -> httpx.Client:
    """An httpx client holding a dashboard session of ``token``'s user (the admin by default); close it after."""
    c = httpx.Client(base_url=pod.url, follow_redirects=False, timeout=30, trust_env=False)
    form = c.get("/ui/login", params={"next": "/ui/"})
    assert form.status_code == 200, form.text
    r = c.post("/ui/login", data={"csrf": hidden(form.text, "csrf"), "next": "/ui/", "token": token or pod.token})
    assert r.status_code == 303, r.text
    assert "deskpod_session" in c.cookies
    return c


def csrf_of(client: httpx.Client, path: str = "/ui/jobs") -> str:
    """The session's CSRF token, read off a page as a form would."""
    r = client.get(path)
    assert r.status_code == 200, r.text
    return hidden(r.text, "csrf")


def new_user(pod: Pod, name: str, admin: bool = False) -> str:
    """Create a user through the API; returns its token.

    Its jobs run as the OS account the tests run as (root in CI), as the admin's do: these tests watch
    the dashboard, not the walls (tests/jobs/test_isolation.py), and this machine's Python and the
    tests' folders are closed to other accounts.
    """
    return str(pod.client().add_user(name, admin, os_user=pwd.getpwuid(os.getuid()).pw_name)["token"])


CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-background-networking", "--disable-component-update",
                 "--disable-sync", "--no-first-run"]  # fmt: skip
"""Headless as root (no sandbox), and no calls home: this machine reaches no other host."""


def launch_chromium(playwright: Any) -> Any:
    """Debian's Chromium under Playwright (no browser download)."""
    return playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)


def open_signed_in(browser: Any, pod: Pod, path: str, token: str | None = None) -> tuple[Any, list[str]]:
    """A new page signed in through the sign-in form and landed on ``path``; and the page's script errors."""
    page = browser.new_page()
    errors: list[str] = []
    page.on("pageerror", lambda e: errors.append(str(e)))
    page.goto(f"{pod.url}/ui/login?next={path}")
    page.fill("input[name=token]", token or pod.token)
    page.click("button[type=submit]")
    page.wait_for_url(f"**{path}")
    return page, errors
