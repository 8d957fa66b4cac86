"""The walls around a job: a bubblewrap sandbox that shows it only what is its own.

Inside `sandbox_argv`'s sandbox a job sees:

* the whole system read-only (``--ro-bind / /``), its own job folder and work directory writable;
* a fresh ``/dev`` with only the device nodes it was given (``/dev/nvidia<N>`` of its GPUs and the
  control nodes), a private ``/tmp`` and ``/dev/shm``;
* nothing of what is hidden: a hidden folder (the pod's home: its database, the token files, other
  users' job folders) is an empty read-only tmpfs, a hidden file is ``/dev/null`` (which, bound
  without device access, cannot even be opened). A path to show inside a hidden folder (the job's own
  folder under the pod's home, its environment in the pod's cache) is bound after it: mounts go in
  order of depth, so the deeper one wins whichever of the two is hidden;
* its own PID, IPC, UTS and cgroup namespaces, so it cannot see or signal other jobs; the network is
  shared (NCCL, Gloo and Slurm need the host's interfaces);
* with an account given, its own user namespace mapping the account's uid/gid onto themselves. bwrap
  must run as that account, unprivileged: either the process that execs the argv has become it
  already (`deskpod.envs.accounts.drop_privileges`, ``Popen(**popen_credentials(account))``), or
  ``switch_user=True`` starts the argv with ``setpriv`` (for a root parent that only spawns). Run as
  root with an account and neither, the job would look like the account inside but be root outside.

The job dies with the process that started bwrap (``--die-with-parent``: the supervisor's shim).

Signals. The pod stops a job with ``killpg`` on the shim's process group, SIGTERM first, so a
preempted trainer can checkpoint. bwrap stays in that group (no ``--new-session``: the shim is a
session leader without a terminal, so there is no terminal to inject keystrokes into), so the job
gets the signal. But bwrap itself would die of it, and ``--die-with-parent`` would then SIGKILL the
job before its handler ran. So the argv starts bwrap through ``env --ignore-signal`` for the
signals a pod or user sends to a group (bwrap ignores them; it exits when the job does, with the
job's code, 128+N for a signal), and the job through ``env --default-signal``, so it starts with
every signal at its default, as it would outside.
"""

from __future__ import annotations

import errno
import functools
import os
import re
import shutil
import subprocess
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from deskpod.envs.accounts import Account, as_account_argv, popen_credentials
from deskpod.errors import ConfigError, DeviceError, RunError

CONTROL_NODES = ("nvidiactl", "nvidia-uvm", "nvidia-uvm-tools", "nvidia-modeset")
"""The NVIDIA driver's shared nodes: every CUDA process opens ``nvidiactl`` and ``nvidia-uvm``
(unified memory); ``nvidia-uvm-tools`` serves profilers, ``nvidia-modeset`` display work."""

GROUP_SIGNALS = ("TERM", "INT", "HUP", "QUIT", "USR1", "USR2")
"""Signals whose default action would end bwrap when sent to the job's process group (stop,
interrupt, checkpoint requests); bwrap ignores them so that only the job decides what they do."""

_DEVICE_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.+-]*(/[A-Za-z0-9][A-Za-z0-9_.+-]*)*$")


def bwrap_path() -> str | None:
    """Where bubblewrap's ``bwrap`` is on PATH; None when it is not installed."""
    return shutil.which("bwrap")


def gpu_device_nodes(indices: Iterable[int], dev_root: Path = Path("/dev")) -> tuple[str, ...]:
    """The device node names a job given GPUs ``indices`` needs: ``nvidia<i>`` per index (in the order
    given), then the `CONTROL_NODES` that exist under ``dev_root``."""
    nodes: list[str] = []
    for i in indices:
        if isinstance(i, bool) or not isinstance(i, int) or i < 0:
            raise DeviceError(f"GPU index {i!r} is not valid; expected a non-negative integer like 0")
        if f"nvidia{i}" not in nodes:
            nodes.append(f"nvidia{i}")
    return (*nodes, *(n for n in CONTROL_NODES if os.path.lexists(dev_root / n)))


