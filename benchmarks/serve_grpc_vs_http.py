"""gRPC against HTTP on one `deskpod serve` process: per-request overhead and throughput, MLP at batch 1.

    .venv/bin/python benchmarks/serve_grpc_vs_http.py --duration 3 --repeats 3 --out /tmp/grpc_vs_http.json

One server process (`deskpod serve REPO --port 0 --grpc-port 0`, its default event loop) serves the MLP of
serve_vs_triton.py (784-512-512-10, ONNX, max batch 32, queue delay 0 µs, 1 instance, 2 intra-op threads)
over both protocols at once, so both go through the same batcher and runtime. Before anything is timed, one
answer over each protocol (official tritonclient.http and tritonclient.grpc) is checked against a direct
ONNX Runtime call on the same input.

Measured, as paired ratios within this run (the 2 cores are shared, absolute numbers drift):
  * overhead per request = protocol p50 at concurrency 1 - direct ONNX Runtime p50 (same settings, this process),
    with deskpod's load generator (its own process; `deskpod bench serve --protocol ...`), the two protocols back
    to back per repeat, order alternating; the ratio gRPC / HTTP is the median of the per-repeat ratios;
  * the same with the official clients, a plain loop of synchronous ``infer`` calls (tritonclient.http with
    binary tensors, tritonclient.grpc with raw contents) in this process, and over tritonclient.grpc's stream
    (ModelStreamInfer: ``async_stream_infer``, each answer awaited before the next is sent);
  * every load-generator level also over ``grpc-stream`` (one ModelStreamInfer stream per client, one request in
    flight on it), beside unary gRPC;
  * throughput at 32 clients with the load generator, gRPC / HTTP, and the server's CPU time per request there
    (user + system from /proc/PID/stat over the level, divided by the requests answered): the server's own cost,
    free of the client's; and the rows per execution there (the model's statistics: how well requests batch);
  * grpcio's own floor: one synchronous grpcio channel in this process sends the very bytes of the MLP's
    ModelInferRequest (raw contents) to deskpod's ModelInfer and to two bare servers, each in its own process,
    whose one generic handler answers deskpod's own reply bytes without reading the request (no deskpod code):
    grpcio's ``grpc.aio`` server and its synchronous ``grpc.server`` (a thread pool); and one blocking socket in
    this process sends the MLP's HTTP request bytes (binary tensors) to deskpod's HTTP port and reads the whole
    answer: deskpod's whole HTTP request from the leanest client there is, against grpcio's bare servers from
    grpcio's own leanest client. The four take turns in blocks of 100 calls (`FLOOR_BLOCK`); p50 of each;
  * grpcio's own ceiling: the load generator's unary gRPC at 32 clients against that bare server (on uvloop,
    as deskpod serves); against the same server making one round trip per call to a one-thread pool (what a
    batch does to its model instance's thread); and with that thread running the MLP in ONNX Runtime (deskpod's
    session settings, one row per call): throughput, server CPU per request, and deskpod's over each.
Prints a table and JSON; writes the JSON to --out when given.
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))

from ab_tree import cli
from serve_vs_triton import mlp

ROOT = Path(__file__).resolve().parent.parent
THREADS = 2
SHAPE = (1, 28, 28)


def build_repo(repo: Path) -> Path:
    import torch

    from deskpod.serve.export import ExportOptions, export_model

    torch.manual_seed(0)
    net = mlp()
    opts = ExportOptions(repo=repo, name="mlp", max_batch_size=32, max_queue_delay_us=0, threads=THREADS)
    return export_model(net, SHAPE, opts) / "model.onnx"


def start_server(repo: Path, port_file: Path, tree: Path = ROOT) -> subprocess.Popen[bytes]:
    """`deskpod serve REPO` on free HTTP and gRPC ports, importing deskpod from ``tree``; returns once it is ready
    (its port file then holds both addresses)."""
    proc = subprocess.Popen(
        [*cli(tree), "serve", str(repo), "--port", "0", "--grpc-port", "0", "--port-file", str(port_file)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        cwd=tree,
    )
    deadline = time.monotonic() + 180
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise SystemExit(f"deskpod serve from {tree} exited with {proc.returncode} before it was ready")
        try:
            if json.loads(port_file.read_text()).get("ready"):
                return proc
        except (OSError, ValueError):
            pass
        time.sleep(0.2)
    proc.kill()
    raise SystemExit(f"deskpod serve from {tree} was not ready within 180 s")


def direct_ort(path: Path, x: np.ndarray, n: int = 2000) -> tuple[float, np.ndarray]:
    import onnxruntime as ort

    opts = ort.SessionOptions()
    opts.intra_op_num_threads = THREADS
    opts.inter_op_num_threads = 1
    opts.add_session_config_entry("session.intra_op.allow_spinning", "0")
    s = ort.InferenceSession(str(path), opts, providers=["CPUExecutionProvider"])
    y = s.run(["logits"], {"input": x})[0]
    times = []
    for _ in range(n):
        t0 = time.perf_counter()
        s.run(["logits"], {"input": x})
        times.append(time.perf_counter() - t0)
    return statistics.median(times) * 1000, y


def clients(urls: dict[str, str]) -> tuple[dict[str, Any], Any]:
    """A synchronous infer call per protocol, with the official clients: name -> call(x) -> logits; and the
    function that closes the gRPC stream."""
    import tritonclient.grpc as g
    import tritonclient.http as h

    hc, gc = h.InferenceServerClient(urls["http"]), g.InferenceServerClient(urls["grpc"])

    def http(x: np.ndarray) -> np.ndarray:
        i = h.InferInput("input", list(x.shape), "FP32")
        i.set_data_from_numpy(x, binary_data=True)
        return hc.infer("mlp", [i], outputs=[h.InferRequestedOutput("logits", binary_data=True)]).as_numpy("logits")  # type: ignore[no-any-return]

    def grpc(x: np.ndarray) -> np.ndarray:
        i = g.InferInput("input", list(x.shape), "FP32")
        i.set_data_from_numpy(x)
        return gc.infer("mlp", [i], outputs=[g.InferRequestedOutput("logits")]).as_numpy("logits")  # type: ignore[no-any-return]

    import queue

    answers: queue.Queue[Any] = queue.Queue()
    gc.start_stream(callback=lambda result, error: answers.put(error or result))

    def grpc_stream(x: np.ndarray) -> np.ndarray:
        i = g.InferInput("input", list(x.shape), "FP32")
        i.set_data_from_numpy(x)
        gc.async_stream_infer("mlp", [i], outputs=[g.InferRequestedOutput("logits")])
        got = answers.get(timeout=30)
        if isinstance(got, Exception):
            raise got
        return got.as_numpy("logits")  # type: ignore[no-any-return]

    return {"http": http, "grpc": grpc, "grpc-stream": grpc_stream}, gc.stop_stream


def client_p50_ms(call: Any, x: np.ndarray, seconds: float) -> float:
    for _ in range(50):
        call(x)
    times: list[float] = []
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        t0 = time.perf_counter()
        call(x)
        times.append(time.perf_counter() - t0)
    return statistics.median(times) * 1000


def cpu_s(pid: int) -> float:
    """User + system CPU seconds of a process so far."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def loadgen(url: str, protocol: str, concurrency: int, duration: float, warmup: float) -> dict[str, Any]:
    """`deskpod bench serve` in its own process (the client must not share this process's GIL)."""
    cmd = [sys.executable, "-c", "import sys; from deskpod.cli import main; sys.exit(main(sys.argv[1:]))"]
    args = ["bench", "serve", "--protocol", protocol, "--url", url, "--model", "mlp", "--concurrency"]
    out = subprocess.run(
        [*cmd, *args, str(concurrency), "--duration", str(duration), "--warmup", str(warmup), "--json"],
        check=True,
        capture_output=True,
        text=True,
        cwd=ROOT,
    ).stdout
    row: dict[str, Any] = json.loads(out)[0]
    if row["errors"] or not row["ok"]:
        raise SystemExit(f"{protocol} at {concurrency} clients: {row['ok']} ok, errors {row['errors']}")
    return row


