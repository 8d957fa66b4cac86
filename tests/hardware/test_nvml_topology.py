"""The live NVML path, replayed through a fake shaped like NVML's answers (no GPU here)."""

from __future__ import annotations

from collections.abc import Sequence

import pytest

from deskpod.hardware.nvml_topology import local_topology, topology_from_query
from deskpod.hardware.topo_matrix import matrix_to_topology, read_topo_matrix

from .conftest import REFERENCE

LEVEL = {"PIX": 10, "PXB": 20, "PHB": 30, "NODE": 40, "SYS": 50}


class FakeQuery:
    """Answers like NVML would on the box a matrix came from: NVLink remotes and common ancestors."""

    def __init__(self, cells: Sequence[Sequence[str]], name: str, switch_links: int = 0) -> None:
        self.cells, self._name, self.switch_links = cells, name, switch_links

    def count(self) -> int:
        return len(self.cells)

    def name(self, i: int) -> str:
        return self._name

    def memory_bytes(self, i: int) -> int:
        return 32 * 10**9

    def bus_id(self, i: int) -> str:
        return f"00000000:{0x10 + i:02x}:00.0"

    def uuid(self, i: int) -> str:
        return f"GPU-{i:08d}-fake"

    def compute_capability(self, i: int) -> str:
        return "7.0"

    def nvlink_remotes(self, i: int) -> list[str]:
        if self.switch_links:  # every link ends in one of 6 NVSwitches
            return [f"00000000:{0xA0 + link % 6:02x}:00.0" for link in range(self.switch_links)]
        out = []
        for j, token in enumerate(self.cells[i]):
            if token.startswith("NV"):
                out += [self.bus_id(j)] * int(token[2:])
        return out

    def common_ancestor(self, i: int, j: int) -> int:
        token = self.cells[i][j]
        return LEVEL.get(token, 30)

    def cpu_affinity(self, i: int) -> str:
        return "0-19,40-59" if i < 4 else "20-39,60-79"

    def numa_node(self, i: int) -> int | None:
        return 0 if i < 4 else 1


def test_nvml_dgx1_reproduces_the_recorded_matrix() -> None:
    m = read_topo_matrix(REFERENCE / "dgx1-v100.txt")
    parsed = matrix_to_topology(m, "dgx1")
    live = topology_from_query(FakeQuery(m.gpu_cells, "Tesla V100-SXM2-32GB"))
    assert [[lk.token for lk in row] for row in live.links] == [[lk.token for lk in row] for row in parsed.links]
    assert live.link_bandwidth(0, 3) == 50.0 and live.source == "nvml"
    assert live.devices[0].model == "Tesla V100-SXM2-32GB" and live.devices[5].numa_node == 1


def test_nvml_nvswitch_links_become_a_fabric() -> None:
    cells = [["X" if a == b else "SYS" for b in range(8)] for a in range(8)]
    live = topology_from_query(FakeQuery(cells, "NVIDIA H200", switch_links=18))
    assert live.fabric is not None and live.fabric.links_per_gpu == 18
    assert live.link(0, 7).token == "NV18" and live.link_bandwidth(0, 7) == 450.0


def test_nvml_honours_cuda_visible_devices(monkeypatch: pytest.MonkeyPatch) -> None:
    m = read_topo_matrix(REFERENCE / "dgx1-v100.txt")
    fake = FakeQuery(m.gpu_cells, "Tesla V100-SXM2-32GB")
    half = topology_from_query(fake, visible=[4, 5, 6, 7])
    assert half.device_count == 4 and half.link(0, 3).token == "NV2" and half.link(0, 1).token == "NV1"  # GPUs 4-7, 4-5
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "3,2")
    t = local_topology(fake)
    assert t.device_count == 2 and t.link(0, 1).token == "NV2" and t.devices[0].cpu_affinity == "0-19,40-59"


def test_local_topology_without_gpu_is_cpu_slots() -> None:
    from deskpod.hardware.devices import discover

    inv = discover()
    if inv.kind != "cpu":
        pytest.skip("this box has GPUs; covered by the gpu-marked test")
    t = local_topology()
    assert t.kind == "cpu" and t.device_count == len(inv.devices) and t.source == "cpu"


@pytest.mark.gpu
def test_local_topology_on_a_gpu_box_uses_nvml() -> None:
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    t = local_topology()
    assert t.kind == "cuda" and t.device_count == torch.cuda.device_count() and t.source == "nvml"
