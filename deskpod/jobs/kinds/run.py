"""A ``deskpod run`` job: your own training script once per device, through deskpod's launcher. On the pod it is a
command job (`deskpod.jobs.kinds.command`) whose argv is ``deskpod run ...`` with the script and its arguments;
`spec` builds it, for ``deskpod run --submit`` and anyone else who queues one."""

from __future__ import annotations

import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from deskpod.errors import ConfigError
from deskpod.hardware.devices import parse_device_spec
from deskpod.train.runs import NAME_HELP, NAME_RE


def spec(target: Sequence[str], *, devices: str = "all", max_restarts: int = 0, name: str | None = None,
         stall_after_s: float = 300.0, workdir: str) -> dict[str, Any]:  # fmt: skip
    """The job that runs ``target`` (``[script, args...]`` or ``["-m", module, args...]``, checked by
    `deskpod.train.script.check_target`) on ``devices`` (``all``, a count, or indices: then as many), in
    ``workdir``."""
    from deskpod.train.script import check_target, default_name

    target = list(check_target(list(target), Path(workdir)))
    name = name or default_name(target)
    if not NAME_RE.match(name):
        raise ConfigError(f"--name {name!r}: use {NAME_HELP}")
    text = str(devices).strip().lower()
    count: int | str
    if text == "all":
        count = "all"
    elif text.isascii() and text.isdigit():  # "¹".isdigit() too, which int() refuses
        count = int(text)
    else:  # a list names this box's devices; the pod chooses them itself, so it asks for as many
        count = len(parse_device_spec(text, 1 << 16))
    command = [sys.executable, "-m", "deskpod", "run", "--devices", str(count), "--max-restarts", str(max_restarts),
               "--name", name, "--stall-after", str(stall_after_s), *target]  # fmt: skip
    return {"name": name, "command": command, "devices": count, "workdir": workdir}