def _echo_main(port_file: str) -> None:
    """A bare grpc.aio server on uvloop (deskpod's loop): every unary call to any method is answered with the
    ``ECHO_REPLY`` bytes. With ``ECHO_HOP=1`` each call first makes one round trip to a one-thread pool, as a
    request's batch does to its model instance's thread (`deskpod.serve.batcher`), doing nothing there; with
    ``ECHO_ONNX=PATH`` as well, that thread runs the MLP there (ONNX Runtime with deskpod's session settings, on
    one row of zeros), and the reply is still the fixed bytes. With ``ECHO_SYNC=1`` it is grpcio's synchronous
    server instead (``grpc.server`` on a 4-thread pool, the handler answering on its pool thread)."""
    import asyncio
    from concurrent.futures import ThreadPoolExecutor

    import grpc

    class AnyMethod(grpc.GenericRpcHandler):
        def __init__(self, handle: Any) -> None:
            self.handler = grpc.unary_unary_rpc_method_handler(handle)

        def service(self, details: Any) -> Any:
            return self.handler

    if os.environ.get("ECHO_SYNC") == "1":
        fixed = bytes.fromhex(os.environ["ECHO_REPLY"])
        sync_server = grpc.server(ThreadPoolExecutor(4))
        sync_server.add_generic_rpc_handlers((AnyMethod(lambda request, context: fixed),))
        Path(port_file).write_text(str(sync_server.add_insecure_port("127.0.0.1:0")))
        sync_server.start()
        sync_server.wait_for_termination()
        return

    async def serve() -> None:
        reply = bytes.fromhex(os.environ["ECHO_REPLY"])
        pool, hop = ThreadPoolExecutor(1), os.environ.get("ECHO_HOP") == "1"
        work: Any = int
        if os.environ.get("ECHO_ONNX"):
            from deskpod.serve.repository import read_config
            from deskpod.serve.runtimes import OnnxRuntime

            path = Path(os.environ["ECHO_ONNX"])
            runtime = OnnxRuntime(path, read_config(path.parent.parent))
            zeros = {"input": np.zeros((1, *SHAPE), np.float32)}
            work = functools.partial(runtime.run, zeros)

        async def handle(request: bytes, context: Any) -> bytes:
            if hop:
                await asyncio.get_running_loop().run_in_executor(pool, work)
            return reply

        server = grpc.aio.server()
        server.add_generic_rpc_handlers((AnyMethod(handle),))
        port = server.add_insecure_port("127.0.0.1:0")
        await server.start()
        Path(port_file).write_text(str(port))
        await server.wait_for_termination()

    try:
        import uvloop
    except ImportError:
        asyncio.run(serve())
    else:
        uvloop.run(serve())


