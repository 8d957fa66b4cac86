"""A job spec: what to run, on how many devices, and how to treat it — validated where it enters.

A spec arrives as TOML (``deskpod submit job.toml``), JSON (the HTTP body) or CLI flags, and always
ends up as one `JobSpec` through `parse_spec`. Everything a spec names is checked here, before the
daemon stores it, so nothing is ever executed from a bad spec::

    name = "resnet-sweep-3"          # letters, digits, . _ - (no shell metacharacters, no path separators)
    command = ["python", "x.py"]     # an argv list, never run through a shell ... or a [train] table,
                                     # or a [serve] table: serve a run's model until the job is stopped
                                     # or a [video] table: index camera streams (deskpod video index)
    devices = 2                      # a count, or "all"
    device_kind = "cuda"             # or "cpu": the kind of device it needs (default: whatever the pod has)
    placement = "best"               # best | pack | partition:<name>
    priority = 0                     # higher runs first (-1000..1000)
    max_runtime = 3600               # seconds; the job is stopped (and fails) past it
    retries = 1                      # re-runs after a failure or a lost process
    workdir = "/abs/path"            # default: the job's own folder
    nodes = 1                        # on a cluster backend (Slurm): nodes, each with `devices` GPUs
    [env]
    SEED = "1"
    stack = "pytorch-2.14"           # or: a fleet's stack (deskpod.fleet.stacks), its current version's environment
    [environment]                    # the job's own Python and packages (deskpod.envs), built once, cached
    requirements = "requirements.txt"    # or lock = "uv.lock" / pyproject = "pyproject.toml" / packages = [...]
    python = "3.11"                      # or image = "docker.io/..." (needs podman or enroot)
    [slurm]                          # only read where the job goes to Slurm
    partition = "gpu"                # default: the cluster's default partition
    account = "proj"                 # and qos = "..."
    signal_before_s = 120            # SIGUSR2 this long before the time limit: checkpoint, requeue
    max_requeues = 20                # requeues after a preemption or a time-limit warning
    max_node_failures = 3            # requeues after a node failure (failures use `retries`)
    stage_data = true                # copy the dataset to node-local scratch first
    scratch = "/local/scratch"       # where (default /tmp/deskpod-scratch); scratch_limit_gb = 500
    env_cache = "/shared/envs"       # where nodes build [environment]s (default ~/.deskpod/envs)

What a job runs is its kind's business: its field (``command``, ``[train]``, ``[serve]`` or ``[video]``) is parsed, checked and
turned into an argv by its module in `deskpod.jobs.kinds`.
"""

from __future__ import annotations

import json
import re
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from deskpod.envs.definition import ENVIRONMENT_SCHEMA, IMAGE_RE, EnvDefinition, parse_environment
from deskpod.envs.definition import KINDS as ENV_KINDS
from deskpod.errors import ConfigError
from deskpod.jobs.kinds import KINDS as KIND_MODULES
from deskpod.jobs.kinds.command import MAX_ARG_CHARS, NO_NUL
from deskpod.jobs.kinds.fields import absolute_path, bad, integer, no_nulls, table, whole
from deskpod.train.runs import NAME_HELP, NAME_RE

ENV_NAME_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,127}$")
RESERVED_ENV = frozenset(
    {"CUDA_VISIBLE_DEVICES", "DESKPOD_CPU_SLOTS", "MASTER_ADDR", "MASTER_PORT", "DESKPOD_JOB_ID", "DESKPOD_JOB_DIR"}
)
"""Set by the pod service for each job; a spec may not override them."""
LOADER_ENV = frozenset({"GCONV_PATH", "GETCONF_DIR", "GLIBC_TUNABLES", "HOSTALIASES", "LOCALDOMAIN", "LOCPATH",
                        "MALLOC_TRACE", "NIS_PATH", "NLSPATH", "RESOLV_HOST_CONF", "RES_OPTIONS", "TZDIR"})  # fmt: skip
"""With every ``LD_*``: the variables that make the C library's loader load other code or files — glibc's own list
of what it ignores in a set-user-ID program (``sysdeps/generic/unsecvars.h``, less TMPDIR). A job's variables only
ever reach its own process, after the drop to its account (`deskpod.jobs.shim`); these are refused as well, so
that no change there can let a user's library into code that runs as root. A job that needs one sets it in its
command (``command = ["env", "LD_LIBRARY_PATH=/opt/lib", "python", "x.py"]``)."""


