"""A job spec: what to run, on how many devices, and how to treat it — validated where it enters.

A spec arrives as TOML (``deskpod submit job.toml``), JSON (the HTTP body) or CLI flags, and always
ends up as one `JobSpec` through `parse_spec`. Everything a spec names is checked here, before the
daemon stores it, so nothing is ever executed from a bad spec::

    name = "resnet-sweep-3"          # letters, digits, . _ - (no shell metacharacters, no path separators)
    command = ["python", "x.py"]     # an argv list, never run through a shell ... or a [train] table
    devices = 2                      # a count, or "all"
    placement = "best"               # best | pack | partition:<name>
    priority = 0                     # higher runs first (-1000..1000)
    max_runtime = 3600               # seconds; the job is stopped (and fails) past it
    retries = 1                      # re-runs after a failure or a lost process
    workdir = "/abs/path"            # default: the job's own folder
    [env]
    SEED = "1"
"""

from __future__ import annotations

import json
import re
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import tomli_w

from deskpod.errors import ConfigError

NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$")
ENV_NAME_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,127}$")
RESERVED_ENV = frozenset({"CUDA_VISIBLE_DEVICES", "DESKPOD_CPU_SLOTS", "MASTER_ADDR", "MASTER_PORT", "DESKPOD_JOB_ID"})
"""Set by the pod service for each job; a spec may not override them."""

MAX_DEVICES = 1024
MAX_PRIORITY = 1000
MAX_RUNTIME_S = 30 * 24 * 3600.0
MAX_RETRIES = 10
MAX_ARGS = 1024
MAX_ARG_CHARS = 8192
MAX_ENV = 256
MAX_TRAIN_CHARS = 32768

FIELDS = ("name", "command", "train", "devices", "placement", "priority", "max_runtime", "retries", "env", "workdir")


@dataclass(frozen=True, slots=True, kw_only=True)
class JobSpec:
    """One job, validated. Exactly one of ``command`` and ``train`` is set."""

    name: str
    """Shown in listings; letters, digits, ``._-``, at most 64 characters."""
    command: tuple[str, ...] = ()
    """The argv to execute (no shell)."""
    train: Mapping[str, Any] | None = None
    """A `deskpod train` config table; the job runs the trainer on it (and resumes from its checkpoint)."""
    devices: int | str = 1
    """A count from 1, or ``"all"`` (resolved to this box's device count at submission)."""
    placement: str = "best"
    """The placement policy: ``best``, ``pack`` or ``partition:<name>``."""
    priority: int = 0
    """Higher runs first and may preempt lower (when the pod allows preemption)."""
    max_runtime: float | None = None
    """Seconds the job may run before it is stopped and marked failed; None: no limit."""
    retries: int = 0
    """How many times a failed or lost job is run again."""
    env: Mapping[str, str] = field(default_factory=dict)
    """Extra environment variables for the job."""
    workdir: str | None = None
    """Absolute working directory; None: the job's folder under ``DESKPOD_HOME``."""

    @property
    def kind(self) -> str:
        return "train" if self.train is not None else "command"

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "name": self.name,
            "devices": self.devices,
            "placement": self.placement,
            "priority": self.priority,
            "max_runtime": self.max_runtime,
            "retries": self.retries,
            "env": dict(self.env),
            "workdir": self.workdir,
        }
        if self.train is not None:
            out["train"] = dict(self.train)
        else:
            out["command"] = list(self.command)
        return out


def _bad(key: str, value: object, valid: str) -> ConfigError:
    shown = repr(value)
    if len(shown) > 80:
        shown = shown[:77] + "..."
    return ConfigError(f"job spec: {key} = {shown} is not valid; {valid}")


def _int(data: Mapping[str, Any], key: str, default: int, lo: int, hi: int) -> int:
    v = data.get(key, default)
    if isinstance(v, bool) or not isinstance(v, int) or not lo <= v <= hi:
        raise _bad(key, v, f"expected a whole number from {lo} to {hi}, e.g. {key} = {max(lo, min(hi, 1))}")
    return v


