"""A deskpod job as a Slurm batch job: its folder, its sbatch script, and the submission.

A job's folder holds everything of it, on a file system every node sees::

    job.json            the validated job spec (what every attempt runs)
    job.sbatch          the batch script given to sbatch (``--dry-run`` prints it)
    attempts.json       one record per attempt: when, on which nodes, how it ended, why it was requeued
    logs/attempt-N.log  the output of attempt N (never overwritten: a requeue starts attempt N+1)
    slurm-<id>.out      what the batch script printed before its attempt log opened (appended)
    train.toml, runs/   for a train job: its config and its run folder (checkpoints, metrics)

The batch script is plain bash with one ``srun`` line: one launcher per node (``deskpod cluster launch``),
which sets each rank's NIC and cores, stages the data if asked, and runs ``deskpod train --nodes N``
(resuming from the run's checkpoint when there is one), the node's ``deskpod video index`` shard, or the job's
command. Around it,
``deskpod cluster attempt begin|end`` keeps the per-cause budgets (see `deskpod.cluster.attempts`).
"""

from __future__ import annotations

import json
import math
import os
import shlex
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from deskpod.cluster import slurm
from deskpod.environment.files import Under
from deskpod.envs.userfiles import read_path
from deskpod.errors import ConfigError, DeviceError
from deskpod.jobs.spec import SLURM_DEFAULTS, JobSpec, parse_spec, without_nulls

CHECKPOINT_SIGNAL = "USR2"
"""What Slurm sends before the time limit (``--signal=USR2@T``): deskpod's trainer checkpoints and exits
with 128 + 12, and the job is requeued. Not USR1, which NCCL uses itself."""
REQUEUE_EXIT_CODE = 128 + 12
"""A step that exits with this code (SIGUSR2's) asks to be requeued: ``deskpod train`` does after the warning."""


@dataclass(frozen=True, slots=True)
class JobFiles:
    """The files of one cluster job (see the module docstring)."""

    folder: Path

    spec = Under("job.json", "folder")
    script = Under("job.sbatch", "folder")
    attempts = Under("attempts.json", "folder")
    slurm_id = Under("slurm_id", "folder")
    run_dir = Under("runs", "folder")

    def log(self, attempt: int) -> Path:
        return self.folder / "logs" / f"attempt-{attempt}.log"

    def read_spec(self) -> JobSpec:
        try:
            data = json.loads(self.spec.read_text())
        except (OSError, json.JSONDecodeError) as e:
            raise ConfigError(f"{self.spec}: not a deskpod cluster job folder ({e})") from None
        return parse_spec(without_nulls(data))  # a folder written when JobSpec.to_json wrote unset fields as null


def slurm_options(spec: JobSpec) -> dict[str, Any]:
    """The spec's ``[slurm]`` table with every default filled in (a spec without one gets the defaults)."""
    return {**SLURM_DEFAULTS, **spec.slurm}


def time_limit(max_runtime: float | None) -> str | None:
    """``--time`` in Slurm's minutes (rounded up), from the spec's ``max_runtime`` seconds."""
    return None if max_runtime is None else str(max(1, math.ceil(max_runtime / 60)))


def check_fits(spec: JobSpec, parts: list[slurm.Partition]) -> slurm.Partition:
    """The partition the job goes to; `ConfigError`/`DeviceError` naming what the cluster has instead."""
    name = slurm_options(spec).get("partition")
    if not parts:
        raise slurm.SlurmError("sinfo lists no partitions: the cluster has no nodes deskpod can use")
    if name is None:
        part = next((p for p in parts if p.default), parts[0])
    else:
        part = next((p for p in parts if p.name == name), None)  # type: ignore[assignment]
        if part is None:
            raise ConfigError(
                f"slurm partition {name!r} does not exist; valid: {', '.join(sorted(p.name for p in parts))}"
            )
    kind = "cuda" if part.gpus_per_node else "cpu"
    if spec.device_kind is not None and spec.device_kind != kind:
        what = f"GPUs (GRES gpu:{part.gpus_per_node})" if part.gpus_per_node else "CPUs, no GPUs"
        raise DeviceError(
            f"device_kind = {spec.device_kind!r}: the nodes of partition {part.name!r} have {what}; "
            f"choose a partition with {'GPUs' if spec.device_kind == 'cuda' else 'no GPUs'}: [slurm] partition"
        )
    if spec.nodes > part.nodes:
        raise DeviceError(
            f"nodes = {spec.nodes}: partition {part.name!r} has {part.nodes} node{'s' if part.nodes != 1 else ''}; "
            f"valid: 1-{part.nodes}"
        )
    devices = int(spec.devices) if str(spec.devices).isdigit() else None
    if part.gpus_per_node and devices is not None and devices > part.gpus_per_node:
        raise DeviceError(
            f"devices = {devices} GPUs per node: the nodes of partition {part.name!r} have at most "
            f"{part.gpus_per_node} (GRES gpu:{part.gpus_per_node}); valid: 1-{part.gpus_per_node}"
        )
    return part


def devices_per_node(spec: JobSpec, part: slurm.Partition) -> int:
    if str(spec.devices) == "all":
        return part.gpus_per_node or 1
    return int(spec.devices)


