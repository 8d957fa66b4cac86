"""The model repository: one folder per model, numbered versions, one config file.

Layout (the same shape as Triton's, with TOML instead of protobuf text)::

    REPO/<model>/config.toml          what the server needs to know (below)
    REPO/<model>/<version>/model.onnx (platform "onnxruntime")  or  model.pt (platform "torch", TorchScript)

A folder with Triton's ``config.pbtxt`` instead (and no ``config.toml``) is read as it is: protobuf's own text
parser against Triton's ``model_config.proto`` (`read_triton_config`), mapped onto the same `ModelConfig`.

``config.toml``::

    platform = "onnxruntime"          # or "torch"
    max_batch_size = 32               # 0: no batching, the inputs carry no batch dimension
    max_queue_delay_us = 2000         # how long the batcher may hold a request for others to join
    max_queue_size = 256              # bounded queue: requests beyond it are refused at once (HTTP 503)
    instances = 1                     # model copies executing concurrently (the role MPS played on a GPU)
    threads = 0                       # intra-op threads per instance (0: the runtime's default)
    timeout_ms = 0                    # default per-request timeout (0: none); a request may set its own
    versions = "latest"               # "latest" (the newest num_versions), "all", or "specific" (specific_versions)
    num_versions = 1; specific_versions = [1, 3]
    preferred_batch_sizes = [4, 8]    # a batch of one of these sizes goes at once, without waiting the delay
    dynamic_batching = true           # false: every request runs alone (Triton without dynamic_batching)
    instance_kind = "auto"            # "auto" (GPU if there is one), "cpu", "gpu" (instances per GPU; gpus = [0])
    model_filename = ""               # the file in each version folder ("": model.onnx / model.pt)
    warmup = true                     # run one batch per instance before the model reports ready
    labels = ["T-shirt", ...]         # class names, reported in the model metadata
    mean = [0.286]; std = [0.353]     # the normalisation baked into the exported graph (informational)
    [preprocess] ...                  # an encoded-image input (deskpod/serve/images.py)
    [detection] layout = "yolo" ...   # a detector's output layout (deskpod/serve/detection.py)
    [[input]]  name = "input"  datatype = "FP32"  dims = [1, 28, 28]   # dims exclude the batch dimension
    [[output]] name = "logits" datatype = "FP32"  dims = [10]
"""

from __future__ import annotations

import math
import tomllib
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

import tomli_w

from deskpod.errors import ConfigError
from deskpod.serve.protocol import DATATYPES

PLATFORMS = {"onnxruntime": "model.onnx", "torch": "model.pt"}
INSTANCE_KINDS = ("auto", "cpu", "gpu")
VERSION_POLICIES = ("latest", "all", "specific")
ALWAYS_WRITTEN = ("platform", "max_batch_size", "max_queue_delay_us", "max_queue_size", "instances", "threads",
                  "timeout_ms", "versions", "warmup")  # fmt: skip
"""The `ModelConfig` settings a written ``config.toml`` always states, even at their defaults."""


