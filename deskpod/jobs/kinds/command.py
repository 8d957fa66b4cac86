"""A command job: ``command = ["python", "x.py"]``, an argv run as it is (no shell)."""

from __future__ import annotations

import re
import sys
from pathlib import Path
from typing import Any

from deskpod.jobs.kinds.fields import bad
from deskpod.train.runs import NAME_MAX, NAME_RE

MAX_ARGS = 1024
MAX_ARG_CHARS = 8192
NO_NUL = "^[^\\u0000]*$"
"""A string without NUL characters (JSON Schema pattern)."""

ENVIRONMENT = True
SESSION = False
EXTRA: str | None = None
SCHEMA: dict[str, Any] = {
    "type": "array",
    "items": {"type": "string", "pattern": NO_NUL, "maxLength": MAX_ARG_CHARS},
    # prefixItems replaces items for the first: it repeats them, and the program is not empty
    "prefixItems": [{"type": "string", "pattern": NO_NUL, "minLength": 1, "maxLength": MAX_ARG_CHARS}],
    "minItems": 1,
    "maxItems": MAX_ARGS,
    "description": "the argv to execute (no shell); the program, first, is not empty",
}


def parse(cmd: object) -> tuple[str, ...]:
    if (
        not isinstance(cmd, list)
        or not 1 <= len(cmd) <= MAX_ARGS
        or not all(isinstance(a, str) and "\0" not in a and len(a) <= MAX_ARG_CHARS for a in cmd)
        or not cmd[0]
    ):
        raise bad(
            "command", cmd, f'expected a list of 1 to {MAX_ARGS} strings (argv, no shell), e.g. ["python", "x.py"]'
        )
    return tuple(cmd)


def default_name(command: tuple[str, ...], fallback: str) -> str:
    """A listing name from the program: ``python x.py`` -> ``x.py``, ``/bin/sleep 5`` -> ``sleep``."""
    parts = [Path(a).name for a in command[:2]]
    pick = parts[1] if len(parts) > 1 and parts[0].startswith("python") and not parts[1].startswith("-") else parts[0]
    cleaned = re.sub(r"[^A-Za-z0-9._-]", "-", pick).strip(".-_")[:NAME_MAX]
    return cleaned if cleaned and NAME_RE.match(cleaned) else fallback


def build_argv(cache: Path, definition: Path, log: Path, python: Path) -> list[str]:
    """What a job whose ``[environment]`` is not built yet runs first, as its account: ``deskpod env build`` of the
    ``definition`` file into the account's ``cache`` with the ``python`` interpreter, its output to ``log``."""
    return [sys.executable, "-m", "deskpod", "env", "build", "--cache", str(cache), "--definition", str(definition),
            "--log", str(log), "--python", str(python)]  # fmt: skip


def check(command: tuple[str, ...]) -> None:
    """Nothing: the command's program is looked for when it starts (in its environment, which it may build)."""


def argv(command: tuple[str, ...], name: str, folder: Path) -> list[str]:
    return list(command)
