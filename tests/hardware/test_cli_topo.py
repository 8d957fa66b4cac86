"""`deskpod topo`: text, JSON schema, PNG, and the exit codes of bad input."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

from deskpod.hardware.catalog import machine_names

from .conftest import REFERENCE

Run = Callable[..., tuple[int, str, str]]

TOP_KEYS = {
    "schema", "name", "source", "kind", "device_count", "link_model", "fabric", "devices", "nics",
    "matrix", "links", "nvlink_cliques", "partitions", "placements",
}  # fmt: skip
DEVICE_KEYS = {
    "index",
    "label",
    "model",
    "memory_gb",
    "compute_capability",
    "numa_node",
    "cpu_affinity",
    "nvlinks",
    "nearest_nics",
}


def test_topo_machine_text(run_cli: Run) -> None:
    code, out, err = run_cli("topo", "--machine", "dgx1-v100")
    assert code == 0 and err == ""
    assert out.splitlines()[0].split("\t")[1:4] == ["GPU0", "GPU1", "GPU2"]
    assert "GPU0\t X \tNV1\tNV1\tNV2\tNV2\tSYS" in out
    assert "NVLink cliques: {0,1,2,3} {4,5,6,7}" in out
    assert "GPU0->mlx5_0 (PIX)" in out
    assert "4 GPUs -> 0,1,2,3: ring 25 GB/s per direction; fully NVLink-connected quad" in out


def test_topo_json_schema(run_cli: Run) -> None:
    code, out, _ = run_cli("topo", "--machine", "dgx1-v100", "--json")
    assert code == 0
    info = json.loads(out)
    assert set(info) == TOP_KEYS and info["schema"] == "deskpod.topo/1"
    assert info["kind"] == "cuda" and info["device_count"] == 8 and info["fabric"] is None
    assert info["link_model"]["gpu"] == "V100" and info["link_model"]["nvlink_gbps_per_link"] == 25.0
    assert all(set(d) == DEVICE_KEYS for d in info["devices"])
    assert info["devices"][2]["nearest_nics"] == ["mlx5_1"] and info["devices"][2]["nvlinks"] == 6
    assert len(info["matrix"]) == 8 and all(len(r) == 8 for r in info["matrix"]) and info["matrix"][0][3] == "NV2"
    assert len(info["links"]) == 28
    assert {"a": 0, "b": 3, "kind": "nvlink", "token": "NV2", "links": 2, "bandwidth_gbps": 50.0} in info["links"]
    assert [n["name"] for n in info["nics"]] == ["mlx5_0", "mlx5_2", "mlx5_1", "mlx5_3"]
    assert info["nvlink_cliques"][:2] == [[0, 1, 2, 3], [4, 5, 6, 7]]
    assert info["partitions"]["halves"] == [[0, 1, 2, 3], [4, 5, 6, 7]]
    assert [p["k"] for p in info["placements"]] == [2, 4, 8]
    assert info["placements"][0]["ring_bandwidth_gbps"] == 50.0 and isinstance(info["placements"][0]["reason"], str)
    code, out, _ = run_cli("topo", "--machine", "dgx-a100", "--json")
    a100 = json.loads(out)
    assert a100["fabric"] == {"links_per_gpu": 12, "link_gbps": 25.0, "gpu_bandwidth_gbps": 300.0, "switches": 6}
    assert a100["nvlink_cliques"] == [list(range(8))]


def test_topo_from_file_and_list(run_cli: Run) -> None:
    code, out, _ = run_cli("topo", "--from", str(REFERENCE / "pcie-8gpu-plx.txt"), "--json")
    info = json.loads(out)
    assert code == 0 and info["nvlink_cliques"] == [] and info["source"].startswith("file:")
    code, out, _ = run_cli("topo", "--list")
    lines = out.splitlines()
    assert (
        code == 0
        and len(lines) == len(machine_names())
        and all(any(n in line for line in lines) for n in machine_names())
    )


def test_topo_png_is_a_valid_png(run_cli: Run, tmp_path: Path) -> None:
    from PIL import Image

    for name in ("dgx1-v100", "dgx-a100"):
        png = tmp_path / f"{name}.png"
        code, out, _ = run_cli("topo", "--machine", name, "--png", str(png))
        assert code == 0 and f"link graph written to {png}" in out
        assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
        with Image.open(png) as im:
            im.verify()
        with Image.open(png) as im:
            assert im.format == "PNG" and im.size == (700, 700)


def test_topo_place(run_cli: Run) -> None:
    code, out, _ = run_cli("topo", "--machine", "dgx1", "--place", "2")
    assert code == 0 and out.startswith("0,3: ring 50 GB/s")
    code, out, _ = run_cli("topo", "--machine", "dgx1", "--place", "4", "--free", "0,5,2,7")
    assert code == 1 and "the largest free clique has 2" in out


def _asym(tmp_path: Path) -> Path:
    p = tmp_path / "asym.txt"
    p.write_text("\tGPU0\tGPU1\nGPU0\t X \tNV1\nGPU1\tNV2\t X \n")
    return p


def test_bad_input_exits_2_with_one_line(run_cli: Run, tmp_path: Path) -> None:
    bad_token = tmp_path / "token.txt"
    bad_token.write_text("GPU0\t X \tNVL\nGPU1\tNVL\t X \n")
    short = tmp_path / "short.txt"
    short.write_text("\tGPU0\tGPU1\tGPU2\nGPU0\t X \tPIX\nGPU1\tPIX\t X \tPIX\nGPU2\tPIX\tPIX\t X \n")
    not_matrix = tmp_path / "notes.txt"
    not_matrix.write_text("just some notes\nGPU0 is hot today\n")
    cases = [
        (["topo", "--from", str(_asym(tmp_path))], "asymmetric matrix"),
        (["topo", "--from", str(bad_token)], "unknown link token 'NVL'"),
        (["topo", "--from", str(short)], "row GPU0 has 2 link entries but the matrix has 3 devices"),
        (["topo", "--from", str(not_matrix)], "not an nvidia-smi topo -m matrix"),
        (["topo", "--from", str(tmp_path / "missing.txt")], "cannot read topology file"),
        (["topo", "--machine", "dgx-h10"], "did you mean 'dgx-h100'"),
        (["topo", "--machine", "dgx1", "--place", "0"], "at least 1 device"),
        (["topo", "--machine", "dgx1", "--place", "9"], "needs 9 GPUs; dgx1-v100 has 8"),
        (["topo", "--machine", "dgx1", "--place", "2", "--policy", "nope"], "unknown placement policy"),
        (["topo", "--from", str(REFERENCE / "dgx1-v100.txt"), "--gpu", "K80"], "unknown GPU 'K80'"),
        (["topo", "--machine", "dgx1", "--gpu", "V100"], "--gpu applies to --from FILE only"),
        (["topo", "--machine", "dgx1", "--free", "0,1"], "--free and --policy go with --place K"),
        (["topo", "--machine", "dgx1", "--place", "2", "--free", "0,x"], "not a device list"),
        (["topo", "--machine", "dgx1", "--place", "2", "--free", "0,9"], "free device 9 does not exist"),
        (["topo", "--machine", "dgx1", "--png", str(tmp_path / "no" / "such" / "x.png")], "does not exist"),
    ]
    for args, message in cases:
        code, out, err = run_cli(*args)
        assert code == 2, (args, out, err)
        assert err.startswith("deskpod: ") and message in err and err.count("\n") == 1, (args, err)


def test_the_installed_command_exits_2(tmp_path: Path) -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "deskpod", "topo", "--from", str(_asym(tmp_path))],
        capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert proc.returncode == 2 and "asymmetric matrix" in proc.stderr