def start_echo(
    reply: bytes, hop: bool, port_file: Path, onnx: Path | None = None, sync: bool = False
) -> tuple[subprocess.Popen[bytes], str]:
    """A bare server (`_echo_main`) in its own process, and the address it listens on."""
    port_file.unlink(missing_ok=True)
    env = {**os.environ, "ECHO_REPLY": reply.hex(), "ECHO_HOP": "1" if hop else "0", "ECHO_ONNX": str(onnx or ""),
           "ECHO_SYNC": "1" if sync else "0"}  # fmt: skip
    echo = subprocess.Popen([sys.executable, __file__, "--_echo", str(port_file)], env=env, cwd=ROOT)
    deadline = time.monotonic() + 60
    while not port_file.exists() or not port_file.read_text():
        if time.monotonic() > deadline or echo.poll() is not None:
            echo.kill()
            raise SystemExit("the bare grpc.aio server did not start")
        time.sleep(0.1)
    return echo, f"127.0.0.1:{port_file.read_text()}"


def stop(proc: subprocess.Popen[bytes]) -> None:
    proc.terminate()
    proc.wait(timeout=30)


def http_call(sock: socket.socket, data: bytes) -> bytes:
    """One HTTP/1.1 request on a blocking keep-alive socket: its answer's body (the head's Content-Length)."""
    sock.sendall(data)
    buf = b""
    while (end := buf.find(b"\r\n\r\n")) < 0:
        buf += sock.recv(65536)
    head = buf[:end].decode("latin-1").lower()
    length = int(head.split("content-length:", 1)[1].split("\r\n", 1)[0])
    body = buf[end + 4 :]
    while len(body) < length:
        body += sock.recv(65536)
    if not head.startswith("http/1.1 200"):
        raise SystemExit(f"deskpod's HTTP infer answered {head.splitlines()[0]!r}")
    return body