def _devices(v: object, device_count: int | None) -> int | str:
    if isinstance(v, str) and v.strip().lower() == "all":
        return "all" if device_count is None else device_count
    if isinstance(v, str) and v.strip().isdigit():
        v = int(v.strip())
    if isinstance(v, bool) or not isinstance(v, int) or not 1 <= v <= MAX_DEVICES:
        raise _bad("devices", v, 'expected a count from 1 or "all", e.g. devices = 2')
    return v


def parse_spec(data: object, *, device_count: int | None = None, default_name: str = "job") -> JobSpec:
    """Validate a decoded TOML/JSON object into a `JobSpec`, or raise `ConfigError` naming the problem.

    ``device_count`` resolves ``devices = "all"``; whether the job can ever fit is the placement's
    question, asked by the daemon at submission.
    """
    if not isinstance(data, Mapping):
        raise ConfigError(
            f"job spec: expected an object/table of fields ({', '.join(FIELDS)}), got {type(data).__name__}"
        )
    unknown = sorted(str(k) for k in data if k not in FIELDS)
    if unknown:
        raise ConfigError(f"job spec: unknown field {unknown[0]!r}; valid fields: {', '.join(FIELDS)}")

    has_cmd, has_train = "command" in data, "train" in data
    if has_cmd == has_train:
        raise ConfigError(
            'job spec: give exactly one of command (an argv list, e.g. ["python", "x.py"]) and train (a table)'
        )
    command: tuple[str, ...] = ()
    train: dict[str, Any] | None = None
    if has_cmd:
        cmd = data["command"]
        if (
            not isinstance(cmd, list)
            or not 1 <= len(cmd) <= MAX_ARGS
            or not all(isinstance(a, str) and "\0" not in a and len(a) <= MAX_ARG_CHARS for a in cmd)
            or not cmd[0]
        ):
            raise _bad(
                "command", cmd, f'expected a list of 1 to {MAX_ARGS} strings (argv, no shell), e.g. ["python", "x.py"]'
            )
        command = tuple(cmd)
    else:
        t = data["train"]
        if not isinstance(t, Mapping) or len(json.dumps(t, default=str)) > MAX_TRAIN_CHARS:
            raise _bad("train", t, f"expected a table of deskpod train settings (under {MAX_TRAIN_CHARS} characters)")
        train = dict(t)
        try:
            tomli_w.dumps(train)  # the trainer gets it as a TOML file: null and mixed arrays cannot be written
        except (TypeError, ValueError) as e:
            raise _bad("train", t, f"it must be writable as TOML (no nulls): {e}") from e

    fallback = "train" if train is not None else _name_from_argv(command, default_name)
    name = data.get("name", fallback)
    if not isinstance(name, str) or not NAME_RE.match(name):
        raise _bad(
            "name",
            name,
            "use 1-64 letters, digits, '.', '_' or '-' starting with a letter or digit (no spaces, shell characters or '/')",
        )

    placement = data.get("placement", "best")
    if not isinstance(placement, str) or not re.match(r"^(best|pack|partition:[A-Za-z0-9_-]{1,64})$", placement):
        raise _bad("placement", placement, "use best, pack or partition:<name>")

    max_runtime = data.get("max_runtime")
    if max_runtime is not None and (
        isinstance(max_runtime, bool)
        or not isinstance(max_runtime, int | float)
        or not 0 < max_runtime <= MAX_RUNTIME_S
    ):
        raise _bad(
            "max_runtime",
            max_runtime,
            f"expected seconds above 0 and at most {MAX_RUNTIME_S:.0f}, e.g. max_runtime = 3600",
        )

    env = data.get("env", {})
    if not isinstance(env, Mapping) or len(env) > MAX_ENV:
        raise _bad("env", env, f'expected a table of at most {MAX_ENV} NAME = "value" strings')
    for k, v in env.items():
        if not isinstance(k, str) or not ENV_NAME_RE.match(k):
            raise _bad("env", k, "variable names are letters, digits and '_', not starting with a digit")
        if k in RESERVED_ENV:
            raise _bad("env", k, f"the pod service sets {', '.join(sorted(RESERVED_ENV))} itself")
        if not isinstance(v, str) or "\0" in v or len(v) > MAX_ARG_CHARS:
            raise _bad(f"env.{k}", v, "values are strings (quote numbers), without NUL characters")

    workdir = data.get("workdir")
    if workdir is not None and (
        not isinstance(workdir, str) or not workdir.startswith("/") or "\0" in workdir or len(workdir) > 4096
    ):
        raise _bad("workdir", workdir, 'expected an absolute path, e.g. workdir = "/home/me/project"')

    return JobSpec(
        name=name,
        command=command,
        train=train,
        devices=_devices(data.get("devices", 1), device_count),
        placement=placement,
        priority=_int(data, "priority", 0, -MAX_PRIORITY, MAX_PRIORITY),
        max_runtime=None if max_runtime is None else float(max_runtime),
        retries=_int(data, "retries", 0, 0, MAX_RETRIES),
        env=dict(env),
        workdir=workdir,
    )


