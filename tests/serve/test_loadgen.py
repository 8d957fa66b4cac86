"""The load generator against the real server: closed and open loop answer, count, and report percentiles."""

from __future__ import annotations

import asyncio
import json

import numpy as np
import pytest

from deskpod.serve.loadgen import LoadSpec, check, closed_loop, format_table, inputs_from_metadata, open_loop
from tests.serve.conftest import Server


def test_closed_and_open_loop(server: Server) -> None:
    inputs = inputs_from_metadata("127.0.0.1", server.port, "mlp", batch=2)
    assert inputs["input"].shape == (2, 2, 4, 4)
    spec = LoadSpec(port=server.port, model="mlp", inputs=inputs, duration_s=0.4, warmup_s=0.1)

    async def main() -> list[object]:
        out = await check(spec)
        assert out["logits"].shape == (2, 3) and np.isfinite(out["logits"]).all()
        return [await closed_loop(spec, 4), await open_loop(spec, 100.0)]

    closed, opened = asyncio.run(main())
    for r in (closed, opened):
        assert r.ok > 0 and not r.errors and 0 < r.p50_ms <= r.p99_ms  # type: ignore[attr-defined]
    assert "req/s" in format_table([closed, opened])  # type: ignore[list-item]


def test_errors_are_counted_by_status(server: Server) -> None:
    inputs = {"input": np.zeros((1, 2, 4, 5), np.float32)}  # wrong shape: every answer is a 400
    spec = LoadSpec(port=server.port, model="mlp", inputs=inputs, duration_s=0.2, warmup_s=0.0)
    r = asyncio.run(closed_loop(spec, 2))
    assert r.ok == 0 and r.errors.get("400", 0) > 0


def test_bench_serve_cli(server: Server, capsys: pytest.CaptureFixture[str]) -> None:
    from deskpod.cli import main

    argv = ["bench", "serve", "--url", server.url, "--model", "mlp", "--concurrency", "2", "--rate", "50"]
    assert main([*argv, "--duration", "0.3", "--warmup", "0.1", "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    assert [(r["mode"], r["level"]) for r in rows] == [("closed", 2), ("open", 50)] and all(r["ok"] > 0 for r in rows)
    assert main(["bench", "serve", "--url", "nonsense", "--model", "mlp"]) == 2
