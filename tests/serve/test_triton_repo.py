"""A Triton-layout model repository (``config.pbtxt``) served as it is: parsing, refusals, versions, batching.

The repository is written here: an ONNX model and a TorchScript one exported from a tiny torch model, each with
Triton's own config text; a TensorRT model and a KIND_GPU one beside them that deskpod cannot serve on this box.
"""

from __future__ import annotations

import asyncio
import threading
import warnings
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from deskpod.errors import ConfigError
from deskpod.serve.batcher import BatchQueue, Pending
from deskpod.serve.registry import ModelRegistry
from deskpod.serve.repository import model_names, parse_triton_config, read_config, versions_to_load, write_config
from deskpod.serve.runtimes import OnnxRuntime, instance_devices
from tests.serve.conftest import make_mlp, start_server, stop_server, torch

tritonclient_http = pytest.importorskip("tritonclient.http")
pytest.importorskip("tritonclient.grpc.model_config_pb2")

ONNX_MLP = """
name: "onnx_mlp"
platform: "onnxruntime_onnx"
max_batch_size: 8
input [ { name: "input", data_type: TYPE_FP32, dims: [ 2, 4, 4 ] } ]
output [ { name: "logits", data_type: TYPE_FP32, dims: [ 3 ], label_filename: "labels.txt" } ]
dynamic_batching {
  preferred_batch_size: [ 4 ]
  max_queue_delay_microseconds: 30000000
  default_queue_policy { max_queue_size: 64 }
}
instance_group [ { count: 2, kind: KIND_CPU } ]
"""
# TorchScript under Triton's naming (INPUT__0), a flat input reshaped to the model's own shape, its own file
# name, and no dynamic_batching: every request runs alone.
TS_MLP = """
backend: "pytorch"
max_batch_size: 8
default_model_filename: "net.pt"
input [ { name: "INPUT__0", data_type: TYPE_FP32, dims: [ 32 ], reshape: { shape: [ 2, 4, 4 ] } } ]
output [ { name: "OUTPUT__0", data_type: TYPE_FP32, dims: [ 3 ] } ]
instance_group [ { kind: KIND_AUTO } ]
"""
VERSIONED = """
platform: "onnxruntime_onnx"
max_batch_size: 8
version_policy: { latest: { num_versions: 2 } }
input [ { name: "input", data_type: TYPE_FP32, dims: [ 2, 4, 4 ] } ]
output [ { name: "logits", data_type: TYPE_FP32, dims: [ 3 ] } ]
"""
TRT = """
platform: "tensorrt_plan"
max_batch_size: 8
input [ { name: "input", data_type: TYPE_FP32, dims: [ 2, 4, 4 ] } ]
output [ { name: "logits", data_type: TYPE_FP32, dims: [ 3 ] } ]
"""
GPU_TS = TS_MLP.replace("KIND_AUTO", "KIND_GPU")


@dataclass
class TritonRepo:
    repo: Path
    port: int
    model: Any

    def client(self) -> Any:
        return tritonclient_http.InferenceServerClient(f"127.0.0.1:{self.port}")


def write_model(repo: Path, name: str, config: str, files: dict[str, Path], versions: tuple[int, ...] = (1,)) -> None:
    (repo / name).mkdir(parents=True)
    (repo / name / "config.pbtxt").write_text(config)
    for v in versions:
        (repo / name / str(v)).mkdir()
        for filename, src in files.items():
            (repo / name / str(v) / filename).write_bytes(src.read_bytes())


def build_triton_repo(repo: Path) -> Any:
    mlp = make_mlp()
    example = torch.rand(2, 2, 4, 4)
    work = repo.parent / f"{repo.name}-exports"
    work.mkdir()
    onnx, pt = work / "model.onnx", work / "model.pt"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # torch's exporters warn about their own deprecations
        torch.onnx.export(
            mlp,
            (example,),
            str(onnx),
            input_names=["input"],
            output_names=["logits"],
            dynamic_axes={"input": {0: "batch"}, "logits": {0: "batch"}},
            opset_version=17,
            dynamo=False,
        )
        torch.jit.save(torch.jit.trace(mlp, example), str(pt))
    write_model(repo, "onnx_mlp", ONNX_MLP, {"model.onnx": onnx})
    (repo / "onnx_mlp" / "labels.txt").write_text("a\nb\nc\n")
    write_model(repo, "ts_mlp", TS_MLP, {"net.pt": pt})
    write_model(repo, "versioned", VERSIONED, {"model.onnx": onnx}, versions=(1, 2, 3))
    write_model(repo, "trt", TRT, {"model.plan": onnx})
    write_model(repo, "gpu_ts", GPU_TS, {"net.pt": pt})
    return mlp