def _name_from_argv(command: tuple[str, ...], default: str) -> str:
    """A listing name from the program: ``python x.py`` -> ``x.py``, ``/bin/sleep 5`` -> ``sleep``."""
    parts = [Path(a).name for a in command[:2]]
    pick = parts[1] if len(parts) > 1 and parts[0].startswith("python") and not parts[1].startswith("-") else parts[0]
    cleaned = re.sub(r"[^A-Za-z0-9._-]", "-", pick).strip(".-_")[:64]
    return cleaned if cleaned and NAME_RE.match(cleaned) else default


def load_spec_file(path: Path) -> dict[str, Any]:
    """Read a spec file (``.toml`` or ``.json``) into a plain object for `parse_spec`."""
    try:
        text = path.read_text()
    except OSError as e:
        raise ConfigError(f"job spec {str(path)!r}: cannot read it ({e.strerror})") from e
    try:
        data = json.loads(text) if path.suffix.lower() == ".json" else tomllib.loads(text)
    except (json.JSONDecodeError, tomllib.TOMLDecodeError) as e:
        raise ConfigError(
            f"job spec {str(path)!r}: not valid {'JSON' if path.suffix.lower() == '.json' else 'TOML'}: {e}"
        ) from e
    if not isinstance(data, dict):
        raise ConfigError(f"job spec {str(path)!r}: expected a table of fields")
    return data


SPEC_SCHEMA: dict[str, Any] = {
    "type": "object",
    "additionalProperties": False,
    "properties": {
        "name": {"type": "string", "pattern": NAME_RE.pattern},
        "command": {"type": "array", "items": {"type": "string"}, "minItems": 1, "maxItems": MAX_ARGS},
        "train": {"type": "object"},
        "devices": {
            "oneOf": [{"type": "integer", "minimum": 1, "maximum": MAX_DEVICES}, {"type": "string", "enum": ["all"]}]
        },
        "placement": {"type": "string", "example": "best"},
        "priority": {"type": "integer", "minimum": -MAX_PRIORITY, "maximum": MAX_PRIORITY},
        "max_runtime": {"type": "number", "exclusiveMinimum": 0, "maximum": MAX_RUNTIME_S},
        "retries": {"type": "integer", "minimum": 0, "maximum": MAX_RETRIES},
        "env": {"type": "object", "additionalProperties": {"type": "string"}},
        "workdir": {"type": "string"},
    },
    "example": {"name": "hello", "command": ["python", "-c", "print('hi')"], "devices": 1},
}
"""The request body of ``POST /v1/jobs`` for the OpenAPI document; `parse_spec` is what enforces it."""
