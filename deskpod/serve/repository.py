"""The model repository: one folder per model, numbered versions, one config file.

Layout (the same shape as Triton's, with TOML instead of protobuf text)::

    REPO/<model>/config.toml          what the server needs to know (below)
    REPO/<model>/<version>/model.onnx (platform "onnxruntime")  or  model.pt (platform "torch", TorchScript)

``config.toml``::

    platform = "onnxruntime"          # or "torch"
    max_batch_size = 32               # 0: no batching, the inputs carry no batch dimension
    max_queue_delay_us = 2000         # how long the batcher may hold a request for others to join
    max_queue_size = 256              # bounded queue: requests beyond it are refused at once (HTTP 503)
    instances = 1                     # model copies executing concurrently (the role MPS played on a GPU)
    threads = 0                       # intra-op threads per instance (0: the runtime's default)
    timeout_ms = 0                    # default per-request timeout (0: none); a request may set its own
    versions = "latest"               # "latest" or "all"
    warmup = true                     # run one batch per instance before the model reports ready
    labels = ["T-shirt", ...]         # class names, reported in the model metadata
    mean = [0.286]; std = [0.353]     # the normalisation baked into the exported graph (informational)
    [[input]]  name = "input"  datatype = "FP32"  dims = [1, 28, 28]   # dims exclude the batch dimension
    [[output]] name = "logits" datatype = "FP32"  dims = [10]
"""

from __future__ import annotations

import tomllib
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

import tomli_w

from deskpod.errors import ConfigError
from deskpod.serve.protocol import DATATYPES

PLATFORMS = {"onnxruntime": "model.onnx", "torch": "model.pt"}


@dataclass(frozen=True, slots=True)
class TensorSpec:
    """An input or output: name, v2 datatype, dims without the batch dimension (-1: any size)."""

    name: str
    datatype: str
    dims: tuple[int, ...]

    def __post_init__(self) -> None:
        if self.datatype not in DATATYPES:
            raise ConfigError(f"tensor {self.name!r}: datatype {self.datatype!r} is not one of {', '.join(DATATYPES)}")
        if any(d < -1 or d == 0 for d in self.dims):
            raise ConfigError(f"tensor {self.name!r}: dims {list(self.dims)} must be positive or -1")

    def as_dict(self) -> dict[str, Any]:
        return {"name": self.name, "datatype": self.datatype, "dims": list(self.dims)}