@dataclass(frozen=True, slots=True)
class Walls:
    """What a job may see and touch; every path absolute."""

    writable: tuple[Path, ...] = ()
    """Bound read-write at the same path: the job folder, the work directory. Each must exist."""
    hidden: tuple[Path, ...] = ()
    """Made invisible: a folder becomes an empty read-only tmpfs, a file ``/dev/null``; one that does
    not exist is skipped. Writable and read-only paths inside a hidden folder still appear."""
    devices: tuple[str, ...] = ()
    """Device node names under ``dev_root`` to show at ``/dev/<name>`` (``nvidia3``, ``nvidiactl``);
    missing ones are skipped. Every other node of ``dev_root`` stays out."""
    dev_root: Path = Path("/dev")
    """Where device nodes are taken from (tests use a folder of plain files standing in for GPUs)."""
    extra_ro: tuple[Path, ...] = ()
    """Bound read-only, for paths inside a hidden folder the job must read. Each must exist."""
    binds: tuple[tuple[int, Path, bool], ...] = ()
    """``(fd, where, writable)``: an open folder shown at ``where`` (``--bind-fd``). The caller opened it, e.g.
    with the job's account's rights (`deskpod.envs.accounts.as_account`), so the folder shown is the folder that
    was checked, whatever the path names by the time bubblewrap runs; the descriptor must reach bwrap
    (inheritable)."""

    def __post_init__(self) -> None:
        for p in (*self.writable, *self.hidden, *self.extra_ro, *(b[1] for b in self.binds), self.dev_root):
            if not Path(p).is_absolute():
                raise ConfigError(f"sandbox path {str(p)!r} is not absolute; expected a path like /srv/job")
        for name in self.devices:
            if not _DEVICE_NAME.match(name) or ".." in name.split("/"):
                raise ConfigError(f"device node {name!r} is not a name under /dev; expected one like nvidia0")


def _mounts(walls: Walls, env_dir: Path | None, *, open_parents: bool = False) -> list[str]:
    """The hide/show binds, shallow first (a deeper mount lands on top), then the hidden folders made read-only.

    ``open_parents``: bwrap runs as root, so the folders it makes inside a tmpfs on the way to a shown path
    would be root's and closed (0700) to the job's account; make them 0755 first (``--perms 0755 --dir``).
    """
    shown: dict[str, list[str]] = {}  # where -> the bwrap arguments that show it there
    for kind, paths in (("--ro-bind", (*walls.extra_ro, *((env_dir,) if env_dir else ()))), ("--bind", walls.writable)):
        for p in paths:
            if not os.path.lexists(p):
                raise RunError(f"cannot sandbox the job: {p} does not exist (it was to be shown {kind[2:]})")
            shown[os.path.realpath(p)] = [kind, os.path.realpath(p)]  # read-write wins over read-only at the same path
    for fd, where, writable in walls.binds:
        shown[os.path.normpath(where)] = ["--bind-fd" if writable else "--ro-bind-fd", str(fd)]
    ops: list[tuple[int, int, str, list[str]]] = []
    hidden_dirs: list[str] = []
    for p in walls.hidden:
        real = os.path.realpath(p)
        if real in shown:
            raise ConfigError(f"sandbox path {p} is both hidden and shown; list it in one of the two")
        if real == "/" or not os.path.lexists(real):
            continue
        if os.path.isdir(real):
            ops.append((real.count("/"), 0, real, ["--tmpfs", real]))
            hidden_dirs.append(real)
        else:
            ops.append((real.count("/"), 0, real, ["--ro-bind", "/dev/null", real]))
    made = {"/", *shown}
    covers = [*hidden_dirs, "/tmp", "/dev/shm"]  # tmpfs the sandbox lays over the host's folders
    for real, source in shown.items():
        parents: list[str] = []
        if open_parents:
            for parent in reversed(Path(real).parents):
                top = str(parent)
                under = any(top != h and top.startswith(h.rstrip("/") + "/") for h in covers)
                if under and top not in made:
                    parents += ["--perms", "0755", "--dir", top]
                    made.add(top)
        ops.append((real.count("/"), 1, real, [*parents, *source, real]))
    out = [arg for *_, args in sorted(ops) for arg in args]
    for d in sorted(hidden_dirs, key=lambda d: d.count("/"), reverse=True):
        out += ["--remount-ro", d]
    return out


