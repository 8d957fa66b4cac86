"""`deskpod bench comm` on 2 real Gloo CPU ranks, and its bad inputs."""

from __future__ import annotations

import json

import pytest

from deskpod.cli import main
from deskpod.comm.bench import CommBenchConfig, format_size, format_table, run_comm_bench


def test_two_cpu_ranks_pass_the_correctness_check(capsys: pytest.CaptureFixture[str]) -> None:
    code = main(["bench", "comm", "--max-bytes", "64K", "--step-factor", "64", "--iters", "2", "--warmup", "1",
                 "--devices", "2", "--backend", "gloo", "--threads", "1"])  # fmt: skip
    out = capsys.readouterr().out
    assert code == 0
    result = json.loads(out.strip().splitlines()[-1])
    assert result["ranks"] == 2 and result["backend"] == "gloo" and result["wrong"] == 0
    names = {r["collective"] for r in result["rows"]}
    assert names == {"all_reduce", "all_gather", "reduce_scatter", "broadcast", "all_to_all"}
    assert [r["size"] for r in result["rows"] if r["collective"] == "all_reduce"] == [8, 512, 32768]
    for r in result["rows"]:
        assert r["time_us"] > 0 and r["busbw"] >= 0 and r["wrong"] == 0
        factor = {"all_reduce": 1.0, "broadcast": 1.0}.get(r["collective"], 0.5)  # n = 2
        assert r["busbw"] == pytest.approx(r["algbw"] * factor)
    assert "#wrong" in out and "out of bounds values: 0 OK" in out


def test_library_result_and_table() -> None:
    cfg = CommBenchConfig(collectives=("all_reduce",), max_bytes=8, iters=1, warmup=0, devices=3, backend="gloo",
                          threads=1)  # fmt: skip
    result = run_comm_bench(cfg)
    assert result["ranks"] == 3 and result["wrong"] == 0 and len(result["rows"]) == 1
    assert "all_reduce" in format_table(result)


def test_sizes() -> None:
    assert format_size(4 << 20) == "4M" and format_size(24) == "24"
    assert CommBenchConfig(min_bytes=8, max_bytes=1024, step_factor=4).sizes == (8, 32, 128, 512)


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["--max-bytes", "2G"], "above the 1G limit"),
        (["--max-bytes", "lots"], "--max-bytes 'lots': not a size"),
        (["--min-bytes", "0"], "--min-bytes must be at least 1"),
        (["--min-bytes", "1M", "--max-bytes", "1K"], "below --min-bytes"),
        (["--step-factor", "1"], "--step-factor must be at least 2"),
        (["--iters", "0"], "--iters must be >= 1"),
        (["--devices", "1"], "--devices must be 2 or more"),
        (["--collectives", "allreduc"], "unknown collective"),
        (["--backend", "nccl"], "needs at least 2 GPUs"),
    ],
)
def test_bad_input_is_one_line_and_exit_2(flags: list[str], message: str, capsys: pytest.CaptureFixture[str]) -> None:
    pytest.importorskip("torch")
    import torch

    if flags[:2] == ["--backend", "nccl"] and torch.cuda.device_count() >= 2:
        pytest.skip("this box has GPUs for NCCL")
    assert main(["bench", "comm", *flags]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and message in err[0]


@pytest.mark.gpu
def test_nccl_on_gpus() -> None:
    import torch

    if torch.cuda.device_count() < 2:
        pytest.skip("needs 2 GPUs")
    result = run_comm_bench(CommBenchConfig(max_bytes=1 << 20, step_factor=16, iters=5, warmup=2, backend="nccl"))
    assert result["backend"] == "nccl" and result["wrong"] == 0


def _fails_on_rank_1(rank: int, world: int, port: int, out: object) -> None:
    import os

    if rank == 1:
        os._exit(3)  # dies without reporting
    out.put({"rank": rank, "rows": []})  # type: ignore[attr-defined]


def test_a_dead_worker_is_named_not_waited_for() -> None:
    from deskpod.comm.bench import spawn_workers

    got = spawn_workers(_fails_on_rank_1, 2, (), timeout_s=60)
    assert got[0] == {"rank": 0, "rows": []}
    assert "worker 1 did not report (exit code 3, timeout 60 s)" in got[1]["error"]
