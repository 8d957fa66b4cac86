"""deskpod serve vs the real Triton Inference Server 2.51, side by side in one run, on this machine.

    .venv/bin/python benchmarks/serve_vs_triton.py            # everything (builds Triton's venv on first use)
    .venv/bin/python benchmarks/serve_vs_triton.py --no-triton  # deskpod-only targets

Both servers serve the same ONNX files (ResNet-18 at 224x224, random init; a small MLP 784-512-512-10), with the
same batching settings (max batch 32, the same queue delay, 1 instance, the same ONNX Runtime threads). Triton
runs them through its Python backend (``execute`` calls ONNX Runtime on the whole batch Triton hands it) with its
own dynamic batcher, from the ``tritonserver`` binary in PyPI's ``nvidia-pytriton`` wheel; its venv lives in /tmp.
Both servers speak HTTP and gRPC, unary calls and ModelStreamInfer streams (``grpc-stream``: one stream per client). Two load tools drive them, closed loop, each in its own process: deskpod's own
load generator (deskpod.serve.loadgen, binary tensors over HTTP, raw contents over gRPC) and Triton's C++
``perf_analyzer`` (from the ``tritonclient==2.51.0`` wheel, installed into Triton's venv; random FP32 inputs,
synchronous, one request per client). The load generator checks every server's first answer against a direct
ONNX Runtime call before anything is timed.

Measured, as ratios within this one run (the 2 cores are shared, absolute numbers drift):
  * throughput at concurrency 1 and 32, deskpod / Triton, for each tool and protocol, with each side's p99;
  * MLP: dynamic batching (max batch 32) vs batch-1 serving at 32 clients, on deskpod;
  * MLP: server overhead at batch 1 = deskpod p50 at concurrency 1 - direct ORT p50 in one process;
  * MLP: 1,000 concurrent connections: only explicit overload answers, server memory before/after.
Prints a table and JSON; writes JSON to --out when given.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request
import warnings
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np

from deskpod.environment.network import free_port

ROOT = Path(__file__).resolve().parent.parent
TRITON_HOME = Path("/tmp/deskpod-triton")
MODELS = {"mlp": (1, 28, 28), "resnet18": (3, 224, 224)}
SERVED = {"deskpod": ["mlp", "resnet18", "mlp_b1", "resnet18_b1"], "triton": ["mlp", "resnet18"]}
"""The models each server loads (deskpod also the batch-1 copies, the reference for the batching gain)."""

TRITON_MODEL_PY = """
import json, os, sys
sys.path.insert(0, SITE)  # the stub does not always honour PYTHONPATH
import numpy as np
import onnxruntime as ort
import triton_python_backend_utils as pb_utils

class TritonPythonModel:
    def initialize(self, args):
        path = os.path.join(args["model_repository"], args["model_version"], "model.onnx")
        opts = ort.SessionOptions()
        opts.intra_op_num_threads = THREADS
        opts.inter_op_num_threads = 1
        opts.add_session_config_entry("session.intra_op.allow_spinning", "0")  # as deskpod does
        self.session = ort.InferenceSession(path, opts, providers=["CPUExecutionProvider"])

    def execute(self, requests):
        xs = [pb_utils.get_input_tensor_by_name(r, "input").as_numpy() for r in requests]
        y = self.session.run(["logits"], {"input": np.concatenate(xs) if len(xs) > 1 else xs[0]})[0]
        out, i = [], 0
        for x in xs:
            out.append(pb_utils.InferenceResponse([pb_utils.Tensor("logits", y[i : i + len(x)])]))
            i += len(x)
        return out
