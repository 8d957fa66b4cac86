"""What an image request costs the server: a 224×224 JPEG into ResNet-18 against the same request as a ready tensor.

    .venv/bin/python benchmarks/bench_serve_image.py --requests 200 --out /tmp/serve_image.json

One run folder (ResNet-18, random init, 1000 classes, trained as ``imagefolder`` at 224: its evaluation transform
is resize 256, centre crop 224) is exported twice into one repository: ``resnet_image`` with ``--image-input``
(a BYTES input; the server decodes, resizes, crops and scales) and ``resnet_tensor`` (FP32 [3, 224, 224]), both
ONNX, max batch 32, queue delay 0, 1 instance, 2 intra-op threads. One ``deskpod serve`` process serves both.
Before anything is timed, the image request's logits are checked against the tensor request made of
`deskpod.serve.images.decode_image` of the same JPEG (they must agree: same preprocessing, same graph).

Measured in the same run, ``--repeats`` times (the medians of the repeats are the figures):
  * decode + preprocess itself: the median of `decode_images` on the JPEG in this process (PIL decode, resize,
    crop, scale to FP32), which is the work the server adds to an image request — wall time, and the thread's
    CPU time (which other processes on the shared cores disturb far less);
  * the server's own time per request (its statistics: success time minus the graph's compute time, a mean),
    image against tensor: the difference is what decoding adds inside the server, the thread hop included;
  * round trip at concurrency 1 (one keep-alive connection, requests alternating image/tensor so drift hits both
    alike): the medians, and their difference — this includes sending 602 KB of tensor against a few KB of JPEG.
Prints a table and JSON; writes the JSON to --out when given.
"""

from __future__ import annotations

import argparse
import http.client
import io
import json
import re
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
THREADS = 2


def jpeg_224(seed: int = 0) -> bytes:
    """A 224×224 JPEG (quality 90) of a smooth random picture: photo-like detail for the codec."""
    from PIL import Image

    rng = np.random.default_rng(seed)
    base = Image.fromarray(rng.integers(0, 256, (14, 14, 3), dtype=np.uint8)).resize(
        (224, 224), Image.Resampling.BICUBIC
    )
    noise = rng.normal(0, 12, (224, 224, 3))
    im = Image.fromarray(np.clip(np.asarray(base, dtype=np.float64) + noise, 0, 255).astype(np.uint8))
    buf = io.BytesIO()
    im.save(buf, format="JPEG", quality=90)
    return buf.getvalue()


def build_repo(tmp: Path) -> Path:
    import torch

    from deskpod.serve.export import ExportOptions, export_run
    from deskpod.train import checkpoint as ckpt
    from deskpod.train.data import IMAGENET_MEAN, IMAGENET_STD
    from deskpod.train.models import ModelSpec, build_model

    torch.manual_seed(0)
    model = build_model("resnet18", ModelSpec(1000, 3, (224, 224)))
    run = tmp / "runs" / "resnet18"
    state = {
        "format": ckpt.FORMAT,
        "model": model.state_dict(),
        "model_name": "resnet18",
        "step": 1,
        "data_spec": {"input_shape": [3, 224, 224], "num_classes": 1000,
                      "class_names": [f"class{i}" for i in range(1000)],
                      "mean": list(IMAGENET_MEAN), "std": list(IMAGENET_STD)},
    }  # fmt: skip
    ckpt.save_atomic(state, ckpt.path_for(run, 1))
    (run / "config.toml").write_text('data = "imagefolder:/data/images"\nmodel = "resnet18"\nimage_size = 224\n')
    repo = tmp / "models"
    tensor = ExportOptions(repo=repo, name="resnet_tensor", max_batch_size=32, max_queue_delay_us=0, threads=THREADS)
    export_run(run, tensor)
    export_run(run, replace(tensor, name="resnet_image", image_input=True))
    return repo


def start_server(repo: Path) -> tuple[subprocess.Popen[str], int]:
    code = (
        "import asyncio, sys; from pathlib import Path; from deskpod.serve.server import ServeConfig, serve; "
        "asyncio.run(serve(ServeConfig(repo=Path(sys.argv[1]), port=0)))"
    )
    proc = subprocess.Popen([sys.executable, "-c", code, str(repo)], stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, cwd=ROOT)  # fmt: skip
    port = 0
    assert proc.stdout is not None
    for line in proc.stdout:
        m = re.search(r"listening on http://127.0.0.1:(\d+)", line)
        port = int(m.group(1)) if m else port
        if "deskpod serve: ready" in line:
            return proc, port
    raise SystemExit(f"server did not start (exit {proc.poll()})")


