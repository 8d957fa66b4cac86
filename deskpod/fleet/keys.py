"""The fleet's Ed25519 key pair, and the assertions it signs for the requests it forwards to its members.

Kept in the fleet's home: ``fleet.key`` (the private key, PEM, 0600, written once) and ``fleet.pub.pem`` (what a
member trusts: ``deskpod up --trust-fleet fleet.pub.pem``). The claims are `deskpod.jobs.trust`'s, which verifies
them on the member.
"""

from __future__ import annotations

import secrets
import time
from pathlib import Path
from typing import Any

import jwt
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from deskpod.environment.files import write_bytes
from deskpod.errors import ConfigError
from deskpod.jobs.trust import ALGORITHM, FLEET_PREFIX, fleet_id

ASSERTION_S = 30.0
"""How long an assertion is good for: long enough for a slow request, short enough that a revoked user's or a
removed fleet's requests stop within it."""


class FleetKey:
    """The key pair of one fleet, loaded from (or made in) its home."""

    def __init__(self, private: Ed25519PrivateKey) -> None:
        self._private = private
        self.public_pem = private.public_key().public_bytes(
            serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
        )
        self.id = fleet_id(self.public_pem)
        """``iss`` of its assertions (`deskpod.jobs.trust.fleet_id`)."""

    @classmethod
    def in_home(cls, home: Path) -> FleetKey:
        """The fleet's key in ``home``, made on its first start (private key 0600 from the first byte)."""
        home.mkdir(parents=True, exist_ok=True, mode=0o700)
        path = home / "fleet.key"
        if path.exists():
            if path.stat().st_mode & 0o077:
                raise ConfigError(f"{path} is readable by others (mode {path.stat().st_mode & 0o777:o}); chmod 600 it")
            try:
                private = serialization.load_pem_private_key(path.read_bytes(), password=None)
            except (ValueError, TypeError) as e:
                raise ConfigError(
                    f"{path}: not the fleet's private key ({e}); move it away to make a new one"
                ) from None
            if not isinstance(private, Ed25519PrivateKey):
                raise ConfigError(f"{path}: a {type(private).__name__}, expected the fleet's Ed25519 key")
        else:
            private = Ed25519PrivateKey.generate()
            pem = private.private_bytes(
                serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
            )
            write_bytes(path, pem, mode=0o600)
        key = cls(private)
        write_bytes(home / "fleet.pub.pem", key.public_pem, mode=0o644)
        return key

    def assertion(self, subject: str | None, audience: str, *, lifetime: float = ASSERTION_S) -> str:
        """A signed assertion for member ``audience`` acting for fleet user ``subject`` (None: the fleet itself)."""
        now = time.time()
        claims: dict[str, Any] = {
            "iss": self.id,
            "aud": audience,
            "sub": subject if subject is not None else FLEET_PREFIX + self.id,
            "iat": int(now),
            "exp": int(now + lifetime) + 1,
            "jti": secrets.token_urlsafe(16),
        }
        return jwt.encode(claims, self._private, algorithm=ALGORITHM)
