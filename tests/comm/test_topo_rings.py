"""``deskpod topo --rings``: the rings the collectives layer builds, shown with the topology."""

from __future__ import annotations

import json

import pytest

from deskpod.cli import main


def test_dgx1_v100_shows_six_nvlink_rings(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["topo", "--machine", "dgx1-v100", "--rings"]) == 0
    out = capsys.readouterr().out
    assert "6 ring(s), nvlink, 150 GB/s per direction in total" in out
    ring_lines = [ln for ln in out.splitlines() if ln.strip().startswith("GPU0 ->") and "(25 GB/s)" in ln]
    assert len(ring_lines) == 6
    for line in ring_lines:
        hops = line.split("(")[0].split("->")
        assert sorted({h.strip() for h in hops}) == [f"GPU{i}" for i in range(8)], "each ring visits all 8 GPUs"


def test_rings_in_json_for_an_nvswitch_box(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["topo", "--machine", "dgx-a100", "--rings", "--json"]) == 0
    rings = json.loads(capsys.readouterr().out)["rings"]
    assert (
        rings["kind"] == "fabric" and rings["total_bandwidth"] == 300.0 and sorted(rings["rings"][0]) == list(range(8))
    )