FLOORS = {
    "deskpod": "deskpod's ModelInfer (gRPC)",
    "bare": "bare grpc.aio server, fixed reply",
    "bare_sync": "bare synchronous grpc.server, fixed reply",
    "deskpod_http": "deskpod's whole HTTP infer, one blocking socket",
}


FLOOR_BLOCK, FLOOR_SETTLE = 100, 10
"""The floor's targets take turns in blocks of this many timed calls, each after this many untimed ones: a
call-by-call alternation made the HTTP call pay for the gRPC call before it (1.19 ms at p50 in alternation,
0.37-0.67 ms alone, 2026-12-02)."""


def grpc_floor(deskpod_url: str, http_url: str, x: np.ndarray, seconds: float, tmp: Path) -> dict[str, float]:
    """p50 ms of raw ModelInfer bytes to deskpod and to grpcio's two bare servers, and of the same request over
    deskpod's HTTP from a blocking socket, taking turns in blocks (`FLOORS`, `FLOOR_BLOCK`)."""
    import grpc

    from deskpod.serve.loadgen import LoadSpec, decode_grpc_response, grpc_request

    request = grpc_request("mlp", {"input": x}).SerializeToString()
    host, port = http_url.rsplit(":", 1)
    http_request = LoadSpec(host=host, port=int(port), model="mlp", inputs={"input": x}).request_bytes()
    channel = grpc.insecure_channel(deskpod_url)
    infer = channel.unary_unary("/inference.GRPCInferenceService/ModelInfer")
    reply = infer(request)
    if decode_grpc_response(reply)["logits"].shape != (1, 10):
        raise SystemExit("deskpod's ModelInfer answered something other than [1, 10] logits")
    echo, url = start_echo(reply, False, tmp / "echo.port")
    echo_sync, sync_url = start_echo(reply, False, tmp / "echo-sync.port", sync=True)
    sock = socket.create_connection((host, int(port)))
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    try:
        bare_channel, sync_channel = grpc.insecure_channel(url), grpc.insecure_channel(sync_url)
        bare = bare_channel.unary_unary("/inference.GRPCInferenceService/ModelInfer")
        bare_sync = sync_channel.unary_unary("/inference.GRPCInferenceService/ModelInfer")
        if bare(request) != reply or bare_sync(request) != reply:
            raise SystemExit("a bare grpcio server answered other bytes")
        http = functools.partial(http_call, sock, http_request)
        if len(http()) < 40:  # the binary logits alone are 40 bytes
            raise SystemExit("deskpod's HTTP infer answered a body too short to hold the logits")
        calls = {"deskpod": functools.partial(infer, request), "bare": functools.partial(bare, request),
                 "bare_sync": functools.partial(bare_sync, request), "deskpod_http": http}  # fmt: skip
        times: dict[str, list[float]] = {k: [] for k in calls}
        for _ in range(50):
            for call in calls.values():
                call()
        end = time.perf_counter() + seconds
        while time.perf_counter() < end:
            for name, call in calls.items():  # in blocks: one target's calls must not pay for another's
                for i in range(FLOOR_BLOCK + FLOOR_SETTLE):
                    t0 = time.perf_counter()
                    call()
                    if i >= FLOOR_SETTLE:
                        times[name].append(time.perf_counter() - t0)
        bare_channel.close()
        sync_channel.close()
    finally:
        sock.close()
        stop(echo)
        stop(echo_sync)
        channel.close()
    return {k: statistics.median(v) * 1000 for k, v in times.items()}