@dataclass(frozen=True, slots=True)
class TensorSpec:
    """An input or output: name, v2 datatype, dims without the batch dimension (-1: any size).

    ``reshape`` (Triton's): the shape the model itself takes or gives, when it differs from ``dims`` (the shape
    clients see); the same number of elements, no -1 in either."""

    name: str
    datatype: str
    dims: tuple[int, ...]
    reshape: tuple[int, ...] | None = field(default=None, kw_only=True)

    def __post_init__(self) -> None:
        if self.datatype not in DATATYPES:
            raise ConfigError(f"tensor {self.name!r}: datatype {self.datatype!r} is not one of {', '.join(DATATYPES)}")
        if any(d < -1 or d == 0 for d in self.dims):
            raise ConfigError(f"tensor {self.name!r}: dims {list(self.dims)} must be positive or -1")
        if self.reshape is not None:
            if -1 in self.dims or any(d < 1 for d in self.reshape):
                raise ConfigError(
                    f"tensor {self.name!r}: reshape {list(self.reshape)} of dims {list(self.dims)} is not supported: "
                    "only fixed dims (no -1) can be reshaped"
                )
            if math.prod(self.reshape) != math.prod(self.dims):
                raise ConfigError(
                    f"tensor {self.name!r}: reshape {list(self.reshape)} has {math.prod(self.reshape)} elements, "
                    f"dims {list(self.dims)} have {math.prod(self.dims)}"
                )

    def as_dict(self) -> dict[str, Any]:
        doc: dict[str, Any] = {"name": self.name, "datatype": self.datatype, "dims": list(self.dims)}
        if self.reshape is not None:
            doc["reshape"] = list(self.reshape)
        return doc


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
    num_versions: int = 1
    specific_versions: tuple[int, ...] = ()
    preferred_batch_sizes: tuple[int, ...] = ()
    dynamic_batching: bool = True
    instance_kind: str = "auto"
    gpus: tuple[int, ...] = ()
    model_filename: str = ""
    warmup: bool = True
    labels: tuple[str, ...] = ()
    mean: tuple[float, ...] = ()
    std: tuple[float, ...] = ()
    preprocess: dict[str, Any] | None = None
    """The ``[preprocess]`` table (an image input, read by `deskpod.serve.images`); None: tensors only."""
    detection: dict[str, Any] | None = None
    """The ``[detection]`` table: a detector's output layout (`deskpod.serve.detection`); None: not a detector."""

    def __post_init__(self) -> None:
        if self.platform not in PLATFORMS:
            raise ConfigError(f"model {self.name!r}: platform {self.platform!r} is not one of {', '.join(PLATFORMS)}")
        for key in ("max_batch_size", "max_queue_delay_us", "threads", "timeout_ms"):
            if getattr(self, key) < 0:
                raise ConfigError(f"model {self.name!r}: {key} = {getattr(self, key)} must be >= 0")
        for key in ("max_queue_size", "instances", "num_versions"):
            if getattr(self, key) < 1:
                raise ConfigError(f"model {self.name!r}: {key} = {getattr(self, key)} must be >= 1")
        if self.versions not in VERSION_POLICIES:
            raise ConfigError(
                f"model {self.name!r}: versions = {self.versions!r}; valid: {', '.join(VERSION_POLICIES)}"
            )
        if self.versions == "specific" and not self.specific_versions:
            raise ConfigError(f"model {self.name!r}: versions = 'specific' needs specific_versions, e.g. [1, 3]")
        if self.instance_kind not in INSTANCE_KINDS:
            raise ConfigError(
                f"model {self.name!r}: instance_kind = {self.instance_kind!r}; valid: {', '.join(INSTANCE_KINDS)}"
            )
        bad = [b for b in self.preferred_batch_sizes if not 1 <= b <= self.max_batch_size]
        if bad:
            raise ConfigError(
                f"model {self.name!r}: preferred batch size {bad[0]} is not within 1..max_batch_size "
                f"({self.max_batch_size})"
            )
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
                    TensorSpec(
                        str(t["name"]),
                        str(t["datatype"]),
                        tuple(int(d) for d in t["dims"]),
                        reshape=tuple(int(d) for d in t["reshape"]) if "reshape" in t else None,
                    )
                    for t in doc.get(k, [])
                )
                for k in ("input", "output")
            }
        except (KeyError, TypeError, ValueError) as e:
            raise ConfigError(f"model {name!r}: each [[input]]/[[output]] needs name, datatype, dims ({e})") from None
        rest = {k: v for k, v in doc.items() if k not in ("input", "output")}
        for k in ("labels", "mean", "std", "specific_versions", "preferred_batch_sizes", "gpus"):
            if k in rest:
                rest[k] = tuple(rest[k])
        if "platform" not in rest:
            raise ConfigError(f"model {name!r}: config needs platform = one of {', '.join(PLATFORMS)}")
        try:
            return cls(name=name, inputs=specs["input"], outputs=specs["output"], **rest)
        except TypeError as e:
            raise ConfigError(f"model {name!r}: bad config value ({e})") from None

    def to_dict(self) -> dict[str, Any]:
        """The ``config.toml`` table: the settings of `ALWAYS_WRITTEN`, and every other one off its default."""
        doc: dict[str, Any] = {}
        for f in fields(self):
            value = getattr(self, f.name)
            if f.name not in ("name", "inputs", "outputs") and (f.name in ALWAYS_WRITTEN or value != f.default):
                doc[f.name] = list(value) if isinstance(value, tuple) else value
        doc["input"] = [t.as_dict() for t in self.inputs]
        doc["output"] = [t.as_dict() for t in self.outputs]
        return doc

    @property
    def filename(self) -> str:
        """The model file inside each version folder."""
        return self.model_filename or PLATFORMS[self.platform]

    def triton_config(self) -> dict[str, Any]:
        """The model configuration in Triton's JSON form (``GET .../config``), which Triton's tools read."""

        def tensor(t: TensorSpec) -> dict[str, Any]:
            doc: dict[str, Any] = {
                "name": t.name,
                "data_type": "TYPE_STRING" if t.datatype == "BYTES" else f"TYPE_{t.datatype}",
                "dims": list(t.dims),
            }
            if t.reshape is not None:
                doc["reshape"] = {"shape": list(t.reshape)}
            return doc

        doc: dict[str, Any] = {
            "name": self.name,
            "platform": "onnxruntime_onnx" if self.platform == "onnxruntime" else "pytorch_libtorch",
            "backend": "onnxruntime" if self.platform == "onnxruntime" else "pytorch",
            "max_batch_size": self.max_batch_size,
            "input": [tensor(t) for t in self.inputs],
            "output": [tensor(t) for t in self.outputs],
            "default_model_filename": self.filename,
        }
        if self.dynamic_batching:
            doc["dynamic_batching"] = {
                "max_queue_delay_microseconds": self.max_queue_delay_us,
                "preferred_batch_size": list(self.preferred_batch_sizes),
                "default_queue_policy": {"max_queue_size": self.max_queue_size},
            }
        group: dict[str, Any] = {
            "count": self.instances,
            "kind": "KIND_GPU" if self.instance_kind == "gpu" else "KIND_CPU",
        }
        if self.gpus:
            group["gpus"] = list(self.gpus)
        doc["instance_group"] = [group]
        if self.versions == "latest":
            doc["version_policy"] = {"latest": {"num_versions": self.num_versions}}
        elif self.versions == "all":
            doc["version_policy"] = {"all": {}}
        else:
            doc["version_policy"] = {"specific": {"versions": list(self.specific_versions)}}
        return doc


