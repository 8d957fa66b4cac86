"""Ring and tree construction on catalog machines, against hand-computed values."""

from __future__ import annotations

import pytest

from deskpod.comm.rings import build_rings, double_binary_tree, hamiltonian_cycles, tree_depth
from deskpod.errors import UsageError
from deskpod.hardware.catalog import machine
from deskpod.hardware.topology import cpu_topology


def _check_ring_is_nvlink_hamiltonian(name: str, ring: tuple[int, ...], n: int) -> None:
    t = machine(name)
    assert sorted(ring) == list(range(n))
    for a, b in zip(ring, (*ring[1:], ring[0]), strict=True):
        assert t.link(a, b).kind == "nvlink", (ring, a, b)


def test_dgx1_v100_six_rings_over_nvlink_only() -> None:
    # 6 NVLinks per V100 x 8 GPUs = 24 links = 3 link-disjoint Hamiltonian cycles, each driven both ways:
    # 6 rings at 25 GB/s = 150 GB/s per direction (docs/reference/hardware.md#nvlink: 25 GB/s per link, 6 links).
    rs = build_rings(machine("dgx1-v100"))
    assert rs.kind == "nvlink" and len(rs.rings) == 6
    assert rs.bandwidth == pytest.approx(150.0)
    for ring in rs.rings:
        _check_ring_is_nvlink_hamiltonian("dgx1-v100", ring, 8)
    # No pair carries more rings per direction than it has NVLinks.
    t = machine("dgx1-v100")
    use: dict[tuple[int, int], int] = {}
    for ring in rs.rings:
        for a, b in zip(ring, (*ring[1:], ring[0]), strict=True):
            use[(a, b)] = use.get((a, b), 0) + 1
    assert all(c <= t.link(a, b).links for (a, b), c in use.items())


def test_dgx1_p100_four_rings_at_80() -> None:
    # 4 NVLinks per P100: 2 cycles x 2 directions x 20 GB/s = 80 GB/s.
    rs = build_rings(machine("dgx1-p100"))
    assert len(rs.rings) == 4 and rs.bandwidth == pytest.approx(80.0)
    for ring in rs.rings:
        _check_ring_is_nvlink_hamiltonian("dgx1-p100", ring, 8)


def test_nvlink_beats_pcie_only_box() -> None:
    pcie = build_rings(machine("pcie-8gpu"))
    assert pcie.kind == "pcie" and pcie.bandwidth == pytest.approx(15.7)
    assert build_rings(machine("dgx1-v100")).bandwidth > 9 * pcie.bandwidth


def test_nvswitch_is_a_fabric() -> None:
    # DGX A100: 12 NVLinks x 25 GB/s into the fabric = 300 GB/s per direction, any order.
    rs = build_rings(machine("dgx-a100"))
    assert rs.kind == "fabric" and rs.bandwidth == pytest.approx(300.0)
    assert build_rings(machine("dgx-a100"), [0, 5]).bandwidth == pytest.approx(300.0)


def test_subsets() -> None:
    t = machine("dgx1-v100")
    assert build_rings(t, [0, 1]).bandwidth == pytest.approx(25.0)  # NV1: one link each way
    assert build_rings(t, [0, 3]).bandwidth == pytest.approx(50.0)  # NV2
    quad = build_rings(t, [0, 1, 2, 3])
    assert quad.kind == "nvlink" and quad.bandwidth == pytest.approx(100.0)
    five = build_rings(t, [0, 1, 2, 3, 4])  # GPU4's NVLink neighbours in the set: only GPU0, no cycle closes
    assert five.kind == "mixed" and five.bandwidth == pytest.approx(15.7)
    assert build_rings(t, [2]).rings == ()
    with pytest.raises(UsageError, match="bad or repeated device"):
        build_rings(t, [0, 0])
    with pytest.raises(UsageError, match="bad or repeated device"):
        build_rings(t, [9])


def test_cpu_slots_share_memory() -> None:
    rs = build_rings(cpu_topology(4))
    assert rs.kind == "shm" and rs.rings == ((0, 1, 2, 3),)


def test_hamiltonian_cycles_of_a_square() -> None:
    cap = {(0, 1): 1, (1, 2): 1, (2, 3): 1, (0, 3): 1}
    assert hamiltonian_cycles([0, 1, 2, 3], cap) == [(0, 1, 2, 3)]
    cap[(0, 2)] = 1
    cap[(1, 3)] = 1
    assert len(hamiltonian_cycles([0, 1, 2, 3], cap)) == 3  # K4 has 3 undirected Hamiltonian cycles


@pytest.mark.parametrize("n", [1, 2, 3, 4, 7, 8, 16, 124])
def test_double_binary_tree(n: int) -> None:
    trees = double_binary_tree(n)
    for tree in trees:
        assert tree.parent.count(-1) == 1
        assert tree.depth <= tree_depth(n) + 1
        for r in range(n):
            assert len(tree.children(r)) <= 2
    assert trees[0].depth == tree_depth(n)
    if n % 2 == 0 and n > 2:
        interior = [set(r for r in range(n) if t.children(r)) for t in trees]
        assert not interior[0] & interior[1]  # interior in one tree, a leaf in the other