"""

TRITON_CONFIG = """name: "{name}"
backend: "python"
max_batch_size: {max_batch}
input [{{ name: "input" data_type: TYPE_FP32 dims: [{dims}] }}]
output [{{ name: "logits" data_type: TYPE_FP32 dims: [{out}] }}]
dynamic_batching {{ max_queue_delay_microseconds: {delay} }}
instance_group [{{ count: {instances} kind: KIND_CPU }}]
"""


def mlp() -> Any:
    """The MNIST-sized MLP (784-512-512-10) both serving benchmarks export."""
    import torch

    return torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(784, 512), torch.nn.ReLU(),
                               torch.nn.Linear(512, 512), torch.nn.ReLU(), torch.nn.Linear(512, 10))  # fmt: skip


def build_models(work: Path, threads: int, delay_us: int, site: str) -> dict[str, Path]:
    """ONNX files into a deskpod repository (via deskpod export) and a Triton repository."""
    import torch
    import torchvision

    from deskpod.serve.export import ExportOptions, export_model
    from deskpod.serve.repository import read_config, write_config

    torch.manual_seed(0)
    nets = {"mlp": mlp(), "resnet18": torchvision.models.resnet18(num_classes=1000)}
    repo, trepo = work / "deskpod", work / "triton"
    for name, net in nets.items():
        opts = ExportOptions(repo=repo, name=name, max_batch_size=32, max_queue_delay_us=delay_us, threads=threads)
        export_model(net, MODELS[name], opts)
        cfg = read_config(repo / name)
        write_config(repo / name, replace(cfg, max_queue_size=1024))
        # batch-1 serving of the same file: the reference for the batching gain
        b1 = repo / f"{name}_b1"
        shutil.copytree(repo / name, b1)
        write_config(b1, replace(cfg, name=f"{name}_b1", max_batch_size=1, max_queue_size=1024))
        tdir = trepo / name
        (tdir / "1").mkdir(parents=True)
        shutil.copy(repo / name / "1" / "model.onnx", tdir / "1" / "model.onnx")
        (tdir / "1" / "model.py").write_text(
            TRITON_MODEL_PY.replace("THREADS", str(threads)).replace("SITE", repr(site))
        )
        (tdir / "config.pbtxt").write_text(
            TRITON_CONFIG.format(
                name=name,
                max_batch=32,
                dims=", ".join(map(str, MODELS[name])),
                out=cfg.outputs[0].dims[0],
                delay=delay_us,
                instances=1,
            )
        )
    return {"deskpod": repo, "triton": trepo}


def triton_env() -> tuple[Path, dict[str, str]]:
    """Build (once) a venv with ``nvidia-pytriton`` (it ships ``tritonserver`` and its Python backend stubs) and
    ``numpy<2`` (under numpy 2 that backend answers empty outputs); returns the tritonserver binary and its env."""
    venv = TRITON_HOME / "venv"
    if not (venv / "bin" / "python").exists():
        TRITON_HOME.mkdir(parents=True, exist_ok=True)
        subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
        subprocess.run(
            [str(venv / "bin" / "pip"), "install", "-q", "nvidia-pytriton", "onnxruntime", "numpy<2"], check=True
        )
    site = Path(
        subprocess.check_output(
            [str(venv / "bin" / "python"), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"], text=True
        ).strip()
    )
    ts = site / "pytriton" / "tritonserver"
    stub = ts / "backends" / "python" / "triton_python_backend_stub"
    if not stub.exists():
        shutil.copy(ts / "python_backend_stubs" / "3.11" / "triton_python_backend_stub", stub)
    libpython = subprocess.check_output(
        [str(venv / "bin" / "python"), "-c", "import sysconfig; print(sysconfig.get_config_var('LIBDIR'))"], text=True
    ).strip()
    env = dict(os.environ)
    env["LD_LIBRARY_PATH"] = f"{site / 'nvidia_pytriton.libs'}:{libpython}:{env.get('LD_LIBRARY_PATH', '')}"
    env["PYTHONPATH"] = str(site)
    return ts / "bin" / "tritonserver", env


def wait_ready(port: int, proc: subprocess.Popen[bytes], what: str, timeout: float = 180) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"{what} exited with {proc.returncode} before it was ready")
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/v2/health/ready", timeout=2) as r:
                if r.status == 200:
                    return
        except OSError:
            pass
        time.sleep(0.5)
    raise RuntimeError(f"{what} not ready after {timeout} s")


def stop(proc: subprocess.Popen[bytes], grace: float = 40) -> None:
    if proc.poll() is None:
        proc.send_signal(signal.SIGINT)
        try:
            proc.wait(grace)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


Ports = dict[str, int]
"""A server's port per protocol: ``{"http": P, "grpc": G}``."""