def read_config(model_dir: Path) -> ModelConfig:
    """A model folder's ``config.toml``, or else its Triton ``config.pbtxt``."""
    path = model_dir / "config.toml"
    if not path.is_file():
        if (model_dir / "config.pbtxt").is_file():
            return read_triton_config(model_dir)
        raise ConfigError(f"model folder {model_dir} has no config.toml (nor a Triton config.pbtxt)")
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
    return sorted(int(p.name) for p in model_dir.iterdir() if p.is_dir() and p.name.isascii() and p.name.isdigit())


def versions_to_load(model_dir: Path, config: ModelConfig) -> list[int]:
    """The versions the policy picks among the version folders that hold the model file (Triton's rules)."""
    found = [v for v in versions(model_dir) if (model_dir / str(v) / config.filename).is_file()]
    if config.versions == "specific":
        missing = [v for v in config.specific_versions if v not in found]
        if missing:
            raise ConfigError(
                f"model {config.name!r}: version_policy specific version {missing[0]} has no "
                f"{model_dir / str(missing[0]) / config.filename}; versions found: {found}"
            )
        return sorted(set(config.specific_versions))
    if not found:
        raise ConfigError(f"model {config.name!r}: no version folder in {model_dir} holds {config.filename}")
    return found if config.versions == "all" else found[-config.num_versions :]


