"""Models that take images: `deskpod export --image-input` of a run folder, encoded JPEG/PNG decoded by the server
with the run's own evaluation transform, Triton's classification extension, and bad images answered 400.

The models are exported into the session's running server (`tests.serve.conftest`) and loaded through its
repository API, so no second server starts. The reference is the run's model in torch on the image as
`deskpod.train.data` itself reads it for evaluation (torchvision's Resize + CenterCrop + ToTensor + Normalize).
"""

from __future__ import annotations

import io
import json
import struct
import tomllib
import zlib
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
from PIL import Image

from deskpod.cli import main
from deskpod.serve.images import BadImage, ImagePreprocess, classify, decode_image, for_run
from deskpod.serve.repository import read_config
from tests.serve.conftest import Server, torch

LABELS = tuple(f"kind{i}" for i in range(8))


def encoded(im: Image.Image, fmt: str, **kw: Any) -> bytes:
    buf = io.BytesIO()
    im.save(buf, format=fmt, **kw)
    return buf.getvalue()


def picture(w: int, h: int, seed: int, mode: str = "RGB") -> Image.Image:
    """A smooth random picture (so JPEG keeps it recognisable and a crop changes the answer)."""
    rng = np.random.default_rng(seed)
    small = rng.integers(0, 256, (4, 5, 3), dtype=np.uint8)
    return Image.fromarray(small).resize((w, h), Image.Resampling.BICUBIC).convert(mode)


def make_image_run(run: Path, data: str, channels: int, side: int, seed: int) -> Path:
    """A run folder as training leaves it: a checkpoint of the registry's ``convnet`` and the resolved config."""
    from deskpod.train import checkpoint as ckpt
    from deskpod.train.data import IMAGENET_MEAN, IMAGENET_STD
    from deskpod.train.models import ModelSpec, build_model

    torch.manual_seed(seed)
    model = build_model("convnet", ModelSpec(len(LABELS), channels, (side, side)))
    mean, std = (IMAGENET_MEAN, IMAGENET_STD) if channels == 3 else ((0.3,), (0.4,))
    state = {
        "format": ckpt.FORMAT,
        "model": model.state_dict(),
        "model_name": "convnet",
        "step": 3,
        "data_spec": {"input_shape": [channels, side, side], "num_classes": len(LABELS), "class_names": list(LABELS),
                      "mean": list(mean), "std": list(std)},
    }  # fmt: skip
    ckpt.save_atomic(state, ckpt.path_for(run, 3))
    (run / "config.toml").write_text(f'data = "{data}"\nmodel = "convnet"\n')
    return run


def top5_in_torch(run: Path, files: list[Path]) -> tuple[np.ndarray, list[list[int]]]:
    """Logits and top-5 class indices of the run's model on image files, read as the run's evaluation reads them."""
    from deskpod.train.checkpoint import load_model
    from deskpod.train.data import FolderSource

    m = load_model(run)
    source = FolderSource([(str(f), 0) for f in files], False, m.input_shape[1], 0, False)
    x = torch.stack([source.dataset[i][0] for i in range(len(files))])  # type: ignore[index]
    with torch.no_grad():
        logits = m.model(x).numpy()
    return logits, [list(np.argsort(-row, kind="stable")[:5]) for row in logits]