def start_deskpod(repo: Path, models: list[str]) -> tuple[subprocess.Popen[bytes], Ports]:
    port, gport = free_port(), free_port()
    cmd = [sys.executable, "-m", "deskpod", "serve", str(repo), "--port", str(port), "--grpc-port", str(gport),
           "--models", ",".join(models)]  # fmt: skip
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, cwd=ROOT)
    wait_ready(port, proc, "deskpod serve")
    return proc, {"http": port, "grpc": gport}


def start_triton(repo: Path, models: list[str]) -> tuple[subprocess.Popen[bytes], Ports]:
    binary, env = triton_env()
    port, gport, mport = free_port(), free_port(), free_port()
    cmd = [
        str(binary), f"--model-repository={repo}", f"--backend-directory={binary.parent.parent / 'backends'}",
        "--http-address", "127.0.0.1", "--grpc-address", "127.0.0.1", "--metrics-address", "127.0.0.1",
        "--http-port", str(port), "--grpc-port", str(gport), "--metrics-port", str(mport), "--allow-gpu-metrics", "false",
        "--model-control-mode", "explicit", *[f"--load-model={m}" for m in models], "--log-error", "false",
    ]  # fmt: skip
    log = open(TRITON_HOME / "tritonserver.log", "wb")  # noqa: SIM115 - lives as long as the process
    proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env)
    wait_ready(port, proc, "tritonserver")
    return proc, {"http": port, "grpc": gport}


def rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def load(port: int, protocol: str, model: str, concurrency: int, duration: float, warmup: float) -> dict[str, Any]:
    """Run one closed-loop level in a separate load-generator process; checks the first answer."""
    arg = json.dumps([port, protocol, model, concurrency, duration, warmup])
    out = subprocess.check_output([sys.executable, __file__, "--_load", arg], cwd=ROOT)
    return json.loads(out)  # type: ignore[no-any-return]


def perf_analyzer() -> tuple[Path, dict[str, str]]:
    """Triton's ``perf_analyzer`` from the ``tritonclient==2.51.0`` wheel in Triton's venv, and its environment:
    ``libcudart.so.12`` from the ``nvidia-cuda-runtime-cu12`` wheel on its library path (it runs on the CPU);
    it also needs Debian's ``libb64-0d``."""
    venv = TRITON_HOME / "venv"
    binary = venv / "bin" / "perf_analyzer"
    if not binary.exists():
        triton_env()
        subprocess.run(
            [str(venv / "bin" / "pip"), "install", "-q", "tritonclient==2.51.0", "nvidia-cuda-runtime-cu12"], check=True
        )
    site = Path(triton_env()[1]["PYTHONPATH"])
    env = dict(os.environ)
    env["LD_LIBRARY_PATH"] = f"{site / 'nvidia' / 'cuda_runtime' / 'lib'}:{env.get('LD_LIBRARY_PATH', '')}"
    ldd = subprocess.run(["ldd", str(binary)], env=env, capture_output=True, text=True, check=False).stdout
    missing = [line.split()[0] for line in ldd.splitlines() if "not found" in line]
    if missing:  # checked before any level runs, not found out halfway through the run
        hint = " (Debian: apt-get install libb64-0d)" if any(m.startswith("libb64") for m in missing) else ""
        raise SystemExit(f"{binary} cannot start: {', '.join(missing)} not found{hint}; or pass --no-perf-analyzer")
    return binary, env


def perf_level(port: int, protocol: str, model: str, concurrency: int, duration: float) -> dict[str, Any]:
    """One level with perf_analyzer: three measurement windows of ``duration / 3`` each, averaged (its stability
    check is switched off: on shared cores it would retry without end). Latencies come in µs; here ms."""
    binary, env = perf_analyzer()
    with tempfile.TemporaryDirectory(prefix="deskpod-pa-") as tmp:
        csv = Path(tmp) / "pa.csv"
        wire = ["-i", "grpc", "--streaming"] if protocol == "grpc-stream" else ["-i", protocol]
        cmd = [str(binary), "-m", model, "-u", f"127.0.0.1:{port}", *wire, "-b", "1",
               "--concurrency-range", f"{concurrency}:{concurrency}", "--measurement-mode", "time_windows",
               "--measurement-interval", str(int(duration * 1000 / 3)), "--max-trials", "3",
               "--stability-percentage", "999", "--percentile", "99", "-f", str(csv)]  # fmt: skip
        try:
            run = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=duration * 4 + 30)
        except subprocess.TimeoutExpired:  # it waits without end on a server that died under it
            raise RuntimeError(f"perf_analyzer did not finish within {duration * 4 + 30:.0f} s") from None
        if run.returncode != 0 or not csv.exists():
            raise RuntimeError(f"perf_analyzer exit {run.returncode}: {(run.stdout + run.stderr)[-2000:]}")
        head, row = csv.read_text().splitlines()[:2]
    rec = dict(zip(head.split(","), row.split(","), strict=True))
    return {
        "throughput": float(rec["Inferences/Second"]),
        "p50_ms": float(rec["p50 latency"]) / 1000,
        "p99_ms": float(rec["p99 latency"]) / 1000,
        "errors": {},  # perf_analyzer fails the whole run on any error
    }