def loader_variable(name: str) -> bool:
    """Whether ``name`` is one of the C library loader's variables (`LOADER_ENV`)."""
    return name.startswith("LD_") or name in LOADER_ENV


MAX_DEVICES = 1024
MAX_PRIORITY = 1000
MAX_RUNTIME_S = 30 * 24 * 3600.0
MAX_RETRIES = 10
MAX_ENV = 256

KINDS = tuple(KIND_MODULES)
"""A spec has exactly one of these fields; it says what the job runs (`deskpod.jobs.kinds`)."""
_OWN = [k for k, m in KIND_MODULES.items() if m.ENVIRONMENT]
OWN_CODE = f"{', '.join(_OWN[:-1])} and {_OWN[-1]}" if len(_OWN) > 1 else _OWN[0]
"""The kinds that run the user's own code, in the job's ``[environment]`` or ``stack`` (the rest run deskpod)."""
FIELDS = (
    "name", *KINDS, "devices", "placement", "priority", "max_runtime", "retries", "env", "workdir", "nodes", "slurm",
    "environment", "stack", "device_kind",
)  # fmt: skip
STACK_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}(@v[1-9][0-9]{0,8})?$")
"""A stack's name (``pytorch-2.14``), or a version of it (``pytorch-2.14@v3``: the form a fleet stores)."""
MAX_NODES = 4096
DEVICE_KINDS = ("cuda", "cpu")
"""What ``device_kind`` may say: GPUs (``cuda``), or CPU worker slots (``cpu``), as a pod's status names its devices."""
SLURM_FIELDS = ("partition", "account", "qos", "signal_before_s", "max_requeues", "max_node_failures", "stage_data",
                "scratch", "scratch_limit_gb", "env_cache")  # fmt: skip
SLURM_DEFAULTS: dict[str, Any] = {"signal_before_s": 120, "max_requeues": 20, "max_node_failures": 3,
                                  "stage_data": False, "scratch": "/tmp/deskpod-scratch"}  # fmt: skip


