"""``deskpod plan calibrate``: fit this box from measurements, store, predict with machine 'local'."""

from __future__ import annotations

import json
from dataclasses import asdict
from pathlib import Path

import pytest

from deskpod.cli import main
from deskpod.errors import RunError, UsageError
from deskpod.hardware.placement import local_topology
from deskpod.hardware.topology import cpu_topology
from deskpod.plan.local import Measurements, fit_local, load, save, scaled_model
from deskpod.plan.predict import Factors, predict_plan
from deskpod.plan.workload import MODELS, Workload


def _measured(devices: int = 2, images_per_s: float = 60.0) -> Measurements:
    return Measurements(kind="cpu", devices=devices, cores=2, peak_tflops=0.1, memory_bandwidth_gbs=20.0,
                        model="resnet18", batch=8, shape=(3, 112, 112), images_per_s=images_per_s,
                        comm_busbw_gbs=2.0)  # fmt: skip


def test_fit_reproduces_the_measured_run(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    topo = cpu_topology(2)
    cal = fit_local(_measured(), topo)
    assert cal.ring_bandwidth == 10.0 and cal.factors.comm_efficiency == pytest.approx(0.2)
    default = Factors()  # CPU slots: only the CPU compute efficiency is refitted, the GPU factors stay
    assert cal.factors.cpu_compute_efficiency != default.cpu_compute_efficiency
    assert (cal.factors.compute_efficiency, cal.factors.memory_passes) == (
        default.compute_efficiency,
        default.memory_passes,
    )
    save(cal, tmp_path)
    assert load(tmp_path) == cal
    monkeypatch.setenv("DESKPOD_HOME", str(tmp_path))
    n = min(2, local_topology().device_count)
    if n != 2:
        pytest.skip("this box has fewer than 2 CPU slots")
    w = Workload(scaled_model("resnet18", (3, 112, 112)), batch=8, data="synthetic")
    plan = predict_plan(w, "local")
    assert plan.images_per_s == pytest.approx(60.0, rel=1e-3)  # the measured run, by construction
    bigger = predict_plan(Workload(MODELS["resnet50"], batch=8, data="synthetic"), "local")
    assert bigger.images_per_s < plan.images_per_s


def test_a_worker_with_more_threads_computes_faster(tmp_path: Path) -> None:
    """Calibrated on 2 slots of 1 thread each, one worker of both threads has twice a slot's FLOP rate: its step
    computes in half the time, with no all-reduce (`deskpod train --devices all` on a one-node box)."""
    save(fit_local(_measured(), cpu_topology(2)), tmp_path)
    if local_topology().device_count < 2:
        pytest.skip("this box has fewer than 2 CPU slots")
    w = Workload(scaled_model("resnet18", (3, 112, 112)), batch=8, data="synthetic")
    slot = predict_plan(w, "local", devices_per_node=1, home=tmp_path)
    both = predict_plan(w, "local", devices_per_node=1, home=tmp_path, threads=2)
    assert both.compute_s == pytest.approx(slot.compute_s / 2, rel=1e-9) and both.comm_s == 0.0
    assert predict_plan(w, "local", devices_per_node=1, home=tmp_path, threads=1).compute_s == slot.compute_s
    with pytest.raises(UsageError, match="threads per worker"):
        predict_plan(w, "local", devices_per_node=1, home=tmp_path, threads=0)


def test_scaled_model() -> None:
    half = scaled_model("resnet50", (3, 112, 112))
    assert half.forward_gflops == pytest.approx(MODELS["resnet50"].forward_gflops / 4)
    assert half.params_m == MODELS["resnet50"].params_m


def test_inconsistent_or_missing_calibration(tmp_path: Path) -> None:
    with pytest.raises(RunError, match="inconsistent"):
        fit_local(_measured(images_per_s=1e6), cpu_topology(2))
    with pytest.raises(RunError, match="images_per_s"):
        _measured(images_per_s=0)
    with pytest.raises(UsageError, match="run: deskpod plan calibrate"):
        load(tmp_path)
    (tmp_path / "plan").mkdir()
    (tmp_path / "plan" / "local.json").write_text("{}")
    with pytest.raises(UsageError, match="not a deskpod calibration"):
        load(tmp_path)


def test_cli_from_json(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setenv("DESKPOD_HOME", str(tmp_path / "home"))
    if local_topology().device_count < 2:
        pytest.skip("this box has fewer than 2 CPU slots")
    src = tmp_path / "m.json"
    src.write_text(json.dumps(asdict(_measured())))
    assert main(["plan", "calibrate", "--from-json", str(src)]) == 0
    assert "stored in" in capsys.readouterr().out
    assert main(["plan", "predict", "--machine", "local", "--model", "resnet18", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)[0]["machine"] == "local"
    (tmp_path / "bad.json").write_text("[]")
    assert main(["plan", "calibrate", "--from-json", str(tmp_path / "bad.json")]) == 2


@pytest.mark.slow
def test_real_calibration_on_this_box(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("DESKPOD_HOME", str(tmp_path))
    code = main(["plan", "calibrate", "--shape", "3x32x32", "--batch", "4", "--steps", "1", "--json"])
    out = json.loads(capsys.readouterr().out)
    assert code == 0 and out["factors"]["cpu_compute_efficiency"] > 0 and 0 < out["factors"]["comm_efficiency"] <= 1
    assert (tmp_path / "plan" / "local.json").exists()
