"""A notebook job: ``[notebook]``, JupyterLab run as the job, reached through the pod at ``/sessions/<id>/lab``::

    [notebook]                  # no fields yet: the job's devices, environment, workdir and max_runtime say the rest

The job's process is this module (``python -m deskpod.jobs.kinds.notebook FOLDER``), run as the job's account in its
sandbox: it writes the job's kernel spec and runs JupyterLab (jupyter-server) on the job folder's Unix socket
(`deskpod.jobs.kinds.session`), under the base path ``/sessions/<id>/``, without a token of its own: the pod signs
people in and forwards only the owner's requests. JupyterLab keeps its cross-site request check (its ``_xsrf``
cookie), and runs with jupyter-collaboration (the sessions extra): the server holds each open notebook and writes it
to its file as it changes, so a session that stops loses nothing the browser had not saved. Its files are the job's ``workdir`` if it has one, else the account's home, so notebooks outlast the job.

The kernel is the job's Python: with an ``[environment]`` the environment's ``python`` (it needs ``ipykernel`` among
its packages), else the pod's own, with the ``sessions`` extra. Kernels talk to the server over Unix sockets in a
private runtime folder (``KernelManager.transport = ipc``), not over loopback ports every account could reach. They
inherit the job's device variables (``CUDA_VISIBLE_DEVICES``, ``DESKPOD_CPU_SLOTS``), so a notebook sees only the
devices it was given.

On a cluster node (the pod's Slurm backend sets `LISTEN_ENV` to the node's address) JupyterLab listens on that address
on a free port instead, asking every request for the secret the pod wrote in the job's folder (`SECRET`, checked by
`deskpod.jobs.kinds.notebook_auth`, read from a file so it is on no command line), and writes where in the folder's
`ENDPOINT`.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
import tempfile
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from deskpod.jobs.kinds.fields import table
from deskpod.jobs.kinds.session import (
    LISTEN_ENV,
    SECRET,
    SECRET_ENV,
    base_path,
    socket_path,
    socket_too_long,
    write_endpoint,
)

ENVIRONMENT = True
SESSION = True
EXTRA: str | None = "sessions"
KERNELS = True
"""Its work runs in Jupyter kernels, which the pod may stop when idle to give the devices back (`deskpod.jobs.culler`)."""
FIELDS: tuple[str, ...] = ()
SCHEMA: dict[str, Any] = {
    "type": "object",
    "additionalProperties": False,
    "properties": {},
    "description": "JupyterLab as the job, reached through the pod at /sessions/<id>/lab (no fields yet)",
}
IDENTITY = "deskpod.jobs.kinds.notebook_auth.SessionSecret"
"""JupyterLab's identity provider on a cluster node: the pod's secret header, or nobody."""
KERNEL = "python3"
"""The kernel spec's name: the one JupyterLab starts by default, so the job's shadows the server's own."""
LAB_OPTIONS = (
    "--no-browser",
    "--ServerApp.allow_remote_access=True",  # the pod forwards with the browser's Host; only the owner gets here
    "--IdentityProvider.token=",  # the pod signs people in: no second token to copy
    "--PasswordIdentityProvider.hashed_password=",
    "--ServerApp.sock_mode=0600",
    "--KernelManager.transport=ipc",
    "--LabApp.news_url=None",  # offline boxes: no news or update checks
    "--LabApp.check_for_updates_class=jupyterlab.NeverCheckForUpdate",
)


def parse(t: object) -> dict[str, Any]:
    table(t, "notebook", FIELDS, "expected a table, e.g. notebook = {} ([notebook] in TOML)")
    return {}


def default_name(notebook: Mapping[str, Any], fallback: str) -> str:
    return "notebook"


def check(notebook: Mapping[str, Any]) -> None:
    """Nothing beyond the extra, which the executor checks: JupyterLab starts in the job."""


def argv(notebook: Mapping[str, Any], name: str, folder: Path) -> list[str]:
    return [sys.executable, "-m", "deskpod.jobs.kinds.notebook", str(folder)]


