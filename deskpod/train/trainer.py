"""One worker's training loop: DistributedDataParallel over whatever process group it is given.

The launcher (`launcher.py`) starts one of these per device. Each optimizer step:

1. ``grad_accum`` micro-steps: a batch of this rank's indices (`sampler.py`), forward under autocast,
   backward (DDP's all-reduce is skipped with ``no_sync`` on all but the last micro-step);
2. optional gradient clipping (unscaled first with fp16), optimizer and LR-schedule step;
3. one tiny all-reduce on a Gloo control group that makes every rank agree on "stop now" (a SIGTERM
   or SIGINT reached some rank) and "checkpoint now" (rank 0's clock says it is time). It runs on
   the CPU even on GPUs, so it never forces the host to wait for the GPU stream.

Losses stay on the device and are averaged across ranks only at log steps. Validation at each
epoch end sums loss, correct and count over ranks. A fixed seed fixes weights, sampling and
augmentation, so on the CPU the same config gives the same loss curve, run after run.
"""

from __future__ import annotations

import contextlib
import math
import os
import random
import signal
import time
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from types import FrameType
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP

from deskpod.errors import ConfigError, DataError
from deskpod.train import checkpoint as ckpt
from deskpod.train.config import TrainConfig, load_config
from deskpod.train.data import Batch, DataRequest, data_spec_from, open_sources
from deskpod.train.metrics import MetricsLog
from deskpod.train.models import ModelSpec, build_model, is_convnet
from deskpod.train.progress import Progress, describe_validation
from deskpod.train.runs import RunPaths, read_json
from deskpod.train.sampler import GlobalBatchSampler, run_length, shard_indices
from deskpod.train.schedule import make_optimizer, make_schedule
from deskpod.train.tasks import load_task


@dataclass(slots=True)
class Position:
    """Where training stands: optimizer steps done, and the epoch/micro-step to continue from."""

    step: int = 0
    epoch: int = 0
    micro: int = 0


class StopFlag:
    """Set by SIGTERM/SIGINT, and by SIGUSR2 (a scheduler's warning before a time limit or a preemption);
    the loop checkpoints and exits at the next step boundary."""

    def __init__(self) -> None:
        self.signum = 0

    def install(self) -> None:
        for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGUSR2):
            signal.signal(sig, self._handle)

    def _handle(self, signum: int, _frame: FrameType | None) -> None:
        self.signum = signum


def resolve_precision(cfg: TrainConfig, device: torch.device) -> str:
    if cfg.precision != "auto":
        return cfg.precision
    if device.type == "cuda":
        return "bf16" if torch.cuda.is_bf16_supported() else "fp16"
    return "fp32"


def rng_state() -> dict[str, Any]:
    state: dict[str, Any] = {"torch": torch.get_rng_state(), "python": random.getstate()}
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        state["cuda"] = torch.cuda.get_rng_state()
    return state


