"""Container-image environments: ``[environment] image = "docker.io/..."``, run by podman or enroot.

An image is not built into the environment cache; the job's command runs inside it. deskpod uses the first of
these on PATH (`container_runtime`) and refuses the job at submission where there is neither (`check_image`)::

    podman   podman run --rm --userns=keep-id --network=host --shm-size=8g --workdir W --volume P:P ...
                        --device D ... --env NAME ... IMAGE ARGV...
             rootless; the job keeps its uid (keep-id), sees the host's network (its servers bind 127.0.0.1
             like every deskpod server) and only the writable folders and device nodes it was given.
    enroot   enroot import --output STORE/NAME.sqsh docker://[REGISTRY#]IMAGE   (once per image)
             enroot create --name NAME STORE/NAME.sqsh                          (once per image)
             enroot start --rw --mount P:P ... --env NAME ... NAME /bin/sh -c 'cd "$0" && exec "$@"' W ARGV...
             (enroot has no working-directory option, hence the ``cd``; GPUs go through enroot's NVIDIA hook
             with NVIDIA_VISIBLE_DEVICES, device nodes are bind-mounted.)

Variables are passed by name only (``--env NAME``): both runtimes then take the value from their own
environment, so the argv must be run with ``env`` in its environment, and values (tokens) never show in ``ps``.

Neither runtime exists on deskpod's CI machines, so only the argv built here and the refusal are tested; what
these commands do is the runtimes' documented behaviour (podman-run(1), enroot's doc/cmd/{import,create,start}.md).
"""

from __future__ import annotations

import hashlib
import re
import shutil
from collections.abc import Mapping, Sequence
from pathlib import Path

from deskpod.envs.definition import EnvDefinition
from deskpod.errors import ConfigError

RUNTIMES = ("podman", "enroot")
SHM_SIZE = "8g"
"""podman's default /dev/shm is 64 MB, too small for PyTorch's DataLoader workers."""


def container_runtime(path: str | None = None) -> str | None:
    """``"podman"`` or ``"enroot"``, the first on PATH (or ``path``), or None."""
    return next((name for name in RUNTIMES if shutil.which(name, path=path)), None)


def check_image(defn: EnvDefinition, *, path: str | None = None) -> str:
    """The runtime that will run ``defn``'s image; `ConfigError` when this box has none."""
    assert defn.image is not None, "check_image is for image environments"
    runtime = container_runtime(path)
    if runtime is None:
        raise ConfigError(
            f"job spec: environment.image {defn.image!r} needs a container runtime; this box has neither podman"
            " nor enroot (install one, or use packages/requirements/lock)"
        )
    return runtime


def container_name(image: str) -> str:
    """The name of the enroot container made from ``image``: stable, and safe as a file name."""
    readable = re.sub(r"[^A-Za-z0-9]+", "-", image.split("/")[-1]).strip("-")[:40]
    return f"deskpod-{readable}-{hashlib.sha256(image.encode()).hexdigest()[:12]}"


def enroot_uri(image: str) -> str:
    """``docker.io/library/python:3.11`` -> ``docker://docker.io#library/python:3.11`` (enroot's form)."""
    first, _, rest = image.partition("/")
    if rest and ("." in first or ":" in first or first == "localhost"):
        return f"docker://{first}#{rest}"
    return f"docker://{image}"


def enroot_setup_argv(image: str, store: Path) -> list[list[str]]:
    """The commands that make ``image`` startable by name with enroot: import it, then create the container."""
    name = container_name(image)
    sqsh = store / f"{name}.sqsh"
    return [
        ["enroot", "import", "--output", str(sqsh), enroot_uri(image)],
        ["enroot", "create", "--name", name, str(sqsh)],
    ]


def image_argv(
    runtime: str,
    image: str,
    argv: Sequence[str],
    *,
    writable: Sequence[Path],
    workdir: Path,
    devices: Sequence[str],
    env: Mapping[str, str],
) -> list[str]:
    """The command that runs ``argv`` in ``image`` with ``runtime`` (``podman`` or ``enroot``, or a path to one).

    ``writable``: folders mounted read-write at the same path (the job folder, its workdir); ``devices``: the
    device nodes it may use (``/dev/nvidia0``, ``/dev/nvidiactl``...; CDI names like ``nvidia.com/gpu=0``
    for podman); ``env``: the variables it gets, passed by name (run the result with them set)."""
    name = Path(runtime).name
    if not argv:
        raise ValueError("image_argv needs a command to run")
    if name not in RUNTIMES:
        raise ValueError(f"unknown container runtime {runtime!r}; deskpod knows {', '.join(RUNTIMES)}")
    mount = "--volume" if name == "podman" else "--mount"
    shared = [arg for folder in writable for arg in (mount, f"{folder}:{folder}")]
    names = [arg for key in sorted(env) for arg in ("--env", key)]
    if name == "podman":
        nodes = [arg for device in devices for arg in ("--device", device)]
        return [runtime, "run", "--rm", "--userns=keep-id", "--network=host", f"--shm-size={SHM_SIZE}",
                "--workdir", str(workdir), *shared, *nodes, *names, image, *argv]  # fmt: skip
    nodes = [arg for device in devices if device.startswith("/dev/") for arg in ("--mount", f"{device}:{device}")]
    return [runtime, "start", "--rw", *shared, *nodes, *names, container_name(image), "/bin/sh", "-c",
            'cd "$0" && exec "$@"', str(workdir), *argv]  # fmt: skip