def kernel_python(environ: Mapping[str, str]) -> str:
    """The kernel's interpreter: the job environment's ``python`` (``VIRTUAL_ENV``), else this one."""
    venv = environ.get("VIRTUAL_ENV")
    if venv:
        found = shutil.which("python", path=str(Path(venv) / "bin"))
        if found:
            return found
    return sys.executable


def write_kernel_spec(data_dir: Path, python: str) -> Path:
    """``<data_dir>/kernels/python3/kernel.json`` running ``python -m ipykernel_launcher``; returns its folder."""
    spec_dir = data_dir / "kernels" / KERNEL
    spec_dir.mkdir(parents=True, exist_ok=True)
    spec = {"argv": [python, "-m", "ipykernel_launcher", "-f", "{connection_file}"], "display_name": "Python 3 (job)",
            "language": "python", "metadata": {"debugger": True}}  # fmt: skip
    (spec_dir / "kernel.json").write_text(json.dumps(spec, indent=1))
    return spec_dir


def lab_argv(folder: Path, root: Path, python: str = sys.executable, *, port: int | None = None,
             host: str = "") -> list[str]:  # fmt: skip
    """JupyterLab for the job in ``folder`` with its files in ``root``: on the folder's socket, or with ``port`` on
    ``host`` (a cluster node's address) behind the secret of `SECRET_ENV` (`deskpod.jobs.kinds.notebook_auth`)."""
    common = [f"--ServerApp.base_url={base_path(folder)}", f"--ServerApp.root_dir={root}"]
    if port is None:
        return [python, "-m", "jupyterlab", *LAB_OPTIONS, f"--ServerApp.sock={socket_path(folder)}", *common]
    options = [o for o in LAB_OPTIONS if not o.startswith("--ServerApp.sock")]
    return [python, "-m", "jupyterlab", *options, f"--ServerApp.ip={host}", f"--ServerApp.port={port}",
            "--ServerApp.port_retries=0", f"--ServerApp.identity_provider_class={IDENTITY}", *common]  # fmt: skip


def main(args: Sequence[str]) -> int:
    """In the job, as its account: the kernel spec, then JupyterLab in this process's place."""
    if len(args) != 1:
        print("usage: python -m deskpod.jobs.kinds.notebook JOB_FOLDER", file=sys.stderr)
        return 2
    folder = Path(args[0])
    if not os.environ.get(LISTEN_ENV) and socket_too_long(folder, "deskpod notebook"):
        return 2
    jupyter = folder / "jupyter"
    write_kernel_spec(jupyter, kernel_python(os.environ))
    cwd = Path.cwd()
    home = Path(os.environ.get("HOME", str(cwd)))
    root = home if cwd == folder and home.is_dir() else cwd  # the workdir, else the account's home
    runtime = tempfile.mkdtemp(prefix="jupyter-")  # 0700; the sandbox's /tmp is its own
    env = {**os.environ, "JUPYTER_PATH": str(jupyter), "JUPYTER_RUNTIME_DIR": runtime,
           "JUPYTER_DATA_DIR": str(jupyter / "data")}  # fmt: skip
    host, port = os.environ.get(LISTEN_ENV), 0
    if host:  # a cluster node: the node's address, a free port, the pod's secret
        from deskpod.environment.network import free_port

        port = free_port(host)
        env[SECRET_ENV] = str(folder / SECRET)
        argv = lab_argv(folder, root, port=port, host=host)
        write_endpoint(folder, host, port)  # before it listens: the pod answers "starting" until it does
    else:
        socket_path(folder).unlink(missing_ok=True)  # a restarted job's stale socket
        argv = lab_argv(folder, root)
    if os.geteuid() == 0:
        argv.append("--allow-root")  # a pod run by root without accounts: its jobs are root's
    where = f"{host}:{port}" if host else "its socket"
    print(f"deskpod: JupyterLab at {base_path(folder)}lab (through the pod; on {where}), files in {root}", flush=True)
    os.execve(argv[0], argv, env)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
