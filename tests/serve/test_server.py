"""A real server process on 127.0.0.1, driven by the official tritonclient and by raw HTTP for bad input."""

from __future__ import annotations

import http.client
import json
import socket
import threading
import time
from typing import Any

import numpy as np
import pytest

from tests.serve.conftest import Server, torch

tritonclient_http = pytest.importorskip("tritonclient.http")
InferenceServerException = pytest.importorskip("tritonclient.utils").InferenceServerException


def client(server: Server) -> Any:
    return tritonclient_http.InferenceServerClient(server.url)


def infer(server: Server, model: str, x: np.ndarray, *, binary: bool = True, **kw: Any) -> Any:
    inp = tritonclient_http.InferInput("input", list(x.shape), "FP32")
    inp.set_data_from_numpy(x, binary_data=binary)
    outs = [tritonclient_http.InferRequestedOutput("logits", binary_data=binary)]
    return client(server).infer(model, [inp], outputs=outs, **kw)


def expected(server: Server, x: np.ndarray) -> np.ndarray:
    mean = torch.tensor([0.5, 0.4]).view(1, 2, 1, 1)
    std = torch.tensor([0.2, 0.3]).view(1, 2, 1, 1)
    with torch.no_grad():
        return server.model((torch.from_numpy(x) - mean) / std).numpy()  # type: ignore[operator,no-any-return]


def raw(
    server: Server, method: str, path: str, body: bytes = b"", headers: dict[str, str] | None = None
) -> tuple[int, Any]:
    conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=30)
    try:
        conn.request(method, path, body=body, headers=headers or {})
        r = conn.getresponse()
        data = r.read()
        return r.status, json.loads(data) if data.startswith(b"{") or data.startswith(b"[") else data
    finally:
        conn.close()


def test_health_and_metadata(server: Server) -> None:
    c = client(server)
    assert c.is_server_live() and c.is_server_ready()
    assert c.is_model_ready("mlp") and c.is_model_ready("mlp", "1") and not c.is_model_ready("broken")
    assert "binary_tensor_data" in c.get_server_metadata()["extensions"]
    meta = c.get_model_metadata("mlp")
    assert meta["versions"] == ["1", "2"]
    assert meta["inputs"] == [{"name": "input", "datatype": "FP32", "shape": [-1, 2, 4, 4]}]
    assert meta["parameters"]["labels"] == ["a", "b", "c"]
    cfg = c.get_model_config("mlp")
    assert (
        cfg["max_batch_size"] == 32
        and cfg["input"][0]["data_type"] == "TYPE_FP32"
        and cfg["input"][0]["dims"] == [2, 4, 4]
    )


@pytest.mark.parametrize("binary", [True, False])
@pytest.mark.parametrize("model", ["mlp", "mlp_torch"])
def test_infer_matches_the_torch_model(server: Server, model: str, binary: bool) -> None:
    x = np.random.default_rng(1).random((3, 2, 4, 4), dtype=np.float32)
    got = infer(server, model, x, binary=binary).as_numpy("logits")
    np.testing.assert_allclose(got, expected(server, x), rtol=1e-4, atol=1e-5)


def test_versions_and_stats(server: Server) -> None:
    x = np.random.default_rng(2).random((2, 2, 4, 4), dtype=np.float32)
    c = client(server)
    inp = tritonclient_http.InferInput("input", list(x.shape), "FP32")
    inp.set_data_from_numpy(x)
    r = c.infer("mlp", [inp], model_version="1")
    assert r.get_response()["model_version"] == "1"
    assert c.infer("mlp", [inp]).get_response()["model_version"] == "2"
    stats = c.get_inference_statistics("mlp", "1")["model_stats"][0]
    assert stats["inference_count"] >= 2 and stats["inference_stats"]["success"]["count"] >= 1
    text = raw(server, "GET", "/metrics")[1].decode()
    assert 'deskpod_requests_total{model="mlp",version="1",outcome="success"}' in text
    assert "deskpod_batch_size_bucket" in text