@pytest.fixture(scope="module")
def triton_repo(tmp_path_factory: pytest.TempPathFactory) -> Iterator[TritonRepo]:
    repo = tmp_path_factory.mktemp("triton-repo")
    mlp = build_triton_repo(repo)
    proc, port = start_server(repo)
    try:
        yield TritonRepo(repo, port, mlp)
    finally:
        stop_server(proc)


def infer(t: TritonRepo, model: str, x: np.ndarray, name: str = "input", out: str = "logits") -> np.ndarray:
    inp = tritonclient_http.InferInput(name, list(x.shape), "FP32")
    inp.set_data_from_numpy(x)
    result: np.ndarray = t.client().infer(model, [inp]).as_numpy(out)
    return result


def torch_says(t: TritonRepo, x: np.ndarray) -> np.ndarray:
    with torch.no_grad():
        result: np.ndarray = t.model(torch.from_numpy(x.reshape(-1, 2, 4, 4))).numpy()
    return result


def batch_counts(t: TritonRepo, model: str) -> dict[int, int]:
    stats = t.client().get_inference_statistics(model)["model_stats"][0]
    return {b["batch_size"]: b["compute_infer"]["count"] for b in stats["batch_stats"]}


def concurrently(t: TritonRepo, model: str, xs: list[np.ndarray], name: str, out: str) -> list[np.ndarray]:
    results: list[Any] = [None] * len(xs)

    def one(i: int) -> None:
        results[i] = infer(t, model, xs[i], name, out)

    threads = [threading.Thread(target=one, args=(i,)) for i in range(len(xs))]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    return results


def test_repository_serves_what_it_can_and_names_what_it_cannot(triton_repo: TritonRepo) -> None:
    index = {r["name"]: r for r in triton_repo.client().get_model_repository_index()}
    assert {n for n, r in index.items() if r["state"] == "READY"} >= {"onnx_mlp", "ts_mlp", "versioned"}
    assert index["trt"]["state"] == "UNAVAILABLE"
    assert "platform 'tensorrt_plan' is not supported" in index["trt"]["reason"]
    if torch.cuda.device_count() == 0:
        assert index["gpu_ts"]["state"] == "UNAVAILABLE"
        assert "instance_group kind KIND_GPU" in index["gpu_ts"]["reason"]
    else:
        assert index["gpu_ts"]["state"] == "READY"


def test_metadata_and_config_follow_config_pbtxt(triton_repo: TritonRepo) -> None:
    c = triton_repo.client()
    meta = c.get_model_metadata("onnx_mlp")
    assert meta["platform"] == "onnxruntime_onnx"
    assert meta["inputs"] == [{"name": "input", "datatype": "FP32", "shape": [-1, 2, 4, 4]}]
    assert meta["parameters"]["labels"] == ["a", "b", "c"]  # from the output's label_filename
    cfg = c.get_model_config("onnx_mlp")
    assert cfg["instance_group"] == [{"count": 2, "kind": "KIND_CPU"}]
    assert cfg["dynamic_batching"]["preferred_batch_size"] == [4]
    assert cfg["dynamic_batching"]["default_queue_policy"]["max_queue_size"] == 64
    ts = c.get_model_metadata("ts_mlp")
    assert ts["platform"] == "pytorch_libtorch"
    assert ts["inputs"] == [{"name": "INPUT__0", "datatype": "FP32", "shape": [-1, 32]}]
    assert c.get_model_metadata("versioned")["versions"] == ["2", "3"]  # latest { num_versions: 2 } of 1, 2, 3


