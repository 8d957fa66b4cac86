"""``deskpod train``: one worker per device through PyTorch's elastic agent, and the run around it.

What the launcher does, in order:

1. finds the devices (`deskpod.hardware.devices`) and picks those ``--devices`` names;
2. checks everything it can before any worker starts — the dataset exists, the model builds and
   accepts the data, the batch divides, ``--resume`` has a compatible checkpoint — so bad input is
   one line and exit code 2, never a worker traceback;
3. writes the run folder (resolved ``config.toml``, ``launch.json``);
4. starts the workers with ``torch.distributed.launcher.api.elastic_launch``: a c10d rendezvous on
   127.0.0.1 port 0 (the OS picks a free port, so two trainings on one box never collide on 29500),
   NCCL on GPUs and Gloo on CPUs, and ``max_restarts``: when a worker dies, the agent stops the
   others and starts them all again; they resume from the latest checkpoint;
5. when restarts run out, raises `WorkerError` with the first failing worker's traceback; on SIGTERM
   or SIGINT the workers checkpoint and exit, and the launcher reports where to resume;
6. writes ``summary.json`` and the plots, and returns the summary.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import signal
import sys
import time
import uuid
from collections.abc import Collection, Iterator, Sequence
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

from deskpod.environment import Environment
from deskpod.environment.files import write_json, write_text
from deskpod.errors import CheckpointError, ConfigError, DataError, DeskpodError, UsageError, WorkerError
from deskpod.hardware.affinity import format_cpu_list, numa_nodes
from deskpod.hardware.devices import Device, Inventory, cpu_inventory, cpu_layout, cpu_slots, discover
from deskpod.processes import child_pids
from deskpod.train import checkpoint as ckpt
from deskpod.train.config import TrainConfig, build_config, dump_config
from deskpod.train.data import DataRequest, DataSpec, describe
from deskpod.train.progress import Mode, Progress, describe_validation, format_duration, format_rate
from deskpod.train.runs import RunPaths, default_run_name, read_json
from deskpod.train.sampler import run_length
from deskpod.train.tasks import Task, load_task
from deskpod.train.world import NodeWorld, check_port_free, slurm_world

CHECKPOINT_SIGNAL = signal.SIGUSR2
"""Checkpoint, stop, and let the scheduler requeue: what Slurm's ``--signal=USR2@T`` sends before a time
limit. Not SIGUSR1: NCCL uses it internally (its watchdog), so a job that trapped USR1 could not tell them apart."""
SHUTDOWN_GRACE_S = 60  # SIGTERM to workers, then SIGKILL after this long (they checkpoint in between)


@dataclass(frozen=True, slots=True)
class Plan:
    """Everything resolved before workers start."""

    cfg: TrainConfig
    run_dir: Path
    devices: tuple[Device, ...]
    kind: str
    data: DataSpec
    per_device_batch: int
    resume: bool
    world: NodeWorld | None = None
    """The nodes of a multi-node run (``--nodes``, from Slurm's environment); None on one box."""
    cpu_pins: tuple[tuple[int, ...], ...] = ()
    """CPU workers: the cores each local rank is pinned to (one NUMA node each); empty when unpinned."""

    @property
    def world_size(self) -> int:
        return len(self.devices) * (self.world.nodes if self.world else 1)


def resolve_devices(
    devices: str,
    *,
    cpu_workers: int = 0,
    inventory: Inventory | None = None,
    env: Environment | None = None,
    affinity: Collection[int] | None = None,
) -> tuple[str, tuple[Device, ...], tuple[tuple[int, ...], ...]]:
    """The kind and devices of a run — one per worker —, and on CPUs the cores to pin each worker to (empty:
    unpinned). The one place a run's layout is decided: the trainer, ``deskpod run`` and the predictions of the
    pod's jobs (`pod_job_devices`) all come here.

    On CPUs ``--devices all`` is `cpu_layout`'s (one worker per NUMA node of ``affinity``, the cores this process
    may run on by default, its cores as threads); a count, a list or ``cpu_workers`` asks for that many workers
    sharing the cores.
    """
    env = env or Environment.read()
    inv = inventory or discover(env)
    if inv.kind == "cpu" and cpu_workers:
        inv = Inventory("cpu", cpu_slots(env, cpu_workers), inv.cores, "cpu")
    elif inv.kind == "cpu" and devices.strip().lower() in ("all", ""):
        cores = os.sched_getaffinity(0) if affinity is None else set(affinity)
        layout = cpu_layout(inv, numa_nodes(cores), pin=env.cpu_slots is None)
        return "cpu", layout.devices, layout.cores
    return inv.kind, inv.select(devices), ()


def pod_job_devices(
    kind: str, slots: Sequence[int], *, cpu_workers: int = 0, env: Environment | None = None,
    affinity: Collection[int] | None = None,
) -> tuple[Device, ...]:  # fmt: skip
    """The workers ``deskpod train`` starts as a pod job given ``slots`` of the pod's ``kind`` of device: what a
    prediction for that job must assume. The pod runs its train jobs with ``--devices all`` and the slots in
    ``DESKPOD_CPU_SLOTS`` (``CUDA_VISIBLE_DEVICES`` on GPUs, one worker each), so on CPUs a job of 2 slots on a
    box of one NUMA node runs 1 worker of 2 threads, not 2 workers (`resolve_devices`)."""
    env = replace(env or Environment.read(), cpu_slots=tuple(slots) if kind == "cpu" else None)
    if kind == "cpu":
        inv = cpu_inventory(env)
    else:
        inv = Inventory("cuda", tuple(Device("cuda", k, "gpu", 0) for k in range(len(slots))), env.cpu_count, "pod")
    return resolve_devices("all", cpu_workers=cpu_workers, inventory=inv, env=env, affinity=affinity)[1]


def find_latest_run(out: Path) -> Path | None:
    runs = [p for p in out.iterdir() if p.is_dir() and ckpt.has_checkpoint(p)] if out.is_dir() else []
    return max(runs, key=lambda p: ckpt.list_checkpoints(p)[-1].stat().st_mtime) if runs else None


def prepare(config_file: str | None, overrides: dict[str, Any], *, resume: bool,
            inventory: Inventory | None = None, env: Environment | None = None, nodes: int = 1) -> Plan:  # fmt: skip
    """Resolve the config, devices, data and run folder; raise a `UsageError` for anything invalid.

    ``nodes > 1`` is one launcher of a multi-node run: its place among the nodes comes from the Slurm
    step it runs in (`deskpod.train.world`); every node must be given the same config.
    """
    if nodes < 1:
        raise ConfigError(f"--nodes {nodes}: expected 1 or more")
    world = slurm_world(nodes) if nodes > 1 else None
    env = env or Environment.read()
    cfg = build_config(config_file, overrides)
    out = Path(cfg.out)
    if resume:
        if cfg.name:
            run_dir = out / cfg.name
        else:
            latest = find_latest_run(out)
            if latest is None:
                raise CheckpointError(
                    f"--resume: no run with a checkpoint in {str(out)!r}; name one with --name", usage=True
                )
            run_dir = latest
        if not ckpt.has_checkpoint(run_dir):
            raise CheckpointError(
                f"--resume: no checkpoint in {ckpt.checkpoint_dir(run_dir)}; nothing to resume", usage=True
            )
        # The run's own config is the base; flags given now override it (e.g. more --epochs).
        cfg = build_config(RunPaths(run_dir).config if RunPaths(run_dir).config.exists() else config_file,
                           {**overrides, "name": run_dir.name, "out": str(out)})  # fmt: skip
    else:
        name = cfg.name or default_run_name(cfg.model, cfg.data)
        run_dir = out / name
        if ckpt.has_checkpoint(run_dir):
            raise ConfigError(
                f"run {str(run_dir)!r} already exists with checkpoints; continue it with --resume --name {name}, "
                "or choose another --name"
            )
        cfg = build_config(None, {**cfg.to_dict(), "name": name})
    kind, devices, cpu_pins = resolve_devices(cfg.devices, cpu_workers=cfg.cpu_workers, inventory=inventory, env=env)
    nodes_txt = f" on {nodes} nodes" if nodes > 1 else ""
    req = DataRequest(cfg.data, cfg.num_classes, cfg.synthetic_samples, cfg.image_size, cfg.val_fraction, cfg.seed,
                      cfg.loader_workers)  # fmt: skip
    task = load_task(cfg.task, cfg.task_options)
    data = describe(req, env.fashion_mnist_dir) if task is None else task.describe(req)
    if task is None:
        cfg = imposed_by_data(cfg, data)
    n = len(devices) * nodes
    if cfg.global_batch_size:
        if cfg.global_batch_size % (n * cfg.grad_accum):
            raise ConfigError(
                f"global_batch_size {cfg.global_batch_size} does not divide by {n} devices{nodes_txt} × grad_accum "
                f"{cfg.grad_accum}; "
                f"use a multiple of {n * cfg.grad_accum}, e.g. {n * cfg.grad_accum * max(1, cfg.global_batch_size // (n * cfg.grad_accum))}"
            )
        per_device = cfg.global_batch_size // (n * cfg.grad_accum)
    else:
        per_device = cfg.batch_size
    if per_device * n > data.train_size:
        raise ConfigError(
            f"batch size {per_device} × {n} devices{nodes_txt} = {per_device * n} samples per step, more than the "
            f"{data.train_size} training samples of {data.name}; use a smaller --batch-size"
        )
    if cfg.sync_batchnorm and kind != "cuda":
        raise ConfigError("sync_batchnorm = true needs GPUs (PyTorch's SyncBatchNorm runs only on CUDA devices)")
    _check_model(cfg, data, run_dir if resume else None, task)
    return Plan(cfg, run_dir, devices, kind, data, per_device, resume, world, cpu_pins)


def imposed_by_data(cfg: TrainConfig, data: DataSpec) -> TrainConfig:
    """``cfg`` with what its dataset imposes, so that the resolved ``config.toml`` says what the run used: the
    classes it has (Fashion-MNIST's 10, an image folder's class folders; ``num_classes`` counts only for synthetic
    data) and the side of its images when they are square and a valid ``image_size`` (Fashion-MNIST's 28, not the
    default crop of 224 that only image folders use)."""
    h, w = data.image_size
    changes: dict[str, Any] = {"num_classes": data.num_classes}
    if h == w and h != cfg.image_size:
        changes["image_size"] = h
    try:
        return build_config(None, {**cfg.to_dict(), **changes})
    except ConfigError:  # a side image_size cannot hold (tiny synthetic images): keep the classes alone
        return build_config(None, {**cfg.to_dict(), "num_classes": data.num_classes})


def _check_model(cfg: TrainConfig, data: DataSpec, resume_from: Path | None, task: Task | None) -> None:
    """Build the model once on the CPU: unknown names, shape mismatches and foreign checkpoints fail here."""
    import torch

    from deskpod.train.models import ModelSpec, build_model, check_forward

    spec = ModelSpec(data.num_classes, data.in_channels, data.image_size)
    with torch.random.fork_rng():
        if task is None:
            model = build_model(cfg.model, spec)
            check_forward(model, spec, cfg.model)
        else:
            model = task.build_model(cfg.model, data)
            task.check_model(model, data)
    if resume_from is not None:
        path, state = ckpt.load_latest(resume_from)
        ckpt.check_compatible(state, cfg.model, model, path)


def worker_env(kind: str, devices: Sequence[Device]) -> dict[str, str]:
    """What the launcher puts in its environment for the workers it starts: the threads of a CPU worker, the
    GPUs they may see."""
    # With the agent's rendezvous TCPStore shared across restarts, workers of a restarted group read the
    # dead group's Gloo addresses (same keys, no per-attempt prefix) and fail to connect. Unshared, rank 0
    # of each attempt hosts a fresh store on a free port.
    env: dict[str, str] = {"TORCH_DISABLE_SHARE_RDZV_TCP_STORE": "1"}
    if kind == "cpu":
        threads = str(devices[0].threads)
        env.update(OMP_NUM_THREADS=threads, MKL_NUM_THREADS=threads, CUDA_VISIBLE_DEVICES="")
    else:
        visible = Environment.read().cuda_visible_devices
        ids = [visible[d.index] if visible else str(d.index) for d in devices]
        env["CUDA_VISIBLE_DEVICES"] = ",".join(ids)
        env.setdefault("TORCH_NCCL_ASYNC_ERROR_HANDLING", "1")
    return env


def _write_run_folder(plan: Plan, mode: Mode, timing_skip_steps: int | None) -> None:
    paths = RunPaths(plan.run_dir)
    paths.root.mkdir(parents=True, exist_ok=True)
    for stale in ("error.json", "worker-result.json"):
        (paths.root / stale).unlink(missing_ok=True)
    # Every node of a multi-node run writes the same files into the shared run folder, and a resumed attempt
    # reads config.toml back on every node while the others rewrite it: atomically, or a reader sees it empty.
    write_text(paths.config, dump_config(plan.cfg))
    launch = {
        "kind": plan.kind,
        "backend": "nccl" if plan.kind == "cuda" else "gloo",
        "devices": [asdict(d) for d in plan.devices],
        "threads": plan.devices[0].threads,
        "per_device_batch": plan.per_device_batch,
        "resume": plan.resume,
        "progress": mode,
        "collective_timeout_s": plan.cfg.collective_timeout_s,
        "data_spec": asdict(plan.data),
        "timing_skip_steps": timing_skip_steps,
        "nodes": plan.world.nodes if plan.world else 1,
        "affinity": _affinity(plan),
        "total_steps": run_length(
            plan.data.train_size,
            plan.per_device_batch * plan.world_size,
            plan.cfg.grad_accum,
            plan.cfg.steps,
            plan.cfg.epochs,
        )[1],
    }
    write_json(paths.launch, launch, indent=2)


def _affinity(plan: Plan) -> dict[str, dict[str, Any]]:
    return rank_affinity_map(plan.kind, plan.devices, plan.cpu_pins)


def rank_affinity_map(
    kind: str, devices: Sequence[Device], cpu_pins: Sequence[Sequence[int]] = ()
) -> dict[str, dict[str, Any]]:
    """Per local rank: the NIC nearest its GPU (``NCCL_IB_HCA``, ``UCX_NET_DEVICES``) and its CPU cores,
    from this box's topology; for CPU workers their NUMA node's cores when the layout pins them. Empty
    for unpinned CPU workers and where the topology knows no NICs. A worker applies its entry with
    `deskpod.hardware.affinity.pin_rank`."""
    if kind != "cuda":
        return {
            str(rank): {
                "env": {},
                "cpus": list(cores),
                "reason": f"local rank {rank}: NUMA node cores {format_cpu_list(cores)}",
            }
            for rank, cores in enumerate(cpu_pins)
        }
    from deskpod.hardware.affinity import node_affinity
    from deskpod.hardware.placement import local_topology

    try:
        topo = local_topology()
        ranks = node_affinity(topo, [d.index for d in devices])
    except DeskpodError:  # no topology this box can describe: the workers run unpinned
        return {}
    return {str(r.local_rank): {"env": r.env, "cpus": list(r.cpus), "reason": r.reason} for r in ranks}


def quiet_torchelastic() -> None:
    # The agent logs every rendezvous and restart at INFO/WARNING; deskpod reports what matters itself.
    for name in ("torch.distributed.elastic", "torch.distributed.launcher", "torch.distributed.run"):
        logging.getLogger(name).setLevel(logging.ERROR)
    # "failed (exitcode: 1) local_rank: 1 ..." for every failed attempt: the launcher names the first failure itself
    logging.getLogger("torch.distributed.elastic.multiprocessing.api").setLevel(logging.CRITICAL)


def launch(plan: Plan, mode: Mode = "lines", *, timing_skip_steps: int | None = None) -> dict[str, Any]:
    """Run the workers for ``plan`` and return the summary (also written to ``summary.json``).

    ``timing_skip_steps`` leaves the first steps of each worker attempt out of the throughput figures
    (``deskpod bench train`` uses it to time only after warm-up); by default the first step is left out
    of runs longer than 10 steps.
    """
    from torch.distributed.elastic.multiprocessing import SignalException
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.launcher.api import elastic_launch

    _write_run_folder(plan, mode, timing_skip_steps)
    # Every node writes the same launch.json (the workers' progress mode included: global rank 0, which
    # prints for the run, may be on any node); the launchers of the other nodes keep quiet themselves.
    follower = plan.world is not None and plan.world.node_rank > 0
    progress = Progress("quiet" if follower else mode)
    what = f"{len(plan.devices)} × {plan.devices[0].name}" + (
        f" ({plan.devices[0].threads} thread{'s' if plan.devices[0].threads != 1 else ''} each)"
        if plan.kind == "cpu"
        else ""
    )
    progress.event("launch", run_dir=str(plan.run_dir), devices=[d.label for d in plan.devices],
                   text=f"deskpod: {what} → {plan.run_dir}")  # fmt: skip
    world = plan.world
    # The agent's error files live in logs/; workers send their own stderr there too (see worker.py).
    log_dir = plan.run_dir / "logs" / (f"node{world.node_rank}" if world else "")
    config = launch_config(world, len(plan.devices), plan.cfg.max_restarts, log_dir, "deskpod")
    start = time.monotonic()
    stopped_by = 0
    previous = signal.signal(CHECKPOINT_SIGNAL, _forward_to_workers)
    try:
        with environment(worker_env(plan.kind, plan.devices)):
            elastic_launch(config, sys.executable)("-m", "deskpod.train.worker", str(plan.run_dir))
    except ChildFailedError as e:
        _raise_bad_input(plan.run_dir)
        rank, failure = e.get_first_failure()
        cause = failure.message if isinstance(failure.message, str) else json.dumps(failure.message)
        trace = failure_traceback(failure)
        raise WorkerError(
            f"training failed: worker rank {rank} (pid {failure.pid}) exited with code {failure.exitcode}"
            f"{' (' + failure.signal_name() + ')' if failure.exitcode < 0 else ''} after {plan.cfg.max_restarts} "
            f"restart{'s' if plan.cfg.max_restarts != 1 else ''} (max_restarts); workers' logs in {plan.run_dir / 'logs'}",
            root_cause=str(trace or cause),
        ) from None
    except SignalException as e:
        stopped_by = int(e.sigval)
    finally:
        signal.signal(CHECKPOINT_SIGNAL, previous)
    _raise_bad_input(plan.run_dir)
    wall = time.monotonic() - start
    return _finish(plan, wall, stopped_by, progress)


def launch_config(world: NodeWorld | None, nproc: int, max_restarts: int, log_dir: Path, run_id_prefix: str) -> Any:
    """The elastic agent's `LaunchConfig` for one box or one node of many (``deskpod train``, ``deskpod run``), made
    once torchelastic is quieted and (many nodes) the rendezvous port is known to be free."""
    from torch.distributed.elastic.multiprocessing import DefaultLogsSpecs
    from torch.distributed.launcher.api import LaunchConfig

    quiet_torchelastic()
    if world is not None:
        check_port_free(world)
    return LaunchConfig(
        min_nodes=world.nodes if world else 1,
        max_nodes=world.nodes if world else 1,
        nproc_per_node=nproc,
        run_id=world.run_id if world else f"{run_id_prefix}-{uuid.uuid4().hex[:12]}",
        rdzv_backend="c10d",
        # One box: port 0, the OS picks a free one. Many nodes: the first node hosts the rendezvous on the
        # port every node derives from the Slurm job id (see deskpod.train.world).
        rdzv_endpoint=world.endpoint if world else "127.0.0.1:0",
        rdzv_configs={"timeout": 300, **({"is_host": world.node_rank == 0} if world else {})},
        max_restarts=max_restarts,
        monitor_interval=0.25,
        start_method="spawn",
        local_addr=world.local_addr if world else "127.0.0.1",
        logs_specs=DefaultLogsSpecs(log_dir=str(log_dir)),
        shutdown_timeout=SHUTDOWN_GRACE_S,
    )


@contextlib.contextmanager
def environment(env: dict[str, str]) -> Iterator[None]:
    """``env`` in this process's environment while the agent starts workers (they inherit it), then as before."""
    saved = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    try:
        yield
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def failure_traceback(failure: Any) -> str | None:
    """The traceback a failed worker recorded in its torch elastic error file, if it wrote one."""
    detail = failure.error_file_data.get("message", {}) if isinstance(failure.error_file_data, dict) else {}
    trace = detail.get("extraInfo", {}).get("py_callstack") if isinstance(detail, dict) else None
    return str(trace) if trace else None


def _forward_to_workers(signum: int, _frame: object) -> None:
    """The launcher got the checkpoint signal: pass it to this node's workers (its own children). One rank
    that has it is enough: the ranks agree on "stop" at the next step (see `Trainer`), checkpoint and exit 0,
    and the summary says ``stopped`` by SIGUSR2."""
    for pid in child_pids(os.getpid()):
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signum)


