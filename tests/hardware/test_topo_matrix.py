"""Parsing `nvidia-smi topo -m` text: the two real outputs, other shapes, and every bad input."""

from __future__ import annotations

from pathlib import Path

import pytest

from deskpod.errors import UsageError
from deskpod.hardware.topo_matrix import format_topo_matrix, matrix_to_topology, parse_topo_matrix, read_topo_matrix

from .conftest import DATA, REFERENCE


def test_dgx1_v100_links_counts_and_nic_affinity() -> None:
    m = read_topo_matrix(REFERENCE / "dgx1-v100.txt")
    assert m.gpus == tuple(f"GPU{i}" for i in range(8))
    assert m.nics == ("mlx5_0", "mlx5_2", "mlx5_1", "mlx5_3")  # nvidia-smi's column order, kept
    t = matrix_to_topology(m, "dgx1")
    assert t.link_model is not None and t.link_model.gpu == "V100"
    assert t.fabric is None
    # The hybrid cube-mesh: each quad fully connected, GPU i linked to GPU i+4, 6 links per V100.
    assert [t.nvlink_degree(i) for i in range(8)] == [6] * 8
    assert t.link(0, 3).token == "NV2" and t.link(0, 3).links == 2 and t.link_bandwidth(0, 3) == 50.0
    assert t.link(0, 1).token == "NV1" and t.link_bandwidth(0, 1) == 25.0
    assert t.link(0, 4).token == "NV2" and t.link(2, 6).token == "NV1"
    assert t.link(0, 5).kind == "pcie" and t.link(0, 5).token == "SYS" and t.link_bandwidth(0, 5) == 15.7
    nearest = [t.nearest_nics(i) for i in range(8)]
    assert nearest == [("mlx5_0",)] * 2 + [("mlx5_1",)] * 2 + [("mlx5_2",)] * 2 + [("mlx5_3",)] * 2
    assert t.devices[0].cpu_affinity == "0-19,40-59" and t.devices[7].cpu_affinity == "20-39,60-79"
    assert m.has_legend and not m.old_names


def test_pcie_plx_server_with_truncated_legend() -> None:
    m = read_topo_matrix(REFERENCE / "pcie-8gpu-plx.txt")
    t = matrix_to_topology(m, "plx")
    assert not t.has_nvlink and t.fabric is None
    assert (t.link(0, 1).token, t.link(2, 3).token, t.link(0, 2).token, t.link(0, 4).token) == (
        "PIX",
        "PIX",
        "PXB",
        "SYS",
    )
    assert m.nics == ("mlx5_0",)
    assert t.nearest_nics(4) == ("mlx5_0",) and t.nics[0].paths[4] == "PHB" and t.nics[0].paths[0] == "SYS"
    assert [d.cpu_affinity for d in t.devices] == ["0-13"] * 4 + ["14-27"] * 4


@pytest.mark.parametrize("name", ["dgx1-v100.txt", "pcie-8gpu-plx.txt", "dgx-a100.txt", "dgx1-p100.txt", "dgx-2.txt"])
def test_printed_matrix_parses_back_to_the_same(name: str) -> None:
    m = read_topo_matrix(REFERENCE / name)
    t = matrix_to_topology(m, name)
    again = parse_topo_matrix(format_topo_matrix(t))
    assert again.cells == m.cells and again.nics == m.nics and again.cpu_affinity == m.cpu_affinity


def test_old_soc_legend_is_sys() -> None:
    m = read_topo_matrix(DATA / "old-soc-4gpu-pcie.txt")
    assert m.old_names
    t = matrix_to_topology(m, "old")
    assert t.link(0, 2).token == "SYS" and t.link(0, 1).token == "PHB"
    assert t.nics == ()  # no NIC rows
    assert [p for p, _ in t.all_partitions()] == ["halves", "numa"]
    assert t.partition("numa") == ((0, 1), (2, 3))


def test_mangled_header_with_escape_codes_spaces_and_direct_nv4() -> None:
    m = read_topo_matrix(DATA / "hgx-a100-4gpu-mangled.txt")
    t = matrix_to_topology(m, "hgx4")
    # 3 peers x NV4 = 12 links per GPU: wired pair by pair (A100 has 12), not a switch fabric.
    assert t.fabric is None and t.link(0, 1).kind == "nvlink" and t.nvlink_degree(0) == 12
    assert t.link_model is not None and t.link_model.gpu == "A100" and t.link_bandwidth(0, 1) == 100.0
    assert m.nics == ("mlx5_0",)  # NIC0 resolved through the NIC legend
    assert t.nearest_nics(1) == ("mlx5_0",)
    assert [d.numa_node for d in t.devices] == [0, 0, 1, 1]


