"""Sizes as people write them (``20G``, ``512M``, ``1.5T``, ``4096``) and read them (``2.0 GiB``); K, M, G and T
are powers of 1024. Durations too (``4h``, ``90m``, ``1h30m``): `parse_duration`."""

from __future__ import annotations

import re

from deskpod.errors import ConfigError

_SIZE = re.compile(r"\s*(\d+(?:\.\d+)?)\s*([KMGT]?)(?:I?B)?\s*", re.IGNORECASE | re.ASCII)
UNITS = {"": 1, "K": 2**10, "M": 2**20, "G": 2**30, "T": 2**40}


def parse_size(text: str, what: str = "size") -> int:
    """Bytes in ``text``: a number, then K, M, G or T (an optional ``B`` or ``iB`` after it: ``2GiB``, ``1tb``).
    `ConfigError` naming ``what`` (the flag or field it came from) and the text when it is not a size."""
    m = _SIZE.fullmatch(text)
    if not m:
        raise ConfigError(f"{what} {text!r}: not a size; use a number with K, M, G or T, e.g. 500M or 20G")
    return int(float(m.group(1)) * UNITS[m.group(2).upper()])


def format_bytes(n: int) -> str:
    """``2.0 GiB``, ``64.0 MiB``, ``1.5 KiB``, ``800 bytes``: a limit or a size as a message shows it."""
    for unit, scale in (("TiB", 1 << 40), ("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= scale:
            return f"{n / scale:.1f} {unit}"
    return f"{n} bytes"


_DURATION = re.compile(r"^(?:(\d+(?:\.\d+)?)([smhd]))+$")
_PART = re.compile(r"(\d+(?:\.\d+)?)([smhd])")
SECONDS = {"s": 1, "m": 60, "h": 3600, "d": 86400}


def duration_text(seconds: float) -> str:
    """A duration as `parse_duration` reads it back: ``4h``, ``1h30m``, ``90s`` (whole seconds)."""
    s = max(0, round(seconds))
    parts = [(s // 86400, "d"), (s % 86400 // 3600, "h"), (s % 3600 // 60, "m"), (s % 60, "s")]
    return "".join(f"{n}{u}" for n, u in parts if n) or "0s"


def parse_duration(text: str, what: str = "--time") -> float:
    """Seconds in ``4h``, ``90m``, ``1h30m``, ``45s`` or plain seconds; `ConfigError` naming ``what`` (the flag or
    field it came from) and the text otherwise."""
    t = text.strip().lower()
    if t.replace(".", "", 1).isdigit():
        seconds = float(t)
    elif _DURATION.match(t):
        seconds = sum(float(n) * SECONDS[u] for n, u in _PART.findall(t))
    else:
        raise ConfigError(f"{what} {text!r}: expected a duration like 4h, 90m, 1h30m or 3600 (seconds)")
    if seconds <= 0:
        raise ConfigError(f"{what} {text!r}: expected a duration above 0, e.g. 4h")
    return seconds
