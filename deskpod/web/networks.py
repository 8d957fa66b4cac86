"""Step 2 of New training: the model registry's networks, each counted for the chosen dataset.

For the dataset's input shape and class count, a network is built on the CPU (random weights, as the
trainer builds it: `deskpod.train.models.build_model`, then `check_forward`) and one sample is run
through it under ``torch.utils.flop_counter.FlopCounterMode`` — what `deskpod.plan.workload` does
at 224×224 — giving its forward FLOPs per sample (2 per multiply-add), its parameters, and its
activation elements (the outputs of its leaf modules, through forward hooks, as the plan's tests
count them). `model_cost` turns those into the planner's `ModelCost`. A network that cannot take the
data (alexnet on 28×28 images) gets the registry's reason instead (its `ConfigError`).

Counts are cached per (model, shape, classes) in the cache dict the caller passes
(``web.cache["networks"]``) and made only when a page asks for them. A user factory
(``package.module:factory``) is imported and counted in a child process (``python -m
deskpod.web.networks NAME C H W CLASSES``) under a timeout: importing a module runs its code, and that
must not happen inside the pod service (a "factory" named ``os:abort`` would end it); its count is
kept a minute only, since its file may be edited meanwhile.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from deskpod.errors import DeskpodError
from deskpod.plan.workload import ModelCost

ABOUT = {
    "convnet": "Two conv blocks and a small classifier, made for 28×28 images: about 91.5% on Fashion-MNIST in 4 epochs.",
    "mlp": "Flatten and two hidden layers of 256, no normalisation: quick, and the same on any number of devices.",
    "alexnet": "torchvision's AlexNet (Krizhevsky et al., 2012), one of the DGX-1's benchmark networks.",
    "resnet18": "torchvision's ResNet-18 (He et al., 2015).",
    "resnet50": "torchvision's ResNet-50 (He et al., 2015), the DGX-1's headline benchmark.",
}
FACTORY_TIMEOUT_S = 120.0
FACTORY_TTL_S = 60.0
MAX_NAME = 200
CACHE_LIMIT = 256

_LOCK = threading.Lock()
"""One registry model built in this process at a time: a page's counts are made once however many tabs ask.
(A factory's child process runs outside it: a slow factory does not hold up the registry's cards.)"""


def count(name: str, shape: Sequence[int], classes: int) -> dict[str, int]:
    """Parameters, forward FLOPs, activation elements and convolution input + output elements of one ``shape``
    (C, H, W) sample; `ConfigError` else."""
    import torch
    from torch.utils.flop_counter import FlopCounterMode

    from deskpod.train.models import ModelSpec, build_model, check_forward

    c, h, w = (int(v) for v in shape)
    spec = ModelSpec(classes, c, (h, w))
    model = build_model(name, spec)
    check_forward(model, spec, name)
    acts: list[int] = []
    conv_io: list[int] = []

    def hook(_m: Any, _i: Any, out: Any) -> None:
        if isinstance(out, torch.Tensor):
            acts.append(out.numel())

    def conv_hook(_m: Any, inp: Any, out: Any) -> None:
        conv_io.append(inp[0].numel() + out.numel())

    nn = torch.nn
    convs = (nn.Conv1d, nn.Conv2d, nn.Conv3d, nn.ConvTranspose1d, nn.ConvTranspose2d, nn.ConvTranspose3d)
    leaves = [m for m in model.modules() if not list(m.children())]
    handles = [m.register_forward_hook(hook) for m in leaves]
    handles += [m.register_forward_hook(conv_hook) for m in leaves if isinstance(m, convs)]
    model.eval()
    try:
        with torch.no_grad(), FlopCounterMode(display=False) as counter:
            model(torch.zeros(1, c, h, w))
    finally:
        for handle in handles:
            handle.remove()
    return {
        "params": int(sum(p.numel() for p in model.parameters())),
        "forward_flops": int(counter.get_total_flops()),
        "activations": int(sum(acts)),
        "conv_io": int(sum(conv_io)),
    }


def _count_factory(name: str, shape: Sequence[int], classes: int, cwd: Path | None) -> dict[str, Any]:
    """`count` of a user factory, in a child process (see the module docstring)."""
    argv = [sys.executable, "-m", "deskpod.web.networks", name, *(str(int(v)) for v in shape), str(classes)]
    env = dict(os.environ, CUDA_VISIBLE_DEVICES="")  # counting is CPU work; never take a GPU from a job
    try:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=FACTORY_TIMEOUT_S, cwd=cwd, env=env)
    except subprocess.TimeoutExpired:
        return {"error": f"model {name!r}: building and counting it took over {FACTORY_TIMEOUT_S:.0f} s"}
    lines = done.stdout.strip().splitlines()
    try:
        got = json.loads(lines[-1]) if lines else None
    except ValueError:
        got = None
    if not isinstance(got, dict):
        tail = (done.stderr.strip().splitlines() or [f"exit code {done.returncode}"])[-1]
        return {"error": f"model {name!r}: counting it failed: {tail[:300]}"}
    return got


def network(
    name: str, shape: Sequence[int], classes: int, cache: dict[Any, Any], *, cwd: Path | None = None
) -> dict[str, Any]:
    """One network for data of ``shape`` and ``classes``: its counts, or ``error`` with the registry's reason."""
    name = name.strip()
    key = (name, tuple(int(v) for v in shape), int(classes))
    hit = cache.get(key)
    if hit is not None and (hit[0] is None or time.monotonic() < hit[0]):
        return hit[1]  # type: ignore[no-any-return]
    factory = ":" in name
    out: dict[str, Any] = {"model": name, "about": ABOUT.get(name, ""), "builtin": not factory}
    if not name or len(name) > MAX_NAME:
        out["error"] = (
            f"model {name[:60]!r} is not valid: a model name such as convnet or resnet18, or package.module:factory"
        )
        return out
    if factory:
        out.update(_count_factory(name, shape, classes, cwd))
    else:
        with _LOCK:
            hit = cache.get(key)
            if hit is not None:
                return hit[1]  # type: ignore[no-any-return]
            try:
                out.update(count(name, shape, classes))
            except DeskpodError as e:
                out["error"] = str(e)
    out.setdefault("error", None)
    if len(cache) >= CACHE_LIMIT:
        cache.pop(next(iter(cache)))
    cache[key] = (time.monotonic() + FACTORY_TTL_S if factory else None, out)
    return out