@dataclass(frozen=True, kw_only=True, slots=True)
class ModelConfig:
    """A model's ``config.toml``, validated."""

    name: str
    platform: str
    inputs: tuple[TensorSpec, ...]
    outputs: tuple[TensorSpec, ...]
    max_batch_size: int = 32
    max_queue_delay_us: int = 2000
    max_queue_size: int = 256
    instances: int = 1
    threads: int = 0
    timeout_ms: int = 0
    versions: str = "latest"
    warmup: bool = True
    labels: tuple[str, ...] = ()
    mean: tuple[float, ...] = ()
    std: tuple[float, ...] = ()

    def __post_init__(self) -> None:
        if self.platform not in PLATFORMS:
            raise ConfigError(f"model {self.name!r}: platform {self.platform!r} is not one of {', '.join(PLATFORMS)}")
        for key in ("max_batch_size", "max_queue_delay_us", "threads", "timeout_ms"):
            if getattr(self, key) < 0:
                raise ConfigError(f"model {self.name!r}: {key} = {getattr(self, key)} must be >= 0")
        for key in ("max_queue_size", "instances"):
            if getattr(self, key) < 1:
                raise ConfigError(f"model {self.name!r}: {key} = {getattr(self, key)} must be >= 1")
        if self.versions not in ("latest", "all"):
            raise ConfigError(f"model {self.name!r}: versions = {self.versions!r}; valid: 'latest', 'all'")
        if not self.inputs or not self.outputs:
            raise ConfigError(f"model {self.name!r}: config needs at least one [[input]] and one [[output]]")

    @classmethod
    def from_dict(cls, name: str, doc: dict[str, Any]) -> ModelConfig:
        valid = {f.name for f in fields(cls)} - {"name", "inputs", "outputs"} | {"input", "output"}
        unknown = sorted(set(doc) - valid)
        if unknown:
            raise ConfigError(f"model {name!r}: unknown config keys {unknown}; valid: {sorted(valid)}")
        try:
            specs = {
                k: tuple(
                    TensorSpec(str(t["name"]), str(t["datatype"]), tuple(int(d) for d in t["dims"]))
                    for t in doc.get(k, [])
                )
                for k in ("input", "output")
            }
        except (KeyError, TypeError, ValueError) as e:
            raise ConfigError(f"model {name!r}: each [[input]]/[[output]] needs name, datatype, dims ({e})") from None
        rest = {k: v for k, v in doc.items() if k not in ("input", "output")}
        for k in ("labels", "mean", "std"):
            if k in rest:
                rest[k] = tuple(rest[k])
        if "platform" not in rest:
            raise ConfigError(f"model {name!r}: config needs platform = one of {', '.join(PLATFORMS)}")
        try:
            return cls(name=name, inputs=specs["input"], outputs=specs["output"], **rest)
        except TypeError as e:
            raise ConfigError(f"model {name!r}: bad config value ({e})") from None

    def to_dict(self) -> dict[str, Any]:
        doc: dict[str, Any] = {
            "platform": self.platform,
            "max_batch_size": self.max_batch_size,
            "max_queue_delay_us": self.max_queue_delay_us,
            "max_queue_size": self.max_queue_size,
            "instances": self.instances,
            "threads": self.threads,
            "timeout_ms": self.timeout_ms,
            "versions": self.versions,
            "warmup": self.warmup,
        }
        for k in ("labels", "mean", "std"):
            if getattr(self, k):
                doc[k] = list(getattr(self, k))
        doc["input"] = [t.as_dict() for t in self.inputs]
        doc["output"] = [t.as_dict() for t in self.outputs]
        return doc

    def triton_config(self) -> dict[str, Any]:
        """The model configuration in Triton's JSON form (``GET .../config``), which Triton's tools read."""

        def tensor(t: TensorSpec) -> dict[str, Any]:
            return {
                "name": t.name,
                "data_type": "TYPE_STRING" if t.datatype == "BYTES" else f"TYPE_{t.datatype}",
                "dims": list(t.dims),
            }

        return {
            "name": self.name,
            "platform": "onnxruntime_onnx" if self.platform == "onnxruntime" else "pytorch_libtorch",
            "backend": "onnxruntime" if self.platform == "onnxruntime" else "pytorch",
            "max_batch_size": self.max_batch_size,
            "input": [tensor(t) for t in self.inputs],
            "output": [tensor(t) for t in self.outputs],
            "dynamic_batching": {"max_queue_delay_microseconds": self.max_queue_delay_us},
            "instance_group": [{"count": self.instances, "kind": "KIND_CPU"}],
            "version_policy": {"latest": {"num_versions": 1}} if self.versions == "latest" else {"all": {}},
        }


def read_config(model_dir: Path) -> ModelConfig:
    path = model_dir / "config.toml"
    if not path.is_file():
        raise ConfigError(f"model folder {model_dir} has no config.toml")
    try:
        doc = tomllib.loads(path.read_text())
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as e:
        raise ConfigError(f"{path}: not valid TOML: {e}") from None
    return ModelConfig.from_dict(model_dir.name, doc)


def write_config(model_dir: Path, config: ModelConfig) -> Path:
    model_dir.mkdir(parents=True, exist_ok=True)
    path = model_dir / "config.toml"
    path.write_text(tomli_w.dumps(config.to_dict()))
    return path


def versions(model_dir: Path) -> list[int]:
    """The numbered version folders of a model, ascending."""
    return sorted(int(p.name) for p in model_dir.iterdir() if p.is_dir() and p.name.isdigit())


def versions_to_load(model_dir: Path, config: ModelConfig) -> list[int]:
    found = [v for v in versions(model_dir) if (model_dir / str(v) / PLATFORMS[config.platform]).is_file()]
    if not found:
        raise ConfigError(f"model {config.name!r}: no version folder in {model_dir} holds {PLATFORMS[config.platform]}")
    return found if config.versions == "all" else found[-1:]


def model_names(repo: Path) -> list[str]:
    """Every model folder of a repository (a folder with a config.toml)."""
    if not repo.is_dir():
        raise ConfigError(f"model repository {repo} is not a folder")
    return sorted(p.name for p in repo.iterdir() if p.is_dir() and (p / "config.toml").is_file())


def next_version(model_dir: Path) -> int:
    return (versions(model_dir)[-1] + 1) if model_dir.is_dir() and versions(model_dir) else 1
