"""Optimizers and learning-rate schedules.

SGD follows Goyal et al., "Accurate, Large Minibatch SGD: Training ImageNet in 1 Hour" (2017):
the learning rate grows linearly with the global batch (``base_lr × global_batch / 256``, applied in
the trainer) and ramps up linearly over a warm-up, from lr/10, so that large batches do not diverge
early. After warm-up it decays by a cosine to zero, by ×0.1 steps at 50% and 75% of training, or
stays constant. Weight decay is not applied to biases and normalisation parameters.
"""

from __future__ import annotations

import math

import torch
from torch import nn

from deskpod.train.config import TrainConfig

WARMUP_START = 0.1  # warm-up starts at lr × 0.1


def _param_groups(model: nn.Module, weight_decay: float) -> list[dict[str, object]]:
    decay: list[nn.Parameter] = []
    no_decay: list[nn.Parameter] = []
    for p in model.parameters():
        if p.requires_grad:
            (no_decay if p.ndim <= 1 else decay).append(p)
    return [{"params": decay, "weight_decay": weight_decay}, {"params": no_decay, "weight_decay": 0.0}]


def make_optimizer(cfg: TrainConfig, model: nn.Module, lr: float) -> torch.optim.Optimizer:
    groups = _param_groups(model, cfg.weight_decay)
    if cfg.optimizer == "adamw":
        return torch.optim.AdamW(groups, lr=lr)
    return torch.optim.SGD(groups, lr=lr, momentum=cfg.momentum)


def lr_factor(step: int, total: int, warmup: int, schedule: str) -> float:
    """Multiplier of the peak lr after ``step`` optimizer steps."""
    if warmup > 0 and step < warmup:
        return WARMUP_START + (1 - WARMUP_START) * step / warmup
    if schedule == "constant":
        return 1.0
    progress = (step - warmup) / max(1, total - warmup)
    if schedule == "step":
        return 0.01 if progress >= 0.75 else 0.1 if progress >= 0.5 else 1.0
    return 0.5 * (1 + math.cos(math.pi * min(1.0, progress)))


def make_schedule(
    schedule: str, optimizer: torch.optim.Optimizer, total: int, warmup: int
) -> torch.optim.lr_scheduler.LambdaLR:
    return torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: lr_factor(s, total, warmup, schedule))
