"""The checks every part of a job spec uses, with the spec's one-line messages (`deskpod.jobs.spec`, the kinds)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, TypeGuard

from deskpod.errors import ConfigError


def bad(key: str, value: object, valid: str) -> ConfigError:
    shown = repr(value)
    if len(shown) > 80:
        shown = shown[:77] + "..."
    return ConfigError(f"job spec: {key} = {shown} is not valid; {valid}")


def whole(v: object) -> object:
    """A JSON number with a whole value as an int: JSON (and the API's schema) cannot tell ``2.0`` from ``2``."""
    return int(v) if isinstance(v, float) and v.is_integer() else v


def absolute_path(v: object) -> TypeGuard[str]:
    """An absolute path a spec may name: a string from ``/``, without NUL, of at most 4096 characters."""
    return isinstance(v, str) and v.startswith("/") and "\0" not in v and len(v) <= 4096


def integer(data: Mapping[str, Any], key: str, default: int, lo: int, hi: int, prefix: str = "") -> int:
    v = whole(data.get(key, default))
    if isinstance(v, bool) or not isinstance(v, int) or not lo <= v <= hi:
        raise bad(prefix + key, v, f"expected a whole number from {lo} to {hi}, e.g. {key} = {max(lo, min(hi, 1))}")
    return v


def flag(data: Mapping[str, Any], key: str, prefix: str = "") -> bool:
    v = data.get(key, False)
    if not isinstance(v, bool):
        raise bad(prefix + key, v, f"expected true or false, e.g. {key} = true")
    return v


def table(t: object, name: str, fields: tuple[str, ...], expected: str) -> Mapping[str, Any]:
    """The spec's ``[name]`` table: a mapping of known ``fields``, none of them null; else `ConfigError`."""
    if not isinstance(t, Mapping):
        raise bad(name, t, expected)
    unknown = sorted(str(k) for k in t if k not in fields)
    if unknown:
        raise ConfigError(f"job spec: unknown field {name}.{unknown[0]}; valid: {', '.join(fields)}")
    no_nulls(t, f"{name}.")
    return t


def no_nulls(table: Mapping[str, Any], prefix: str) -> None:
    """Refuse a field given as null: no field of a spec takes one (the schema says so); a field left out gets its
    default. (`deskpod.jobs.spec.stored_spec` reads specs stored when unset fields were written as null.)"""
    for key, value in table.items():
        if value is None:
            raise ConfigError(f"job spec: {prefix}{key} = null is not valid; leave {prefix}{key} out for its default")