def is_model_folder(path: Path) -> bool:
    """A folder with a ``config.toml`` or a Triton ``config.pbtxt``."""
    return path.is_dir() and ((path / "config.toml").is_file() or (path / "config.pbtxt").is_file())


def model_names(repo: Path) -> list[str]:
    """Every model folder of a repository (a folder with a config.toml or a config.pbtxt)."""
    if not repo.is_dir():
        raise ConfigError(f"model repository {repo} is not a folder")
    return sorted(p.name for p in repo.iterdir() if not p.name.startswith(".") and is_model_folder(p))


def next_version(model_dir: Path) -> int:
    return (versions(model_dir)[-1] + 1) if model_dir.is_dir() and versions(model_dir) else 1


# ---- Triton's config.pbtxt ---------------------------------------------------------------------------------------

TRITON_PLATFORMS = {"onnxruntime_onnx": "onnxruntime", "pytorch_libtorch": "torch"}
TRITON_BACKENDS = {"onnxruntime": "onnxruntime", "pytorch": "torch"}
KINDS = {"KIND_AUTO": "auto", "KIND_CPU": "cpu", "KIND_GPU": "gpu"}

# Every field of model_config.proto that is mapped onto ModelConfig; any other field set is refused, by name.
TRITON_FIELDS = frozenset(
    """name platform backend max_batch_size default_model_filename parameters
    version_policy version_policy.latest version_policy.latest.num_versions version_policy.all
    version_policy.specific version_policy.specific.versions
    input input.name input.data_type input.format input.dims input.reshape input.reshape.shape
    output output.name output.data_type output.dims output.reshape output.reshape.shape output.label_filename
    dynamic_batching dynamic_batching.preferred_batch_size dynamic_batching.max_queue_delay_microseconds
    dynamic_batching.default_queue_policy dynamic_batching.default_queue_policy.max_queue_size
    instance_group instance_group.name instance_group.count instance_group.kind instance_group.gpus""".split()  # noqa: SIM905
)
# Backend parameters (``parameters { key: ... value: { string_value: ... } }``) that map onto a setting.
TRITON_PARAMETERS = {"intra_op_thread_count": "threads"}
DETECTION_PARAMETER = "deskpod.detection."
"""Parameters ``deskpod.detection.<setting>`` are the ``[detection]`` table (``...labels``: class names, "a,b")."""


def _refuse_unsupported(msg: Any, model: str, prefix: str = "") -> None:
    for fd, value in msg.ListFields():
        path = prefix + fd.name
        if path not in TRITON_FIELDS:
            shown = "{...}" if fd.type == fd.TYPE_MESSAGE else value
            if fd.type == fd.TYPE_ENUM and isinstance(value, int):
                shown = fd.enum_type.values_by_number[value].name
            raise ConfigError(
                f"model {model!r}: config.pbtxt sets {path} ({shown}), which deskpod does not support; "
                "supported: name, platform/backend (onnxruntime_onnx, pytorch_libtorch), max_batch_size, input, "
                "output, dynamic_batching (preferred_batch_size, max_queue_delay_microseconds, "
                "default_queue_policy.max_queue_size), instance_group (count, kind, gpus), version_policy, "
                "default_model_filename"
            )
        if fd.type == fd.TYPE_MESSAGE and path != "parameters":
            # protobuf 6.31+ has is_repeated and 7 dropped label; older ones have only label
            repeated = fd.is_repeated if hasattr(fd, "is_repeated") else fd.label == fd.LABEL_REPEATED
            for item in value if repeated else [value]:
                _refuse_unsupported(item, model, path + ".")