@dataclass(frozen=True, slots=True, kw_only=True)
class JobSpec:
    """One job, validated. Exactly one kind's field (`KINDS`: ``command``, ``train``, ...) is set."""

    name: str
    """Shown in listings; letters, digits, ``._-``, at most `NAME_MAX` (64) characters: a train job's run folder
    is named after it."""
    command: tuple[str, ...] = ()
    """The argv to execute (no shell)."""
    train: Mapping[str, Any] | None = None
    """A `deskpod train` config table; the job runs the trainer on it (and resumes from its checkpoint)."""
    serve: Mapping[str, Any] | None = None
    """What to serve (every key of `SERVE_FIELDS` filled in): the job exports the run and serves it."""
    video: Mapping[str, Any] | None = None
    """What to index (`deskpod.jobs.kinds.video`): the job runs ``deskpod video index`` on its streams."""
    notebook: Mapping[str, Any] | None = None
    """A JupyterLab session (`deskpod.jobs.kinds.notebook`), reached through the pod at ``/sessions/<id>/``."""
    shell: Mapping[str, Any] | None = None
    """A shell in a pty (`deskpod.jobs.kinds.shell`), a WebSocket through the pod at ``/sessions/<id>/terminal``."""
    tensorboard: Mapping[str, Any] | None = None
    """TensorBoard over runs (`deskpod.jobs.kinds.tensorboard`), through the pod at ``/sessions/<id>/``."""
    devices: int | str = 1
    """A count from 1, or ``"all"`` (resolved to this box's device count at submission); 0 for a kind that holds
    none (its module's ``DEVICES = 0``: tensorboard), and only for such a kind."""
    device_kind: str | None = None
    """The kind of device the job needs (`DEVICE_KINDS`): a pod of the other kind refuses it, and a fleet sends it
    only to members of that kind. None: whatever the pod has."""
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
    nodes: int = 1
    """Nodes of a cluster backend, each running ``devices`` devices; a single box has one."""
    slurm: Mapping[str, Any] = field(default_factory=dict)
    """How the job goes to Slurm (`SLURM_FIELDS`, defaults filled in); ignored by a local pod."""
    environment: EnvDefinition | None = None
    """The job's own software environment (`deskpod.envs`); None: the daemon's own Python."""
    stack: str | None = None
    """The fleet stack the job runs in: ``NAME`` as submitted, ``NAME@vN`` once a fleet resolved it (with
    ``environment`` then that version's). Only a fleet takes it (`deskpod.fleet.stacks`); a plain pod refuses it."""
    refused: str | None = None
    """Why a spec the store kept is no longer accepted (`stored_spec`): such a job is listed, never run."""

    @property
    def kind(self) -> str:
        return next((k for k in KINDS[1:] if getattr(self, k) is not None), "command")

    @property
    def what(self) -> Any:
        """The kind's field: the command, or the kind's table."""
        return self.command if self.kind == "command" else getattr(self, self.kind)

    def argv(self, folder: Path) -> list[str]:
        """The command line the job runs in its ``folder``: its kind's (`deskpod.jobs.kinds`)."""
        return KIND_MODULES[self.kind].argv(self.what, self.name, folder)

    def check(self) -> None:
        """What a pod that runs jobs as itself refuses at submission: what its kind could not start here."""
        KIND_MODULES[self.kind].check(self.what)

    def to_json(self) -> dict[str, Any]:
        """The canonical form, as the store keeps it and the API shows it: a spec `parse_spec` takes back unchanged
        (a field that is not set is left out, never null: the parser, like the API's schema, refuses null)."""
        out: dict[str, Any] = {
            "name": self.name,
            "devices": self.devices,
            "placement": self.placement,
            "priority": self.priority,
            "retries": self.retries,
            "env": dict(self.env),
        }
        environment = None if self.environment is None else self.environment.to_json()
        unless_unset = {"max_runtime": self.max_runtime, "workdir": self.workdir,
                        "nodes": self.nodes if self.nodes != 1 else None, "device_kind": self.device_kind,
                        "slurm": dict(self.slurm) or None, "environment": environment, "stack": self.stack}  # fmt: skip
        out.update((k, v) for k, v in unless_unset.items() if v is not None)
        out[self.kind] = list(self.command) if self.kind == "command" else dict(self.what)
        return out


def without_nulls(data: object) -> object:
    """A spec stored before `JobSpec.to_json` left unset fields out (it wrote them as null), as `parse_spec` takes
    it."""
    if not isinstance(data, Mapping):
        return data
    out = {k: v for k, v in data.items() if v is not None}
    if isinstance(out.get("slurm"), Mapping):
        out["slurm"] = {k: v for k, v in out["slurm"].items() if v is not None}
    return out


def _fixed(data: Mapping[str, Any], fixed: int, kind: str) -> int:
    """The ``devices`` of a kind that always holds ``fixed`` of them (`deskpod.jobs.kinds.tensorboard.DEVICES`)."""
    v = whole(data.get("devices", fixed))
    if isinstance(v, bool) or v not in (fixed, str(fixed)):
        raise bad("devices", v, f"a {kind} job holds {fixed} devices; leave devices out")
    return fixed