def bare_at_32(
    deskpod_url: str, x: np.ndarray, duration: float, warmup: float, tmp: Path, onnx: Path
) -> list[dict[str, Any]]:
    """The load generator's unary gRPC at 32 clients against the bare server: alone, with its thread hop, and
    with the MLP's ONNX Runtime call on that thread (`BARE_STEPS`): grpcio's own ceiling on this box, step by
    step towards what deskpod does, and the server CPU per request of each."""
    import grpc

    from deskpod.serve.loadgen import grpc_request

    request = grpc_request("mlp", {"input": x}).SerializeToString()
    with grpc.insecure_channel(deskpod_url) as channel:
        reply = channel.unary_unary("/inference.GRPCInferenceService/ModelInfer")(request)
    rows = []
    for step in BARE_STEPS:
        echo, url = start_echo(reply, step != "bare", tmp / "echo.port", onnx if step == "hop+ort" else None)
        try:
            c0 = cpu_s(echo.pid)
            r = loadgen(url, "grpc", 32, duration, warmup)
            r["server_us_per_request"] = (cpu_s(echo.pid) - c0) / (r["ok"] * (duration + warmup) / duration) * 1e6
        finally:
            stop(echo)
        rows.append({"tool": "bare_grpc", "protocol": step, "clients": 32, **r})
    return rows


BARE_STEPS = {
    "bare": "bare grpc.aio",
    "hop": "bare grpc.aio + one thread hop per call",
    "hop+ort": "bare grpc.aio + the hop running the MLP in ONNX Runtime",
}