def test_concurrent_requests_merge_into_batches(server: Server) -> None:
    """``merge`` holds a request up to 400 ms: 6 concurrent requests go as few batches, each gets its rows."""
    rng = np.random.default_rng(3)
    xs = [rng.random((k, 2, 4, 4), dtype=np.float32) for k in (1, 2, 1, 3, 1, 2)]
    results: list[Any] = [None] * len(xs)

    def one(i: int) -> None:
        results[i] = infer(server, "merge", xs[i]).as_numpy("logits")

    threads = [threading.Thread(target=one, args=(i,)) for i in range(len(xs))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for x, r in zip(xs, results, strict=True):
        np.testing.assert_allclose(r, expected(server, x), rtol=1e-4, atol=1e-5)
    s = client(server).get_inference_statistics("merge")["model_stats"][0]
    assert s["inference_count"] == 10
    assert s["execution_count"] < 6  # merged (usually into 1; thread start-up may split it)


def test_overload_is_refused_fast(server: Server) -> None:
    """``slow`` holds its one queue slot for 300 ms: a second request gets 503 at once, not after the wait."""
    x = np.zeros((1, 2, 4, 4), np.float32)
    first = threading.Thread(target=infer, args=(server, "slow", x))
    first.start()
    time.sleep(0.1)
    t0 = time.monotonic()
    with pytest.raises(InferenceServerException) as e:
        infer(server, "slow", x)
    assert time.monotonic() - t0 < 0.15
    assert e.value.status() == "503" and "queue full" in str(e.value)
    first.join()


def test_per_request_timeout(server: Server) -> None:
    x = np.zeros((1, 2, 4, 4), np.float32)
    with pytest.raises(InferenceServerException) as e:
        infer(server, "merge", x, timeout=20_000)  # 20 ms, while the batcher would hold it 400 ms
    assert e.value.status() == "504" and "timed out" in str(e.value)


def _body(x: np.ndarray, name: str = "input", datatype: str = "FP32") -> bytes:
    return json.dumps(
        {"inputs": [{"name": name, "shape": list(x.shape), "datatype": datatype, "data": x.ravel().tolist()}]}
    ).encode()


@pytest.mark.parametrize(
    ("path", "body", "headers", "status", "fragment"),
    [
        ("/v2/models/mlp/infer", _body(np.zeros((1, 2, 4, 5))), {}, 400, "expects [1..32, 2, 4, 4]"),
        ("/v2/models/mlp/infer", _body(np.zeros((33, 2, 4, 4))), {}, 400, "expects [1..32"),
        ("/v2/models/mlp/infer", _body(np.zeros((1, 2, 4, 4)), datatype="FP64"), {}, 400, "model expects FP32"),
        ("/v2/models/mlp/infer", _body(np.zeros((1, 2, 4, 4)), name="images"), {}, 400, "unknown input 'images'"),
        ("/v2/models/mlp/infer", b'{"inputs": [', {}, 400, "malformed"),
        (
            "/v2/models/mlp/infer",
            b"{}xxxx",
            {"Inference-Header-Content-Length": "999"},
            400,
            "Inference-Header-Content-Length is 999",
        ),
        ("/v2/models/mlp/infer", b"{}", {"Inference-Header-Content-Length": "two"}, 400, "not an integer"),
        ("/v2/models/nope/infer", _body(np.zeros((1, 2, 4, 4))), {}, 404, "unknown model 'nope'"),
        ("/v2/models/mlp/versions/7/infer", _body(np.zeros((1, 2, 4, 4))), {}, 404, "no version '7'"),
        ("/v2/models/broken/infer", _body(np.zeros((1, 2, 4, 4))), {}, 503, "failed to load"),
        ("/v2/nothing", b"", {}, 404, "no endpoint"),
        # Bodies that once answered 500: JSON nested 1,000 or 5,000 deep (past orjson's limit, then Python's
        # recursion limit), an id whose str() would recurse, and a number past Python's 4,300-digit limit.
        ("/v2/models/mlp/infer", b'{"inputs": ' + b"[" * 1000 + b"]" * 1000 + b"}", {}, 400, "nested too deeply"),
        ("/v2/models/mlp/infer", b'{"inputs": ' + b"[" * 5000 + b"]" * 5000 + b"}", {}, 400, "nested too deeply"),
        (
            "/v2/models/mlp/infer",
            b'{"id": ' + b"[" * 1000 + b"]" * 1000 + b', "inputs": [1]}',
            {},
            400,
            "nested too deeply",
        ),
        (
            "/v2/models/mlp/infer",
            b'{"inputs": [{"name": "input", "shape": [' + b"1" * 5000 + b"]}]}",
            {},
            400,
            "more than 4300 digits",
        ),
        (
            "/v2/models/mlp/infer",
            b'{"inputs": [{"name": "input", "shape": [1], "datatype": "BYTES", "data": [1000000000]}]}',
            {},
            400,
            "BYTES elements in JSON are strings",
        ),
    ],
)
def test_bad_input_gets_4xx_and_the_server_keeps_serving(
    server: Server, path: str, body: bytes, headers: dict[str, str], status: int, fragment: str
) -> None:
    got, doc = raw(server, "POST", path, body, headers)
    assert got == status and fragment in doc["error"]
    x = np.zeros((1, 2, 4, 4), np.float32)
    assert infer(server, "mlp", x).as_numpy("logits").shape == (1, 3)


def test_too_large_body_and_garbage(server: Server) -> None:
    with socket.create_connection(("127.0.0.1", server.port), timeout=10) as s:
        s.sendall(b"POST /v2/models/mlp/infer HTTP/1.1\r\nContent-Length: 999999999\r\n\r\n")
        reply = s.recv(4096)
    assert reply.startswith(b"HTTP/1.1 413") and b'"error"' in reply
    with socket.create_connection(("127.0.0.1", server.port), timeout=10) as s:
        s.sendall(b"\x16\x03\x01 not http at all\r\n\r\n")
        assert s.recv(4096).startswith(b"HTTP/1.1 400")
    assert client(server).is_server_live()


def test_failed_model_is_reported_while_others_serve(server: Server) -> None:
    index = {(m["name"], m.get("version")): m for m in client(server).get_model_repository_index()}
    assert index[("broken", None)]["state"] == "UNAVAILABLE" and "failed to load" in index[("broken", None)]["reason"]
    assert index[("mlp", "2")]["state"] == "READY"
    with pytest.raises(InferenceServerException) as e:
        client(server).load_model("broken")
    assert e.value.status() == "500" and "ONNX Runtime could not load" in str(e.value)  # a failure, not bad input


def test_unload_and_reload_while_serving(server: Server) -> None:
    c = client(server)
    x = np.random.default_rng(4).random((1, 2, 4, 4), dtype=np.float32)
    statuses: list[str] = []
    stop = threading.Event()

    def hammer() -> None:
        while not stop.is_set():
            try:
                infer(server, "mlp_torch", x)
                statuses.append("ok")
            except InferenceServerException as e:
                statuses.append(str(e.status()))

    t = threading.Thread(target=hammer)
    t.start()
    c.load_model("mlp_torch")  # reload: the new copy is swapped in while requests keep flowing
    time.sleep(0.2)
    stop.set()
    t.join()
    assert statuses and set(statuses) == {"ok"}
    c.unload_model("mlp_torch")
    assert not c.is_model_ready("mlp_torch")
    with pytest.raises(InferenceServerException) as e:
        infer(server, "mlp_torch", x)
    assert e.value.status() == "503"
    c.load_model("mlp_torch")
    np.testing.assert_allclose(
        infer(server, "mlp_torch", x).as_numpy("logits"), expected(server, x), rtol=1e-4, atol=1e-5
    )


def test_compressed_request(server: Server) -> None:
    x = np.random.default_rng(5).random((2, 2, 4, 4), dtype=np.float32)
    inp = tritonclient_http.InferInput("input", list(x.shape), "FP32")
    inp.set_data_from_numpy(x)
    for algo in ("gzip", "deflate"):
        r = client(server).infer("mlp", [inp], request_compression_algorithm=algo, response_compression_algorithm=algo)
        np.testing.assert_allclose(r.as_numpy("logits"), expected(server, x), rtol=1e-4, atol=1e-5)


def test_config_errors_name_the_bad_value(tmp_path: Any) -> None:
    from deskpod.errors import ConfigError
    from deskpod.serve.repository import read_config

    (tmp_path / "m").mkdir()
    (tmp_path / "m" / "config.toml").write_text('platform = "onnxruntime"\nmax_batch = 4\n')
    with pytest.raises(ConfigError, match=r"unknown config keys \['max_batch'\]"):
        read_config(tmp_path / "m")
    (tmp_path / "m" / "config.toml").write_text('platform = "tensorrt"\n')
    with pytest.raises(ConfigError, match="platform 'tensorrt' is not one of"):
        read_config(tmp_path / "m")


def test_serve_cli_refuses_a_missing_repository(tmp_path: Any, capsys: pytest.CaptureFixture[str]) -> None:
    from deskpod.cli import main

    assert main(["serve", str(tmp_path / "nowhere"), "--port", "0"]) == 2
    assert "is not a folder" in capsys.readouterr().err


def test_expect_continue_and_pipelining(server: Server) -> None:
    body = _body(np.zeros((1, 2, 4, 4)))
    head = f"POST /v2/models/mlp/infer HTTP/1.1\r\nContent-Length: {len(body)}\r\n".encode()
    with socket.create_connection(("127.0.0.1", server.port), timeout=10) as s:
        s.sendall(head + b"Expect: 100-continue\r\n\r\n")
        assert s.recv(4096).startswith(b"HTTP/1.1 100 Continue")
        s.sendall(body + head + b"\r\n" + body)  # the body, then a second request pipelined behind it
        data = b""
        while data.count(b"HTTP/1.1 200") < 2:
            chunk = s.recv(65536)
            assert chunk, "server closed the connection"
            data += chunk


def test_idle_connections_are_closed(tmp_path: Any) -> None:
    """Only connections with nothing in flight and no bytes for longer than the timeout are closed."""
    from deskpod.serve.registry import ModelRegistry
    from deskpod.serve.server import App, HttpConnection, ServeConfig

    class Transport:
        closed = False

        def close(self) -> None:
            self.closed = True

    app = App(ServeConfig(repo=tmp_path, idle_timeout_s=10), ModelRegistry(tmp_path))
    conns = [HttpConnection(app) for _ in range(3)]
    for c, (busy, age) in zip(conns, [(False, 20), (True, 20), (False, 5)], strict=True):
        c.transport, c.busy, c.last_active = Transport(), busy, 100.0 - age  # type: ignore[assignment]
        app.open.add(c)
    assert app.close_idle(now=100.0) == 1
    assert [c.transport.closed for c in conns] == [True, False, False]  # type: ignore[union-attr]
