"""The fleets a pod trusts, and the assertions they sign for the requests they forward.

A fleet (`deskpod.fleet`) keeps its users and tokens itself; a request it forwards to a member pod carries, instead
of a token, ``Authorization: Bearer <assertion>``: a JSON Web Token signed with the fleet's Ed25519 key (PyJWT,
``alg = EdDSA``), good for seconds::

    iss  the fleet's id: ``fleet-`` and the first 16 hex digits of the SHA-256 of its raw public key (`fleet_id`)
    aud  the member's own name (``deskpod up --name``; ``GET /health`` says it), so that one member's
         assertion is refused by another
    sub  the fleet user it acts for, or ``fleet:<iss>`` when the fleet acts as itself (`FLEET_PREFIX`)
    iat, exp, jti   issued, expires (seconds later), a random id: each is accepted once (`Trust.verify`)

A member trusts a fleet by its public key: ``deskpod up --trust-fleet fleet.pub.pem`` copies it to
``<home>/trusted-fleets/<fleet id>.pem``, where it stays until removed. The member maps ``sub`` to its own user of
that name — who has an OS account of this box, so the walls of its jobs hold here as for a token's user — and
refuses a fleet user without one (403). The fleet acting as itself is a user of no job: it reads the pod's status
and renews the leases of the jobs it forwarded (`deskpod.jobs.pod.Pod.renew`).

Verifying needs PyJWT (the ``fleet`` extra); a pod that trusts no fleet never imports it.
"""

from __future__ import annotations

import hashlib
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from deskpod.environment.files import write_bytes
from deskpod.errors import AccessError, AuthError, ConfigError, require_extra

FLEET_PREFIX = "fleet:"
"""``sub`` of an assertion by which a fleet acts as itself: ``fleet:<its id>`` (no user name has a colon)."""
ALGORITHM = "EdDSA"
FOLDER = "trusted-fleets"
"""The folder of the pod's home that holds the public keys of the fleets it trusts, one ``<fleet id>.pem`` each."""


def fleet_id(public_pem: bytes) -> str:
    """A fleet's id, from its public key: ``fleet-`` and 16 hex digits of the SHA-256 of the raw Ed25519 key."""
    key = load_public(public_pem, "a fleet's public key")
    from cryptography.hazmat.primitives import serialization

    raw = key.public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)
    return "fleet-" + hashlib.sha256(raw).hexdigest()[:16]


def load_public(pem: bytes, what: str) -> Any:
    """An Ed25519 public key from PEM text, or `ConfigError` naming ``what`` it should have been."""
    require_extra("fleet", what)
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

    try:
        key = serialization.load_pem_public_key(pem)
    except (ValueError, TypeError) as e:
        raise ConfigError(f"{what}: not a PEM public key ({e}); expected the fleet's fleet.pub.pem") from None
    if not isinstance(key, Ed25519PublicKey):
        raise ConfigError(f"{what}: a {type(key).__name__}, expected an Ed25519 key (the fleet's fleet.pub.pem)")
    return key


def add_trusted(home: Path, pem_file: Path) -> str:
    """Trust the fleet whose public key is in ``pem_file`` from now on: copied into the home; returns its id."""
    try:
        pem = pem_file.read_bytes()
    except OSError as e:
        raise ConfigError(f"--trust-fleet {str(pem_file)!r}: cannot read it ({e.strerror})") from None
    fid = fleet_id(pem)
    home.mkdir(parents=True, exist_ok=True, mode=0o700)
    folder = home / FOLDER
    folder.mkdir(exist_ok=True, mode=0o700)
    write_bytes(folder / f"{fid}.pem", pem, mode=0o600)
    return fid


@dataclass(frozen=True, slots=True)
class Asserted:
    """What a verified assertion says."""

    fleet: str
    """The fleet that signed it (``iss``)."""
    subject: str
    """The fleet user it acts for, or ``fleet:<id>`` for the fleet itself."""

    @property
    def fleet_itself(self) -> bool:
        return self.subject == FLEET_PREFIX + self.fleet


class Trust:
    """The fleets one pod trusts (``<home>/trusted-fleets``), and the assertion ids it has seen."""

    def __init__(self, name: str, keys: Mapping[str, Any]) -> None:
        self.name = name
        """This pod's own name: every assertion it accepts names it as ``aud``."""
        self.keys = dict(keys)
        self._seen: dict[str, float] = {}
        self._lock = threading.Lock()

    @classmethod
    def load(cls, home: Path, name: str) -> Trust | None:
        """The fleets trusted in ``home``; None when there are none (then no assertion is ever accepted)."""
        files = sorted((home / FOLDER).glob("fleet-*.pem"))
        if not files:
            return None
        keys = {}
        for f in files:
            pem = f.read_bytes()
            fid = fleet_id(pem)
            if fid != f.stem:
                raise ConfigError(f"{f}: holds the key of {fid}, not of {f.stem}; remove the file or rename it")
            keys[fid] = load_public(pem, str(f))
        return cls(name, keys)

    def verify(self, token: str, now: float | None = None) -> Asserted:
        """The fleet and subject of a valid assertion for this pod, or `AuthError` saying why it is refused."""
        import jwt

        now = time.time() if now is None else now
        try:
            claims = jwt.decode(token, options={"verify_signature": False})
            iss = claims.get("iss")
        except jwt.PyJWTError as e:
            raise AuthError(f"malformed fleet assertion ({e})") from None
        key = self.keys.get(iss) if isinstance(iss, str) else None
        if key is None or not isinstance(iss, str):
            raise AuthError(f"assertion from {str(iss)[:40]!r}, a fleet this pod ({self.name}) does not trust")
        try:
            claims = jwt.decode(token, key, algorithms=[ALGORITHM], audience=self.name, issuer=iss,
                                options={"require": ["iss", "aud", "sub", "iat", "exp", "jti"]})  # fmt: skip
        except jwt.InvalidAudienceError:
            raise AuthError(f"assertion from {iss} is for another pod; this one is {self.name!r}") from None
        except jwt.PyJWTError as e:
            raise AuthError(f"assertion from {iss} refused: {e}") from None
        jti, sub, exp = claims["jti"], claims["sub"], float(claims["exp"])
        if not isinstance(jti, str) or not isinstance(sub, str):
            raise AuthError(f"assertion from {iss} refused: jti and sub must be strings")
        with self._lock:  # each assertion once: a copied header is no use to anyone else
            if len(self._seen) > 10_000:
                self._seen = {j: e for j, e in self._seen.items() if e > now}
            if jti in self._seen:
                raise AuthError(f"assertion from {iss} was used before (jti {jti[:16]})")
            self._seen[jti] = exp
        if not sub.startswith(FLEET_PREFIX) or sub == FLEET_PREFIX + iss:
            return Asserted(iss, sub)
        raise AccessError(f"assertion from {iss} acts as another fleet ({sub[:60]})")


def looks_like_assertion(token: str) -> bool:
    """A JSON Web Token (three base64url parts), not a deskpod token (``dp_...``)."""
    return token.count(".") == 2 and not token.startswith("dp_")
