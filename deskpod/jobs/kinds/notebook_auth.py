"""JupyterLab's sign-in on a cluster node: the pod's secret header, or nobody.

Loaded by the notebook's server (``--ServerApp.identity_provider_class``) where it listens on a node's address
(`deskpod.jobs.kinds.session.LISTEN_ENV`). Every request must carry the session's secret in
`deskpod.jobs.kinds.session.SECRET_HEADER`, which only the pod adds; anything else is refused (403, or JupyterLab's
sign-in page, which has nothing to sign in with). Jupyter's own token is not used: JupyterLab writes it into every page
it serves (its page config), so the browser, and whatever runs in it, would hold it; this secret never leaves the pod
and the node.
"""

from __future__ import annotations

import functools
import hmac
import os
from typing import Any

from deskpod.jobs.kinds.session import SECRET_ENV, SECRET_HEADER


def read_secret(environ: dict[str, str] | os._Environ[str] = os.environ) -> str:
    """The secret from the file `SECRET_ENV` names; "" (nobody gets in) when it is unset or unreadable."""
    path = environ.get(SECRET_ENV)
    if not path:
        return ""
    try:
        with open(path) as f:
            return f.read().strip()
    except OSError:
        return ""


def __getattr__(name: str) -> Any:
    """``SessionSecret``, made when jupyter-server asks for it: this module imports without the sessions extra (the
    pod's code imports everywhere; only the notebook's server, which has the extra, loads the class)."""
    if name == "SessionSecret":
        return session_secret_class()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


@functools.cache
def session_secret_class() -> type:
    from jupyter_server.auth.identity import IdentityProvider, User

    class SessionSecret(IdentityProvider):  # type: ignore[misc]
        """The pod is the one user: a request with the secret is the session's owner, forwarded by the pod."""

        def __init__(self, **kwargs: Any) -> None:
            super().__init__(**kwargs)
            self.secret = read_secret()

        def get_user(self, handler: Any) -> User | None:
            given = handler.request.headers.get(SECRET_HEADER, "")
            if self.secret and given and hmac.compare_digest(given.encode(), self.secret.encode()):
                return User(username=os.environ.get("USER", "owner"))
            return None

    SessionSecret.__qualname__ = "SessionSecret"
    return SessionSecret