def stats(http_url: str) -> tuple[int, int]:
    """The MLP's (inference count, execution count) so far, from the server's statistics."""
    with urllib.request.urlopen(f"http://{http_url}/v2/models/mlp/stats", timeout=30) as resp:
        s = json.load(resp)["model_stats"][0]
    return int(s["inference_count"]), int(s["execution_count"])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    ap.add_argument("--duration", type=float, default=3.0, help="measured seconds per level and protocol")
    ap.add_argument("--warmup", type=float, default=1.0)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--out", type=Path, default=None)
    ap.add_argument("--_echo", help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a._echo:
        _echo_main(a._echo)
        return
    with tempfile.TemporaryDirectory(prefix="deskpod-grpc-bench-") as tmp:
        onnx_path = build_repo(Path(tmp) / "repo")
        x = np.random.default_rng(0).random((1, *SHAPE), dtype=np.float32)
        direct_ms, want = direct_ort(onnx_path, x)
        proc = start_server(Path(tmp) / "repo", Path(tmp) / "serve.json")
        try:
            doc = json.loads((Path(tmp) / "serve.json").read_text())
            urls = {"http": doc["url"].removeprefix("http://"), "grpc": doc["grpc"]}
            calls, stop_stream = clients(urls)
            for name, call in calls.items():  # correctness, outside anything timed
                np.testing.assert_allclose(call(x), want, rtol=1e-4, atol=1e-5, err_msg=f"{name} answer is wrong")
            rows: list[dict[str, Any]] = []
            for rep in range(a.repeats):
                order = ["http", "grpc"] if rep % 2 == 0 else ["grpc", "http"]
                for c in (1, 32):
                    for p in [*order, "grpc-stream"] if rep % 2 == 0 else ["grpc-stream", *order]:
                        c0, (n0, e0) = cpu_s(proc.pid), stats(urls["http"])
                        r = loadgen(urls["http" if p == "http" else "grpc"], p, c, a.duration, a.warmup)
                        r["server_cpu_s"] = cpu_s(proc.pid) - c0  # over warm-up and measured part
                        n1, e1 = stats(urls["http"])
                        r["mean_batch"] = (n1 - n0) / max(e1 - e0, 1)  # rows per execution, warm-up included
                        r["server_us_per_request"] = (
                            r["server_cpu_s"] / (r["ok"] * (a.duration + a.warmup) / a.duration) * 1e6
                        )
                        rows.append({"tool": "loadgen", "protocol": p, "clients": c, "repeat": rep, **r})
                for p in [*order, "grpc-stream"] if rep % 2 == 0 else ["grpc-stream", *order]:
                    p50 = client_p50_ms(calls[p], x, a.duration)
                    rows.append({"tool": "tritonclient", "protocol": p, "clients": 1, "repeat": rep, "p50_ms": p50})
                floor = grpc_floor(urls["grpc"], urls["http"], x, a.duration, Path(tmp))
                for server, p50 in floor.items():
                    rows.append({"tool": "raw_grpc", "protocol": server, "clients": 1, "repeat": rep, "p50_ms": p50})
                for r in bare_at_32(urls["grpc"], x, a.duration, a.warmup, Path(tmp), onnx_path):
                    rows.append({**r, "repeat": rep})
            stop_stream()
        finally:
            proc.terminate()
            proc.wait(timeout=60)
    summary = summarize(rows, direct_ms, a.repeats)
    print(table(summary))
    print(json.dumps(summary))
    if a.out is not None:
        a.out.write_text(json.dumps({"summary": summary, "rows": rows}, indent=1) + "\n")


PROTOCOLS = ("http", "grpc", "grpc-stream")


def summarize(rows: list[dict[str, Any]], direct_ms: float, repeats: int) -> dict[str, Any]:
    def each(tool: str, p: str, c: int, key: str) -> list[float]:
        return [
            next(r for r in rows if (r["tool"], r["protocol"], r["clients"], r["repeat"]) == (tool, p, c, i))[key]
            for i in range(repeats)
        ]

    def ratio(a: list[float], b: list[float]) -> dict[str, Any]:
        r = [x / y for x, y in zip(a, b, strict=True)]
        return {"median": round(statistics.median(r), 3), "per_repeat": [round(x, 3) for x in r]}

    out: dict[str, Any] = {"direct_ort_p50_ms": round(direct_ms, 4)}
    for tool in ("loadgen", "tritonclient"):
        over = {p: [v - direct_ms for v in each(tool, p, 1, "p50_ms")] for p in PROTOCOLS}
        out[f"{tool}_overhead_ms"] = {p: round(statistics.median(v), 4) for p, v in over.items()}
        for p in PROTOCOLS[1:]:
            out[f"{tool}_{p}_over_http"] = ratio(over[p], over["http"])
    tput = {p: each("loadgen", p, 32, "throughput") for p in PROTOCOLS}
    out["throughput_32"] = {p: round(statistics.median(v), 1) for p, v in tput.items()}
    out["p99_32_ms"] = {p: round(statistics.median(each("loadgen", p, 32, "p99_ms")), 3) for p in PROTOCOLS}
    out["server_us_per_request_32"] = {
        p: round(statistics.median(each("loadgen", p, 32, "server_us_per_request")), 1) for p in PROTOCOLS
    }
    out["mean_batch_32"] = {p: round(statistics.median(each("loadgen", p, 32, "mean_batch")), 2) for p in PROTOCOLS}
    for p in PROTOCOLS[1:]:
        out[f"throughput_32_{p}_over_http"] = ratio(tput[p], tput["http"])
    for k in BARE_STEPS:
        bare = each("bare_grpc", k, 32, "throughput")
        out[f"bare_{k}_throughput_32"] = round(statistics.median(bare), 1)
        out[f"bare_{k}_us_per_request_32"] = round(
            statistics.median(each("bare_grpc", k, 32, "server_us_per_request")), 1
        )
        out[f"throughput_32_grpc_over_bare_{k}"] = ratio(tput["grpc"], bare)
    raw = {k: each("raw_grpc", k, 1, "p50_ms") for k in FLOORS}
    out["raw_grpc_p50_ms"] = {k: round(statistics.median(v), 4) for k, v in raw.items()}
    out["raw_grpc_deskpod_minus_bare_ms"] = round(
        statistics.median(d - b for d, b in zip(raw["deskpod"], raw["bare"], strict=True)), 4
    )
    for k in ("bare", "bare_sync"):
        out[f"raw_{k}_over_deskpod_http"] = ratio(raw[k], raw["deskpod_http"])
    return out


def table(s: dict[str, Any]) -> str:
    lines = [f"direct ONNX Runtime p50: {s['direct_ort_p50_ms']:.4f} ms"]
    lines.append(f"{'measure':<36}{'HTTP':>9}{'gRPC':>9}{'stream':>9}  gRPC/HTTP; stream/HTTP (per repeat)")

    def row(label: str, v: dict[str, float], ratios: list[dict[str, Any]], fmt: str = ".3f") -> None:
        cells = "".join(f"{v[p]:>9{fmt}}" for p in PROTOCOLS)
        lines.append(f"{label:<36}{cells}  " + "; ".join(f"{r['median']:.2f} {r['per_repeat']}" for r in ratios))

    for tool in ("loadgen", "tritonclient"):
        row(f"overhead ms, {tool}, 1 client", s[f"{tool}_overhead_ms"],
            [s[f"{tool}_{p}_over_http"] for p in PROTOCOLS[1:]])  # fmt: skip
    row("req/s at 32 clients, loadgen", s["throughput_32"],
        [s[f"throughput_32_{p}_over_http"] for p in PROTOCOLS[1:]], ".1f")  # fmt: skip
    u = s["server_us_per_request_32"]
    row("server CPU us/request, 32 clients", u,
        [{"median": u[p] / u["http"], "per_repeat": []} for p in PROTOCOLS[1:]], ".1f")  # fmt: skip
    row("rows per execution, 32 clients", s["mean_batch_32"], [], ".2f")
    r = s["raw_grpc_p50_ms"]
    lines.append(
        f"raw gRPC p50 ms: deskpod ModelInfer {r['deskpod']:.3f}, bare grpc.aio {r['bare']:.3f}, "
        f"deskpod adds {s['raw_grpc_deskpod_minus_bare_ms']:.3f} (direct ORT {s['direct_ort_p50_ms']:.3f}); "
        f"bare synchronous grpc.server {r['bare_sync']:.3f}; deskpod's whole HTTP infer, one blocking socket, "
        f"{r['deskpod_http']:.3f}"
    )
    for k in ("bare", "bare_sync"):
        g = s[f"raw_{k}_over_deskpod_http"]
        lines.append(f"{FLOORS[k]} / {FLOORS['deskpod_http']}: {g['median']:.2f} {g['per_repeat']}")
    for k, what in BARE_STEPS.items():
        g = s[f"throughput_32_grpc_over_bare_{k}"]
        lines.append(
            f"{what} at 32 clients (loadgen): {s[f'bare_{k}_throughput_32']:.1f} req/s, "
            f"{s[f'bare_{k}_us_per_request_32']:.1f} us server CPU/request; deskpod's unary gRPC / it: "
            f"{g['median']:.2f} {g['per_repeat']}"
        )
    return "\n".join(lines)


if __name__ == "__main__":
    main()
