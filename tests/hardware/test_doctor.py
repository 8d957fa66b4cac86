"""`deskpod doctor` on this box: real measurements, a real Gloo all-reduce, the verdict and exit code."""

from __future__ import annotations

import json
from collections.abc import Callable

import pytest

from deskpod.hardware import doctor
from deskpod.hardware.doctor import Check, DoctorReport, judge

Run = Callable[..., tuple[int, str, str]]


@pytest.mark.alone  # its slots are judged against their median: a sibling test on one core makes that one slow
def test_doctor_json_on_this_box(run_cli: Run) -> None:
    code, out, err = run_cli("doctor", "--json", "--seconds", "0.05")
    report = json.loads(out)
    assert report["schema"] == "deskpod.doctor/1"
    assert code == (0 if report["ok"] else 1), err
    checks = report["checks"]
    names = {(c["device"], c["name"]) for c in checks}
    devices = sorted({c["device"] for c in checks if c["device"] != "all"})
    assert len(devices) == report["devices"]
    for d in devices:
        assert {(d, "matmul fp32"), (d, "matmul bf16"), (d, "memory copy")} <= names
    allreduce = next(c for c in checks if c["name"] == "all-reduce")
    assert allreduce["status"] == "pass" and "0 wrong elements" in allreduce["note"] and allreduce["measured"] > 0
    for c in checks:
        assert c["status"] in ("pass", "warn", "fail", "skip")
        if c["name"].startswith(("matmul", "memory")):
            assert c["measured"] > 0 and c["status"] != "fail"
    if report["kind"] == "cpu":
        peer = next(c for c in checks if c["name"] == "peer bandwidth")
        assert peer["status"] == "skip" and "no GPUs" in peer["note"]
        fp32 = next(c for c in checks if c["name"] == "matmul fp32")
        assert fp32["spec"] is None and "no catalog spec for this CPU" in fp32["note"]


def test_judge_thresholds() -> None:
    assert judge(800, 989.4) == "pass"
    assert judge(300, 989.4) == "warn"
    assert judge(100, 989.4) == "fail"
    assert judge(5, None) == "pass"
    assert judge(5, None, correct=False) == "fail"
    assert judge(0.0, None) == "fail"


def test_gpu_spec_lookup() -> None:
    found = doctor.gpu_spec("NVIDIA H200")
    assert found is not None
    name, spec, sources = found
    assert name == "hgx-h200" and spec == {"fp32": 67.0, "bf16": 989.4, "copy": 4800.0}
    assert "docs/reference/hardware.md#gpus" in sources
    assert doctor.gpu_spec("Radeon") is None


def test_a_failed_check_exits_1(run_cli: Run, monkeypatch: pytest.MonkeyPatch) -> None:
    bad = DoctorReport("cpu", 2, [Check("all", "all-reduce", "fail", note="3 wrong elements")], 0.1)
    monkeypatch.setattr(doctor, "run_doctor", lambda seconds: bad)
    code, out, _ = run_cli("doctor")
    assert code == 1 and "FAIL" in out and "3 wrong elements" in out
    code, _, err = run_cli("doctor", "--seconds", "0")
    assert code == 2 and "--seconds" in err


@pytest.mark.gpu
def test_doctor_on_gpus_reports_bf16_and_copy_against_spec() -> None:
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    report = doctor.run_doctor(seconds=0.5)
    bf16 = [c for c in report.checks if c.name == "matmul bf16"]
    copy = [c for c in report.checks if c.name == "memory copy"]
    assert bf16 and copy and all(c.measured and c.measured > 0 for c in bf16 + copy)
    print(report.to_table())
    assert not report.failed