@pytest.fixture(scope="module")
def image_models(server: Server, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Two image models in the running server: ``photo`` (RGB 28×28, imagefolder: resize 32, crop) and ``gray``
    (1×28×28 from a tensor dataset: plain resize, TorchScript). 28: the convnet's pooling exports to ONNX."""
    runs = tmp_path_factory.mktemp("image-runs")
    photo = make_image_run(runs / "photo", "imagefolder:/data/photos", 3, 28, seed=1)
    gray = make_image_run(runs / "gray", "synthetic:1x28x28", 1, 28, seed=2)
    repo = str(server.repo)
    assert main(["export", str(photo), "--repo", repo, "--image-input", "--max-batch-size", "4"]) == 0
    assert main(["export", str(gray), "--repo", repo, "--image-input", "--format", "torch"]) == 0
    with httpx.Client(base_url=f"http://{server.url}", trust_env=False, timeout=60) as c:
        for name in ("photo", "gray"):
            r = c.post(f"/v2/repository/models/{name}/load")
            assert r.status_code == 200, r.text
    return {"photo": photo, "gray": gray}


def infer_images(server: Server, model: str, images: list[bytes], k: int | None = 5) -> Any:
    import tritonclient.http as tc

    client = tc.InferenceServerClient(server.url)
    inp = tc.InferInput("image", [len(images)], "BYTES")
    inp.set_data_from_numpy(np.array(images, dtype=object))
    out = tc.InferRequestedOutput("logits", class_count=k or 0)
    return client.infer(model, [inp], outputs=[out])


def test_export_records_the_runs_transform(image_models: dict[str, Path], server: Server) -> None:
    photo, gray = read_config(server.repo / "photo"), read_config(server.repo / "gray")
    assert [(t.name, t.datatype, t.dims) for t in photo.inputs] == [("image", "BYTES", ())]
    assert photo.preprocess == {"input": "image", "tensor": "input", "channels": 3, "height": 28, "width": 28,
                                "resize": 32, "max_pixels": 25_000_000}  # fmt: skip
    assert gray.preprocess is not None and gray.preprocess["resize"] == 0 and gray.preprocess["channels"] == 1
    doc = tomllib.loads((server.repo / "photo" / "config.toml").read_text())
    assert doc["preprocess"]["resize"] == 32
    meta = httpx.get(f"http://{server.url}/v2/models/photo", trust_env=False).json()
    assert meta["inputs"] == [{"name": "image", "datatype": "BYTES", "shape": [-1]}]
    assert meta["parameters"]["preprocess"]["height"] == 28 and meta["parameters"]["labels"] == list(LABELS)


def test_image_request_gives_the_torch_top5(image_models: dict[str, Path], server: Server, tmp_path: Path) -> None:
    """A JPEG (non-square: the resize and crop matter) and a grayscale PNG in one request -> torch's logits and top-5."""
    files = [tmp_path / "a.jpg", tmp_path / "b.png"]
    picture(61, 47, seed=3).save(files[0], quality=90)
    picture(40, 90, seed=4, mode="L").save(files[1])
    want_logits, want_top = top5_in_torch(image_models["photo"], files)
    data = [f.read_bytes() for f in files]
    logits = infer_images(server, "photo", data, k=None).as_numpy("logits")
    np.testing.assert_allclose(logits, want_logits, rtol=1e-4, atol=1e-4)
    got = infer_images(server, "photo", data, k=5).as_numpy("logits")
    assert got.shape == (2, 5)
    for row, top, ref in zip(got, want_top, want_logits, strict=True):
        fields = [x.decode().split(":") for x in row]
        assert [int(f[1]) for f in fields] == top
        assert [f[2] for f in fields] == [LABELS[i] for i in top]
        np.testing.assert_allclose([float(f[0]) for f in fields], ref[top], atol=1e-4)


def test_plain_curl_image_body(image_models: dict[str, Path], server: Server) -> None:
    """``curl --data-binary @x.png -H 'Content-Type: image/png'``: the body is the image; the top-5 come back."""
    im = picture(28, 28, seed=5, mode="L")
    body = encoded(im, "PNG")
    r = httpx.post(f"http://{server.url}/v2/models/gray/infer", content=body,
                   headers={"Content-Type": "image/png"}, trust_env=False)  # fmt: skip
    assert r.status_code == 200, r.text
    out = r.json()["outputs"][0]
    assert out["datatype"] == "BYTES" and out["shape"] == [1, 5]
    from deskpod.train.checkpoint import load_model

    m = load_model(image_models["gray"])
    x = (torch.from_numpy(np.asarray(im, dtype=np.float32) / 255).view(1, 1, 28, 28) - 0.3) / 0.4
    with torch.no_grad():
        ref = m.model(x).numpy()[0]
    assert [int(s.split(":")[1]) for s in out["data"]] == list(np.argsort(-ref, kind="stable")[:5])


def test_image_body_to_a_tensor_model_is_refused(server: Server) -> None:
    r = httpx.post(f"http://{server.url}/v2/models/mlp/infer", content=encoded(picture(8, 8, 0), "PNG"),
                   headers={"Content-Type": "image/png"}, trust_env=False)  # fmt: skip
    assert r.status_code == 400 and "takes tensors, not an image body" in r.json()["error"]


def test_decoder_refuses_beyond_its_bound() -> None:
    """Requests waiting for the decoder threads are bounded: one more is refused at once (HTTP 503)."""
    import asyncio

    from deskpod.serve.batcher import Overloaded
    from deskpod.serve.images import Decoder

    pre = for_run(1, 8, 8, "synthetic:1x8x8")
    images = {"image": np.array([encoded(picture(8, 8, 0, "L"), "PNG")], dtype=object)}

    async def go() -> np.ndarray:
        d = Decoder(1, max_pending=1)
        first = d.decode(images, pre)
        with pytest.raises(Overloaded, match="1 requests waiting"):
            d.decode(images, pre)
        await first
        again = await d.decode(images, pre)  # the first one done: room again
        d.executor.shutdown()
        return again["input"]

    assert asyncio.run(go()).shape == (1, 1, 8, 8)


def test_transparency_and_mode_are_converted_as_trained() -> None:
    """RGBA into a grayscale model: over black, then L; grayscale into an RGB model: PIL's convert("RGB")."""
    rgba = Image.new("RGBA", (16, 16), (255, 255, 255, 255))
    rgba.paste((255, 255, 255, 0), (0, 0, 8, 16))  # the left half transparent
    x = decode_image(encoded(rgba, "PNG"), for_run(1, 16, 16, "fashion-mnist"))
    assert x.shape == (1, 16, 16) and x[0, :, :8].max() == 0.0 and x[0, :, 8:].min() == 1.0
    gray = Image.new("L", (40, 40), 51)
    x3 = decode_image(encoded(gray, "PNG"), for_run(3, 32, 32, "imagefolder:x"))
    assert x3.shape == (3, 32, 32)
    np.testing.assert_allclose(x3, 0.2, atol=1e-6)


@pytest.mark.parametrize(
    ("size", "resampled"),
    [
        ((224, 224), (224, 224)),  # only the cropped box, both axes
        ((300, 200), (224, 224)),
        ((199, 311), (224, 400)),  # the box across, the whole height (its scale is not exact in floats)
        ((640, 480), (341, 224)),  # the whole width, the box down
        ((64, 500), (224, 2000)),
        ((261, 710), (256, 696)),  # the box would change Pillow's pass order, so the whole image
        ((256, 256), (256, 256)),  # nothing to resample: the crop alone
    ],
)
def test_resize_and_crop_give_torchvisions_own_pixels(size: tuple[int, int], resampled: tuple[int, int]) -> None:
    """Where Pillow computes the same filter, the server resamples only what the centre crop keeps; either way the
    pixels must be exactly those of the run's own transform."""
    from torchvision import transforms

    from deskpod.serve.images import _crop_box

    w, h = size
    short, long = min(size), max(size)
    new = (256, int(256 * long / short)) if w <= h else (int(256 * long / short), 256)
    corner = (round((new[0] - 224) / 2.0), round((new[1] - 224) / 2.0))
    assert _crop_box(size, new, corner, (224, 224))[1] == resampled
    rng = np.random.default_rng(sum(size))
    im = Image.fromarray((rng.random((h, w, 3)) * 255).astype(np.uint8))
    want = transforms.Compose([transforms.Resize(256), transforms.CenterCrop(224), transforms.ToTensor()])(im)
    got = decode_image(encoded(im, "PNG"), for_run(3, 224, 224, "imagefolder:x"))
    np.testing.assert_array_equal(np.rint(got * 255), np.rint(want.numpy() * 255))


def huge_png_header(w: int, h: int) -> bytes:
    """A PNG that claims a w×h canvas: a valid signature and IHDR, then one empty IDAT (no pixels to decode)."""

    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))

    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", w, h, 8, 0, 0, 0, 0)) + chunk(b"IEND", b"")


