"""Software stacks: an input that changes the prediction, each fitted to its own table, named in every answer."""

from __future__ import annotations

import json
from dataclasses import asdict, replace
from pathlib import Path

import pytest

from deskpod.cli import main
from deskpod.errors import UsageError
from deskpod.hardware.topology import cpu_topology
from deskpod.plan.calibration import (
    DLE_MACHINE,
    DLE_POINTS,
    MACHINE,
    fit_stack,
    pytorch_2021_table,
    stack_table,
)
from deskpod.plan.factors import TRANSPOSE_MOVES, Factors, layout_bytes, sample_terms
from deskpod.plan.generations import HELD_OUT, held_out_table
from deskpod.plan.local import Measurements, fit_local, save
from deskpod.plan.predict import machine_facts, predict_plan
from deskpod.plan.report import NO_STACK, evaluate, markdown
from deskpod.plan.stacks import DEFAULT_STACK, PYTORCH_2021, STACKS, TF1_2017, find_stack
from deskpod.plan.workload import MODELS, Workload

R50_AMP = Workload(MODELS["resnet50"], batch=256, precision="fp16")


@pytest.mark.parametrize("name", list(STACKS))
def test_each_stack_owns_the_fit_of_its_own_table(name: str) -> None:
    fitted = fit_stack(name)
    for key, value in asdict(STACKS[name].factors).items():
        if isinstance(value, tuple):  # a fact of the stack (its layouts), carried by the fit unchanged
            assert asdict(fitted)[key] == value, (name, key)
        else:
            assert asdict(fitted)[key] == pytest.approx(value, rel=1e-4), (name, key)


def test_stacks_differ_and_each_is_fitted_to_another_table() -> None:
    assert TF1_2017.factors != PYTORCH_2021.factors
    assert "#tensorflow-2017" in TF1_2017.fitted_to and "#pytorch-2021" in PYTORCH_2021.fitted_to
    assert {r["machine"] for r in stack_table(TF1_2017.name)} == {MACHINE, "xeon-e5-2699v4-2s"}
    assert {r["machine"] for r in stack_table(PYTORCH_2021.name)} == {DLE_MACHINE}


def test_pytorch_2021_reproduces_its_table_within_what_the_report_says() -> None:
    rows = pytorch_2021_table()
    assert len(rows) == len(DLE_POINTS) == 8
    for r in rows:
        ratio = float(r["ratio"])
        if r["fitted"] and r["devices"] == 1:
            assert ratio == pytest.approx(1.0, abs=1e-3), r  # solved exactly
        elif r["fitted"] and r["precision"] == "fp32":
            assert ratio == pytest.approx(1.0, abs=1e-3), r  # sync_s is solved from it exactly
        elif r["fitted"]:
            assert 0.99 <= ratio <= 1.01, r  # AMP at 8 GPUs, the input pipeline's row: 0.998
        else:
            assert 0.96 <= ratio <= 0.975, r  # the DGX-1 16GB rows, not fitted: 0.963-0.970


def test_the_stack_is_an_input_that_changes_the_prediction() -> None:
    tf = predict_plan(R50_AMP, "dgx1-v100", stack="tf1-2017")
    pt = predict_plan(R50_AMP, "dgx1-v100", stack="pytorch-2021")
    default = predict_plan(R50_AMP, "dgx1-v100")
    assert (tf.stack, pt.stack, default.stack) == ("tf1-2017", "pytorch-2021", DEFAULT_STACK)
    assert default.images_per_s == pt.images_per_s != tf.images_per_s
    assert pt.compute_s < tf.compute_s  # 2021 software on the same V100: fewer memory passes per element
    # The hardware stays first principles under one stack: the same factors, the machine's own peak and bandwidth.
    a100 = predict_plan(R50_AMP, "dgx-a100", devices_per_node=1, stack="pytorch-2021")
    a100_80 = predict_plan(R50_AMP, "dgx-a100-80gb", devices_per_node=1, stack="pytorch-2021")
    assert a100_80.compute_s < a100.compute_s  # only the memory bandwidth differs
    f40, f80 = machine_facts("dgx-a100", "fp16"), machine_facts("dgx-a100-80gb", "fp16")
    assert (f40.memory_bandwidth_gbs, f80.memory_bandwidth_gbs) == (1555.0, 2039.0)
    assert (f40.peak_tflops, f40.cpu_cores, f40.devices) == (f80.peak_tflops, f80.cpu_cores, f80.devices)


