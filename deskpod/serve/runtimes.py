"""Execution runtimes: ONNX Runtime and torch (TorchScript), each behind the same two-method interface.

A runtime is one *instance* of a model: it runs one batch at a time, on one thread of its own (the batcher
gives each instance its own executor). ONNX Runtime and torch both release the GIL while computing, so N
instances compute concurrently — on a GPU this is what MPS provided: several model copies sharing a device.

Where an instance runs follows the config's ``instance_kind`` (Triton's ``instance_group`` kind), as Triton
does it: ``auto`` a GPU when there is one, else the CPU; ``cpu`` the CPU even on a GPU box; ``gpu`` ``instances``
copies on each GPU (or on each of ``gpus``) — and on a box without a usable GPU the model fails to load,
naming the field, as Triton's does (`instance_devices`).
"""

from __future__ import annotations

import warnings
from pathlib import Path
from typing import Any, Protocol

import numpy as np

from deskpod.errors import ConfigError, RunError
from deskpod.serve.protocol import DTYPES
from deskpod.serve.repository import ModelConfig


class Runtime(Protocol):
    def run(self, inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]: ...

    def close(self) -> None: ...


class OnnxRuntime:
    """An ONNX Runtime session; uses the TensorRT and CUDA execution providers when this build has them."""

    def __init__(self, path: Path, config: ModelConfig, device: str = "auto") -> None:
        import onnxruntime as ort

        opts = ort.SessionOptions()
        if config.threads:
            opts.intra_op_num_threads = config.threads
        opts.inter_op_num_threads = 1
        opts.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
        # Idle intra-op threads spin by default; on shared cores that steals the CPU the HTTP loop needs.
        opts.add_session_config_entry("session.intra_op.allow_spinning", "0")
        opts.log_severity_level = 3
        available = ort.get_available_providers()
        wanted = ["TensorrtExecutionProvider", "CUDAExecutionProvider", "CPUExecutionProvider"]
        if device == "cpu":
            wanted = wanted[2:]
        self.providers = [p for p in wanted if p in available]
        providers: list[Any] = list(self.providers)
        if device.startswith("cuda:"):
            gpu = {"device_id": int(device.removeprefix("cuda:"))}
            providers = [(p, gpu) if p != "CPUExecutionProvider" else p for p in self.providers]
        try:
            self.session = ort.InferenceSession(str(path), sess_options=opts, providers=providers)
        except Exception as e:  # onnxruntime raises its own untyped errors
            raise RunError(f"ONNX Runtime could not load {path}: {e}") from e
        names = {i.name for i in self.session.get_inputs()}
        want = {t.name for t in config.inputs}
        if names != want:
            raise ConfigError(
                f"model {config.name!r}: config inputs {sorted(want)} but {path.name} has {sorted(names)}"
            )
        self.output_names = [t.name for t in config.outputs]
        have = {o.name for o in self.session.get_outputs()}
        if not set(self.output_names) <= have:
            raise ConfigError(
                f"model {config.name!r}: config outputs {self.output_names} but {path.name} has {sorted(have)}"
            )

    def run(self, inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        results = self.session.run(self.output_names, inputs)
        return dict(zip(self.output_names, results, strict=True))

    def close(self) -> None:
        del self.session


class TorchRuntime:
    """A TorchScript module (``torch.jit.save``) run under ``torch.inference_mode``."""

    def __init__(self, path: Path, config: ModelConfig, device: str = "auto") -> None:
        import torch

        if config.threads:
            torch.set_num_threads(config.threads)  # process-wide in torch: the last model loaded sets it
        if device == "auto":
            device = "cuda" if torch.cuda.is_available() else "cpu"
        self.device = torch.device(device)
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                self.module = torch.jit.load(str(path), map_location=self.device).eval()
        except Exception as e:  # torch raises RuntimeError for a bad archive
            raise RunError(f"torch could not load {path}: {e}") from e
        self.input_names = [t.name for t in config.inputs]
        self.output_names = [t.name for t in config.outputs]

    def run(self, inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        import torch

        with torch.inference_mode():
            args = [
                torch.from_numpy(np.require(inputs[n], requirements=["C", "W"])).to(self.device)
                for n in self.input_names
            ]
            out = self.module(*args)
        outs = out if isinstance(out, tuple | list) else (out,)
        if len(outs) != len(self.output_names):
            raise RunError(f"torch model returned {len(outs)} outputs, config lists {len(self.output_names)}")
        return {n: o.detach().cpu().numpy() for n, o in zip(self.output_names, outs, strict=True)}

    def close(self) -> None:
        del self.module


class ReshapingRuntime:
    """Triton's ``reshape``: inputs as clients send them (``dims``) become the model's shape, and its outputs
    are reshaped back to ``dims``; the batch dimension, when there is one, stays as it is."""

    def __init__(self, inner: Runtime, config: ModelConfig) -> None:
        self.inner = inner
        self.batched = config.max_batch_size > 0
        self.inputs = {t.name: t.reshape for t in config.inputs if t.reshape is not None}
        self.outputs = {t.name: t.dims for t in config.outputs if t.reshape is not None}

    def _reshape(self, a: np.ndarray, shape: tuple[int, ...]) -> np.ndarray:
        return a.reshape(((a.shape[0],) if self.batched else ()) + shape)

    def run(self, inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        moved = {n: self._reshape(a, self.inputs[n]) if n in self.inputs else a for n, a in inputs.items()}
        outputs = self.inner.run(moved)
        return {n: self._reshape(a, self.outputs[n]) if n in self.outputs else a for n, a in outputs.items()}

    def close(self) -> None:
        self.inner.close()


def gpu_count() -> int:
    """GPUs torch can use on this box (0 on a CPU-only box or a CPU build of torch)."""
    import torch

    return int(torch.cuda.device_count())


def instance_devices(config: ModelConfig, gpus: int | None = None) -> list[str]:
    """The device of each instance of a model: ``auto`` (the runtime picks), ``cpu`` or ``cuda:N``.

    ``instance_kind = "gpu"`` (Triton's KIND_GPU) puts ``instances`` copies on each GPU listed in ``gpus`` (all
    GPUs when empty); on a box without those GPUs it raises `ConfigError` naming the field, as Triton refuses
    the model rather than quietly running it somewhere else. ``gpus`` defaults to `gpu_count`."""
    if config.instance_kind == "cpu":
        return ["cpu"] * config.instances
    if config.instance_kind == "auto":
        return ["auto"] * config.instances
    have = gpu_count() if gpus is None else gpus
    wanted = list(config.gpus) or list(range(have))
    missing = [g for g in wanted if not 0 <= g < have]
    if not wanted or missing:
        which = f"GPU {missing[0]}" if missing else "a GPU"
        raise ConfigError(
            f"model {config.name!r}: instance_group kind KIND_GPU needs {which} but this box has {have} GPU(s) "
            "usable by torch; use kind KIND_CPU or KIND_AUTO to run it on the CPU"
        )
    if config.platform == "onnxruntime":
        import onnxruntime as ort

        if "CUDAExecutionProvider" not in ort.get_available_providers():
            raise ConfigError(
                f"model {config.name!r}: instance_group kind KIND_GPU needs onnxruntime with the "
                "CUDAExecutionProvider (the onnxruntime-gpu package); this build has "
                f"{', '.join(ort.get_available_providers())}"
            )
    return [f"cuda:{g}" for g in wanted for _ in range(config.instances)]


def load_runtime(version_dir: Path, config: ModelConfig, device: str = "auto") -> Runtime:
    """One instance of one version of a model, on ``device`` (from `instance_devices`)."""
    path = version_dir / config.filename
    runtime: Runtime
    if config.platform == "onnxruntime":
        runtime = OnnxRuntime(path, config, device)
    else:
        runtime = TorchRuntime(path, config, device)
    if any(t.reshape is not None for t in (*config.inputs, *config.outputs)):
        runtime = ReshapingRuntime(runtime, config)
    return runtime


def example_inputs(config: ModelConfig, batch: int) -> dict[str, np.ndarray]:
    """Zero inputs of the model's shape (variable dims as 1), for warm-up and checks."""
    out: dict[str, np.ndarray] = {}
    for t in config.inputs:
        dims = tuple(1 if d == -1 else d for d in t.dims)
        shape = ((batch,) if config.max_batch_size else ()) + dims
        dtype: Any = object if t.datatype == "BYTES" else DTYPES[t.datatype]
        out[t.name] = np.zeros(shape, dtype=dtype)
    return out