@pytest.mark.parametrize(
    ("data", "problem"),
    [
        (b"GIF? no: plain text, not an image", "is not an image"),
        (b"", "is empty"),
        ("truncated", "damaged or truncated"),
        (huge_png_header(6000, 5000), "6000×5000 = 30,000,000 pixels; the limit is 25,000,000"),
    ],
)
def test_bad_images_are_400_naming_the_problem(
    image_models: dict[str, Path], server: Server, data: bytes | str, problem: str
) -> None:
    from deskpod.serve.protocol import encode_request

    good = encoded(picture(40, 40, seed=6), "JPEG")
    if data == "truncated":
        data = good[: len(good) // 2]
    assert isinstance(data, bytes)
    body, hl = encode_request({"image": np.array([good, data], dtype=object)}, outputs=["logits"])
    r = httpx.post(f"http://{server.url}/v2/models/photo/infer", content=body,
                   headers={"Inference-Header-Content-Length": str(hl)}, trust_env=False)  # fmt: skip
    assert r.status_code == 400, r.text
    assert problem in r.json()["error"] and "'image' row 1" in r.json()["error"]
    assert infer_images(server, "photo", [good]).as_numpy("logits").shape == (1, 5)  # still serving


def test_classification_extension_on_a_tensor_model(server: Server) -> None:
    """The format Triton gives: ``score:index:label``, six decimals, best first, k capped at the classes."""
    import tritonclient.http as tc

    client = tc.InferenceServerClient(server.url)
    assert "classification" in client.get_server_metadata()["extensions"]
    x = np.random.default_rng(7).random((3, 2, 4, 4), dtype=np.float32)
    inp = tc.InferInput("input", list(x.shape), "FP32")
    inp.set_data_from_numpy(x)
    raw = client.infer("mlp", [inp]).as_numpy("logits")
    got = client.infer("mlp", [inp], outputs=[tc.InferRequestedOutput("logits", class_count=2)]).as_numpy("logits")
    assert got.shape == (3, 2)
    for row, ref in zip(got, raw, strict=True):
        order = np.argsort(-ref)[:2]
        assert [s.decode() for s in row] == [f"{ref[i]:f}:{i}:{'abc'[i]}" for i in order]
    capped = client.infer("mlp", [inp], outputs=[tc.InferRequestedOutput("logits", class_count=9)])
    assert capped.as_numpy("logits").shape == (3, 3)
    body = json.dumps({"inputs": [{"name": "input", "shape": [1, 2, 4, 4], "datatype": "FP32", "data": [0.0] * 32}],
                       "outputs": [{"name": "logits", "parameters": {"classification": -1}}]})  # fmt: skip
    r = httpx.post(f"http://{server.url}/v2/models/mlp/infer", content=body, trust_env=False)
    assert r.status_code == 400 and "classification must be a positive integer, got -1" in r.json()["error"]


def test_classify_without_labels_and_checks() -> None:
    out = classify({"y": np.array([[0.5, 2.0, -1.0]], dtype=np.float32)}, "y", (), 2)
    assert out.tolist() == [[b"2.000000:1", b"0.500000:0"]]
    with pytest.raises(BadImage.__mro__[1], match="outputs"):  # ProtocolError: HTTP 400
        classify({"y": np.zeros((1, 3))}, "z", (), 1)


def test_preprocess_table_is_validated() -> None:
    from deskpod.errors import ConfigError

    with pytest.raises(ConfigError, match="channels = 2"):
        ImagePreprocess(channels=2, height=8, width=8)
    with pytest.raises(ConfigError, match="resize = 20 is smaller than the crop 32×32"):
        ImagePreprocess(channels=3, height=32, width=32, resize=20)
    with pytest.raises(ConfigError, match="unknown keys \\['mean'\\]"):
        ImagePreprocess.from_dict({"channels": 3, "height": 8, "width": 8, "mean": [0.5]})


def test_dashboard_try_it_sends_the_file_as_it_is(
    image_models: dict[str, Path], server: Server, tmp_path: Path
) -> None:
    """The Models page's "try it" on an image model: the upload goes as it is; the top-5 is torch's."""
    import asyncio

    from deskpod.web import models

    url = f"http://{server.url}"
    meta = httpx.get(f"{url}/v2/models/photo", trust_env=False).json()
    assert models.image_input(meta) == "image"
    assert models.image_input({"inputs": [{"name": "input", "datatype": "FP32", "shape": [-1, 3, 28, 28]}]}) is None
    f = tmp_path / "c.jpg"
    picture(50, 70, seed=8).save(f)
    raw = f.read_bytes()
    got = models._prepare_upload(raw, "c.jpg", 0, 0, 0, meta)
    assert got.x.dtype == object and got.x.tolist() == [raw] and got.shape == [3, 28, 28]
    assert got.seen is not None and got.seen.startswith("data:image/png;base64,")
    result = asyncio.run(models.infer(url, "photo", meta, got.x, "image"))
    _, want_top = top5_in_torch(image_models["photo"], [f])
    assert [t["index"] for t in result["top"]] == want_top[0]
    assert [t["label"] for t in result["top"]] == [LABELS[i] for i in want_top[0]]