def _devices(v: object, device_count: int | None) -> int | str:
    v = whole(v)
    if isinstance(v, str) and v.strip().lower() == "all":
        return "all" if device_count is None else device_count
    text = v.strip() if isinstance(v, str) else ""
    if 0 < len(text) <= 9 and text.isascii() and text.isdigit():  # "²".isdigit() is True; int() refuses it
        v = int(text)
    if isinstance(v, bool) or not isinstance(v, int) or not 1 <= v <= MAX_DEVICES:
        raise bad("devices", v, 'expected a count from 1 or "all", e.g. devices = 2')
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
    no_nulls(data, "")

    given = [k for k in KINDS if k in data]
    if len(given) != 1:
        raise ConfigError(
            'job spec: give exactly one of command (an argv list, e.g. ["python", "x.py"]), train (a table of'
            " deskpod train settings), serve (a table with run = PATH), video (a table with sources = [...]) and"
            " notebook, shell (tables, e.g. {}) and tensorboard (a table with runs = [...]);"
            f" got {' and '.join(given) or 'none'}"
        )
    kind = KIND_MODULES[given[0]]
    value = kind.parse(data[given[0]])
    fixed: int | None = getattr(kind, "DEVICES", None)
    name = data.get("name", kind.default_name(value, default_name))
    if not isinstance(name, str) or not NAME_RE.match(name):
        raise bad(
            "name",
            name,
            f"use {NAME_HELP} (no spaces, shell characters or '/')",
        )

    placement = data.get("placement", "best")
    if not isinstance(placement, str) or not re.match(r"^(best|pack|partition:[A-Za-z0-9_-]{1,64})$", placement):
        raise bad("placement", placement, "use best, pack or partition:<name>")

    max_runtime = data.get("max_runtime")
    if max_runtime is not None and (
        isinstance(max_runtime, bool)
        or not isinstance(max_runtime, int | float)
        or not 0 < max_runtime <= MAX_RUNTIME_S
    ):
        raise bad(
            "max_runtime",
            max_runtime,
            f"expected seconds above 0 and at most {MAX_RUNTIME_S:.0f}, e.g. max_runtime = 3600",
        )

    env = data.get("env", {})
    if not isinstance(env, Mapping) or len(env) > MAX_ENV:
        raise bad("env", env, f'expected a table of at most {MAX_ENV} NAME = "value" strings')
    for k, v in env.items():
        if not isinstance(k, str) or not ENV_NAME_RE.match(k):
            raise bad("env", k, "variable names are letters, digits and '_', not starting with a digit")
        if k in RESERVED_ENV:
            raise bad("env", k, f"the pod service sets {', '.join(sorted(RESERVED_ENV))} itself")
        if loader_variable(k):
            raise bad(
                "env",
                k,
                "the C library loader's variables (LD_*, GLIBC_TUNABLES, GCONV_PATH, ...) are not accepted in"
                f' a job spec; set it in the command instead, e.g. command = ["env", "{k}=...", "python", "x.py"]',
            )
        if not isinstance(v, str) or "\0" in v or len(v) > MAX_ARG_CHARS:
            raise bad(f"env.{k}", v, "values are strings (quote numbers), without NUL characters")

    device_kind = data.get("device_kind")
    if device_kind is not None and device_kind not in DEVICE_KINDS:
        raise bad(
            "device_kind", device_kind, 'use "cuda" (GPUs) or "cpu" (CPU worker slots), e.g. device_kind = "cuda"'
        )

    workdir = data.get("workdir")
    if workdir is not None and not absolute_path(workdir):
        raise bad("workdir", workdir, 'expected an absolute path, e.g. workdir = "/home/me/project"')

    return JobSpec(
        name=name,
        **{given[0]: value},
        devices=_devices(data.get("devices", 1), device_count) if fixed is None else _fixed(data, fixed, given[0]),
        device_kind=device_kind,
        placement=placement,
        priority=integer(data, "priority", 0, -MAX_PRIORITY, MAX_PRIORITY),
        max_runtime=None if max_runtime is None else float(max_runtime),
        retries=integer(data, "retries", 0, 0, MAX_RETRIES),
        env=dict(env),
        workdir=workdir,
        nodes=integer(data, "nodes", 1, 1, MAX_NODES),
        slurm=_slurm(data["slurm"]) if "slurm" in data else {},
        environment=_environment(data.get("environment"), not kind.ENVIRONMENT),
        stack=_stack(data.get("stack"), not kind.ENVIRONMENT, "environment" in data),
    )


def stored_spec(data: object) -> JobSpec:
    """A spec as the store keeps it, validated again. One that was accepted when it was stored but that today's
    rules refuse (a loader variable in its ``env``, an environment from a local path) is kept for listings
    without its ``env`` and ``environment``, with `JobSpec.refused` saying why: it never runs."""
    data = without_nulls(data)
    try:
        return parse_spec(data)
    except ConfigError as e:
        if not isinstance(data, Mapping) or not {"env", "environment"} & set(data):
            raise
        kept = parse_spec({k: v for k, v in data.items() if k not in ("env", "environment")})
        return JobSpec(**{**{f: getattr(kept, f) for f in kept.__dataclass_fields__}, "refused": str(e)})