def _load_main(arg: str) -> None:
    import asyncio

    from deskpod.serve.loadgen import LoadSpec, check, closed_loop

    port, protocol, model, concurrency, duration, warmup = json.loads(arg)
    base = model.removesuffix("_b1")
    x = np.random.default_rng(0).random((1, *MODELS[base]), dtype=np.float32)
    spec = LoadSpec(port=port, model=model, inputs={"input": x}, duration_s=duration, warmup_s=warmup,
                    max_connections=2000, protocol=protocol)  # fmt: skip

    async def main() -> dict[str, Any]:
        got = (await check(spec))["logits"]
        ref = np.load(os.environ["DESKPOD_BENCH_REF"] + f"/{base}.npy")
        if not np.allclose(got, ref, rtol=1e-3, atol=1e-4):
            raise SystemExit(f"WRONG ANSWER from {model} on port {port}: max diff {np.abs(got - ref).max()}")
        return (await closed_loop(spec, concurrency)).as_dict()

    print(json.dumps(asyncio.run(main())))


def direct_ort_ms(path: Path, shape: tuple[int, ...], threads: int, n: int = 2000) -> tuple[float, np.ndarray]:
    import onnxruntime as ort

    opts = ort.SessionOptions()
    opts.intra_op_num_threads, opts.inter_op_num_threads = threads, 1
    s = ort.InferenceSession(str(path), opts, providers=["CPUExecutionProvider"])
    x = np.random.default_rng(0).random((1, *shape), dtype=np.float32)
    for _ in range(50):
        y = s.run(["logits"], {"input": x})[0]
    ts = []
    for _ in range(n):
        t = time.perf_counter()
        s.run(["logits"], {"input": x})
        ts.append(time.perf_counter() - t)
    return float(np.median(ts) * 1000), y


Level = tuple[str, str, int, str, str]
"""(server, model, concurrency, protocol, tool)."""


def _key(r: dict[str, Any]) -> Level:
    return r["server"], r["model"], r["concurrency"], r["protocol"], r["tool"]


def _paired(rows: list[dict[str, Any]], a: Level, b: Level) -> dict[str, Any]:
    """Per-repeat ratio of a to b (measured back to back, so background load hits both alike), and the median."""

    def level(key: Level) -> dict[int, dict[str, Any]]:
        return {r["repeat"]: r for r in rows if _key(r) == key}

    ra, rb = level(a), level(b)
    both = sorted(set(ra) & set(rb))
    crashed = {"a": [i for i in both if "server-crashed" in ra[i]["errors"]],
               "b": [i for i in both if "server-crashed" in rb[i]["errors"]]}  # fmt: skip
    reps = [i for i in both if i not in crashed["a"] and i not in crashed["b"]]
    ratios = [ra[i]["throughput"] / rb[i]["throughput"] for i in reps]
    if not reps:
        return {"ratios": [], "median": math.nan, "throughput": [math.nan, math.nan], "p99_ms": [math.nan, math.nan],
                "p50_ms": [math.nan, math.nan], "crashed_repeats": crashed}  # fmt: skip
    return {
        "crashed_repeats": crashed,
        "ratios": [round(x, 3) for x in ratios],
        "median": float(np.median(ratios)),
        "throughput": [
            float(np.median([ra[i]["throughput"] for i in reps])),
            float(np.median([rb[i]["throughput"] for i in reps])),
        ],
        "p99_ms": [
            float(np.median([ra[i]["p99_ms"] for i in reps])),
            float(np.median([rb[i]["p99_ms"] for i in reps])),
        ],
        "p50_ms": [
            float(np.median([ra[i]["p50_ms"] for i in reps])),
            float(np.median([rb[i]["p50_ms"] for i in reps])),
        ],
    }