def request(conn: http.client.HTTPConnection, model: str, inputs: dict[str, np.ndarray]) -> tuple[float, Any]:
    """One binary v2 request; its round trip in seconds and the logits."""
    from deskpod.serve.protocol import decode_response, encode_request

    body, hl = encode_request(inputs, outputs=["logits"])
    t0 = time.perf_counter()
    conn.request("POST", f"/v2/models/{model}/infer", body, {"Inference-Header-Content-Length": str(hl)})
    r = conn.getresponse()
    data = r.read()
    dt = time.perf_counter() - t0
    if r.status != 200:
        raise SystemExit(f"{model}: HTTP {r.status}: {data[:300]!r}")
    rhl = r.getheader("Inference-Header-Content-Length")
    return dt, decode_response(data, int(rhl) if rhl else None)["logits"]


def server_stats(conn: http.client.HTTPConnection, model: str) -> dict[str, Any]:
    conn.request("GET", f"/v2/models/{model}/stats")
    doc = json.loads(conn.getresponse().read())
    return doc["model_stats"][0]["inference_stats"]  # type: ignore[no-any-return]


def per_request_ms(before: dict[str, Any], after: dict[str, Any]) -> dict[str, float]:
    n = int(after["success"]["count"] - before["success"]["count"])

    def ms(key: str) -> float:
        return float(after[key]["ns"] - before[key]["ns"]) / n / 1e6

    return {"success": ms("success"), "compute_infer": ms("compute_infer"), "own": ms("success") - ms("compute_infer")}


def time_decode(images: np.ndarray, pre: Any, n: int) -> dict[str, float]:
    """Median wall and thread-CPU milliseconds of `decode_images` over ``n`` calls (after 20 untimed), and, call
    by call alternating with it, of the reference: the run's own evaluation transform in torchvision (PIL decode,
    ``Resize(256)``, ``CenterCrop(224)``, ``ToTensor``), which gives the same numbers (checked here)."""
    from PIL import Image
    from torchvision import transforms

    from deskpod.serve.images import decode_images

    reference = transforms.Compose(
        [transforms.Resize(pre.resize), transforms.CenterCrop(pre.height), transforms.ToTensor()]
    )

    def torchvision_decode(images: np.ndarray, _: Any = None) -> np.ndarray:
        return np.stack([reference(Image.open(io.BytesIO(b)).convert("RGB")).numpy() for b in images])

    ours, theirs = decode_images(images, pre), torchvision_decode(images, pre)
    if not np.array_equal(np.rint(ours * 255), np.rint(theirs * 255)):  # the same 8-bit pixels (x/255 vs x*(1/255))
        raise SystemExit("WRONG: decode_images gives other pixels than torchvision's transform")
    for _ in range(20):
        decode_images(images, pre)
        torchvision_decode(images, pre)
    times: dict[str, list[float]] = {"wall": [], "cpu": [], "ref_wall": [], "ref_cpu": []}
    for _ in range(n):
        for fn, key in ((decode_images, ""), (torchvision_decode, "ref_")):
            c0, t0 = time.thread_time(), time.perf_counter()
            fn(images, pre)
            times[key + "wall"].append(time.perf_counter() - t0)
            times[key + "cpu"].append(time.thread_time() - c0)
    return {k: statistics.median(v) * 1000 for k, v in times.items()}