def sandbox_argv(
    walls: Walls,
    argv: Sequence[str],
    *,
    account: Account | None,
    env_dir: Path | None = None,
    cwd: Path | None = None,
    bwrap: str | None = None,
    switch_user: bool = False,
) -> list[str]:
    """The command line that runs ``argv`` inside ``walls``.

    ``account``: the account the caller will have become before exec'ing this (None: run as the
    caller, e.g. a daemon serving its own user). ``env_dir``: the job's environment, shown read-only.
    ``cwd``: where the job starts (default: where the caller is). ``bwrap``: the binary (default: PATH).
    ``switch_user``: the caller is root; bwrap runs as root (so it can show paths under folders closed to
    the account, such as an interpreter under ``/root``), then ``setpriv`` inside the sandbox becomes
    ``account`` (uid, gid, groups, no new privileges) right before the job starts.
    `RunError` when bwrap (or setpriv) is not installed or a path to show does not exist.
    """
    if not argv:
        raise ConfigError("nothing to run in the sandbox: the command is empty")
    bwrap = bwrap or bwrap_path()
    if bwrap is None:
        raise RunError(
            "bubblewrap is not installed, so jobs cannot be sandboxed; install it (apt-get install bubblewrap)"
        )
    env = shutil.which("env") or "/usr/bin/env"
    out = [env, *(f"--ignore-signal={s}" for s in GROUP_SIGNALS), "--", bwrap]
    out += ["--ro-bind", "/", "/", "--dev", "/dev"]
    for name in walls.devices:
        out += ["--dev-bind-try", str(walls.dev_root / name), f"/dev/{name}"]
    # 1777: with switch_user bwrap runs as root, and a tmpfs it makes is root's 0755, closed to the account
    out += ["--proc", "/proc", "--perms", "1777", "--tmpfs", "/tmp", "--perms", "1777", "--tmpfs", "/dev/shm"]
    if switch_user and account is None:
        raise ConfigError("switch_user=True needs the account to switch to")
    out += _mounts(walls, env_dir, open_parents=switch_user)
    out += ["--unshare-pid", "--unshare-ipc", "--unshare-uts", "--unshare-cgroup-try", "--die-with-parent"]
    if account is not None and not switch_user:
        out += ["--unshare-user", "--uid", str(account.uid), "--gid", str(account.gid)]
    if cwd is not None:
        out += ["--chdir", os.path.realpath(cwd)]
    inner = [env, "--default-signal", "--", *argv]
    if switch_user and account is not None:
        inner = as_account_argv(account, inner, no_new_privs=True)
    return [*out, "--", *inner]


@functools.cache
def check_sandbox(account: Account | None = None) -> str | None:
    """None when bwrap can build `sandbox_argv`'s sandbox here, run as ``account`` (None: as this
    process); otherwise one line saying why not. Tried once per account, then remembered.

    Probe as a job account: where unprivileged user namespaces are disabled bwrap works for root only.
    """
    bwrap = bwrap_path()
    if bwrap is None:
        return "bubblewrap (bwrap) is not installed; install it (apt-get install bubblewrap) to sandbox jobs"
    who = f" as OS account {account.name!r}" if account is not None else ""
    argv = sandbox_argv(Walls(), ["true"], account=account, cwd=Path("/"), bwrap=bwrap)
    creds: dict[str, Any] = {}
    if account is not None and account.uid != os.geteuid():
        creds = dict(popen_credentials(account))
    try:
        done = subprocess.run(argv, stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=60, **creds)
    except subprocess.TimeoutExpired:
        return f"bwrap did not finish a trial sandbox{who} within 60 s"
    except OSError as e:
        return f"cannot start bwrap{who}: {e.strerror or errno.errorcode.get(e.errno or 0, str(e))}"
    if done.returncode != 0:
        lines = [line for line in done.stderr.strip().splitlines() if line.strip()]
        why = lines[-1].strip() if lines else f"exit code {done.returncode}"
        return f"bwrap cannot make a sandbox here{who}: {why}"
    return None