def test_onnx_and_torchscript_answer_as_the_torch_model(triton_repo: TritonRepo) -> None:
    x = np.random.default_rng(0).random((8, 2, 4, 4), dtype=np.float32)  # a full batch: it goes at once
    np.testing.assert_allclose(infer(triton_repo, "onnx_mlp", x), torch_says(triton_repo, x), rtol=1e-4, atol=1e-5)
    flat = x[:3].reshape(3, 32)  # sent as dims [32], reshaped to the model's [2, 4, 4]
    got = infer(triton_repo, "ts_mlp", flat, "INPUT__0", "OUTPUT__0")
    np.testing.assert_allclose(got, torch_says(triton_repo, flat), rtol=1e-4, atol=1e-5)


def test_preferred_batch_size_goes_without_waiting_the_delay(triton_repo: TritonRepo) -> None:
    """onnx_mlp holds a request up to 30 s, but 4 rows (a preferred size) go at once: 8 requests, 2 batches of 4."""
    before = batch_counts(triton_repo, "onnx_mlp")
    xs = [np.random.default_rng(i).random((1, 2, 4, 4), dtype=np.float32) for i in range(8)]
    for x, got in zip(xs, concurrently(triton_repo, "onnx_mlp", xs, "input", "logits"), strict=True):
        np.testing.assert_allclose(got, torch_says(triton_repo, x), rtol=1e-4, atol=1e-5)
    after = batch_counts(triton_repo, "onnx_mlp")
    assert {b: n - before.get(b, 0) for b, n in after.items() if n != before.get(b, 0)} == {4: 2}


def test_without_dynamic_batching_every_request_runs_alone(triton_repo: TritonRepo) -> None:
    before = batch_counts(triton_repo, "ts_mlp")
    xs = [np.random.default_rng(i).random((2, 32), dtype=np.float32) for i in range(4)]
    concurrently(triton_repo, "ts_mlp", xs, "INPUT__0", "OUTPUT__0")
    assert batch_counts(triton_repo, "ts_mlp").get(2, 0) - before.get(2, 0) == 4


def test_instance_group_count_and_kind_build_the_instances(triton_repo: TritonRepo) -> None:
    async def load() -> list[Any]:
        registry = ModelRegistry(triton_repo.repo)
        await registry.load("onnx_mlp")
        instances = list(registry.get("onnx_mlp").batcher.instances)
        await registry.close()
        return instances

    instances = asyncio.run(load())
    assert len(instances) == 2
    assert all(isinstance(rt, OnnxRuntime) and rt.providers == ["CPUExecutionProvider"] for rt in instances)


# ---- parsing and refusals, without a server ----------------------------------------------------------------------


def parse(tmp_path: Path, text: str, name: str = "m") -> Any:
    (tmp_path / name).mkdir(exist_ok=True)
    return parse_triton_config(text, tmp_path / name)


def test_malformed_config_names_the_line(tmp_path: Path) -> None:
    text = 'platform: "onnxruntime_onnx"\nmax_batch_size: 8\ninput [ { name: "x" dims: [ 1, ] } ]\n'
    with pytest.raises(ConfigError, match=r"config\.pbtxt: line 3 column \d+: .*integer"):
        parse(tmp_path, text)
    with pytest.raises(ConfigError, match=r"line 2 column 1: .*no field named \"max_batch\""):
        parse(tmp_path, 'platform: "onnxruntime_onnx"\nmax_batch: 8\n')


