"""Bus-bandwidth formulas and correctness patterns, against hand-computed values."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from deskpod.comm.collectives import (
    COLLECTIVES,
    algbw,
    bus_factor,
    busbw,
    element_count,
    make_buffers,
    parse_collectives,
    run_once,
)
from deskpod.errors import UsageError


def test_bus_factors_match_nccl_tests() -> None:
    # doc/PERFORMANCE.md: all-reduce 2(n-1)/n; all-gather, reduce-scatter (n-1)/n; broadcast 1.
    assert bus_factor("all_reduce", 8) == pytest.approx(1.75)
    assert bus_factor("all_reduce", 2) == pytest.approx(1.0)
    assert bus_factor("all_gather", 8) == pytest.approx(0.875)
    assert bus_factor("reduce_scatter", 4) == pytest.approx(0.75)
    assert bus_factor("all_to_all", 16) == pytest.approx(15 / 16)
    assert bus_factor("broadcast", 8) == 1.0


def test_busbw_by_hand() -> None:
    # 1 GiB all-reduce on 8 ranks in 10 ms: algbw 107.374 GB/s, busbw 187.905 GB/s.
    assert algbw(1 << 30, 0.01) == pytest.approx(107.3741824)
    assert busbw("all_reduce", 8, 1 << 30, 0.01) == pytest.approx(107.3741824 * 1.75)
    assert algbw(8, 0.0) == 0.0


def test_element_count_splits_evenly() -> None:
    assert element_count("all_reduce", 8, 4, 3) == 2
    assert element_count("all_gather", 40, 4, 3) == 9  # 10 floats rounded down to 3 chunks of 3
    assert element_count("all_to_all", 4, 4, 4) == 4  # at least one element per rank


def test_parse_collectives() -> None:
    assert parse_collectives("all") == COLLECTIVES
    assert parse_collectives("allreduce,a2a,all_reduce") == ("all_reduce", "all_to_all")
    with pytest.raises(UsageError, match="unknown collective 'allreduc'"):
        parse_collectives("allreduc")


class _World:
    """A fake `torch.distributed` over in-process buffers of every rank: real semantics, no processes."""

    def __init__(self, n: int) -> None:
        self.n = n
        self.bufs: list[Any] = []

    def run(self, name: str) -> list[int]:
        n = self.n
        bufs = [make_buffers(torch, name, element_count(name, 64, 4, n), r, n, torch.float32, "cpu") for r in range(n)]  # type: ignore[arg-type]
        chunk = bufs[0].input.numel() // n if name != "all_gather" else bufs[0].input.numel()
        if name == "all_reduce":
            total = sum(b.input.clone() for b in bufs)
            for b in bufs:
                b.output.copy_(total)
        elif name == "broadcast":
            for b in bufs:
                b.output.copy_(bufs[0].output)
        elif name == "all_gather":
            full = torch.cat([b.input for b in bufs])
            for b in bufs:
                b.output.copy_(full)
        elif name == "reduce_scatter":
            total = sum(b.input.clone() for b in bufs)
            for r, b in enumerate(bufs):
                b.output.copy_(total[r * chunk : (r + 1) * chunk])
        elif name == "all_to_all":
            for r, b in enumerate(bufs):
                b.output.copy_(torch.cat([bufs[p].input[r * chunk : (r + 1) * chunk] for p in range(n)]))
        return [int((b.output != b.expected).sum()) for b in bufs]


@pytest.mark.parametrize("name", COLLECTIVES)
def test_expected_results_match_true_semantics(name: str) -> None:
    assert _World(4).run(name) == [0, 0, 0, 0]


class _NoOp:
    """A `torch.distributed` that does nothing: every collective then leaves wrong results."""

    def __getattr__(self, _name: str) -> Any:
        return lambda *a, **k: None


@pytest.mark.parametrize("name", ["all_reduce", "all_gather", "reduce_scatter", "all_to_all"])
def test_a_collective_that_did_nothing_is_wrong(name: str) -> None:
    b = make_buffers(torch, name, 16, 1, 2, torch.float32, "cpu")  # type: ignore[arg-type]
    run_once(_NoOp(), name, b)  # type: ignore[arg-type]
    assert int((b.output != b.expected).sum()) > 0