def _triton_tensor(t: Any, model: str, model_dir: Path) -> tuple[TensorSpec, tuple[str, ...]]:
    from tritonclient.grpc import model_config_pb2 as mc

    dtype = mc.DataType.Name(t.data_type)
    if dtype == "TYPE_INVALID":
        raise ConfigError(f"model {model!r}: tensor {t.name!r} has no data_type (e.g. data_type: TYPE_FP32)")
    datatype = "BYTES" if dtype == "TYPE_STRING" else dtype.removeprefix("TYPE_")
    reshape = tuple(t.reshape.shape) if t.HasField("reshape") else None
    labels: tuple[str, ...] = ()
    if getattr(t, "label_filename", ""):
        path = model_dir / t.label_filename
        if not path.is_file():
            raise ConfigError(f"model {model!r}: output {t.name!r} label_filename {path} is not a file")
        labels = tuple(line for line in path.read_text().splitlines() if line.strip())
    try:
        return TensorSpec(t.name, datatype, tuple(t.dims), reshape=reshape), labels
    except ConfigError as e:
        raise ConfigError(f"model {model!r}: {e}") from None


def _triton_instances(cfg: Any, model: str) -> dict[str, Any]:
    from tritonclient.grpc import model_config_pb2 as mc

    groups = list(cfg.instance_group)
    if not groups:  # Triton: one instance per GPU when there is one, else one on the CPU
        return {"instances": 1, "instance_kind": "auto"}
    kinds = {mc.ModelInstanceGroup.Kind.Name(g.kind) for g in groups}
    for kind in kinds:
        if kind not in KINDS:
            raise ConfigError(
                f"model {model!r}: instance_group kind {kind} is not supported; valid: {', '.join(KINDS)}"
            )
    if len(kinds) > 1 or (len(groups) > 1 and "KIND_GPU" in kinds):
        raise ConfigError(
            f"model {model!r}: instance_group has {len(groups)} groups of kinds {sorted(kinds)}; deskpod serves "
            "one GPU group, or CPU/AUTO groups of the same kind"
        )
    gpus = tuple(groups[0].gpus)
    if gpus and kinds != {"KIND_GPU"}:
        raise ConfigError(f"model {model!r}: instance_group gpus {list(gpus)} needs kind KIND_GPU")
    return {
        "instances": sum(g.count or 1 for g in groups),  # Triton: count 0 (unset) is 1
        "instance_kind": KINDS[kinds.pop()],
        "gpus": gpus,
    }


def _triton_versions(cfg: Any, model: str) -> dict[str, Any]:
    which = cfg.version_policy.WhichOneof("policy_choice") if cfg.HasField("version_policy") else None
    if which is None:
        return {"versions": "latest"}
    if which == "latest":
        n = cfg.version_policy.latest.num_versions
        if n < 1:
            raise ConfigError(f"model {model!r}: version_policy latest num_versions {n} must be >= 1")
        return {"versions": "latest", "num_versions": n}
    if which == "all":
        return {"versions": "all"}
    return {"versions": "specific", "specific_versions": tuple(cfg.version_policy.specific.versions)}