def _raise_bad_input(run_dir: Path) -> None:
    err = run_dir / "error.json"
    if err.exists():
        data = read_json(err)
        cls: type[DeskpodError] = {"DataError": DataError, "ConfigError": ConfigError}.get(
            str(data.get("type")), UsageError
        )
        raise cls(str(data.get("message")))


def _finish(plan: Plan, wall: float, stopped_by: int, progress: Progress) -> dict[str, Any]:
    paths = RunPaths(plan.run_dir)
    result = read_json(plan.run_dir / "worker-result.json") if (plan.run_dir / "worker-result.json").exists() else {}
    n = plan.world_size
    train_time = float(result.get("train_time_s", 0.0))
    images_total = int(result.get("images", 0)) * n
    throughput = images_total / train_time if train_time > 0 else 0.0
    val = result.get("validation") or {}
    stopped = bool(stopped_by or result.get("stopped_by_signal"))
    signum = stopped_by or int(result.get("stopped_by_signal") or 0)
    latest = ckpt.list_checkpoints(plan.run_dir)
    summary: dict[str, Any] = {
        "run": plan.cfg.name,
        "run_dir": str(plan.run_dir),
        "state": "stopped" if stopped else "completed",
        "signal": signal.Signals(signum).name if signum else None,
        "model": plan.cfg.model,
        "data": plan.data.name,
        "devices": [f"{d.label} {d.name}" for d in plan.devices],
        "device_kind": plan.kind,
        "world_size": n,
        "nodes": plan.world.nodes if plan.world else 1,
        "precision": result.get("precision"),
        "global_batch": result.get("global_batch"),
        "lr": result.get("lr"),
        "steps": result.get("step"),
        "total_steps": result.get("total_steps"),
        "test_accuracy": val.get("val_accuracy"),
        "test_loss": val.get("val_loss"),
        "validation": val,
        "throughput_images_per_s": round(throughput, 1),
        "throughput_per_device": round(throughput / n, 1),
        "train_time_s": round(train_time, 2),
        "wall_time_s": round(wall, 2),
        "data_wait_fraction": result.get("data_wait_fraction"),
        "bad_images": result.get("bad_images", 0),
        "restarts": result.get("restarts", 0),
        "checkpoint": str(latest[-1]) if latest else None,
        "data_spec": asdict(plan.data),
    }
    if plan.world is not None and plan.world.node_rank > 0:
        return summary  # the first node writes the run's summary and plots
    write_json(paths.summary, summary, indent=2)
    if not stopped:
        from deskpod.train.plots import write_plots

        write_plots(plan.run_dir)
    progress.event("done", **{k: v for k, v in summary.items() if k != "data_spec"}, text=format_summary(summary))
    return summary