def test_no_header_row_and_gpu_numa_id_column() -> None:
    m = read_topo_matrix(DATA / "no-header-2gpu-nic-legend.txt")
    t = matrix_to_topology(m, "pair", gpu="A100")
    assert m.nics == ("mlx5_0", "mlx5_1")
    assert t.link(0, 1).kind == "nvlink" and t.link(0, 1).links == 12
    assert t.nearest_nics(0) == ("mlx5_0",) and t.nearest_nics(1) == ("mlx5_1",)
    assert t.devices[1].cpu_affinity == "48-95" and t.devices[1].numa_node == 1


def test_nvswitch_matrices_are_fabric_counts_never_summed() -> None:
    a100 = matrix_to_topology(read_topo_matrix(REFERENCE / "dgx-a100.txt"), "a100")
    assert a100.fabric is not None and a100.fabric.links_per_gpu == 12
    assert a100.link(0, 7).kind == "nvswitch" and a100.link_bandwidth(0, 7) == 300.0  # 12 x 25, not 7 x 12 x 25
    assert a100.nvlink_degree(0) == 12
    assert a100.nics[0].name == "mlx5_0" and a100.nearest_nics(0) == ("mlx5_0", "mlx5_1")
    assert a100.devices[0].numa_node == 3 and a100.devices[0].cpu_affinity == "48-63,176-191"
    h100 = matrix_to_topology(read_topo_matrix(REFERENCE / "dgx-h100.txt"), "h100")
    assert h100.link_model is not None and h100.link_model.gpu == "H100" and h100.link_bandwidth(2, 5) == 450.0
    dgx2 = matrix_to_topology(read_topo_matrix(REFERENCE / "dgx-2.txt"), "dgx2")
    assert dgx2.device_count == 16 and dgx2.link_bandwidth(0, 15) == 150.0 and dgx2.fabric is not None


def _bad(text: str) -> str:
    with pytest.raises(UsageError) as e:
        parse_topo_matrix(text, source="t.txt")
    return str(e.value)


def test_not_a_matrix() -> None:
    assert "not an nvidia-smi topo -m matrix" in _bad("root:x:0:0:root:/root:/bin/bash\n")
    assert "not an nvidia-smi topo -m matrix" in _bad("")
    assert "not an nvidia-smi topo -m matrix" in _bad("\tGPU0\tGPU1\tCPU Affinity\n")


def test_unknown_token_names_line_row_and_column() -> None:
    msg = _bad("\tGPU0\tGPU1\nGPU0\t X \tNVX\nGPU1\tNV1\t X \n")
    assert "line 2" in msg and "'NVX'" in msg and "row GPU0, column GPU1" in msg and "valid:" in msg
    assert "'NV0'" in _bad("GPU0\t X \tNV0\nGPU1\tNV0\t X \n")


def test_asymmetric_matrix() -> None:
    msg = _bad("\tGPU0\tGPU1\tGPU2\nGPU0\t X \tNV1\tNV2\nGPU1\tNV1\t X \tSYS\nGPU2\tNV1\tSYS\t X \n")
    assert "asymmetric" in msg and "GPU0->GPU2 is NV2 (line 2)" in msg and "GPU2->GPU0 is NV1 (line 4)" in msg


def test_malformed_rows() -> None:
    msg = _bad(
        "\tGPU0\tGPU1\tGPU2\tCPU Affinity\nGPU0\t X \tNV1\t0-7\nGPU1\tNV1\t X \tNV1\t0-7\nGPU2\tNV1\tNV1\t X \t0-7\n"
    )
    assert "line 2: row GPU0 has 2 link entries but the matrix has 3 devices" in msg
    assert "X marks a device with itself" in _bad("GPU0\tNV1\t X \nGPU1\t X \tNV1\n")
    assert "repeated" in _bad("GPU0\t X \tPIX\nGPU0\tPIX\t X \n")
    assert "in order" in _bad("GPU1\t X \tPIX\nGPU0\tPIX\t X \n")
    assert "NICs attach over PCIe only" in _bad("GPU0\t X \tNV1\nmlx5_0\tNV1\t X \n")