def set_rng_state(state: dict[str, Any]) -> None:
    torch.set_rng_state(state["torch"])
    random.setstate(state["python"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state(state["cuda"])


class Trainer:
    def __init__(self, run_dir: Path, stop: StopFlag) -> None:
        self.paths = RunPaths(run_dir)
        self.cfg: TrainConfig = load_config(self.paths.config)
        self.launch = read_json(self.paths.launch)
        self.stop = stop
        self.rank, self.world = dist.get_rank(), dist.get_world_size()
        self.local_rank = int(os.environ.get("LOCAL_RANK", "0"))
        self.restart = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))
        self.control = dist.new_group(backend="gloo", timeout=timedelta(seconds=self.cfg.collective_timeout_s))
        if self.launch["kind"] == "cuda":
            self.device = torch.device("cuda", torch.cuda.current_device())
        else:
            self.device = torch.device("cpu")
        self.precision = resolve_precision(self.cfg, self.device)
        self.spec = data_spec_from(self.launch["data_spec"])
        self.per_device = int(self.launch["per_device_batch"])
        self.is_main = self.rank == 0
        self.progress = Progress(self.launch["progress"] if self.is_main else "quiet")

    # ------------------------------------------------------------------ setup
    def _build(self) -> None:
        cfg = self.cfg
        self.loss_window: tuple[torch.Tensor, int] = (torch.zeros((), device=self.device), 0)
        torch.manual_seed(cfg.seed)
        random.seed(cfg.seed)
        self.task = load_task(cfg.task, cfg.task_options)
        if self.task is None:
            model = build_model(
                cfg.model, ModelSpec(self.spec.num_classes, self.spec.in_channels, self.spec.image_size)
            )
        else:
            model = self.task.build_model(cfg.model, self.spec)
        if cfg.sync_batchnorm:
            if self.device.type != "cuda":
                raise ConfigError(
                    "sync_batchnorm = true needs GPUs (PyTorch's SyncBatchNorm runs only on CUDA devices)"
                )
            model = nn.SyncBatchNorm.convert_sync_batchnorm(model)
        # Tensor Cores on GPUs, oneDNN's blocked convolutions on CPUs (the demo's convnet trains 1.5x as fast)
        self.channels_last = cfg.channels_last and is_convnet(model) and not self.task
        model = model.to(
            self.device, memory_format=torch.channels_last if self.channels_last else torch.preserve_format
        )
        self.raw_model = model
        ddp_kwargs: dict[str, Any] = {"device_ids": [self.device.index]} if self.device.type == "cuda" else {}
        self.model: nn.Module = DDP(model, gradient_as_bucket_view=True, **ddp_kwargs)
        if cfg.compile:
            self.model = torch.compile(self.model)  # type: ignore[assignment]
        req = DataRequest(cfg.data, cfg.num_classes, cfg.synthetic_samples, cfg.image_size, cfg.val_fraction, cfg.seed,
                          cfg.loader_workers)  # fmt: skip
        from deskpod.environment import Environment

        if self.task is None:
            self.train_src, self.val_src = open_sources(
                req, self.spec, self.device, Environment.read().fashion_mnist_dir
            )
        else:
            self.train_src, self.val_src = self.task.open_sources(req, self.spec, self.device)
        self.sampler = GlobalBatchSampler(len(self.train_src), self.per_device, self.world, self.rank, seed=cfg.seed)
        self.steps_per_epoch, self.total_steps = run_length(
            len(self.train_src), self.sampler.global_batch, cfg.grad_accum, cfg.steps, cfg.epochs
        )
        if self.steps_per_epoch < 1:
            raise ConfigError(
                f"grad_accum {cfg.grad_accum} needs {cfg.grad_accum} micro-steps per optimizer step, but an epoch has "
                f"only {self.sampler.steps_per_epoch}; lower grad_accum or batch_size"
            )
        self.epochs = math.ceil(self.total_steps / self.steps_per_epoch)
        global_batch = self.per_device * self.world * cfg.grad_accum
        self.lr = cfg.lr or cfg.base_lr * global_batch / 256
        self.optimizer = make_optimizer(cfg, self.raw_model, self.lr)
        warmup = min(int(cfg.warmup_epochs * self.steps_per_epoch), self.total_steps // 4)
        self.schedule = make_schedule(cfg.schedule, self.optimizer, self.total_steps, warmup)
        self.scaler = torch.amp.GradScaler("cuda", enabled=self.precision == "fp16" and self.device.type == "cuda")
        self.autocast_dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}.get(self.precision)
        self.loss_fn = nn.CrossEntropyLoss(label_smoothing=cfg.label_smoothing)
        self.global_batch = global_batch

    def _restore(self) -> Position:
        wants = bool(self.launch.get("resume")) or self.restart > 0
        if not wants or (self.restart > 0 and not ckpt.has_checkpoint(self.paths.root)):
            return Position()
        path, state = ckpt.load_latest(self.paths.root, warn=self._warn)
        ckpt.check_compatible(state, self.cfg.model, self.raw_model, path)
        self.raw_model.load_state_dict(state["model"])
        self.optimizer.load_state_dict(state["optimizer"])
        self.schedule.load_state_dict(state["schedule"])
        self.scaler.load_state_dict(state["scaler"])
        ranks = state.get("ranks", [])
        if state.get("world_size") == self.world and self.rank < len(ranks):
            set_rng_state(ranks[self.rank]["rng"])
            window_sum, window_n = ranks[self.rank]["loss_window"]
            self.loss_window = (torch.tensor(float(window_sum), device=self.device), int(window_n))
        pos = Position(int(state["step"]), int(state["epoch"]), int(state["micro"]))
        if state.get("world_size") != self.world or state.get("global_batch") != self.global_batch:
            self._warn(
                f"resuming a run saved with {state.get('world_size')} workers and global batch {state.get('global_batch')} "
                f"on {self.world} workers and global batch {self.global_batch}"
            )
        if self.is_main:
            why = "restarted after a worker failure" if self.restart else "resumed"
            self.progress.event(
                "resume", step=pos.step, checkpoint=str(path), text=f"{why} from {path.name} (step {pos.step})"
            )
        return pos

    def _warn(self, msg: str) -> None:
        if self.is_main:
            self.progress.event("warning", message=msg, text=f"warning: {msg}")

    # ------------------------------------------------------------------ checkpoints
    def save(self, pos: Position) -> Path:
        # Each rank's RNG state and the loss it has summed since the last log step (so the first logged
        # loss after a resume averages the same steps as an uninterrupted run would).
        mine = {"rng": rng_state(), "loss_window": [float(self.loss_window[0]), self.loss_window[1]]}
        ranks: list[Any] = [None] * self.world
        dist.all_gather_object(ranks, mine, group=self.control)
        path = ckpt.path_for(self.paths.root, pos.step)
        if self.is_main:
            state = {
                "format": ckpt.FORMAT,
                "model_name": self.cfg.model,
                "model": self.raw_model.state_dict(),
                "optimizer": self.optimizer.state_dict(),
                "schedule": self.schedule.state_dict(),
                "scaler": self.scaler.state_dict(),
                "step": pos.step,
                "epoch": pos.epoch,
                "micro": pos.micro,
                "ranks": ranks,
                "world_size": self.world,
                "global_batch": self.global_batch,
                "data_spec": self.data_spec_record(),
            }
            ckpt.save_atomic(state, path)
            ckpt.prune(self.paths.root, self.cfg.keep_checkpoints)
        dist.barrier(group=self.control)
        return path

    def data_spec_record(self) -> dict[str, Any]:
        s = self.spec
        return {"name": s.name, "num_classes": s.num_classes, "input_shape": [s.in_channels, *s.image_size],
                "class_names": list(s.class_names), "mean": list(s.mean), "std": list(s.std)}  # fmt: skip

    # ------------------------------------------------------------------ the loop
    def _batches(self, epoch: int, micro: int) -> Iterator[Batch]:
        return self.train_src.batches(self.sampler.batches(epoch, micro), epoch)

    def _agree(self, ckpt_due: bool) -> tuple[int, bool]:
        """All ranks agree on (stop signal, checkpoint now) with one all-reduce on the control group."""
        flags = torch.tensor([self.stop.signum, int(ckpt_due and self.is_main)], dtype=torch.int64)
        dist.all_reduce(flags, op=dist.ReduceOp.MAX, group=self.control)
        return int(flags[0]), bool(flags[1])

    def run(self) -> dict[str, Any]:
        self._build()
        pos = self._restore()
        cfg = self.cfg
        metrics = (
            MetricsLog(self.paths.metrics, self.paths.tensorboard, pos.step if pos.step else None)
            if self.is_main
            else None
        )
        if self.is_main and pos.step == 0:
            self.progress.event(
                "start", devices=self.world, global_batch=self.global_batch, lr=self.lr, precision=self.precision,
                total_steps=self.total_steps,
                text=f"training {cfg.model} on {self.spec.name}: {self.world} × {self.launch['kind']}, global batch "
                     f"{self.global_batch}, lr {self.lr:g}, {self.precision}, {self.total_steps} steps",
            )  # fmt: skip
        train_time = 0.0
        wait_time = 0.0
        # Throughput leaves out the first step(s) of each attempt: compilation, autotuning, allocator warm-up.
        skip = self.launch.get("timing_skip_steps")
        timing_skip = int(skip) if skip is not None else (1 if self.total_steps > 10 else 0)
        done_here = timed_images = 0

        bad = seen = 0
        last_ckpt = time.monotonic()
        last_val: dict[str, float] = {}
        stopped = 0
        loss_sum, loss_n = self.loss_window
        window_t, window_imgs = time.perf_counter(), 0
        rate = 0.0
        self.model.train()
        while pos.step < self.total_steps and not stopped:
            it = self._batches(pos.epoch, pos.micro)
            epoch_done = False
            while pos.step < self.total_steps:
                t0 = time.perf_counter()
                micro_batches: list[Batch] = []
                for _ in range(cfg.grad_accum):
                    try:
                        micro_batches.append(next(it))
                    except StopIteration:
                        epoch_done = True
                        break
                if epoch_done:
                    break
                t1 = time.perf_counter()
                self._optimizer_step(micro_batches, loss_sum)
                for b in micro_batches:
                    bad += b.bad
                    seen += b.bad + b.size
                    window_imgs += b.size
                loss_n += 1
                self.loss_window = (loss_sum, loss_n)
                pos.step += 1
                pos.micro += len(micro_batches)
                done_here += 1
                log = pos.step % cfg.log_every_steps == 0 or pos.step == self.total_steps
                logged_loss = None
                if log:
                    stats = torch.stack([loss_sum.float(), torch.tensor(float(loss_n), device=self.device)])
                    dist.all_reduce(stats)
                    logged_loss = float(stats[0] / stats[1])
                    loss_sum.zero_()
                    loss_n = 0
                    self.loss_window = (loss_sum, loss_n)
                    now = time.perf_counter()
                    rate = window_imgs * self.world / max(1e-9, now - window_t)
                    window_t, window_imgs = now, 0
                    self._check_bad(bad, seen)
                    if metrics is not None:
                        metrics.write({
                            "kind": "train", "step": pos.step, "epoch": pos.epoch, "loss": round(logged_loss, 6),
                            "lr": self.optimizer.param_groups[0]["lr"], "images_per_s": round(rate, 1),
                            "data_wait_fraction": round(wait_time / max(train_time, 1e-9), 4),
                            "memory_bytes": self._memory(),
                        })  # fmt: skip
                elif rate == 0.0 and pos.step >= 2:
                    rate = window_imgs * self.world / max(1e-9, time.perf_counter() - window_t)
                eta = (self.total_steps - pos.step) * self.global_batch / max(rate, 1e-9)
                self.progress.update(epoch=pos.epoch + 1, epochs=self.epochs, step=pos.step, total=self.total_steps,
                                     loss=logged_loss, images_per_s=rate, eta_s=eta, log=log)  # fmt: skip
                due = (cfg.checkpoint_every_steps > 0 and pos.step % cfg.checkpoint_every_steps == 0) or (
                    cfg.checkpoint_every_minutes > 0
                    and time.monotonic() - last_ckpt >= cfg.checkpoint_every_minutes * 60
                )
                stopped, save_now = self._agree(due)
                if (stopped or save_now) and pos.step < self.total_steps:
                    path = self.save(pos)
                    last_ckpt = time.monotonic()
                    if self.is_main and not stopped:
                        self.progress.event("checkpoint", step=pos.step, path=str(path))
                if done_here > timing_skip:
                    # The whole iteration counts: data, compute, logging, the stop/checkpoint agreement and any
                    # checkpoint written; only validation is left out.
                    wait_time += t1 - t0
                    train_time += time.perf_counter() - t0
                    timed_images += sum(b.size for b in micro_batches)
                if stopped:
                    break
            if stopped:
                break
            if epoch_done or pos.step == self.total_steps:
                last_val = self.validate()
                if metrics is not None:
                    metrics.write({"kind": "val", "step": pos.step, "epoch": pos.epoch, **last_val})
                if self.is_main:
                    self.progress.event("val", step=pos.step, epoch=pos.epoch + 1, **last_val,
                                        text=f"epoch {pos.epoch + 1}: {describe_validation(last_val)}")  # fmt: skip
                if epoch_done and pos.step < self.total_steps:
                    pos.epoch += 1
                    pos.micro = 0
                    self.save(pos)
                    last_ckpt = time.monotonic()
                self.model.train()
        final = self.save(pos) if pos.step == self.total_steps else None
        if metrics is not None:
            metrics.close()
        self.progress.close()
        return {
            "stopped_by_signal": stopped,
            "step": pos.step,
            "total_steps": self.total_steps,
            "train_time_s": train_time,
            "images": timed_images,
            "data_wait_fraction": wait_time / max(train_time, 1e-9),
            "bad_images": bad,
            "validation": last_val,
            "final_checkpoint": str(final) if final else None,
            "lr": self.lr,
            "precision": self.precision,
            "global_batch": self.global_batch,
            "memory_bytes": self._memory(),
        }

    def _optimizer_step(self, micro_batches: list[Batch], loss_sum: torch.Tensor) -> None:
        """Forward and backward over the micro-batches (DDP syncs on the last), then one optimizer step."""
        self.optimizer.zero_grad(set_to_none=True)
        n = len(micro_batches)
        for i, b in enumerate(micro_batches):
            ctx = contextlib.nullcontext() if i == n - 1 else self.model.no_sync()  # type: ignore[operator]
            with ctx:
                with torch.autocast(self.device.type, dtype=self.autocast_dtype or torch.float32,
                                    enabled=self.autocast_dtype is not None):  # fmt: skip
                    loss = self._loss(b) / n
                self.scaler.scale(loss).backward()
            loss_sum += loss.detach()
        if self.cfg.grad_clip:
            self.scaler.unscale_(self.optimizer)
            nn.utils.clip_grad_norm_(self.raw_model.parameters(), self.cfg.grad_clip)
        self.scaler.step(self.optimizer)
        self.scaler.update()
        self.schedule.step()

    def _loss(self, b: Batch) -> torch.Tensor:
        if self.task is not None:
            return self.task.loss(self.model, b, self.device)
        x = b.images.to(self.device, non_blocking=True)
        y = b.labels.to(self.device, non_blocking=True)
        if self.channels_last:
            x = x.contiguous(memory_format=torch.channels_last)
        return self.loss_fn(self.model(x), y)  # type: ignore[no-any-return]

    def _check_bad(self, bad: int, seen: int) -> None:
        t = torch.tensor([bad, seen], dtype=torch.int64)
        dist.all_reduce(t, group=self.control)
        b, s = int(t[0]), int(t[1])
        if s and b / s > self.cfg.max_bad_fraction:
            raise DataError(
                f"{b} of {s} images ({100 * b / s:.1f}%) could not be decoded, more than max_bad_fraction "
                f"{self.cfg.max_bad_fraction:g}; fix or remove the corrupt files"
            )

    def _memory(self) -> int:
        if self.device.type == "cuda":
            return int(torch.cuda.max_memory_allocated(self.device))
        import resource

        return int(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss) * 1024

    @torch.no_grad()
    def validate(self) -> dict[str, float]:
        self.model.eval()
        batches = shard_indices(len(self.val_src), self.world, self.rank, self.per_device * 2)
        if self.task is not None:
            task_sums = torch.zeros(self.task.val_sums_size, dtype=torch.float64, device=self.device)
            for b in self.val_src.batches(batches, 0):
                with torch.autocast(self.device.type, dtype=self.autocast_dtype or torch.float32,
                                    enabled=self.autocast_dtype is not None):  # fmt: skip
                    task_sums += self.task.val_sums(self.raw_model, b, self.device).to(self.device)
            dist.all_reduce(task_sums)
            return self.task.val_metrics(task_sums.cpu())
        sums = torch.zeros(3, dtype=torch.float64, device=self.device)
        for b in self.val_src.batches(batches, 0):
            if b.labels.numel() == 0:
                continue
            x = b.images.to(self.device, non_blocking=True)
            y = b.labels.to(self.device, non_blocking=True)
            if self.channels_last:
                x = x.contiguous(memory_format=torch.channels_last)
            with torch.autocast(self.device.type, dtype=self.autocast_dtype or torch.float32,
                                enabled=self.autocast_dtype is not None):  # fmt: skip
                logits = self.raw_model(x)
            sums[0] += nn.functional.cross_entropy(logits.float(), y, reduction="sum").double()
            sums[1] += (logits.argmax(1) == y).sum().double()
            sums[2] += y.shape[0]
        dist.all_reduce(sums)
        n = max(1.0, float(sums[2]))
        return {"val_loss": round(float(sums[0]) / n, 6), "val_accuracy": round(float(sums[1]) / n, 6)}