def sbatch_script(spec: JobSpec, files: JobFiles, *, version: slurm.Version, partition: slurm.Partition,
                  python: str = sys.executable) -> str:  # fmt: skip
    """The batch script of ``spec`` for this Slurm version and partition."""
    n, per_node, options = spec.nodes, devices_per_node(spec, partition), slurm_options(spec)
    opts = [f"--job-name=deskpod:{spec.name}", f"--nodes={n}", f"--ntasks={n}"]
    if partition.gpus_per_node:
        opts += slurm.gpu_options(version, per_node)
    else:
        opts.append(f"--cpus-per-task={per_node}")
    opts += [f"--partition={partition.name}", f"--output={files.folder}/slurm-%j.out", "--open-mode=append",
             "--requeue", f"--comment=deskpod:{files.folder}"]  # fmt: skip
    opts += [f"--{key}={options[key]}" for key in ("account", "qos") if options.get(key)]
    limit = time_limit(spec.max_runtime)
    if limit:
        opts.append(f"--time={limit}")
        before = int(options.get("signal_before_s", 0))
        if before:
            opts.append(f"--signal={CHECKPOINT_SIGNAL}@{before}")
    if spec.workdir:
        opts.append(f"--chdir={spec.workdir}")
    q = shlex.quote
    py, folder = q(python), q(str(files.folder))
    what = (
        f"deskpod train ({spec.train.get('model', 'convnet')} on {spec.train.get('data', 'fashion-mnist')})"
        if spec.train is not None
        else f"deskpod video index ({len(spec.video['sources'])} sources, one shard a node)"
        if spec.video is not None
        else "the command " + shlex.join(spec.command)
    ).replace("\n", "\\n")  # one comment line: an argument's newline would start a line of the script
    lines = [
        "#!/bin/bash",
        *(f"#SBATCH {o}" for o in opts),
        f"# deskpod job {spec.name!r}: {what} on {n} node{'s' if n != 1 else ''} x {per_node} "
        f"{'GPU' if partition.gpus_per_node else 'CPU worker'}{'s' if per_node != 1 else ''}",
        "# Written by deskpod (deskpod submit --cluster slurm); each attempt logs to logs/attempt-N.log.",
        "set -u",
        f"FOLDER={folder}",
        "# Count this attempt, check its retry budgets, and send what follows to its own log.",
        f'attempt=$({py} -m deskpod cluster attempt begin "$FOLDER") || exit $?',
        'exec >>"$FOLDER/logs/attempt-$attempt.log" 2>&1',
        "# One launcher per node; --kill-on-bad-exit ends every node's launcher when one dies.",
        f'srun --nodes={n} --ntasks={n} --kill-on-bad-exit=1 --export=ALL {py} -m deskpod cluster launch "$FOLDER"',
        "code=$?",
        "# Done, or requeued (after the time-limit warning, a lost step) while the budgets allow.",
        f'exec {py} -m deskpod cluster attempt end "$FOLDER" "$attempt" "$code"',
    ]
    return "\n".join(lines) + "\n"


def new_folder(root: Path, name: str) -> Path:
    root.mkdir(parents=True, exist_ok=True)
    return Path(tempfile.mkdtemp(prefix=f"{name}-", dir=root))


def write_job(spec: JobSpec, folder: Path, script: str) -> JobFiles:
    files = JobFiles(folder)
    (folder / "logs").mkdir(parents=True, exist_ok=True)
    files.spec.write_text(json.dumps(spec.to_json(), indent=2))
    files.script.write_text(script)
    if spec.train is not None:
        import tomli_w

        (folder / "train.toml").write_text(tomli_w.dumps(dict(spec.train)))
    return files


@dataclass(frozen=True, slots=True)
class Submitted:
    job_id: str | None
    """Slurm's job id; None for a dry run."""
    folder: Path | None
    script: str


def prepare(spec: JobSpec, folder: Path) -> tuple[str, slurm.Partition]:
    """Check the spec against the cluster and write the script (nothing is submitted)."""
    version = slurm.version()
    part = check_fits(spec, slurm.partitions())
    return sbatch_script(spec, JobFiles(folder), version=version, partition=part), part


def submit(spec: JobSpec, root: Path, *, dry_run: bool = False) -> Submitted:
    """Submit ``spec`` to Slurm from a folder under ``root``; ``dry_run`` only shows the script.

    Before anything is submitted, ``sbatch --test-only`` asks the controller whether the request can ever
    run (a GRES, account or QOS it does not know is refused there), so nothing half-valid is queued."""
    if dry_run:
        script, _ = prepare(spec, root / f"{spec.name}-DRYRUN")
        return Submitted(None, None, script)
    folder = new_folder(root, spec.name)
    return submit_in(spec, folder)


def submit_in(spec: JobSpec, folder: Path) -> Submitted:
    """Submit ``spec`` from ``folder`` (created if needed): the pod's Slurm backend uses its own job folders."""
    folder.mkdir(parents=True, exist_ok=True)
    script, _ = prepare(spec, folder)
    test = slurm.run(["sbatch", "--test-only"], stdin=script, check=False)
    if test.returncode != 0:
        raise ConfigError(f"Slurm refuses this job: {slurm.message(test.stderr)}")
    files = write_job(spec, folder, script)
    done = slurm.run(["sbatch", "--parsable", str(files.script)], env={**os.environ, "SLURM_EXPORT_ENV": "ALL"})
    job_id = done.stdout.strip().split(";")[0]
    if not job_id.isdigit():
        raise slurm.SlurmError(f"sbatch gave no job id: {done.stdout.strip()!r}")
    files.slurm_id.write_text(job_id)
    return Submitted(job_id, folder, script)


def read_attempts(files: JobFiles) -> list[dict[str, Any]]:
    """The job's attempt records, read as `deskpod.envs.userfiles.open_path` reads a job's folder (a root pod in front
    of Slurm reads folders its users write); [] when missing, refused or not a list."""
    try:
        data = json.loads(read_path(files.attempts, limit=16 << 20))
    except (OSError, ValueError, RecursionError):
        return []
    return list(data) if isinstance(data, list) else []
