"""Step 2's networks: parameters, FLOPs and activations per sample for the chosen data, and the registry's refusals."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest

from deskpod.errors import ConfigError
from deskpod.plan.workload import MODELS
from deskpod.train.models import ModelSpec, build_model, model_names
from deskpod.web.networks import cards, count, model_cost, network


def test_convnet_on_fashion_mnist_matches_its_arithmetic() -> None:
    got = count("convnet", (1, 28, 28), 10)
    # 3×3 convolutions (2 FLOPs per multiply-add): 28² × 32 × 1·9, then 14² × 64 × 32·9; then 3136→128→10.
    flops = 2 * (28 * 28 * 32 * 1 * 9 + 14 * 14 * 64 * 32 * 9 + 3136 * 128 + 128 * 10)
    assert got["forward_flops"] == flops
    assert got["params"] == (32 * 9 + 2 * 32) + (64 * 32 * 9 + 2 * 64) + (3136 * 128 + 128) + (128 * 10 + 10)
    # every leaf's output: conv, BN, ReLU (28²×32 each), pool (14²×32); the same at 14²×64 / 7²×64; the head
    acts = 3 * 784 * 32 + 196 * 32 + 3 * 196 * 64 + 49 * 64 + 49 * 64 + 3136 + 3 * 128 + 10
    assert got["activations"] == acts
    assert got["conv_io"] == (1 * 784 + 32 * 784) + (32 * 196 + 64 * 196)  # each convolution's input + output


def test_resnet50_at_224_is_what_the_planner_knows() -> None:
    got = count("resnet50", (3, 224, 224), 1000)
    cost = MODELS["resnet50"]  # deskpod.plan.workload's figures, computed the same way at 224×224
    assert got["forward_flops"] / 1e9 == pytest.approx(cost.forward_gflops, rel=1e-9)
    assert got["params"] / 1e6 == pytest.approx(cost.params_m, rel=1e-9)
    assert got["activations"] / 1e6 == pytest.approx(cost.activations_m, rel=1e-9)
    assert got["conv_io"] / 1e6 == pytest.approx(cost.conv_io_m, rel=1e-9)
    planned = model_cost({"model": "resnet50", **got}, (3, 224, 224))
    assert (planned.forward_gflops, planned.params_m, planned.conv_io_m) == pytest.approx(
        (cost.forward_gflops, cost.params_m, cost.conv_io_m)
    )


def test_a_model_that_cannot_take_the_data_shows_the_registrys_reason() -> None:
    with pytest.raises(ConfigError) as registry:
        build_model("alexnet", ModelSpec(10, 1, (28, 28)))
    got = network("alexnet", (1, 28, 28), 10, {})
    assert got["error"] == str(registry.value) and "params" not in got
    assert "63×63" in got["error"]
    unknown = network("convnett", (1, 28, 28), 10, {})
    assert "unknown model 'convnett'" in unknown["error"] and "did you mean 'convnet'" in unknown["error"]


def test_counts_are_cached_per_shape_and_classes() -> None:
    cache: dict[Any, Any] = {}
    small = network("mlp", (1, 28, 28), 10, cache)
    assert network("mlp", (1, 28, 28), 10, cache) is small
    wider = network("mlp", (3, 32, 32), 10, cache)
    more = network("mlp", (1, 28, 28), 100, cache)
    assert small["params"] < wider["params"] and small["params"] < more["params"]
    assert len(cache) == 3


def test_cards_cover_the_registry() -> None:
    got = cards((1, 28, 28), 10, {})
    assert [c["model"] for c in got] == model_names()
    assert {c["model"] for c in got if c["error"]} == {"alexnet"}  # too small for it; the others take 28×28
    assert all(c["forward_flops"] > 0 and c["params"] > 0 for c in got if not c["error"])


def test_user_factories_are_counted_in_a_child_process(tmp_path: Path) -> None:
    (tmp_path / "mynets.py").write_text(
        "import torch\n"
        "def tiny(num_classes, in_channels, image_size):\n"
        "    h, w = image_size\n"
        "    return torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(in_channels * h * w, num_classes))\n"
        "def broken(num_classes):\n"
        "    raise RuntimeError('no weights for ' + str(num_classes))\n"
    )
    got = network("mynets:tiny", (1, 28, 28), 10, {}, cwd=tmp_path)
    assert got["error"] is None
    assert (got["params"], got["forward_flops"]) == (784 * 10 + 10, 2 * 784 * 10)
    broken = network("mynets:broken", (1, 28, 28), 10, {}, cwd=tmp_path)
    assert "RuntimeError: no weights for 10" in broken["error"]
    pid = os.getpid()
    fatal = network("os:abort", (1, 28, 28), 10, {}, cwd=tmp_path)  # would have ended the pod service in-process
    assert fatal["error"] and os.getpid() == pid