def test_gradient_bytes_and_input_overlap_are_the_stacks() -> None:
    def comm(precision: str, stack: str) -> float:
        w = Workload(MODELS["resnet50"], batch=256, precision=precision)  # type: ignore[arg-type]
        return predict_plan(w, "dgx1-v100", stack=stack).comm_s

    # Native AMP keeps FP32 gradients: the all-reduce is the FP32 one; tf1-2017 all-reduces FP16 in FP16.
    assert comm("fp16", "pytorch-2021") == comm("fp32", "pytorch-2021")
    assert comm("fp16", "tf1-2017") < comm("fp32", "tf1-2017")
    # A pipeline that runs ahead shows only where it is slower than the GPUs; in series it always adds.
    fast_input = replace(PYTORCH_2021.factors, input_images_per_core=1e6)
    hidden = predict_plan(R50_AMP, "dgx1-v100", factors=fast_input)
    assert hidden.input_s == 0 and hidden.step_s == pytest.approx(hidden.compute_s + hidden.exposed_comm_s)
    slow = predict_plan(R50_AMP, "dgx1-v100", factors=replace(PYTORCH_2021.factors, input_images_per_core=10.0))
    decode = 256 * 8 / (10.0 * 40)
    busy = slow.compute_s + slow.exposed_comm_s  # the sync cost of 8 devices meeting is part of the busy step
    assert slow.step_s == pytest.approx(decode) and slow.input_s == pytest.approx(decode - busy)
    series = predict_plan(R50_AMP, "dgx1-v100", factors=replace(fast_input, input_overlap=False))
    assert series.input_s == pytest.approx(256 * 8 / (1e6 * 40))


def test_the_stacks_sync_cost_is_paid_once_a_step_only_where_devices_meet() -> None:
    sync = PYTORCH_2021.factors.sync_s
    assert sync > 0 and TF1_2017.factors.sync_s == 0
    one = predict_plan(R50_AMP, "dgx-a100-80gb", devices_per_node=1)
    eight = predict_plan(R50_AMP, "dgx-a100-80gb", devices_per_node=8)
    nodes = predict_plan(R50_AMP, "dgx-a100-80gb", 4)
    assert one.sync_s == 0 and one.exposed_comm_s == 0
    assert eight.sync_s == nodes.sync_s == sync  # per step, whatever the scale or the hardware
    assert eight.exposed_comm_s == pytest.approx(sync)  # NVSwitch's all-reduce hides behind the backward pass
    assert eight.step_s == pytest.approx(one.step_s + sync) and eight.compute_s == one.compute_s
    free = predict_plan(R50_AMP, "dgx-a100-80gb", devices_per_node=8, factors=replace(PYTORCH_2021.factors, sync_s=0))
    assert free.images_per_s == pytest.approx(8 * one.images_per_s)


