"""``deskpod bench train``: deskpod's loop and the plain DDP reference, side by side."""

from __future__ import annotations

import json
import os

import pytest

from deskpod.hardware.affinity import numa_nodes

from .conftest import run_deskpod

pytestmark = pytest.mark.slow


def test_bench_train_table_and_json() -> None:
    r = run_deskpod("bench", "train", "--model", "resnet18", "--data", "synthetic:3x32x32", "--batch-size", "4",
                    "--steps", "2", "--warmup", "1", "--json", timeout=300)  # fmt: skip
    assert r.code == 0, r.err
    result = json.loads(r.out)
    rows = result["rows"]
    assert [row["devices"] for row in rows] == [1, 2]
    for row in rows:
        assert row["images_per_s"] > 0 and row["reference_images_per_s"] > 0
        assert row["vs_reference"] == pytest.approx(row["images_per_s"] / row["reference_images_per_s"])
        assert row["per_device"] == pytest.approx(row["images_per_s"] / row["devices"])
    assert rows[0]["scaling_efficiency"] == 1.0
    # CPU rows all use every core: scaling sets each against 1 worker's rate with those cores, not n times it.
    assert result["device_kind"] == "cpu"
    assert rows[1]["scaling_efficiency"] == pytest.approx(rows[1]["images_per_s"] / rows[0]["images_per_s"])
    assert [row["threads_per_worker"] for row in rows] == [result["cores"], max(1, result["cores"] // 2)]
    nodes = len(numa_nodes(os.sched_getaffinity(0)))
    assert [row["default_layout"] for row in rows] == [nodes == 1, nodes == 2]


def test_bench_train_refuses_real_data() -> None:
    r = run_deskpod("bench", "train", "--data", "fashion-mnist")
    assert r.code == 2 and "use --data synthetic:CxHxW" in r.err
