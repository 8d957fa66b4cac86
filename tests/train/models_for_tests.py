"""Model factories the multi-process tests load as ``tests.train.models_for_tests:NAME``."""

from __future__ import annotations

import os
import time

import torch
from torch import nn


class _Tiny(nn.Module):
    def __init__(self, num_classes: int, in_channels: int, image_size: tuple[int, int]) -> None:
        super().__init__()
        self.fc = nn.Linear(in_channels * image_size[0] * image_size[1], num_classes)
        self.calls = 0

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.calls += 1
        return self.fc(x.flatten(1))


class _Crashing(_Tiny):
    """Raises in rank 1's 5th training forward pass, on every attempt."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.training and os.environ.get("RANK") == "1" and self.calls == 4:
            raise RuntimeError("injected failure: rank 1 cannot go on")
        return super().forward(x)


class _Stalling(_Tiny):
    """Rank 1 stops answering (a hung kernel, a lost host) in its 3rd training step."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.training and os.environ.get("RANK") == "1" and self.calls == 2:
            time.sleep(600)
        return super().forward(x)


def crashing(num_classes: int, in_channels: int, image_size: tuple[int, int]) -> nn.Module:
    return _Crashing(num_classes, in_channels, image_size)


def stalling(num_classes: int, in_channels: int, image_size: tuple[int, int]) -> nn.Module:
    return _Stalling(num_classes, in_channels, image_size)


def tiny(num_classes: int, in_channels: int, image_size: tuple[int, int]) -> nn.Module:
    return _Tiny(num_classes, in_channels, image_size)


def not_a_module(num_classes: int) -> object:
    return {"classes": num_classes}
