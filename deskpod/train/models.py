"""The model registry: the DGX-1's benchmark networks, two small ones, and any user factory.

- ``alexnet``, ``resnet18``, ``resnet50``: torchvision's definitions (random init: no weights are
  downloaded), with the first convolution rebuilt when the data has other than 3 channels.
- ``convnet``: a small VGG-style network for 28×28 images (Fashion-MNIST), ~0.1 M parameters.
- ``mlp``: two hidden layers, no normalisation; handy for parity tests and serving.
- ``package.module:factory``: any callable returning an ``nn.Module``, importable from the Python path or
  the current directory. It is called with those of ``num_classes``, ``in_channels`` and ``image_size``
  that its signature accepts.
"""

from __future__ import annotations

import difflib
import importlib
import inspect
import os
import sys
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from deskpod.errors import ConfigError


@dataclass(frozen=True, slots=True)
class ModelSpec:
    """What a model needs to know about its data."""

    num_classes: int
    in_channels: int
    image_size: tuple[int, int]


class ConvNet(nn.Module):
    """Two conv blocks and a small classifier: ~91% on Fashion-MNIST in a few epochs."""

    def __init__(self, num_classes: int = 10, in_channels: int = 1, width: int = 32, norm: bool = True) -> None:
        super().__init__()

        def block(cin: int, cout: int) -> nn.Sequential:
            layers: list[nn.Module] = [nn.Conv2d(cin, cout, 3, padding=1, bias=not norm)]
            if norm:
                layers.append(nn.BatchNorm2d(cout))
            layers += [nn.ReLU(inplace=True), nn.MaxPool2d(2)]
            return nn.Sequential(*layers)

        self.features = nn.Sequential(block(in_channels, width), block(width, 2 * width))
        self.pool = nn.AdaptiveAvgPool2d((7, 7))
        self.classifier = nn.Sequential(
            nn.Flatten(),
            nn.Linear(2 * width * 49, 128),
            nn.ReLU(inplace=True),
            nn.Dropout(0.2),
            nn.Linear(128, num_classes),
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.classifier(self.pool(self.features(x)))  # type: ignore[no-any-return]


class MLP(nn.Module):
    """Flatten, two hidden ReLU layers, no normalisation or dropout (deterministic across layouts)."""

    def __init__(self, num_classes: int, in_features: int, hidden: int = 256) -> None:
        super().__init__()
        self.net = nn.Sequential(
            nn.Flatten(),
            nn.Linear(in_features, hidden),
            nn.ReLU(),
            nn.Linear(hidden, hidden),
            nn.ReLU(),
            nn.Linear(hidden, num_classes),
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)  # type: ignore[no-any-return]


def _torchvision(name: str) -> Callable[[ModelSpec], nn.Module]:
    def build(spec: ModelSpec) -> nn.Module:
        import torchvision

        model: nn.Module = getattr(torchvision.models, name)(weights=None, num_classes=spec.num_classes)
        if spec.in_channels != 3:
            _rebuild_stem(model, spec.in_channels)
        return model

    return build


def _rebuild_stem(model: nn.Module, in_channels: int) -> None:
    """Replace the first Conv2d with one taking ``in_channels`` (same kernel, stride, padding)."""
    for parent in model.modules():
        for child_name, child in parent.named_children():
            if isinstance(child, nn.Conv2d):
                new = nn.Conv2d(
                    in_channels,
                    child.out_channels,
                    child.kernel_size,  # type: ignore[arg-type]
                    stride=child.stride,  # type: ignore[arg-type]
                    padding=child.padding,  # type: ignore[arg-type]
                    bias=child.bias is not None,
                )
                setattr(parent, child_name, new)
                return


BUILTIN: dict[str, Callable[[ModelSpec], nn.Module]] = {
    "convnet": lambda s: ConvNet(s.num_classes, s.in_channels),
    "mlp": lambda s: MLP(s.num_classes, s.in_channels * s.image_size[0] * s.image_size[1]),
    "alexnet": _torchvision("alexnet"),
    "resnet18": _torchvision("resnet18"),
    "resnet50": _torchvision("resnet50"),
}

# Smallest input side each torchvision network accepts (its stride and pooling).
MIN_SIDE = {"alexnet": 63}


def model_names() -> list[str]:
    return list(BUILTIN)


def import_factory(name: str, what: str = "model") -> Callable[..., Any]:
    """The callable named ``package.module:attr`` (a model's or a task's factory); `ConfigError` when missing."""
    module_name, _, attr = name.partition(":")
    # Like `python -m` (and the workers, which run as `python -m deskpod.train.worker`), look in the
    # current directory too, so a model file next to where you run `deskpod train` is found.
    if "" not in sys.path and os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())
    try:
        module = importlib.import_module(module_name)
    except ImportError as e:
        raise ConfigError(f"{what} {name!r}: cannot import module {module_name!r} ({e})") from None
    factory = getattr(module, attr, None)
    if not callable(factory):
        raise ConfigError(f"{what} {name!r}: module {module_name!r} has no callable {attr!r}")
    return factory  # type: ignore[no-any-return]


def build_model(name: str, spec: ModelSpec) -> nn.Module:
    """Build a model by registry name or ``package.module:factory``; raise `ConfigError` for unknown ones."""
    if ":" in name:
        factory = import_factory(name)
        params = inspect.signature(factory).parameters
        offered = {"num_classes": spec.num_classes, "in_channels": spec.in_channels, "image_size": spec.image_size}
        kwargs = {k: v for k, v in offered.items() if k in params}
        model = factory(**kwargs)
        if not isinstance(model, nn.Module):
            raise ConfigError(f"model {name!r}: the factory returned {type(model).__name__}, not a torch.nn.Module")
        return model
    if name not in BUILTIN:
        close = difflib.get_close_matches(name, BUILTIN, n=1)
        hint = f" (did you mean {close[0]!r}?)" if close else ""
        raise ConfigError(
            f"unknown model {name!r}{hint}; valid: {', '.join(BUILTIN)}, or a factory as package.module:function"
        )
    side = min(spec.image_size)
    if side < MIN_SIDE.get(name, 0):
        raise ConfigError(
            f"model {name!r} needs images of at least {MIN_SIDE[name]}×{MIN_SIDE[name]} pixels; "
            f"this data is {spec.image_size[0]}×{spec.image_size[1]} (try --data synthetic:3x224x224)"
        )
    return BUILTIN[name](spec)


def is_convnet(model: nn.Module) -> bool:
    return any(isinstance(m, nn.Conv2d) for m in model.modules())


def check_forward(model: nn.Module, spec: ModelSpec, name: str) -> None:
    """Run one sample through ``model`` so shape mismatches become a clear error before any worker starts."""
    x = torch.zeros(1, spec.in_channels, *spec.image_size)
    was_training = model.training
    model.eval()
    try:
        with torch.no_grad():
            out = model(x)
    except Exception as e:
        raise ConfigError(
            f"model {name!r} does not accept this data's images ({spec.in_channels}×{spec.image_size[0]}×{spec.image_size[1]}): {e}"
        ) from None
    finally:
        model.train(was_training)
    if not isinstance(out, torch.Tensor) or out.shape != (1, spec.num_classes):
        shape = tuple(out.shape) if isinstance(out, torch.Tensor) else type(out).__name__
        raise ConfigError(f"model {name!r} returns {shape} for one image; expected (1, {spec.num_classes}) logits")