def test_nchw_convolutions_on_tensor_cores_pay_layout_changes_and_nothing_else_does() -> None:
    def per_sample(precision: str, machine: str, stack: str) -> float:
        w = Workload(MODELS["resnet50"], batch=256, precision=precision)  # type: ignore[arg-type]
        return predict_plan(w, machine, devices_per_node=1, stack=stack).compute_s / 256

    r50 = MODELS["resnet50"]
    a100 = machine_facts("dgx-a100-80gb", "tf32")
    # pytorch-2021 trains TF32 in NCHW (configs.yml): each convolution element moves 6 more times, in FP32 bytes.
    extra = TRANSPOSE_MOVES * r50.conv_io_m * 1e6 * 4 / (a100.memory_bandwidth_gbs * 1e9)
    nhwc = replace(PYTORCH_2021.factors, channels_last=("tf32",))
    w = Workload(r50, batch=256, precision="tf32")
    with_layout = predict_plan(w, "dgx-a100-80gb", devices_per_node=1).compute_s
    without = predict_plan(w, "dgx-a100-80gb", devices_per_node=1, factors=nhwc).compute_s
    assert (with_layout - without) / 256 == pytest.approx(extra, rel=1e-9) and extra > 0
    plan = predict_plan(w, "dgx-a100-80gb", devices_per_node=1)
    assert plan.layout_s == pytest.approx(256 * extra) and plan.as_dict()["layout_s"] == plan.layout_s
    # AMP runs channels_last under pytorch-2021 and NCHW under tf1-2017; FP32 runs on CUDA cores either way;
    # the P100's FP16 has no Tensor Cores.
    for precision, machine in (("fp16", "dgx-a100-80gb"), ("fp32", "dgx-a100-80gb"), ("fp16", "dgx1-p100")):
        f = machine_facts(machine, precision)  # type: ignore[arg-type]
        wp = Workload(r50, precision=precision)  # type: ignore[arg-type]
        pays = layout_bytes(wp, f, TF1_2017.factors.channels_last)
        assert layout_bytes(wp, f, PYTORCH_2021.factors.channels_last) == 0
        assert (pays > 0) == (precision == "fp16" and machine == "dgx-a100-80gb"), (precision, machine)
        t = sample_terms(wp, f, TF1_2017.factors.channels_last)
        want = t.flops_s / TF1_2017.factors.compute_efficiency + TF1_2017.factors.memory_passes * t.pass_s
        assert per_sample(precision, machine, "tf1-2017") == pytest.approx(want + pays / (f.memory_bandwidth_gbs * 1e9))
    # The fitted V100 rows have none (FP32 on CUDA cores, AMP in channels_last): the fit is unchanged by the term.
    for p in DLE_POINTS:
        wp = Workload(MODELS[p.model], batch=p.batch, precision=p.precision)
        assert layout_bytes(wp, machine_facts(DLE_MACHINE, p.precision), PYTORCH_2021.factors.channels_last) == 0


def test_held_out_generations_are_other_machines_and_their_errors_are_computed() -> None:
    rows = held_out_table()
    assert len(rows) == len(HELD_OUT) == 4
    for h, r in zip(HELD_OUT, rows, strict=True):
        assert r["stack"] == h.stack == PYTORCH_2021.name and r["machine"] != DLE_MACHINE
        assert "not in the reference" in r["source"] and "@291f0d02" in r["source"]
        w = Workload(MODELS[h.model], batch=h.batch, precision=h.precision, data="real")
        want = predict_plan(w, h.machine, devices_per_node=h.gpus, stack=h.stack).images_per_s
        assert r["predicted"] == want and r["error_pct"] == pytest.approx((want / h.images_per_s - 1) * 100)
        other = predict_plan(w, h.machine, devices_per_node=h.gpus, stack=r["other_stack"]).images_per_s
        assert r["other_stack"] == TF1_2017.name and r["other_predicted"] == other != want  # comparison only


def test_report_labels_every_row_with_its_stack() -> None:
    rows = evaluate()
    for r in rows:
        assert r["stack"] in (*STACKS, NO_STACK), r
        assert r["marked"] == (r["software"] not in ("own", "peak"))
        if r["marked"]:  # another era's software: shown under the other stack too
            assert r["other_stack"] in STACKS and r["other_stack"] != r["stack"] and r["other_predicted"] > 0
    assert {r["stack"] for r in rows} == {*STACKS, NO_STACK}
    k80 = next(r for r in rows if r["claim"].startswith("8x K80 (GCE): ResNet-50"))
    assert k80["stack"] == TF1_2017.name and not k80["marked"]  # the fitted table's own page and software
    text = markdown(rows, stack_table(TF1_2017.name), held_out_table(), pytorch_2021_table())
    for r in rows:
        line = next(line for line in text.splitlines() if line.startswith(f"| {r['claim']} |"))
        cell = line.split(" | ")[2]
        assert cell.startswith(r["stack"] if r["stack"] != NO_STACK else "- (peak)"), line
        assert ("**marked**" in cell) == r["marked"]
    assert text.count("| pytorch-2021 | dgx-a100-80gb |") == 4
    assert f"## The fit of {TF1_2017.name}" in text and f"## The fit of {PYTORCH_2021.name}" in text