def _environment(table: object, deskpod_job: bool) -> EnvDefinition | None:
    """The ``[environment]`` table; file values must arrive as ``{"file", "text"}`` (the CLI reads them)."""
    if table is None:
        return None
    if deskpod_job:
        raise ConfigError(
            f"job spec: environment applies to {OWN_CODE} jobs; a train, serve or video job runs deskpod itself, in"
            ' the daemon\'s Python (for your own script in your own packages: command = ["python", "train.py"])'
        )
    return parse_environment(table)


def _stack(name: object, deskpod_job: bool, with_environment: bool) -> str | None:
    """The ``stack`` field: a stack's name, or ``NAME@vN`` (with that version's environment, as a fleet stores it)."""
    if name is None:
        return None
    if not isinstance(name, str) or not STACK_RE.match(name):
        raise bad(
            "stack", name, 'expected the name of a fleet\'s stack, e.g. stack = "pytorch-2.14" (or "pytorch-2.14@v3")'
        )
    if deskpod_job:
        raise ConfigError(f"job spec: stack applies to {OWN_CODE} jobs; a train, serve or video job runs deskpod itself,"
                          " in the daemon's Python")  # fmt: skip
    if with_environment and "@" not in name:
        raise ConfigError(
            f"job spec: give stack = {name!r} or an [environment], not both: the stack is the environment"
        )
    return name


def _slurm(t: object) -> dict[str, Any]:
    """The ``[slurm]`` table, checked, with its defaults filled in."""
    slurm = table(t, "slurm", SLURM_FIELDS, 'expected a table, e.g. [slurm] partition = "gpu"')
    out = {**SLURM_DEFAULTS, **slurm}
    for key in ("partition", "account", "qos"):
        v = out.get(key)
        if v is not None and (not isinstance(v, str) or not re.fullmatch(r"[A-Za-z0-9_.-]{1,64}", v)):
            raise bad(f"slurm.{key}", v, "a Slurm name: 1-64 letters, digits, '.', '_' or '-'")
    out["signal_before_s"] = integer(out, "signal_before_s", 120, 0, 3600, "slurm.")
    out["max_requeues"] = integer(out, "max_requeues", 20, 0, 1000, "slurm.")
    out["max_node_failures"] = integer(out, "max_node_failures", 3, 0, 100, "slurm.")
    if not isinstance(out["stage_data"], bool):
        raise bad("slurm.stage_data", out["stage_data"], "true or false")
    sc = out["scratch"]
    if not absolute_path(sc):
        raise bad("slurm.scratch", sc, 'an absolute path of node-local storage, e.g. scratch = "/local/scratch"')
    ec = out.get("env_cache")
    if ec is not None and not absolute_path(ec):
        raise bad("slurm.env_cache", ec, 'an absolute path every node sees, e.g. env_cache = "/shared/deskpod-envs"')
    lim = out.get("scratch_limit_gb")
    if lim is not None and (isinstance(lim, bool) or not isinstance(lim, int | float) or not 0 < lim <= 1e6):
        raise bad("slurm.scratch_limit_gb", lim, "gigabytes above 0, e.g. scratch_limit_gb = 500")
    return out


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
    if "environment" in data:  # files it names are read here, beside the spec, and sent as their contents
        data["environment"] = parse_environment(data["environment"], base_dir=path.parent).to_json()
    return data


ABS_PATH: dict[str, Any] = {"type": "string", "pattern": "^/[^\\u0000]*$", "maxLength": 4096}
SLURM_NAME: dict[str, Any] = {"type": "string", "pattern": r"^[A-Za-z0-9_.-]{1,64}$"}


REQUIREMENT = r"^[A-Za-z0-9]([A-Za-z0-9._-]*[A-Za-z0-9])?(==[0-9]+(\.[0-9]+)*)?$"
"""The document's form of a package requirement, ``name`` or ``name==version``: a part of PEP 508 (which the
server reads in full), so that what the document calls valid is."""


def _env_schema() -> dict[str, Any]:
    """`ENVIRONMENT_SCHEMA` with what `parse_environment` also demands: exactly one kind (a lock with its
    pyproject), no python beside an image, an image reference's form, packages as ``name[==version]``."""
    one_kind = []
    for kind in ENV_KINDS:
        needs = ["lock", "pyproject"] if kind == "lock" else [kind]
        others = [k for k in ENV_KINDS if k not in needs] + (["python"] if kind == "image" else [])
        one_kind.append({"required": needs, "properties": {k: False for k in others}})
    props = dict(ENVIRONMENT_SCHEMA["properties"])
    props["packages"] = {**props["packages"], "items": {**props["packages"]["items"], "pattern": REQUIREMENT}}
    props["image"] = {**props["image"], "pattern": IMAGE_RE.pattern}
    return {**ENVIRONMENT_SCHEMA, "properties": props, "oneOf": one_kind}