def cards(shape: Sequence[int], classes: int, cache: dict[Any, Any]) -> list[dict[str, Any]]:
    """Every registry model, counted for this data (those that cannot take it carry their reason)."""
    from deskpod.train.models import model_names

    return [network(n, shape, classes, cache) for n in model_names()]


def model_cost(info: dict[str, Any], shape: Sequence[int]) -> ModelCost:
    """The planner's cost of one sample through the counted network ``info``."""
    c, h, w = (int(v) for v in shape)
    return ModelCost(
        info["model"],
        forward_gflops=info["forward_flops"] / 1e9,
        params_m=info["params"] / 1e6,
        activations_m=info["activations"] / 1e6,
        conv_io_m=info.get("conv_io", 0) / 1e6,
        source=f"counted: FlopCounterMode on {info['model']} at 1x{c}x{h}x{w}",
    )


def main(argv: Sequence[str]) -> int:
    """``python -m deskpod.web.networks NAME C H W CLASSES``: one JSON line of counts, or of ``error``."""
    try:
        name, c, h, w, classes = argv
        print(json.dumps(count(name, (int(c), int(h), int(w)), int(classes))))
    except (DeskpodError, ValueError) as e:
        print(json.dumps({"error": str(e) if isinstance(e, DeskpodError) else f"usage: NAME C H W CLASSES ({e})"}))
    except Exception as e:  # a user's factory may raise anything; its message is the answer
        print(json.dumps({"error": f"model {argv[0]!r}: building it failed: {type(e).__name__}: {e}"}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