def parse_triton_config(text: str, model_dir: Path) -> ModelConfig:
    """Triton's ``config.pbtxt`` text, parsed by protobuf against ``model_config.proto``, as a `ModelConfig`.

    Raises `ConfigError` naming the line of a syntax error, or the field and value deskpod cannot serve."""
    try:
        from google.protobuf import text_format
        from tritonclient.grpc import model_config_pb2 as mc
    except ImportError as e:
        raise ConfigError(
            f"reading {model_dir / 'config.pbtxt'} needs Triton's model_config.proto as shipped by tritonclient "
            f"(the serve extra: pip install 'deskpod[serve]'): {e}"
        ) from None
    path, model = model_dir / "config.pbtxt", model_dir.name
    try:
        cfg = text_format.Parse(text, mc.ModelConfig())
    except text_format.ParseError as e:
        where = f"line {e.GetLine()} column {e.GetColumn()}" if e.GetLine() is not None else "text"
        message = str(e).split(" : ", 1)[-1]
        raise ConfigError(f"{path}: {where}: {message}") from None
    if cfg.name and cfg.name != model:
        raise ConfigError(f"{path}: name {cfg.name!r} must match the model folder's name {model!r} (Triton's rule)")
    if (cfg.platform or not cfg.backend) and cfg.platform not in TRITON_PLATFORMS:
        raise ConfigError(
            f"model {model!r}: platform {cfg.platform!r} is not supported; valid: "
            f"{', '.join(TRITON_PLATFORMS)} (or backend: {', '.join(TRITON_BACKENDS)})"
        )
    if cfg.backend and cfg.backend not in TRITON_BACKENDS:
        raise ConfigError(
            f"model {model!r}: backend {cfg.backend!r} is not supported; valid: {', '.join(TRITON_BACKENDS)}"
        )
    platform = TRITON_PLATFORMS.get(cfg.platform) or TRITON_BACKENDS[cfg.backend]
    if cfg.platform and cfg.backend and TRITON_BACKENDS[cfg.backend] != platform:
        raise ConfigError(f"model {model!r}: platform {cfg.platform!r} and backend {cfg.backend!r} disagree")
    if cfg.HasField("sequence_batching"):
        raise ConfigError(f"model {model!r}: sequence_batching is not supported (deskpod serves stateless models)")
    _refuse_unsupported(cfg, model)
    if not cfg.input or not cfg.output:
        raise ConfigError(
            f"model {model!r}: config.pbtxt lists no {'input' if not cfg.input else 'output'}; deskpod does not "
            "complete a config from the model file (Triton's auto-complete): list every input and output"
        )
    inputs = tuple(_triton_tensor(t, model, model_dir)[0] for t in cfg.input)
    outputs: list[TensorSpec] = []
    labels: tuple[str, ...] = ()
    for t in cfg.output:
        spec, found = _triton_tensor(t, model, model_dir)
        outputs.append(spec)
        labels = labels or found
    settings: dict[str, Any] = {}
    detection: dict[str, str] = {}
    for key, value in cfg.parameters.items():
        if key.startswith(DETECTION_PARAMETER):
            detection[key.removeprefix(DETECTION_PARAMETER)] = value.string_value
            continue
        if key not in TRITON_PARAMETERS:
            raise ConfigError(
                f"model {model!r}: parameters key {key!r} is not supported; supported: "
                f"{', '.join(TRITON_PARAMETERS)}, {DETECTION_PARAMETER}<setting>"
            )
        try:
            settings[TRITON_PARAMETERS[key]] = int(value.string_value)
        except ValueError:
            raise ConfigError(f"model {model!r}: parameters {key} = {value.string_value!r} is not an integer") from None
    if "labels" in detection:
        labels = tuple(n.strip() for n in detection.pop("labels").split(","))
    if detection:
        settings["detection"] = detection
    if cfg.HasField("dynamic_batching"):
        db = cfg.dynamic_batching
        settings |= {
            "dynamic_batching": True,
            "preferred_batch_sizes": tuple(db.preferred_batch_size),
            "max_queue_delay_us": db.max_queue_delay_microseconds,
        }
        if db.default_queue_policy.max_queue_size:  # 0: Triton's unbounded queue; deskpod keeps its bound
            settings["max_queue_size"] = db.default_queue_policy.max_queue_size
    else:  # Triton without dynamic_batching runs every request on its own
        settings |= {"dynamic_batching": False, "max_queue_delay_us": 0}
    return ModelConfig(
        name=model,
        platform=platform,
        inputs=inputs,
        outputs=tuple(outputs),
        max_batch_size=cfg.max_batch_size,
        model_filename=cfg.default_model_filename,
        labels=labels,
        **settings,
        **_triton_instances(cfg, model),
        **_triton_versions(cfg, model),
    )


def read_triton_config(model_dir: Path) -> ModelConfig:
    path = model_dir / "config.pbtxt"
    try:
        text = path.read_text()
    except (OSError, UnicodeDecodeError) as e:
        raise ConfigError(f"{path}: cannot read: {e}") from None
    return parse_triton_config(text, model_dir)