def _devices_schema(fixed: int | None) -> dict[str, Any]:
    """What one kind's ``devices`` may be: ``fixed`` when the kind always holds that many, else anything but 0."""
    return {"const": fixed} if fixed is not None else {"not": {"const": 0}}


SPEC_SCHEMA: dict[str, Any] = {
    "type": "object",
    "additionalProperties": False,
    "description": f"A job: exactly one of {', '.join(KINDS)} says what it runs; environment and stack only with"
    f" {OWN_CODE}.",
    "oneOf": [
        {
            "required": [kind],
            "properties": {
                **{k: False for k in KINDS if k != kind},
                **({} if KIND_MODULES[kind].ENVIRONMENT else {"environment": False, "stack": False}),
                "devices": _devices_schema(getattr(KIND_MODULES[kind], "DEVICES", None)),
            },
        }
        for kind in KINDS
    ],
    "properties": {
        "name": {"type": "string", "pattern": NAME_RE.pattern},
        **{name: kind.SCHEMA for name, kind in KIND_MODULES.items()},
        "devices": {
            "oneOf": [{"type": "integer", "minimum": 0, "maximum": MAX_DEVICES}, {"type": "string", "enum": ["all"]}],
            "description": "a count from 1, or all; 0 (the only value) for a kind that holds none: tensorboard",
        },
        "device_kind": {"type": "string", "enum": list(DEVICE_KINDS), "description": "GPUs (cuda) or CPU worker slots"},
        "placement": {"type": "string", "pattern": r"^(best|pack|partition:[A-Za-z0-9_-]{1,64})$", "example": "best"},
        "priority": {"type": "integer", "minimum": -MAX_PRIORITY, "maximum": MAX_PRIORITY},
        "max_runtime": {"type": "number", "exclusiveMinimum": 0, "maximum": MAX_RUNTIME_S},
        "retries": {"type": "integer", "minimum": 0, "maximum": MAX_RETRIES},
        "env": {
            "type": "object",
            "maxProperties": MAX_ENV,
            "propertyNames": {
                "pattern": ENV_NAME_RE.pattern,
                "not": {"anyOf": [{"enum": sorted(RESERVED_ENV | LOADER_ENV)}, {"pattern": "^LD_"}]},
            },
            "additionalProperties": {"type": "string", "pattern": NO_NUL, "maxLength": MAX_ARG_CHARS},
        },
        "workdir": ABS_PATH,
        "nodes": {"type": "integer", "minimum": 1, "maximum": MAX_NODES},
        "environment": _env_schema(),
        "stack": {
            "type": "string",
            "pattern": STACK_RE.pattern,
            "example": "pytorch-2.14",
            "description": "a fleet's stack: the fleet runs the job in its current version's environment",
        },
        "slurm": {
            "type": "object",
            "additionalProperties": False,
            "properties": {
                "partition": SLURM_NAME,
                "account": SLURM_NAME,
                "qos": SLURM_NAME,
                "signal_before_s": {"type": "integer", "minimum": 0, "maximum": 3600},
                "max_requeues": {"type": "integer", "minimum": 0, "maximum": 1000},
                "max_node_failures": {"type": "integer", "minimum": 0, "maximum": 100},
                "stage_data": {"type": "boolean"},
                "scratch": ABS_PATH,
                "scratch_limit_gb": {"type": "number", "exclusiveMinimum": 0, "maximum": 1e6},
                "env_cache": {**ABS_PATH, "description": "where nodes build and share job environments"},
            },
        },
    },
    "example": {"name": "hello", "command": ["python", "-c", "print('hi')"], "devices": 1},
}
"""The request body of ``POST /v1/jobs`` for the OpenAPI document; `parse_spec` is what enforces it (and checks
what a schema cannot say: a train table's size, an environment's file contents)."""
