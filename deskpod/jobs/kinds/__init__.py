"""What a job runs: one module per kind, each owning its table of the spec, its checks and their messages, what
it needs before it starts, and the argv it runs.

The spec (`deskpod.jobs.spec`) holds what every job has (name, devices, priority, ...) and exactly one kind's
field, which the kind's module parses; the pod, the CLI, the API and the dashboard all go through it, so a
kind's argv is built in one place. A kind is a module with this shape (`Kind`)::

    command   command = ["python", "x.py"]          the argv itself (kinds/command.py)
    train     [train] model = "resnet18" ...         deskpod train on the table, resumed (kinds/train.py)
    serve     [serve] run = "/abs/runs/NAME" ...     export the run if new, then deskpod serve (kinds/serve.py)
    video     [video] sources = ["/abs/cam.mp4"] ...  deskpod video index, its figures to a file (kinds/video.py)
    notebook  [notebook]                             JupyterLab, reached through the pod (kinds/notebook.py)
    shell     [shell]                                a shell in a pty, a WebSocket through the pod (kinds/shell.py)
    tensorboard [tensorboard] runs = ["/abs/runs/a"]  TensorBoard over runs, no devices (kinds/tensorboard.py)

A session kind (``SESSION = True``: notebook, shell, tensorboard) serves people rather than finishing work: its process answers HTTP on
the Unix socket `deskpod.jobs.kinds.session.SOCKET` in its folder, and the pod forwards ``/sessions/<id>/`` there.

``deskpod run --submit`` queues a command job whose argv is ``deskpod run ...`` (kinds/run.py builds it).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Protocol

from deskpod.jobs.kinds import command, notebook, serve, shell, tensorboard, train, video


class Kind(Protocol):
    """One kind of job (a module). ``value`` is its field of a spec: what ``parse`` made of it."""

    SCHEMA: dict[str, Any]
    """Its field's JSON Schema, for the OpenAPI document (``parse`` enforces it, with the one-line messages)."""
    ENVIRONMENT: bool
    """Whether it runs the user's own code, so that the spec's ``[environment]`` or ``stack`` applies."""
    SESSION: bool
    """Whether it is a session (see above): an HTTP server on its folder's socket, proxied by the pod."""
    EXTRA: str | None
    """The install extra its process needs on the box that runs it (``deskpod[serve]``, ...), or None: the core."""

    def parse(self, value: object) -> Any: ...
    def default_name(self, value: Any, fallback: str) -> str: ...
    def check(self, value: Any) -> None:
        """What a pod that runs jobs as itself refuses at submission (`ConflictError`): what it could not start."""

    def argv(self, value: Any, name: str, folder: Path) -> list[str]:
        """The command line job ``name`` runs in its ``folder`` (writing there what the command line names)."""


KINDS: dict[str, Kind] = {
    "command": command, "train": train, "serve": serve, "video": video, "notebook": notebook, "shell": shell,
    "tensorboard": tensorboard,
}  # fmt: skip
"""A spec has exactly one of these fields; it says what the job runs."""