def exit_code(plan: Plan, summary: dict[str, Any]) -> int:
    """The launcher's exit code: 0 when done; 128 + the signal when the run checkpointed and stopped on one
    (140 after SIGUSR2: requeue me). In a multi-node run only the first node says so: the others exit 0 once
    their workers are down, so srun's ``--kill-on-bad-exit`` never cuts the first node short."""
    if summary["state"] != "stopped" or (plan.world is not None and plan.world.node_rank > 0):
        return 0
    name = str(summary.get("signal"))
    return 128 + int(signal.Signals[name]) if name in signal.Signals.__members__ else 128 + int(signal.SIGTERM)


def format_summary(s: dict[str, Any]) -> str:
    if s["state"] == "stopped":
        return (
            f"stopped by {s['signal'] or 'a signal'} at step {s['steps']}/{s['total_steps']}; checkpoint {s['checkpoint']}\n"
            f"continue with: deskpod train --resume --name {s['run']} --out {Path(s['run_dir']).parent}"
        )
    acc = s.get("test_accuracy")
    val = s.get("validation") or {}
    if isinstance(acc, int | float) or not val:
        acc_txt = f"{100 * acc:.2f}%" if isinstance(acc, int | float) else "n/a"
        result = f"test accuracy {acc_txt} (loss {s.get('test_loss')})"
    else:  # a task other than classification: its own validation figures
        result = describe_validation(val)
    wait = s.get("data_wait_fraction") or 0.0
    restarts = f", {s['restarts']} restart{'s' if s['restarts'] != 1 else ''}" if s.get("restarts") else ""
    return "\n".join([
        f"done: {result} after {s['steps']} steps{restarts}",
        f"throughput: {format_rate(s['throughput_images_per_s'])} img/s total, "
        f"{format_rate(s['throughput_per_device'])} img/s per device "
        f"({s['world_size']} × {s['device_kind']}, {s['precision']}, global batch {s['global_batch']})",
        f"wall time {format_duration(s['wall_time_s'])} (training {format_duration(s['train_time_s'])}, "
        f"waiting for data {100 * wait:.1f}%)",
        f"run folder: {s['run_dir']}",
    ])  # fmt: skip


def train(
    config_file: str | None, overrides: dict[str, Any], *, resume: bool = False, mode: Mode = "lines"
) -> dict[str, Any]:
    """Prepare and launch a training run; the library entry point behind ``deskpod train``."""
    return launch(prepare(config_file, overrides, resume=resume), mode)
