"""The alpha-beta cost model: limits by hand, monotonic in size, affinity, bad input."""

from __future__ import annotations

import itertools

import pytest

from deskpod.comm.collectives import COLLECTIVES, CollectiveName
from deskpod.comm.cost import Network, node_network, parse_network, predict
from deskpod.errors import UsageError
from deskpod.hardware.catalog import machine

SIZES = [8, 1 << 10, 1 << 16, 1 << 20, 1 << 24, 1 << 28, 1 << 30]


@pytest.mark.parametrize("name", ["dgx1-v100", "dgx1-p100", "pcie-8gpu", "dgx-a100", "xeon-e5-2697v3-2s"])
@pytest.mark.parametrize("collective", COLLECTIVES)
def test_time_grows_with_size(name: str, collective: CollectiveName) -> None:
    t = machine(name)
    times = [predict(t, collective, s).time_s for s in SIZES]
    assert all(a < b for a, b in itertools.pairwise(times))


def test_large_all_reduce_approaches_ring_bandwidth() -> None:
    # 1 GiB on DGX-1V: latency 8.4 + 14 x 5.7 us (Simple) is 0.1% of 12.5 ms; busbw -> 150 GB/s.
    p = predict(machine("dgx1-v100"), "all_reduce", 1 << 30)
    assert p.algorithm == "ring" and p.protocol == "Simple"
    expected_t = (8.4 + 14 * 5.7) * 1e-6 + 1.75 * (1 << 30) / 1e9 / 150
    assert p.time_s == pytest.approx(expected_t)
    assert p.busbw == pytest.approx(150 * 1.75 * (1 << 30) / 1e9 / 150 / expected_t)
    assert 148 < p.busbw < 150
    a100 = predict(machine("dgx-a100"), "all_reduce", 1 << 30)
    assert 294 < a100.busbw < 300  # 88 us of latency on 6.3 ms
    assert p.busbw > 9 * predict(machine("pcie-8gpu"), "all_reduce", 1 << 30).busbw


def test_small_messages_use_low_latency_protocol() -> None:
    p = predict(machine("dgx1-v100"), "all_reduce", 8)
    assert p.protocol == "LL"
    assert p.time_s == pytest.approx((3.6 + 14 * 0.4) * 1e-6 + 1.75 * 8 / 1e9 / 75)


def test_across_nodes_nic_affinity_and_tree() -> None:
    t = machine("dgx1-v100")
    # All 8 GPUs reach the 4 EDR NICs: 4 x 100 Gb/s = 50 GB/s per node, below the 150 GB/s rings.
    assert node_network(t, range(8)) == Network(4, 100.0)
    big = predict(t, "all_reduce", 1 << 30, nodes=16)
    assert big.bandwidth == pytest.approx(50.0) and 45 < big.busbw < 50
    # GPUs 0 and 1 sit behind one PCIe switch with mlx5_0 only: one NIC, 12.5 GB/s.
    assert node_network(t, [0, 1]) == Network(1, 100.0)
    assert predict(t, "all_reduce", 1 << 30, devices=[0, 1], nodes=4).bandwidth == pytest.approx(12.5)
    # Many nodes, small message: the tree's log2 latency beats the ring's 2(n-1) hops.
    assert predict(t, "all_reduce", 1024, nodes=512).algorithm == "tree"
    assert predict(t, "all_reduce", 1 << 30, nodes=2).algorithm == "ring"


def test_all_to_all_across_nodes_is_bound_by_the_nics() -> None:
    t = machine("dgx1-v100")
    one = predict(t, "all_to_all", 1 << 28)
    many = predict(t, "all_to_all", 1 << 28, nodes=8)
    assert many.time_s > one.time_s and many.algorithm == "p2p"


def test_one_rank_costs_nothing() -> None:
    p = predict(machine("dgx1-v100"), "all_reduce", 1 << 20, devices=[3])
    assert p.time_s == 0.0 and p.busbw == 0.0


def test_bad_input() -> None:
    t = machine("dgx1-v100")
    with pytest.raises(UsageError, match="message size"):
        predict(t, "all_reduce", 0)
    with pytest.raises(UsageError, match="nodes must be"):
        predict(t, "all_reduce", 8, nodes=0)
    with pytest.raises(UsageError, match="no NICs"):
        predict(machine("pcie-8gpu"), "all_reduce", 8, nodes=2)
    assert (
        predict(machine("pcie-8gpu"), "all_reduce", 1 << 30, nodes=2, network=parse_network("1x100")).bandwidth == 12.5
    )
    with pytest.raises(UsageError, match="bad network"):
        parse_network("four")
    with pytest.raises(UsageError, match="unknown collective"):
        predict(t, "gather", 8)  # type: ignore[arg-type]