def summarize(rows: list[dict[str, Any]], direct: dict[str, float]) -> dict[str, Any]:
    """The targets, as medians over repeats of paired (back-to-back) measurements."""
    p50 = float(np.median([r["p50_ms"] for r in rows if _key(r) == ("deskpod", "mlp", 1, "http", "loadgen")]))
    summary: dict[str, Any] = {"direct_ort_p50_ms": direct, "mlp_overhead_ms": p50 - direct["mlp"]}
    for model in ("mlp", "resnet18"):
        summary[f"{model}_batching_gain_c32"] = _paired(
            rows, ("deskpod", model, 32, "http", "loadgen"), ("deskpod", f"{model}_b1", 32, "http", "loadgen")
        )
    for tool, protocol in sorted({(r["tool"], r["protocol"]) for r in rows if r["server"] == "triton"}):
        for model in ("mlp", "resnet18"):
            for c in (1, 32):
                summary[f"{model}_c{c}_vs_triton_{protocol}_{tool}"] = v = _paired(
                    rows, ("deskpod", model, c, protocol, tool), ("triton", model, c, protocol, tool)
                )
                v.update(tool=tool, protocol=protocol, model=model, concurrency=c)
    big = [r for r in rows if r["concurrency"] == 1000]
    if big:
        summary["mlp_c1000"] = {
            k: big[0].get(k) for k in ("throughput", "p99_ms", "errors", "rss_before_mb", "rss_after_mb")
        }
    return summary


