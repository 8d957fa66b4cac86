"""The v2 gRPC service of a real ``deskpod serve --grpc-port 0`` process, driven by the official tritonclient.grpc.

One process serves both protocols over the session's repository (tests/serve/conftest.py), so HTTP and gRPC
are compared on the same models, the same batcher and the same statistics.
"""

from __future__ import annotations

import json
import subprocess
import sys
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from tests.serve.conftest import Server, stop_server, torch

grpcclient = pytest.importorskip("tritonclient.grpc")
httpclient = pytest.importorskip("tritonclient.http")
InferenceServerException = pytest.importorskip("tritonclient.utils").InferenceServerException
grpc = pytest.importorskip("grpc")
pb = pytest.importorskip("tritonclient.grpc.service_pb2")
pb_grpc = pytest.importorskip("tritonclient.grpc.service_pb2_grpc")


@dataclass
class Both:
    http: str  # host:port
    grpc: str
    repo: Path
    port_file: dict[str, Any]
    model: Any


@pytest.fixture(scope="module")
def both(server: Server, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Both]:
    """``deskpod serve REPO --port 0 --grpc-port 0`` (the CLI, its default event loop) on the session's repository."""
    port_file = tmp_path_factory.mktemp("grpc") / "serve.json"
    cmd = [sys.executable, "-c", "import sys; from deskpod.cli import main; sys.exit(main(sys.argv[1:]))", "serve"]
    proc = subprocess.Popen(
        [*cmd, str(server.repo), "--port", "0", "--grpc-port", "0", "--port-file", str(port_file)],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    drain: threading.Thread | None = None
    try:
        assert proc.stdout is not None
        lines = []
        for line in proc.stdout:
            lines.append(line)
            if "deskpod serve: ready" in line:
                break
        assert proc.poll() is None, "".join(lines)
        drain = threading.Thread(target=proc.stdout.read, daemon=True)  # keep reading its log: a full pipe blocks it
        drain.start()
        doc = json.loads(port_file.read_text())
        yield Both(doc["url"].removeprefix("http://"), doc["grpc"], server.repo, doc, server.model)
    finally:
        stop_server(proc, drain)


def gclient(both: Both) -> Any:
    return grpcclient.InferenceServerClient(both.grpc)


def ginfer(both: Both, model: str, x: np.ndarray, datatype: str = "FP32", name: str = "input", **kw: Any) -> Any:
    inp = grpcclient.InferInput(name, list(x.shape), datatype)
    inp.set_data_from_numpy(x)
    return gclient(both).infer(model, [inp], outputs=[grpcclient.InferRequestedOutput("logits")], **kw)


def hinfer(both: Both, model: str, x: np.ndarray, datatype: str = "FP32", name: str = "input", **kw: Any) -> Any:
    inp = httpclient.InferInput(name, list(x.shape), datatype)
    inp.set_data_from_numpy(x)
    c = httpclient.InferenceServerClient(both.http)
    return c.infer(model, [inp], outputs=[httpclient.InferRequestedOutput("logits")], **kw)


def expected(model: Any, x: np.ndarray, *, normalized: bool = True) -> np.ndarray:
    """What the torch model answers; ``normalized``: with the mean/std the export baked in (not ``slow``)."""
    t = torch.from_numpy(x)
    if normalized:
        t = (t - torch.tensor([0.5, 0.4]).view(1, 2, 1, 1)) / torch.tensor([0.2, 0.3]).view(1, 2, 1, 1)
    with torch.no_grad():
        return model(t).numpy()  # type: ignore[no-any-return]


def test_health_metadata_and_port_file(both: Both) -> None:
    c = gclient(both)
    assert c.is_server_live() and c.is_server_ready()
    assert c.is_model_ready("mlp") and c.is_model_ready("mlp", "1")
    assert not c.is_model_ready("broken") and not c.is_model_ready("nope") and not c.is_model_ready("mlp", "7")
    meta = c.get_server_metadata(as_json=True)
    assert meta["name"] == "deskpod" and "model_repository" in meta["extensions"]
    m = c.get_model_metadata("mlp", as_json=True)
    assert m["versions"] == ["1", "2"] and m["platform"] == "onnxruntime_onnx"
    assert m["inputs"] == [{"name": "input", "datatype": "FP32", "shape": ["-1", "2", "4", "4"]}]
    assert m["outputs"] == [{"name": "logits", "datatype": "FP32", "shape": ["-1", "3"]}]
    assert both.port_file["ready"] and "mlp" in both.port_file["models"]
    assert both.port_file["grpc"].startswith("127.0.0.1:") and both.port_file["grpc"] != both.http


def test_model_config_is_tritons_proto_of_the_http_config(both: Both) -> None:
    cfg = gclient(both).get_model_config("mlp").config  # a model_config_pb2.ModelConfig
    http = httpclient.InferenceServerClient(both.http).get_model_config("mlp")
    assert cfg.name == http["name"] == "mlp" and cfg.platform == http["platform"]
    assert cfg.max_batch_size == http["max_batch_size"] == 32
    assert [(t.name, list(t.dims)) for t in cfg.input] == [(t["name"], t["dims"]) for t in http["input"]]
    assert cfg.input[0].data_type == grpcclient.model_config_pb2.TYPE_FP32
    assert cfg.version_policy.WhichOneof("policy_choice") == "all"  # mlp serves every version


@pytest.mark.parametrize("model", ["mlp", "mlp_torch"])
def test_grpc_and_http_answer_the_same_numbers(both: Both, model: str) -> None:
    x = np.random.default_rng(1).random((3, 2, 4, 4), dtype=np.float32)
    g = ginfer(both, model, x)
    h = hinfer(both, model, x)
    assert g.get_response().model_version == h.get_response()["model_version"]
    np.testing.assert_array_equal(g.as_numpy("logits"), h.as_numpy("logits"))
    np.testing.assert_allclose(g.as_numpy("logits"), expected(both.model, x), rtol=1e-4, atol=1e-5)


def test_typed_contents_and_versions(both: Both) -> None:
    """Inputs as typed ``contents`` (not raw), a version asked for, the request id echoed back."""
    x = np.random.default_rng(2).random((2, 2, 4, 4), dtype=np.float32)
    req = pb.ModelInferRequest(model_name="mlp", model_version="1", id="req-7")
    t = req.inputs.add(name="input", datatype="FP32", shape=list(x.shape))
    t.contents.fp32_contents.extend(x.ravel().tolist())
    with grpc.insecure_channel(both.grpc) as channel:
        resp = pb_grpc.GRPCInferenceServiceStub(channel).ModelInfer(req, timeout=30)
    assert (resp.model_name, resp.model_version, resp.id) == ("mlp", "1", "req-7")
    out = resp.outputs[0]
    assert (out.name, out.datatype, list(out.shape)) == ("logits", "FP32", [2, 3])
    got = np.frombuffer(resp.raw_output_contents[0], np.float32).reshape(2, 3)
    np.testing.assert_allclose(got, expected(both.model, x), rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize(
    ("model", "x", "datatype", "name", "code", "fragment"),
    [
        ("mlp", np.zeros((1, 2, 4, 5), np.float32), "FP32", "input", "INVALID_ARGUMENT", "expects [1..32, 2, 4, 4]"),
        ("mlp", np.zeros((33, 2, 4, 4), np.float32), "FP32", "input", "INVALID_ARGUMENT", "expects [1..32"),
        ("mlp", np.zeros((1, 2, 4, 4), np.float64), "FP64", "input", "INVALID_ARGUMENT", "model expects FP32"),
        ("mlp", np.zeros((1, 2, 4, 4), np.float32), "FP32", "images", "INVALID_ARGUMENT", "unknown input 'images'"),
        ("nope", np.zeros((1, 2, 4, 4), np.float32), "FP32", "input", "NOT_FOUND", "unknown model 'nope'"),
        ("broken", np.zeros((1, 2, 4, 4), np.float32), "FP32", "input", "UNAVAILABLE", "failed to load"),
    ],
)
def test_errors_have_the_http_message_and_the_matching_code(
    both: Both, model: str, x: np.ndarray, datatype: str, name: str, code: str, fragment: str
) -> None:
    with pytest.raises(InferenceServerException) as g:
        ginfer(both, model, x, datatype, name)
    with pytest.raises(InferenceServerException) as h:
        hinfer(both, model, x, datatype, name)
    assert g.value.status() == f"StatusCode.{code}" and fragment in g.value.message()
    assert g.value.message() == h.value.message()
    assert gclient(both).is_server_live()


def test_stream_infer_answers_every_request_on_the_stream(both: Both) -> None:
    """tritonclient's ModelStreamInfer: answers come back on the stream with their ids and HTTP's numbers; a bad
    request is an error message on the stream, which goes on; requests in flight together batch together."""
    import queue

    c = gclient(both)
    answers: queue.Queue[tuple[Any, Any]] = queue.Queue()
    c.start_stream(callback=lambda result, error: answers.put((result, error)))
    rng = np.random.default_rng(5)
    xs = {f"r{k}": rng.random((k, 2, 4, 4), dtype=np.float32) for k in (1, 2, 3)}
    h0 = json.loads(_http_get(both, "/v2/models/merge/stats"))["model_stats"][0]
    try:
        for rid, x in xs.items():  # within merge's 400 ms queue delay of each other: one batch of 6 rows
            inp = grpcclient.InferInput("input", list(x.shape), "FP32")
            inp.set_data_from_numpy(x)
            c.async_stream_infer("merge", [inp], request_id=rid, outputs=[grpcclient.InferRequestedOutput("logits")])
        bad = grpcclient.InferInput("nope", [1, 2, 4, 4], "FP32")
        bad.set_data_from_numpy(np.zeros((1, 2, 4, 4), np.float32))
        c.async_stream_infer("mlp", [bad], request_id="bad")
        got, errors = {}, []
        for _ in range(4):
            result, error = answers.get(timeout=60)
            if error is not None:
                errors.append(error)
            else:
                got[result.get_response().id] = result.as_numpy("logits")
    finally:
        c.stop_stream()
    assert sorted(got) == sorted(xs)
    for rid, x in xs.items():
        np.testing.assert_array_equal(got[rid], hinfer(both, "merge", x).as_numpy("logits"))
    with pytest.raises(InferenceServerException) as h:
        hinfer(both, "mlp", np.zeros((1, 2, 4, 4), np.float32), name="nope")
    assert len(errors) == 1 and errors[0].message() == h.value.message()
    h1 = json.loads(_http_get(both, "/v2/models/merge/stats"))["model_stats"][0]
    assert h1["inference_count"] - h0["inference_count"] == 6 + 6  # the same 6 rows over the stream, then HTTP
    assert h1["execution_count"] - h0["execution_count"] == 1 + 3  # the stream's three requests ran as one batch


def test_malformed_requests_are_invalid_argument(both: Both) -> None:
    def call(req: Any) -> Any:
        with grpc.insecure_channel(both.grpc) as channel, pytest.raises(grpc.RpcError) as e:
            pb_grpc.GRPCInferenceServiceStub(channel).ModelInfer(req, timeout=30)
        return e.value

    short = pb.ModelInferRequest(model_name="mlp", raw_input_contents=[b"\0" * 12])
    short.inputs.add(name="input", datatype="FP32", shape=[1, 2, 4, 4])
    bad_type = pb.ModelInferRequest(model_name="mlp")
    bad_type.inputs.add(name="input", datatype="FP33", shape=[1, 2, 4, 4])
    fp16_typed = pb.ModelInferRequest(model_name="mlp")
    fp16_typed.inputs.add(name="input", datatype="FP16", shape=[1, 2, 4, 4])
    for req, fragment in [
        (short, "needs 128 bytes, raw_input_contents has 12"),
        (bad_type, "datatype 'FP33' is not one of"),
        (fp16_typed, "FP16 has no typed contents"),
    ]:
        e = call(req)
        assert e.code() == grpc.StatusCode.INVALID_ARGUMENT and fragment in e.details()


def test_timeout_is_deadline_exceeded(both: Both) -> None:
    x = np.zeros((1, 2, 4, 4), np.float32)
    with pytest.raises(InferenceServerException) as e:
        ginfer(both, "merge", x, timeout=20_000)  # 20 ms, while the batcher would hold it 400 ms
    assert e.value.status() == "StatusCode.DEADLINE_EXCEEDED" and "timed out after 20 ms" in e.value.message()


def test_overload_is_unavailable_and_counted(both: Both) -> None:
    """``slow`` queues one request for 300 ms and holds no more: of four sent at once, the extra are refused."""
    c = gclient(both)
    x = np.random.default_rng(3).random((1, 2, 4, 4), dtype=np.float32)
    inp = grpcclient.InferInput("input", list(x.shape), "FP32")
    inp.set_data_from_numpy(x)
    done: list[tuple[Any, Any]] = []
    finished = threading.Semaphore(0)

    def callback(result: Any, error: Any) -> None:
        done.append((result, error))
        finished.release()

    before = c.get_inference_statistics("slow", as_json=True)
    for _ in range(4):
        c.async_infer("slow", [inp], callback)
    for _ in range(4):
        assert finished.acquire(timeout=30)
    refused = [e for r, e in done if e is not None]
    answered = [r.as_numpy("logits") for r, e in done if e is None]
    assert refused and answered and len(refused) + len(answered) == 4
    for e in refused:
        assert e.status() == "StatusCode.UNAVAILABLE" and e.message() == "queue full (1 requests waiting); retry later"
    for a in answered:
        np.testing.assert_allclose(a, expected(both.model, x, normalized=False), rtol=1e-4, atol=1e-5)
    after = c.get_inference_statistics("slow", as_json=True)
    s0, s1 = before["model_stats"][0], after["model_stats"][0]
    assert int(s1["inference_stats"]["success"].get("count", 0)) - int(
        s0["inference_stats"]["success"].get("count", 0)
    ) == len(answered)
    text = _http_get(both, "/metrics")
    assert f'deskpod_requests_rejected_total{{model="slow",version="1"}} {len(refused)}' in text


def _http_get(both: Both, path: str) -> str:
    import urllib.request

    with urllib.request.urlopen(f"http://{both.http}{path}", timeout=30) as r:
        return r.read().decode()  # type: ignore[no-any-return]


def test_statistics_are_the_http_statistics(both: Both) -> None:
    x = np.zeros((2, 2, 4, 4), np.float32)
    ginfer(both, "mlp", x, model_version="2")
    g = gclient(both).get_inference_statistics("mlp", "2", as_json=True)["model_stats"][0]
    h = json.loads(_http_get(both, "/v2/models/mlp/versions/2/stats"))["model_stats"][0]
    assert (g["name"], g["version"]) == ("mlp", "2")
    assert int(g["inference_count"]) == h["inference_count"] >= 2
    assert int(g["execution_count"]) == h["execution_count"] >= 1
    assert int(g["inference_stats"]["success"]["count"]) == h["inference_stats"]["success"]["count"]
    every = gclient(both).get_inference_statistics(as_json=True)["model_stats"]
    assert {(s["name"], s["version"]) for s in every} >= {("mlp", "1"), ("mlp", "2"), ("slow", "1")}


def test_repository_index_unload_and_load(both: Both) -> None:
    c = gclient(both)
    index = {(m["name"], m.get("version")): m for m in c.get_model_repository_index(as_json=True)["models"]}
    assert index[("mlp", "2")]["state"] == "READY"
    assert index[("broken", None)]["state"] == "UNAVAILABLE" and "failed to load" in index[("broken", None)]["reason"]
    with pytest.raises(InferenceServerException) as e:
        c.load_model("broken")
    assert e.value.status() == "StatusCode.INTERNAL" and "ONNX Runtime could not load" in e.value.message()
    with pytest.raises(InferenceServerException) as e:
        c.load_model("nope")
    assert e.value.status() == "StatusCode.NOT_FOUND"
    x = np.random.default_rng(4).random((1, 2, 4, 4), dtype=np.float32)
    c.unload_model("mlp_torch")
    assert not c.is_model_ready("mlp_torch")
    with pytest.raises(InferenceServerException) as e:
        ginfer(both, "mlp_torch", x)
    assert e.value.status() == "StatusCode.UNAVAILABLE" and "unloaded" in e.value.message()
    c.load_model("mlp_torch")
    assert c.is_model_ready("mlp_torch")
    np.testing.assert_allclose(ginfer(both, "mlp_torch", x).as_numpy("logits"), expected(both.model, x), rtol=1e-4)


def test_grpc_port_is_validated(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from deskpod.cli import main

    assert main(["serve", str(tmp_path), "--port", "0", "--grpc-port", "70000"]) == 2
    assert "--grpc-port 70000 is not a TCP port (0..65535)" in capsys.readouterr().err


@pytest.mark.parametrize("protocol", ["grpc", "grpc-stream"])
def test_bench_serve_over_grpc(both: Both, protocol: str, capsys: pytest.CaptureFixture[str]) -> None:
    from deskpod.cli import main

    argv = ["bench", "serve", "--protocol", protocol, "--url", both.grpc, "--model", "mlp", "--concurrency", "2"]
    assert main([*argv, "--rate", "50", "--duration", "0.3", "--warmup", "0.1", "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    assert [(r["mode"], r["level"]) for r in rows] == [("closed", 2), ("open", 50)]
    assert all(r["ok"] > 0 and not r["errors"] and 0 < r["p50_ms"] <= r["p99_ms"] for r in rows)


def test_load_generator_over_grpc_checks_and_counts_errors_by_code(both: Both) -> None:
    import asyncio
    from dataclasses import replace

    from deskpod.errors import RunError
    from deskpod.serve.loadgen import LoadSpec, check, closed_loop

    host, port = both.grpc.rsplit(":", 1)
    x = np.random.default_rng(7).random((2, 2, 4, 4), dtype=np.float32)
    for binary in (True, False):  # raw contents, then typed contents
        spec = LoadSpec(host=host, port=int(port), protocol="grpc", model="mlp", inputs={"input": x}, binary=binary)
        np.testing.assert_allclose(asyncio.run(check(spec))["logits"], expected(both.model, x), rtol=1e-4, atol=1e-5)
    stream = LoadSpec(host=host, port=int(port), protocol="grpc-stream", model="mlp", inputs={"input": x})
    np.testing.assert_allclose(asyncio.run(check(stream))["logits"], expected(both.model, x), rtol=1e-4, atol=1e-5)
    inputs = {"input": np.zeros((1, 2, 4, 5), np.float32)}  # wrong shape: every answer is INVALID_ARGUMENT
    spec = LoadSpec(host=host, port=int(port), protocol="grpc", model="mlp", inputs=inputs, duration_s=0.2, warmup_s=0)
    r = asyncio.run(closed_loop(spec, 2))
    assert r.ok == 0 and r.errors.get("INVALID_ARGUMENT", 0) > 0
    r = asyncio.run(closed_loop(replace(spec, protocol="grpc-stream"), 2))  # an error message on the stream each time
    assert r.ok == 0 and r.errors.get("stream-error", 0) > 0
    with pytest.raises(RunError, match=r"stream-error.*shape"):
        asyncio.run(check(replace(spec, protocol="grpc-stream")))


def test_classification_is_the_http_classification(both: Both) -> None:
    """``parameters["classification"]`` on an output: the top-k ``score:index:label`` strings HTTP answers."""
    x = np.random.default_rng(6).random((2, 2, 4, 4), dtype=np.float32)
    gi, hi = (
        grpcclient.InferInput("input", list(x.shape), "FP32"),
        httpclient.InferInput("input", list(x.shape), "FP32"),
    )
    gi.set_data_from_numpy(x)
    hi.set_data_from_numpy(x)
    g = gclient(both).infer("mlp", [gi], outputs=[grpcclient.InferRequestedOutput("logits", class_count=2)])
    hc = httpclient.InferenceServerClient(both.http)
    h = hc.infer("mlp", [hi], outputs=[httpclient.InferRequestedOutput("logits", class_count=2)])
    got = g.as_numpy("logits")
    assert got.shape == (2, 2) and got.tolist() == h.as_numpy("logits").tolist()
    want = expected(both.model, x)
    top = [[int(s.split(b":")[1]) for s in row] for row in got]
    assert top == np.argsort(-want, axis=1)[:, :2].tolist()
    assert all(s.split(b":")[2] == [b"a", b"b", b"c"][int(s.split(b":")[1])] for s in got.ravel())


def test_image_model_over_grpc(both: Both, tmp_path: Path) -> None:
    """An image model (BYTES JPEG/PNG input, decoded in the server) loaded and asked over gRPC: torch's top-5, the
    answer HTTP gives to the same request, and HTTP's message for a bad image."""
    from deskpod.cli import main
    from tests.serve.test_images import make_image_run, picture, top5_in_torch

    run = make_image_run(tmp_path / "run", "imagefolder:/data/photos", 3, 28, seed=1)
    files = [tmp_path / "a.jpg", tmp_path / "b.png"]
    picture(61, 47, seed=3).save(files[0], quality=90)
    picture(40, 90, seed=4, mode="L").save(files[1])
    _, want_top = top5_in_torch(run, files)
    assert main(["export", str(run), "--repo", str(both.repo), "--name", "photo_grpc", "--image-input"]) == 0
    c = gclient(both)
    c.load_model("photo_grpc")
    hc = httpclient.InferenceServerClient(both.http)

    def ask(images: list[bytes], k: int) -> tuple[Any, Any]:
        a = np.array(images, dtype=object)
        gi, hi = grpcclient.InferInput("image", [len(a)], "BYTES"), httpclient.InferInput("image", [len(a)], "BYTES")
        gi.set_data_from_numpy(a)
        hi.set_data_from_numpy(a)
        g = c.infer("photo_grpc", [gi], outputs=[grpcclient.InferRequestedOutput("logits", class_count=k)])
        h = hc.infer("photo_grpc", [hi], outputs=[httpclient.InferRequestedOutput("logits", class_count=k)])
        return g.as_numpy("logits"), h.as_numpy("logits")

    g, h = ask([f.read_bytes() for f in files], 5)
    assert [[int(x.split(b":")[1]) for x in row] for row in g] == want_top
    assert g.tolist() == h.tolist()
    with pytest.raises(InferenceServerException) as ge:
        ask([b"not an image"], 5)
    assert ge.value.status() == "StatusCode.INVALID_ARGUMENT"
    with pytest.raises(InferenceServerException) as he:
        hc.infer("photo_grpc", [_bytes_input(httpclient, [b"not an image"])])
    assert ge.value.message() == he.value.message() and "row 0" in ge.value.message()
    # The same two over a stream: decoded off the loop, then answered on the stream; the bad image is its message.
    import queue

    answers: queue.Queue[tuple[Any, Any]] = queue.Queue()
    c.start_stream(callback=lambda result, error: answers.put((result, error)))
    try:
        for rid, images in (("good", [f.read_bytes() for f in files]), ("bad", [b"not an image"])):
            inp = _bytes_input(grpcclient, images)
            out = grpcclient.InferRequestedOutput("logits", class_count=5)
            c.async_stream_infer("photo_grpc", [inp], request_id=rid, outputs=[out])
        got = [answers.get(timeout=60) for _ in range(2)]
    finally:
        c.stop_stream()
    assert [r.as_numpy("logits").tolist() for r, e in got if e is None] == [g.tolist()]
    assert [e.message() for r, e in got if e is not None] == [he.value.message()]


def _bytes_input(module: Any, images: list[bytes]) -> Any:
    inp = module.InferInput("image", [len(images)], "BYTES")
    inp.set_data_from_numpy(np.array(images, dtype=object))
    return inp


def test_a_taken_grpc_port_is_refused(tmp_path: Path) -> None:
    """A port something already listens on is bad input naming the port, not a silently shared socket."""
    import asyncio
    import socket

    from deskpod.errors import UsageError
    from deskpod.serve.grpc_server import GrpcListener
    from deskpod.serve.registry import ModelRegistry
    from deskpod.serve.server import App, ServeConfig

    async def bind(port: int) -> None:
        listener = GrpcListener("127.0.0.1", port, 1 << 20)
        await listener.start(App(ServeConfig(repo=tmp_path), ModelRegistry(tmp_path)))
        await listener.stop()

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        taken = s.getsockname()[1]
        with pytest.raises(UsageError, match=f"--grpc-port {taken}: cannot listen on 127.0.0.1:{taken}"):
            asyncio.run(bind(taken))