BASE = 'max_batch_size: 8\ninput [ { name: "i", data_type: TYPE_FP32, dims: [ 4 ] } ]\n' + (
    'output [ { name: "o", data_type: TYPE_FP32, dims: [ 2 ] } ]\n'
)


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ('backend: "python"\n' + BASE, "backend 'python' is not supported"),
        ('platform: "ensemble"\n' + BASE, "platform 'ensemble' is not supported"),
        (BASE, "platform '' is not supported"),
        ('platform: "onnxruntime_onnx"\nsequence_batching { }\n' + BASE, "sequence_batching is not supported"),
        ('platform: "onnxruntime_onnx"\ndynamic_batching { priority_levels: 2 }\n' + BASE, "priority_levels (2)"),
        ('platform: "onnxruntime_onnx"\nmodel_warmup [ { name: "w" } ]\n' + BASE, "sets model_warmup"),
        ('platform: "onnxruntime_onnx"\ndynamic_batching { preferred_batch_size: [ 16 ] }\n' + BASE, "size 16"),
        ('platform: "onnxruntime_onnx"\ninstance_group [ { kind: KIND_MODEL } ]\n' + BASE, "KIND_MODEL"),
        ('name: "other"\nplatform: "onnxruntime_onnx"\n' + BASE, "name 'other' must match"),
        (
            'platform: "onnxruntime_onnx"\n' + BASE.replace("dims: [ 4 ]", "dims: [ -1 ], reshape { shape: [ 4 ] }"),
            "only fixed dims",
        ),
        ('platform: "pytorch_libtorch"\nbackend: "onnxruntime"\n' + BASE, "disagree"),
        ('platform: "onnxruntime_onnx"\nparameters { key: "foo" value { string_value: "1" } }\n' + BASE, "'foo'"),
    ],
)
def test_what_deskpod_cannot_serve_is_named(tmp_path: Path, text: str, message: str) -> None:
    with pytest.raises(ConfigError) as e:
        parse(tmp_path, text)
    assert message in str(e.value)


def test_config_pbtxt_maps_onto_model_config(tmp_path: Path) -> None:
    text = (
        'backend: "onnxruntime"\nparameters { key: "intra_op_thread_count" value { string_value: "2" } }\n'
        + BASE.replace("TYPE_FP32", "TYPE_STRING", 1)
        + "dynamic_batching { max_queue_delay_microseconds: 500 }\n"
    )
    c = parse(tmp_path, text)
    assert (c.platform, c.threads, c.max_queue_delay_us, c.inputs[0].datatype) == ("onnxruntime", 2, 500, "BYTES")
    assert c.dynamic_batching and c.max_queue_size == 256  # Triton's 0 (unbounded) keeps deskpod's bounded queue
    plain = parse(tmp_path, 'platform: "onnxruntime_onnx"\n' + BASE)
    assert not plain.dynamic_batching and plain.max_queue_delay_us == 0 and plain.instance_kind == "auto"


@pytest.mark.parametrize(
    ("policy", "picked"),
    [
        ("", [3]),
        ("version_policy: { latest: { num_versions: 2 } }", [2, 3]),
        ("version_policy: { all: { } }", [1, 2, 3]),
        ("version_policy: { specific: { versions: [ 1, 3 ] } }", [1, 3]),
    ],
)
def test_version_policy_picks_the_versions(tmp_path: Path, policy: str, picked: list[int]) -> None:
    model = tmp_path / "m"
    for v in (1, 2, 3):
        (model / str(v)).mkdir(parents=True)
        (model / str(v) / "model.onnx").write_bytes(b"")
    (model / "4").mkdir()  # a version folder without the model file is not a version
    (model / "config.pbtxt").write_text(f'platform: "onnxruntime_onnx"\n{policy}\n{BASE}')
    assert model_names(tmp_path) == ["m"]
    assert versions_to_load(model, read_config(model)) == picked


def test_a_missing_specific_version_is_named(tmp_path: Path) -> None:
    model = tmp_path / "m"
    (model / "1").mkdir(parents=True)
    (model / "1" / "model.onnx").write_bytes(b"")
    (model / "config.pbtxt").write_text(
        'platform: "onnxruntime_onnx"\nversion_policy: { specific: { versions: [ 1, 5 ] } }\n' + BASE
    )
    with pytest.raises(ConfigError, match="specific version 5"):
        versions_to_load(model, read_config(model))