def markdown(summary: dict[str, Any]) -> str:
    """The comparison table for docs/benchmarks.md."""
    out = ["| load tool | protocol | model | clients | deskpod req/s | Triton req/s | deskpod / Triton (per repeat) "
           "| p99 ms deskpod | p99 ms Triton |", "|---|---|---|---|---|---|---|---|---|"]  # fmt: skip
    for v in summary.values():
        if isinstance(v, dict) and "tool" in v:
            out.append(
                f"| {v['tool']} | {v['protocol']} | {v['model']} | {v['concurrency']} | {v['throughput'][0]:.1f} | "
                f"{v['throughput'][1]:.1f} | **{v['median']:.2f}x** ({', '.join(f'{x:.2f}' for x in v['ratios'])}) "
                f"| {v['p99_ms'][0]:.2f} | {v['p99_ms'][1]:.2f} |"
                + (
                    f" crashed in repeat(s): deskpod {v['crashed_repeats']['a']}, Triton {v['crashed_repeats']['b']}"
                    if v["crashed_repeats"]["a"] or v["crashed_repeats"]["b"]
                    else ""
                )
            )
    return "\n".join(out)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--no-triton", action="store_true")
    ap.add_argument("--duration", type=float, default=6.0, help="measured seconds per level")
    ap.add_argument("--warmup", type=float, default=1.5)
    ap.add_argument("--threads", type=int, default=2, help="ONNX Runtime intra-op threads (both servers)")
    ap.add_argument("--delay-us", type=int, default=0, help="max queue delay (both servers)")
    ap.add_argument("--repeats", type=int, default=2, help="alternating repeats of every level")
    ap.add_argument(
        "--protocols",
        default="http,grpc,grpc-stream",
        help="protocols to compare on (default http,grpc,grpc-stream: ModelStreamInfer, one stream per client)",
    )
    ap.add_argument("--no-perf-analyzer", action="store_true", help="only deskpod's load generator")
    ap.add_argument("--out", type=Path)
    ap.add_argument("--_load")
    args = ap.parse_args()
    if args._load:
        _load_main(args._load)
        return
    warnings.simplefilter("ignore")
    work = Path(tempfile.mkdtemp(prefix="deskpod-serve-bench-"))
    site = "" if args.no_triton else str(triton_env()[1]["PYTHONPATH"])
    repos = build_models(work, args.threads, args.delay_us, site)
    refdir = work / "ref"
    refdir.mkdir()
    os.environ["DESKPOD_BENCH_REF"] = str(refdir)
    direct: dict[str, float] = {}
    for name, shape in MODELS.items():
        direct[name], y = direct_ort_ms(
            repos["deskpod"] / name / "1" / "model.onnx", shape, args.threads, 2000 if name == "mlp" else 30
        )
        np.save(refdir / f"{name}.npy", y)
    rows: list[dict[str, Any]] = []
    d, w = args.duration, args.warmup
    servers = ["deskpod"] + ([] if args.no_triton else ["triton"])
    procs: dict[str, tuple[subprocess.Popen[bytes], Ports]] = {}
    protocols = [p for p in args.protocols.split(",") if p]
    if not set(protocols) <= {"http", "grpc", "grpc-stream"} or not protocols:
        raise SystemExit(f"--protocols {args.protocols!r}: give some of http, grpc, grpc-stream (comma-separated)")
    tools = ["loadgen"] + ([] if args.no_triton or args.no_perf_analyzer else ["perf_analyzer"])
    if "perf_analyzer" in tools:
        perf_analyzer()

    def measure(
        server: str, model: str, c: int, duration: float, rep: int, protocol: str = "http", tool: str = "loadgen"
    ) -> dict[str, Any]:
        port = procs[server][1]["http" if protocol == "http" else "grpc"]
        try:
            r = (
                load(port, protocol, model, c, duration, w)
                if tool == "loadgen"
                else perf_level(port, protocol, model, c, duration)
            )
            if procs[server][0].poll() is not None:
                raise RuntimeError("the server died during the level")
        except (RuntimeError, subprocess.CalledProcessError):
            if procs[server][0].poll() is None:
                raise
            # The server crashed under this load (Triton 2.51's Python backend has, under 32 streams): the level
            # is recorded as such and the server started again for the levels after it.
            print(f"{server} died at {tool} {protocol} {model} c={c} (exit {procs[server][0].returncode}); restarting",
                  flush=True)  # fmt: skip
            r = {"throughput": 0.0, "p50_ms": math.nan, "p99_ms": math.nan, "errors": {"server-crashed": 1}}
            procs[server] = (start_triton if server == "triton" else start_deskpod)(repos[server], SERVED[server])
        r.update(server=server, model=model, concurrency=c, repeat=rep, protocol=protocol, tool=tool)
        rows.append(r)
        print(
            f"{server:8} {tool:13} {protocol:4} {model:12} c={c:<4} {r['throughput']:8.1f} req/s  "
            f"p50 {r['p50_ms']:8.2f}  p99 {r['p99_ms']:8.2f} ms  errors {r['errors']}",
            flush=True,
        )
        return r

    try:
        # Both servers stay up (an idle server costs next to nothing); levels alternate between them and repeat,
        # so drift in the machine's background load hits both alike.
        procs["deskpod"] = start_deskpod(repos["deskpod"], SERVED["deskpod"])
        if "triton" in servers:
            procs["triton"] = start_triton(repos["triton"], SERVED["triton"])
        for rep in range(args.repeats):
            for model in ("mlp", "resnet18"):
                dur = d if model == "mlp" else d * 1.5
                for c in (1, 32):
                    for protocol in protocols:
                        for tool in tools:
                            for server in servers if rep % 2 == 0 else servers[::-1]:
                                measure(server, model, c, dur, rep, protocol, tool)
                measure("deskpod", f"{model}_b1", 32, dur, rep)
        pid = procs["deskpod"][0].pid
        before = rss_mb(pid)
        r = measure("deskpod", "mlp", 1000, 3.0, 0)
        r.update(rss_before_mb=before, rss_after_mb=rss_mb(pid))
        print(f"deskpod RSS {before:.0f} -> {r['rss_after_mb']:.0f} MB around 1000 connections", flush=True)
    finally:
        for proc, _ in procs.values():
            stop(proc)

    summary = summarize(rows, direct)
    print(markdown(summary))
    print(json.dumps({"summary": summary, "rows": rows}, indent=1))
    if args.out:
        args.out.write_text(json.dumps({"summary": summary, "rows": rows}, indent=1))
    shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