def time_requests(conn: http.client.HTTPConnection, inputs: dict[str, dict[str, np.ndarray]], n: int) -> dict[str, Any]:
    """``n`` requests of each model, alternating; round-trip medians and the server's own time per request."""
    s0 = {m: server_stats(conn, m) for m in inputs}
    rtt: dict[str, list[float]] = {m: [] for m in inputs}
    models = list(inputs)
    for i in range(len(models) * n):
        m = models[i % len(models)]
        rtt[m].append(request(conn, m, inputs[m])[0])
    s1 = {m: server_stats(conn, m) for m in inputs}
    return {"p50_ms": {m: statistics.median(v) * 1000 for m, v in rtt.items()},
            "server": {m: per_request_ms(s0[m], s1[m]) for m in inputs}}  # fmt: skip


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--requests", type=int, default=200, help="timed requests of each kind per repeat (default 200)")
    ap.add_argument("--repeats", type=int, default=3, help="repeats of the timed part (default 3)")
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args()

    from deskpod.serve.images import decode_image, preprocess_of
    from deskpod.serve.repository import read_config

    jpeg = jpeg_224()
    rows: list[dict[str, float]] = []
    with tempfile.TemporaryDirectory(prefix="bench-serve-image-") as tmp:
        repo = build_repo(Path(tmp))
        pre = preprocess_of(read_config(repo / "resnet_image"))
        assert pre is not None and (pre.resize, pre.height) == (256, 224)
        inputs = {
            "resnet_image": {"image": np.array([jpeg], dtype=object)},
            "resnet_tensor": {"input": decode_image(jpeg, pre)[None]},
        }
        proc, port = start_server(repo)
        try:
            conn = http.client.HTTPConnection("127.0.0.1", port)
            _, got = request(conn, "resnet_image", inputs["resnet_image"])
            _, want = request(conn, "resnet_tensor", inputs["resnet_tensor"])
            if not np.allclose(got, want, rtol=1e-4, atol=1e-4):
                print(f"WRONG: image and tensor logits differ by {np.abs(got - want).max()}", file=sys.stderr)
                return 1
            time_requests(conn, inputs, 10)  # warm-up, untimed
            for _ in range(args.repeats):
                d = time_decode(inputs["resnet_image"]["image"], pre, args.requests)
                t = time_requests(conn, inputs, args.requests)
                si, st = t["server"]["resnet_image"], t["server"]["resnet_tensor"]
                rows.append({
                    "decode_p50_ms": d["wall"], "decode_cpu_p50_ms": d["cpu"],
                    "torchvision_p50_ms": d["ref_wall"], "torchvision_cpu_p50_ms": d["ref_cpu"],
                    "decode_vs_torchvision": d["cpu"] / d["ref_cpu"],
                    "server_own_image_ms": si["own"], "server_own_tensor_ms": st["own"],
                    "server_added_ms": si["own"] - st["own"], "compute_ms": st["compute_infer"],
                    "rtt_p50_image_ms": t["p50_ms"]["resnet_image"], "rtt_p50_tensor_ms": t["p50_ms"]["resnet_tensor"],
                    "rtt_added_p50_ms": t["p50_ms"]["resnet_image"] - t["p50_ms"]["resnet_tensor"],
                })  # fmt: skip
        finally:
            proc.terminate()
            proc.wait(timeout=30)
            if proc.stdout is not None:
                proc.stdout.close()

    median = {k: statistics.median(r[k] for r in rows) for k in rows[0]}
    result = {
        "jpeg_bytes": len(jpeg),
        "tensor_bytes": int(inputs["resnet_tensor"]["input"].nbytes),
        "requests_each": args.requests,
        "repeats": rows,
        "median": median,
        "checked": "image logits == tensor logits (rtol/atol 1e-4); decode_images == torchvision transform (same 8-bit pixels)",
    }
    print(f"JPEG {len(jpeg)} bytes; tensor {result['tensor_bytes']} bytes; {args.requests} requests of each per repeat")
    labels = {
        "decode_p50_ms": "decode + preprocess in process, p50 ms",
        "decode_cpu_p50_ms": "  the same, thread CPU time, p50 ms",
        "torchvision_p50_ms": "reference: torchvision's transform in process, p50 ms",
        "torchvision_cpu_p50_ms": "  the same, thread CPU time, p50 ms",
        "decode_vs_torchvision": "deskpod / torchvision, thread CPU time",
        "server_own_image_ms": "server own time (success - compute), image, mean ms",
        "server_own_tensor_ms": "server own time (success - compute), tensor, mean ms",
        "server_added_ms": "server own time added by the image, mean ms",
        "compute_ms": "graph compute (tensor model), mean ms",
        "rtt_p50_image_ms": "round trip p50 ms, image",
        "rtt_p50_tensor_ms": "round trip p50 ms, tensor",
        "rtt_added_p50_ms": "round trip p50 added by the image, ms",
    }
    print("| measure | median | per repeat |")
    print("|---|---|---|")
    for k, label in labels.items():
        print(f"| {label} | {median[k]:.2f} | {', '.join(f'{r[k]:.2f}' for r in rows)} |")
    print(json.dumps(result, indent=2))
    if args.out is not None:
        args.out.write_text(json.dumps(result, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