def test_instance_kinds_place_the_instances(tmp_path: Path) -> None:
    groups = {
        "instance_group [ { count: 3, kind: KIND_CPU } ]": ["cpu"] * 3,
        "instance_group [ { count: 2, kind: KIND_AUTO }, { kind: KIND_AUTO } ]": ["auto"] * 3,
    }
    for group, devices in groups.items():
        c = parse(tmp_path, f'platform: "pytorch_libtorch"\n{group}\n{BASE}')
        assert instance_devices(c, gpus=0) == devices
    gpu = parse(
        tmp_path,
        f'platform: "pytorch_libtorch"\ninstance_group [ {{ count: 2, gpus: [ 1 ], kind: KIND_GPU }} ]\n{BASE}',
    )
    assert instance_devices(gpu, gpus=2) == ["cuda:1", "cuda:1"]
    with pytest.raises(ConfigError, match=r"kind KIND_GPU needs GPU 1 but this box has 1 GPU"):
        instance_devices(gpu, gpus=1)
    with pytest.raises(ConfigError, match=r"kind KIND_GPU needs a GPU but this box has 0"):
        instance_devices(
            parse(tmp_path, f'platform: "pytorch_libtorch"\ninstance_group [ {{ kind: KIND_GPU }} ]\n{BASE}'), gpus=0
        )


def pending(rows: int, arrived: float, loop: asyncio.AbstractEventLoop) -> Pending:
    return Pending({"i": np.zeros((rows, 4), np.float32)}, rows, ((4,),), arrived, loop.create_future())


def test_batch_queue_takes_the_largest_preferred_size_before_the_delay() -> None:
    loop = asyncio.new_event_loop()

    def rows_of(batch: list[Pending] | None) -> list[int] | None:
        return None if batch is None else [p.rows for p in batch]

    try:
        q = BatchQueue(max_batch_size=8, max_delay_s=1.0, max_size=64, preferred=(2, 4))
        q.put(pending(1, 0.0, loop))
        assert q.take(0.1) is None  # 1 row: no preferred size, and the delay has not run out
        for _ in range(4):
            q.put(pending(1, 0.0, loop))
        assert rows_of(q.take(0.1)) == [1, 1, 1, 1]  # 2 and 4 are both reachable: the largest goes, at once
        assert q.take(0.1) is None  # 1 left: it waits ...
        assert rows_of(q.take(1.0)) == [1]  # ... until the delay runs out
        q.put(pending(3, 2.0, loop))
        q.put(pending(3, 2.0, loop))
        assert rows_of(q.take(2.1)) == [3]  # 3 + 3 passes every preferred size: the 3 goes at once ...
        assert q.take(2.1) is None  # ... and the other 3 waits for company ...
        q.put(pending(3, 2.5, loop))
        assert rows_of(q.take(3.0)) == [3, 3]  # ... until the delay runs out: then everything that fits goes
        q.put(pending(5, 4.0, loop))
        q.put(pending(4, 4.0, loop))
        assert rows_of(q.take(4.0)) == [5]  # the next request cannot join (5 + 4 > 8): no reason to wait
        plain = BatchQueue(max_batch_size=8, max_delay_s=1.0, max_size=64)
        for _ in range(4):
            plain.put(pending(1, 0.0, loop))
        assert plain.take(0.1) is None  # without preferred sizes the same queue waits out the delay
        alone = BatchQueue(max_batch_size=8, max_delay_s=1.0, max_size=64, merge=False)
        for _ in range(2):
            alone.put(pending(1, 0.0, loop))
        assert rows_of(alone.take(0.0)) == [1]  # no dynamic batching: one request per execution, no wait
    finally:
        loop.close()


def test_config_toml_takes_the_same_settings(tmp_path: Path) -> None:
    text = (
        'platform: "pytorch_libtorch"\ndefault_model_filename: "net.pt"\n'
        "version_policy: { specific: { versions: [ 2 ] } }\n"
        "dynamic_batching { preferred_batch_size: [ 2, 4 ] }\ninstance_group [ { count: 2, kind: KIND_CPU } ]\n"
        + BASE.replace("dims: [ 4 ] }", "dims: [ 4 ], reshape: { shape: [ 2, 2 ] } }")
    )
    from_pbtxt = parse(tmp_path, text)
    write_config(tmp_path / "m", from_pbtxt)
    from_toml = read_config(tmp_path / "m")  # config.toml, when present, is what is read
    assert from_toml == from_pbtxt
    assert (from_toml.instance_kind, from_toml.filename, from_toml.inputs[0].reshape) == ("cpu", "net.pt", (2, 2))
    assert from_toml.preferred_batch_sizes == (2, 4) and from_toml.specific_versions == (2,)
