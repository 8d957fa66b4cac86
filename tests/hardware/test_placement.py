"""Placement on the reference machines: expected sets and reasons, the contract, and a brute-force cross-check."""

from __future__ import annotations

import dataclasses
import itertools
import random

import pytest

from deskpod.errors import UsageError
from deskpod.hardware.placement import Placement, Unplaceable, local_topology, machine, place
from deskpod.hardware.topology import Topology


def placed(result: Placement | Unplaceable) -> Placement:
    assert isinstance(result, Placement), result
    return result


def refused(result: Placement | Unplaceable) -> Unplaceable:
    assert isinstance(result, Unplaceable), result
    return result


DGX1 = machine("dgx1-v100")
ALL8 = range(8)


def test_dgx1_v100_four_gpus_get_a_fully_connected_quad() -> None:
    p = placed(place(DGX1, ALL8, 4))
    assert p.devices in ((0, 1, 2, 3), (4, 5, 6, 7))
    assert all(DGX1.link(a, b).kind == "nvlink" for a, b in itertools.combinations(p.devices, 2))
    assert p.ring_bandwidth == 25.0 and p.reason.startswith("fully NVLink-connected quad")


def test_dgx1_v100_two_gpus_get_a_two_link_pair() -> None:
    p = placed(place(DGX1, ALL8, 2))
    assert DGX1.link(*p.devices).token == "NV2" and p.ring_bandwidth == 50.0
    assert p.reason == "two-link NVLink pair (NV2, 50 GB/s per direction)"
    # Of the NV2 pairs it takes one inside a quad (0-3 or 1-2 …), not 0-4 / 1-5, so the other quad stays whole.
    assert len({d // 4 for d in p.devices}) == 1


def test_dgx1_v100_one_gpu_leaves_two_link_pairs_whole() -> None:
    p = placed(place(DGX1, {0, 3, 5}, 1))  # 0-3 is an NV2 pair, 5 is alone
    assert p.devices == (5,) and p.ring_bandwidth == 0.0
    assert p.reason == "one GPU (5); leaves the free NV2 pairs whole"
    assert placed(place(DGX1, {0, 1, 2, 3, 7}, 1)).devices == (7,)  # keeps the free quad whole
    # A 2-GPU job in a free quad takes a pair whose partners stay an NV2 pair.
    p2 = placed(place(DGX1, {0, 1, 2, 3}, 2))
    rest = sorted({0, 1, 2, 3} - set(p2.devices))
    assert DGX1.link(*p2.devices).token == "NV2" and DGX1.link(*rest).token == "NV2"


def test_dgx1_v100_eight_gpus_ring_over_the_nv2_cycle() -> None:
    p = placed(place(DGX1, ALL8, 8))
    assert p.devices == tuple(range(8)) and p.ring_bandwidth == 50.0


def test_ring_order_follows_the_nv2_cycle() -> None:
    from deskpod.hardware.placement import ring_order

    order = ring_order(DGX1, range(8))
    hops = [DGX1.link(order[i], order[(i + 1) % 8]).token for i in range(8)]
    assert sorted(order) == list(range(8)) and hops == ["NV2"] * 8


def test_dgx1_v100_why_not_and_pack() -> None:
    r = refused(place(DGX1, {0, 5, 2, 7}, 4))
    assert r.reason == "needs 4 NVLink-connected GPUs; the largest free clique has 2" and r.ever
    p = placed(place(DGX1, {0, 5, 2, 7}, 4, policy="pack"))
    assert p.devices == (0, 2, 5, 7) and p.ring_bandwidth == 15.7
    r2 = refused(place(DGX1, ALL8, 9))
    assert not r2.ever and r2.reason == "needs 9 GPUs; dgx1-v100 has 8"
    r3 = refused(place(DGX1, {1, 2}, 3))
    assert r3.ever and r3.reason == "needs 3 GPUs; only 2 free (1, 2)"


def test_dgx1_partitions() -> None:
    p = placed(place(DGX1, {0, 1, 4, 5, 6}, 3, policy="partition:halves"))
    assert p.devices == (4, 5, 6) and p.reason.startswith("inside 'halves' block {4-7}: fully NVLink-connected trio")
    # Best fit: a 1-GPU job goes into the half that is already in use.
    assert placed(place(DGX1, {0, 1, 2, 3, 4}, 1, policy="partition:halves")).devices == (4,)
    r = refused(place(DGX1, ALL8, 5, policy="partition:halves"))
    assert not r.ever and "blocks hold at most 4" in r.reason
    r2 = refused(place(DGX1, {0, 1, 4, 5}, 3, policy="partition:halves"))
    assert r2.ever and "the most free in one block is 2" in r2.reason
    assert placed(place(DGX1, ALL8, 4, policy="partition:numa")).devices == (0, 1, 2, 3)


def test_bad_requests_raise_usage_errors() -> None:
    with pytest.raises(UsageError, match="at least 1 device"):
        place(DGX1, ALL8, 0)
    with pytest.raises(
        UsageError, match=r"valid: best, pack, partition:<name> \(here: partition:halves, partition:numa\)"
    ):
        place(DGX1, ALL8, 2, policy="spread")
    with pytest.raises(UsageError, match="no partition 'thirds'; valid: halves, numa"):
        place(DGX1, ALL8, 2, policy="partition:thirds")
    with pytest.raises(UsageError, match="free device 8 does not exist"):
        place(DGX1, [0, 8], 1)


def test_dgx1_p100_single_links() -> None:
    t = machine("dgx1-p100")
    p2 = placed(place(t, ALL8, 2))
    assert p2.ring_bandwidth == 20.0 and p2.reason == "one-link NVLink pair (NV1, 20 GB/s per direction)"
    p4 = placed(place(t, ALL8, 4))
    assert (
        p4.devices == (0, 1, 2, 3) and p4.ring_bandwidth == 20.0 and p4.reason.startswith("fully NVLink-connected quad")
    )
    assert refused(place(t, {0, 5, 2, 7}, 4)).reason == "needs 4 NVLink-connected GPUs; the largest free clique has 2"


def test_pcie_only_server_prefers_the_nearest_path() -> None:
    t = machine("pcie-8gpu")
    p = placed(place(t, ALL8, 2))
    assert p.devices == (0, 1) and p.reason == "PCIe pair behind one switch (PIX, 15.7 GB/s per direction)"
    assert placed(place(t, {0, 2, 4, 5}, 2)).devices == (4, 5)
    p4 = placed(place(t, ALL8, 4))
    assert p4.devices == (0, 1, 2, 3) and "PIX to PXB" in p4.reason  # stays on one socket
    one = placed(place(t, {0, 1, 2, 4, 5}, 1))  # GPU 2 is alone behind its switch
    assert one.devices == (2,) and one.reason == "one GPU (2); leaves the free PIX pairs whole"
    p_far = placed(place(t, {0, 4}, 2))  # no NVLink anywhere: best takes what there is
    assert p_far.devices == (0, 4) and "SYS" in p_far.reason


def test_nvswitch_machines_any_set_at_the_fabric_rate() -> None:
    a100 = machine("dgx-a100")
    p = placed(place(a100, ALL8, 4))
    assert p.ring_bandwidth == 300.0 and p.reason.startswith("NVSwitch fabric: any 4 GPUs ring at 300 GB/s")
    assert placed(place(a100, {1, 3, 5, 6, 7}, 3)).devices == (1, 3, 5)
    dgx2 = machine("dgx-2")
    p16 = placed(place(dgx2, range(16), 16))
    assert p16.ring_bandwidth == 150.0 and p16.devices == tuple(range(16))
    assert placed(place(dgx2, range(8, 16), 8, policy="partition:halves")).devices == tuple(range(8, 16))
    assert placed(place(machine("hgx-h200"), ALL8, 8)).ring_bandwidth == 450.0


def test_dgx_station_all_pairs_two_links() -> None:
    t = machine("dgx-station")
    p = placed(place(t, range(4), 4))
    assert p.devices == (0, 1, 2, 3) and p.ring_bandwidth == 50.0


def test_cpu_only_box_places_worker_slots() -> None:
    t = local_topology()
    assert t.kind in ("cpu", "cuda") and t.device_count >= 1
    if t.kind == "cpu":
        assert t.device_count >= 2
        p = placed(place(t, range(t.device_count), 2))
        assert p.devices == (0, 1) and "CPU slots" in p.reason
        assert t.link_bandwidth(0, 1) == t.link_bandwidth(1, 0) > 0


def test_result_types_are_frozen_and_sorted() -> None:
    p = placed(place(DGX1, [7, 6, 5, 4], 4))
    assert list(p.devices) == sorted(p.devices)
    with pytest.raises(dataclasses.FrozenInstanceError):
        p.devices = ()  # type: ignore[misc]
    assert not hasattr(p, "__dict__")  # slots


def _brute_ring(t: Topology, devices: tuple[int, ...]) -> tuple[float, int]:
    if len(devices) == 2:
        lk = t.link(*devices)
        return (lk.bandwidth, -lk.rank)
    first, rest = devices[0], devices[1:]
    best = (-1.0, -99)
    for perm in itertools.permutations(rest):
        order = (first, *perm)
        hops = [t.link(order[i], order[(i + 1) % len(order)]) for i in range(len(order))]
        best = max(best, min((h.bandwidth, -h.rank) for h in hops))
    return best


@pytest.mark.parametrize("name", ["dgx1-v100", "dgx1-p100", "pcie-8gpu"])
def test_pack_matches_a_brute_force_best_ring(name: str) -> None:
    t = machine(name)
    rng = random.Random(3)
    for _ in range(60):
        free = tuple(sorted(rng.sample(range(8), rng.randint(2, 8))))
        k = rng.randint(2, len(free))
        p = placed(place(t, free, k, policy="pack"))
        best = max(_brute_ring(t, c) for c in itertools.combinations(free, k))
        assert _brute_ring(t, p.devices) == best and p.ring_bandwidth == best[0], (free, k, p)
        assert set(p.devices) <= set(free)


def test_machines_too_big_for_tables_use_the_exact_per_set_search() -> None:
    from deskpod.hardware.topology import DeviceInfo, build_links, link_model_for

    n = 14  # two sockets of 7 GPUs: PIX pairs, PXB inside a socket, SYS across

    def token(a: int, b: int) -> str:
        if a == b:
            return "X"
        if a // 7 != b // 7:
            return "SYS"
        return "PIX" if a // 2 == b // 2 else "PXB"

    links, _ = build_links([[token(a, b) for b in range(n)] for a in range(n)], link_model_for("V100"))
    t = Topology("big", tuple(DeviceInfo(i, f"GPU{i}") for i in range(n)), links)
    p = placed(place(t, range(n), 2))
    assert p.devices == (0, 1) and "PIX" in p.reason
    assert placed(place(t, {0, 2, 8, 9}, 2)).devices == (8, 9)
    p4 = placed(place(t, {0, 1, 5, 7, 8, 9, 10}, 4))
    assert set(p4.devices) <= {7, 8, 9, 10, 0, 1, 5} and _brute_ring(t, p4.devices) == max(
        _brute_ring(t, c) for c in itertools.combinations((0, 1, 5, 7, 8, 9, 10), 4)
    )
    assert p4.devices == (7, 8, 9, 10)  # stays on one socket


def test_a_16_gpu_pcie_box_is_decided_quickly() -> None:
    from deskpod.hardware.topology import DeviceInfo, build_links, link_model_for

    n = 16  # 2 sockets x 2 switches x 4 GPUs; PIX within a switch, PXB across switches, SYS across sockets

    def token(a: int, b: int) -> str:
        if a == b:
            return "X"
        return "PIX" if a // 4 == b // 4 else "PXB" if a // 8 == b // 8 else "SYS"

    links, _ = build_links([[token(a, b) for b in range(n)] for a in range(n)], link_model_for("V100"))
    t = Topology("pcie16", tuple(DeviceInfo(i, f"GPU{i}") for i in range(n)), links)
    assert placed(place(t, range(n), 8)).devices == tuple(range(8))  # one socket (greedy: C(16,8) > limit)
    assert placed(place(t, range(1, 16), 4)).devices == (4, 5, 6, 7)  # a whole switch, leaving 1-3 together
    p = placed(place(t, {0, 1, 2, 5, 9, 10}, 3))
    assert p.devices == (0, 1, 2) and "PIX" in p.reason