def test_cli_says_what_the_layout_costs_only_where_it_costs(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = _cli(capsys, "predict", "--machine", "dgx-a100-80gb", "--precision", "tf32", "--batch", "256")
    layout = predict_plan(Workload(MODELS["resnet50"], batch=256, precision="tf32"), "dgx-a100-80gb").layout_s
    assert code == 0 and f"compute includes {layout * 1e3:.1f} ms of layout changes per step (tf32" in out
    code, out, _ = _cli(capsys, "predict", "--machine", "dgx-a100-80gb", "--precision", "fp16", "--batch", "256")
    assert code == 0 and "layout" not in out.split("\n", 1)[1]  # AMP runs channels_last (the stack line aside)


def _cli(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(["plan", *argv])
    out, err = capsys.readouterr()
    return code, out, err


def test_cli_states_the_stack_and_refuses_unknown_ones(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = _cli(capsys, "predict", "--machine", "dgx1-v100", "--precision", "fp16", "--json")
    assert code == 0 and json.loads(out)[0]["stack"] == DEFAULT_STACK
    code, out, _ = _cli(capsys, "predict", "--machine", "dgx1-v100", "--precision", "fp16", "--stack", "tf1-2017")
    assert code == 0 and out.startswith("stack: tf1-2017 (TensorFlow")
    tf_rate = out.splitlines()[-1].split()[8]
    code, out, _ = _cli(capsys, "predict", "--machine", "dgx1-v100", "--precision", "fp16")
    assert out.startswith(f"stack: {DEFAULT_STACK} (PyTorch") and out.splitlines()[-1].split()[8] != tf_rate
    code, out, _ = _cli(capsys, "compare", "dgx1-p100", "dgx-a100-80gb", "--stack", "tf1-2017", "--json")
    assert code == 0 and {p["stack"] for p in json.loads(out)} == {"tf1-2017"}
    code, out, _ = _cli(capsys, "nodes", "--machine", "dgx1-v100", "--hours", "2", "--stack", "tf1-2017", "--json")
    assert code == 0 and json.loads(out)["stack"] == json.loads(out)["plan"]["stack"] == "tf1-2017"
    code, out, _ = _cli(capsys, "fit", "--stack", "pytorch-2021", "--json")
    assert code == 0 and [s["stack"] for s in json.loads(out)] == ["pytorch-2021"]
    for argv in (
        ["predict", "--stack", "tf2-2019"],
        ["fit", "--stack", "caffe"],
        ["compare", "dgx1-p100", "--stack", "x"],
    ):
        code, _, err = _cli(capsys, *argv)
        lines = err.strip().splitlines()
        assert code == 2 and len(lines) == 1, err
        assert f"unknown stack {argv[-1]!r}; valid: pytorch-2021, tf1-2017" in lines[0]


def test_machine_local_is_its_own_stack(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    m = Measurements(kind="cpu", devices=2, cores=2, peak_tflops=0.1, memory_bandwidth_gbs=20.0, model="resnet18",
                     batch=8, shape=(3, 112, 112), images_per_s=60.0, comm_busbw_gbs=2.0)  # fmt: skip
    save(fit_local(m, cpu_topology(2)), tmp_path)
    w = Workload(MODELS["resnet18"], batch=8, data="synthetic")
    assert predict_plan(w, "local", devices_per_node=1, home=tmp_path).stack == "local"
    with pytest.raises(UsageError, match="machine 'local' is predicted with its own calibration"):
        predict_plan(w, "local", devices_per_node=1, home=tmp_path, stack="tf1-2017")
    with pytest.raises(UsageError, match="stack 'local' is machine 'local''s own calibration"):
        find_stack("local")
    assert predict_plan(w, "dgx1-p100", factors=Factors()).stack == "custom"  # explicit factors are not a stack