def test_unreadable_file(tmp_path: Path) -> None:
    with pytest.raises(UsageError, match="cannot read topology file"):
        read_topo_matrix(tmp_path / "missing.txt")


def test_single_gpu_box_with_crlf_line_ends() -> None:
    text = "\tGPU0\tCPU Affinity\tNUMA Affinity\tGPU NUMA ID\r\nGPU0\t X \t0-71\t1\t\t4\r\n\r\nLegend:\r\n\r\n  X    = Self\r\n"
    t = matrix_to_topology(parse_topo_matrix(text), "one")
    assert t.device_count == 1 and t.devices[0].cpu_affinity == "0-71" and t.devices[0].numa_node == 1


def test_pcie_box_all_sys_with_blank_columns() -> None:
    rows = ["\tGPU0\tGPU1\tGPU2\tGPU3\tNIC0\tCPU Affinity\tNUMA Affinity\tGPU NUMA ID"]
    for i in range(4):
        cells = ["X" if i == j else "SYS" for j in range(4)] + ["PHB" if i == 3 else "SYS"]
        cpus = "0-55,112-167\t0" if i < 2 else "56-111,168-223\t1"
        rows.append(f"GPU{i}\t" + "\t".join(f" {c} " if c == "X" else c for c in cells) + f"\t{cpus}\t\tN/A")
    rows.append("NIC0\tSYS\tSYS\tSYS\tPHB\t X ")
    t = matrix_to_topology(parse_topo_matrix("\n".join(rows) + "\n"), "sys4")
    assert all(t.link(a, b).token == "SYS" for a in range(4) for b in range(4) if a != b)
    assert t.nearest_nics(3) == ("NIC0",) and t.partition("numa") == ((0, 1), (2, 3))


def _cut(name: str, keep_rows: int) -> str:
    """The file's text with only its first ``keep_rows`` device rows after the header (what a terminal cut shows)."""
    lines = (REFERENCE / name).read_text().splitlines()
    header = next(i for i, ln in enumerate(lines) if ln.startswith("\tGPU0"))
    return "\n".join(lines[: header + 1 + keep_rows]) + "\n"


def test_a_matrix_cut_after_five_gpu_rows_is_refused_not_read_as_a_smaller_box(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    msg = _bad(_cut("dgx-2.txt", 5))  # the header names 16 GPUs and 8 NICs
    assert "the header names 24 devices but only 5 rows follow" in msg
    assert "the rows of 19 devices are missing (GPU5, GPU6, GPU7, …, mlx5_7)" in msg and "cut" in msg
    assert "\n" not in msg
    path = tmp_path / "cut.txt"
    path.write_text(_cut("dgx-2.txt", 5))
    from deskpod.cli import main

    assert main(["topo", "--from", str(path)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "rows of 19 devices are missing" in err


def test_a_matrix_whose_nic_rows_stop_early_is_read_and_says_which_are_missing(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    full = read_topo_matrix(REFERENCE / "dgx1-v100.txt")
    cut = parse_topo_matrix(_cut("dgx1-v100.txt", 9), source="cut.txt")  # 8 GPU rows and the first NIC row
    assert cut.gpus == full.gpus and cut.nics == full.nics
    assert cut.cpu_affinity == full.cpu_affinity  # the affinity column is not mistaken for links
    g = len(full.gpus)
    assert [row[:g] for row in cut.cells] == [row[:g] for row in full.cells]  # every GPU-GPU and NIC-GPU link
    assert cut.notes == (
        "cut.txt: the header names 12 devices but the rows of mlx5_2, mlx5_1, mlx5_3 are missing (the output was "
        "cut); their links to the GPUs are read from the GPU rows' columns, and the links among them are unknown, "
        "taken as SYS",
    )
    t, ref = matrix_to_topology(cut, "cut"), matrix_to_topology(full, "full")
    assert [t.nearest_nics(i) for i in range(g)] == [ref.nearest_nics(i) for i in range(g)]
    # The command says so too.
    path = tmp_path / "cut.txt"
    path.write_text(_cut("dgx1-v100.txt", 9))
    from deskpod.cli import main

    assert main(["topo", "--from", str(path)]) == 0
    err = capsys.readouterr().err
    assert err.startswith("deskpod: warning: ") and "mlx5_2, mlx5_1, mlx5_3 are missing" in err
