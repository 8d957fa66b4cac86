"""Execution runtimes: ONNX Runtime and torch (TorchScript), each behind the same two-method interface.

A runtime is one *instance* of a model: it runs one batch at a time, on one thread of its own (the batcher
gives each instance its own executor). ONNX Runtime and torch both release the GIL while computing, so N
instances compute concurrently — on a GPU this is what MPS provided: several model copies sharing a device.
"""

from __future__ import annotations

import warnings
from pathlib import Path
from typing import Any, Protocol

import numpy as np

from deskpod.errors import ConfigError, RunError
from deskpod.serve.protocol import DTYPES
from deskpod.serve.repository import PLATFORMS, ModelConfig


class Runtime(Protocol):
    def run(self, inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]: ...

    def close(self) -> None: ...


class OnnxRuntime:
    """An ONNX Runtime session; uses the TensorRT and CUDA execution providers when this build has them."""

    def __init__(self, path: Path, config: ModelConfig) -> None:
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
        self.providers = [p for p in wanted if p in available]
        try:
            self.session = ort.InferenceSession(str(path), sess_options=opts, providers=self.providers)
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

    def __init__(self, path: Path, config: ModelConfig) -> None:
        import torch

        if config.threads:
            torch.set_num_threads(config.threads)  # process-wide in torch: the last model loaded sets it
        self.device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
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


def load_runtime(version_dir: Path, config: ModelConfig) -> Runtime:
    path = version_dir / PLATFORMS[config.platform]
    if config.platform == "onnxruntime":
        return OnnxRuntime(path, config)
    return TorchRuntime(path, config)


def example_inputs(config: ModelConfig, batch: int) -> dict[str, np.ndarray]:
    """Zero inputs of the model's shape (variable dims as 1), for warm-up and checks."""
    out: dict[str, np.ndarray] = {}
    for t in config.inputs:
        dims = tuple(1 if d == -1 else d for d in t.dims)
        shape = ((batch,) if config.max_batch_size else ()) + dims
        dtype: Any = object if t.datatype == "BYTES" else DTYPES[t.datatype]
        out[t.name] = np.zeros(shape, dtype=dtype)
    return out
