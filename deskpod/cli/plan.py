"""``deskpod plan``: predict training on catalog machines before buying or waiting for them.

deskpod plan predict --model resnet50 --machine dgx1-v100 --nodes 4 --precision fp16
deskpod plan predict --machine dgx1-p100 --stack tf1-2017   # the 2017 TensorFlow software, not the default
deskpod plan compare --model alexnet dgx1-p100 xeon-e5-2697v3-2s dgx1-p100:124
deskpod plan match --model resnet50 --machine xeon-e5-2697v3-2s --target dgx1-p100
deskpod plan nodes --model resnet50 --machine dgx1-v100 --hours 1
deskpod plan comm dgx1-v100 --devices 0,1,2,3 --nodes 2
deskpod plan fit --stack pytorch-2021

Every prediction is made under a named software stack (`deskpod.plan.stacks`; default pytorch-2021,
machine ``local``: its own calibration) and says which, in text and in --json.
"""

from __future__ import annotations

import argparse
import json
from typing import Any

_STACK_HELP = (
    "software stack whose fitted factors predict: pytorch-2021 (default; PyTorch 21.03, AMP, DALI) or tf1-2017 "
    "(TensorFlow, May 2017, FP32); machine local uses its own calibration (stack local)"
)


def _workload_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model", default="resnet50", help="alexnet, resnet18, resnet50 (default), or give --gflops")
    p.add_argument("--gflops", type=float, default=None, help="forward GFLOPs per sample (instead of --model)")
    p.add_argument("--params", type=float, default=None, help="millions of parameters (with --gflops)")
    p.add_argument("--activations", type=float, default=None, help="millions of activation elements per sample")
    p.add_argument("--batch", type=int, default=None, help="samples per device per step (default 64)")
    p.add_argument("--global-batch", type=int, default=None, help="samples per step over all devices instead")
    p.add_argument("--precision", default="fp32", help="fp32 (default), tf32, fp16, bf16")
    p.add_argument("--dataset-images", type=int, default=None, help="images per epoch (default ImageNet-1k)")
    p.add_argument("--epochs", type=float, default=90.0)
    p.add_argument("--data", default="real", choices=["real", "synthetic"], help="real adds the CPU input pipeline")
    p.add_argument("--network", default=None, help="NICs x Gb/s per node, e.g. 4x100 (default: the catalog's)")
    p.add_argument("--stack", default=None, help=_STACK_HELP)
    p.add_argument("--json", action="store_true", help="print only JSON")


def register(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    p = sub.add_parser("plan", help="predict training time, throughput, energy and cost on catalog machines")
    p.add_argument(
        "--calibrate", action="store_true", help="measure this box and fit machine 'local' (same as `plan calibrate`)"
    )
    p.set_defaults(func=run_root)
    plan = p.add_subparsers(dest="plan_command", metavar="WHAT")

    q = plan.add_parser("predict", help="one machine x N nodes: step breakdown, images/s, time, energy, cost")
    q.add_argument("--machine", default="dgx1-p100")
    q.add_argument("--nodes", type=int, default=1)
    q.add_argument("--devices", type=int, default=None, help="devices per node (default: all)")
    _workload_args(q)
    q.set_defaults(func=run_predict)

    c = plan.add_parser("compare", help="machines side by side (MACHINE or MACHINE:NODES)")
    c.add_argument("machines", nargs="+", metavar="MACHINE[:NODES]")
    _workload_args(c)
    c.set_defaults(func=run_compare)

    m = plan.add_parser("match", help="how many nodes of --machine match --target (MACHINE[:NODES])")
    m.add_argument("--machine", required=True)
    m.add_argument("--target", required=True, metavar="MACHINE[:NODES]")
    _workload_args(m)
    m.set_defaults(func=run_match)

    n = plan.add_parser("nodes", help="fewest nodes reaching a throughput (--images-per-s) or a time (--hours)")
    n.add_argument("--machine", required=True)
    goal = n.add_mutually_exclusive_group(required=True)
    goal.add_argument("--images-per-s", type=float, default=None)
    goal.add_argument("--hours", type=float, default=None, help="time to train")
    _workload_args(n)
    n.set_defaults(func=run_nodes)

    r = plan.add_parser("comm", help="rings through a machine's devices and predicted bus bandwidth per size")
    r.add_argument("machine")
    r.add_argument("--devices", default=None, help="comma list of device indices (default: all)")
    r.add_argument("--nodes", type=int, default=1)
    r.add_argument("--collective", default="all_reduce")
    r.add_argument("--network", default=None, help="NICs x Gb/s per node, e.g. 4x100 (default: the nearest NICs)")
    r.add_argument("--json", action="store_true")
    r.set_defaults(func=run_comm)

    rep = plan.add_parser("report", help="Markdown + PNG: the DGX-1's headline claims against the model, with errors")
    rep.add_argument("--out", default="plan-report", help="folder for report.md and the plots (default plan-report)")
    rep.set_defaults(func=run_report)

    cal = plan.add_parser(
        "calibrate", help="measure this box (doctor, bench train, bench comm) and fit machine 'local'"
    )
    cal.add_argument("--model", default="resnet18", help="model bench train runs (default resnet18)")
    cal.add_argument("--shape", default="3x112x112", help="synthetic input CxHxW (default 3x112x112)")
    cal.add_argument("--batch", type=int, default=8, help="samples per device (default 8)")
    cal.add_argument("--steps", type=int, default=3, help="timed training steps (default 3)")
    cal.add_argument("--from-json", default=None, metavar="FILE", help="fit recorded measurements instead of measuring")
    cal.add_argument("--out", default=None, metavar="FILE",
                     help="write the calibration to FILE instead of DESKPOD_HOME/plan/local.json (the dashboard's "
                          "calibration job hands it to its pod so)")  # fmt: skip
    cal.add_argument("--json", action="store_true")
    cal.set_defaults(func=run_calibrate)

    f = plan.add_parser("fit", help="refit each stack's factors to its own table and show the fit")
    f.add_argument("--stack", default=None, help="one stack (default: every catalog stack)")
    f.add_argument("--json", action="store_true")
    f.set_defaults(func=run_fit)


def _split(text: str) -> tuple[str, int]:
    from deskpod.errors import UsageError

    name, _, count = text.partition(":")
    if not count:
        return name, 1
    if not (count.isascii() and count.isdigit()) or int(count) < 1:
        raise UsageError(f"bad machine {text!r}; write MACHINE or MACHINE:NODES, e.g. dgx1-p100:124")
    return name, int(count)


def _workload(args: argparse.Namespace, devices: int = 1) -> Any:
    from deskpod.errors import UsageError
    from deskpod.plan.workload import IMAGENET_TRAIN_IMAGES, Workload, custom_model, find_model

    if args.gflops is not None or args.params is not None:
        if args.gflops is None or args.params is None:
            raise UsageError("give both --gflops and --params for a custom model")
        model = custom_model(args.gflops, args.params, args.activations)
    else:
        model = find_model(args.model)
    batch = args.batch if args.batch is not None else 64
    if args.global_batch is not None:
        if args.batch is not None:
            raise UsageError("give --batch (per device) or --global-batch, not both")
        if args.global_batch < devices:
            raise UsageError(f"global batch {args.global_batch} is fewer samples than the {devices} devices")
        batch = args.global_batch // devices
    return Workload(
        model, batch=batch, precision=args.precision,
        dataset_images=args.dataset_images if args.dataset_images is not None else IMAGENET_TRAIN_IMAGES,
        epochs=args.epochs, data=args.data,
    )  # fmt: skip


def _network(text: str | None) -> Any:
    from deskpod.comm.cost import parse_network

    return parse_network(text) if text else None


def _devices_of(machine: str, precision: str, nodes: int, per_node: int | None = None) -> int:
    from deskpod.plan.predict import machine_facts

    return (per_node or machine_facts(machine, precision).devices) * nodes  # type: ignore[arg-type]


def _hours(s: float) -> str:
    return f"{s / 3600:.2f} h" if s >= 3600 else f"{s / 60:.1f} min"


def _print_plans(plans: list[Any], as_json: bool) -> None:
    if as_json:
        print(json.dumps([p.as_dict() for p in plans], indent=2))
        return
    from deskpod.plan.stacks import STACKS

    for name in dict.fromkeys(p.stack for p in plans):
        s = STACKS.get(name)
        about = f"{s.title}; factors fitted to {s.fitted_to}" if s else "this box as deskpod plan calibrate measured it"
        print(f"stack: {name} ({about})")
    head = f"{'machine':<20}{'nodes':>6}{'dev':>5}{'compute ms':>11}{'comm ms':>9}{'exposed':>9}{'input':>8}" \
           f"{'step ms':>9}{'images/s':>11}{'scaling':>8}{'train':>10}{'energy kWh':>11}{'price $':>13}"  # fmt: skip
    print(head)
    for p in plans:
        price = f"{p.price_usd:,.0f}" if p.price_usd is not None else "-"
        print(f"{p.machine:<20}{p.nodes:>6}{p.devices_per_node:>5}{p.compute_s * 1e3:>11.1f}{p.comm_s * 1e3:>9.1f}"
              f"{p.exposed_comm_s * 1e3:>9.1f}{p.input_s * 1e3:>8.1f}{p.step_s * 1e3:>9.1f}{p.images_per_s:>11,.0f}"
              f"{p.scaling_efficiency:>8.1%}{_hours(p.time_to_train_s):>10}{p.energy_kwh:>11,.0f}{price:>13}")  # fmt: skip
    for p in plans:
        if p.layout_s > 0:
            print(f"{p.machine}: compute includes {p.layout_s * 1e3:.1f} ms of layout changes per step ({p.precision} "
                  f"convolutions in NCHW on Tensor Cores, as stack {p.stack} runs them; channels_last pays none)")  # fmt: skip


def run_predict(args: argparse.Namespace) -> int:
    from deskpod.plan.predict import predict_plan

    w = _workload(args, _devices_of(args.machine, args.precision, args.nodes, args.devices))
    plan = predict_plan(w, args.machine, args.nodes, devices_per_node=args.devices, network=_network(args.network),
                        stack=args.stack)  # fmt: skip
    _print_plans([plan], args.json)
    return 0


def run_compare(args: argparse.Namespace) -> int:
    from deskpod.plan.predict import predict_plan

    plans = []
    for text in args.machines:
        name, nodes = _split(text)
        w = _workload(args, _devices_of(name, args.precision, nodes))
        plans.append(predict_plan(w, name, nodes, network=_network(args.network), stack=args.stack))
    _print_plans(plans, args.json)
    if not args.json and len(plans) > 1:
        base = plans[0]
        for p in plans[1:]:
            print(
                f"{p.machine}:{p.nodes} vs {base.machine}:{base.nodes}: {p.images_per_s / base.images_per_s:.3g}x the images/s"
            )
    return 0


def run_match(args: argparse.Namespace) -> int:
    from deskpod.plan.predict import machine_facts, match_nodes, predict_plan

    name, nodes = _split(args.target)
    target = predict_plan(_workload(args, _devices_of(name, args.precision, nodes)), name, nodes, stack=args.stack)
    w = _workload(args, _devices_of(args.machine, args.precision, 1))
    single = predict_plan(w, args.machine, 1, stack=args.stack)
    ideal = target.images_per_s / single.images_per_s
    needed: int | None = None
    note = ""
    if single.images_per_s >= target.images_per_s:
        needed = 1
    elif args.network or machine_facts(args.machine, w.precision).topology.nics:
        needed = match_nodes(w, args.machine, target.images_per_s, network=_network(args.network), stack=args.stack)
        note = "" if needed else ", and no node count up to the bound reaches it"
    else:
        note = f" ({single.machine} has no NICs in the catalog: give --network to count communication)"
    out = {"stack": single.stack, "target_stack": target.stack, "target": f"{target.machine}:{target.nodes}",
           "target_images_per_s": target.images_per_s,
           "machine": single.machine, "single_node_images_per_s": single.images_per_s,
           "ideal_nodes": ideal, "nodes_with_communication": needed}  # fmt: skip
    if args.json:
        print(json.dumps(out, indent=2))
    else:
        print(f"stack: {single.stack}" + (f" (target: {target.stack})" if target.stack != single.stack else ""))
        print(f"{target.machine}:{target.nodes} trains {w.model.name} at {target.images_per_s:,.0f} images/s; "
              f"one {single.machine} at {single.images_per_s:,.1f}: {ideal:,.1f} of them with perfect scaling"
              + (f", {needed:,} counting communication" if needed else "") + note)  # fmt: skip
    return 0


def run_nodes(args: argparse.Namespace) -> int:
    from deskpod.errors import UsageError
    from deskpod.plan.predict import match_nodes, predict_plan

    w = _workload(args, _devices_of(args.machine, args.precision, 1))
    if args.hours is not None:
        if args.hours <= 0:
            raise UsageError(f"--hours must be positive, got {args.hours}")
        target = w.dataset_images * w.epochs / (args.hours * 3600)
    else:
        target = args.images_per_s
    needed = match_nodes(w, args.machine, target, network=_network(args.network), stack=args.stack)
    if needed is None:
        raise UsageError(f"no node count up to the bound reaches {target:,.0f} images/s on {args.machine}")
    plan = predict_plan(w, args.machine, needed, network=_network(args.network), stack=args.stack)
    if args.json:
        print(json.dumps({"nodes": needed, "stack": plan.stack, "target_images_per_s": target, "plan": plan.as_dict()},
                         indent=2))  # fmt: skip
    else:
        print(f"{needed} x {plan.machine} reach {target:,.0f} images/s (predicted {plan.images_per_s:,.0f}):")
        _print_plans([plan], False)
    return 0


def run_comm(args: argparse.Namespace) -> int:
    from deskpod.comm.collectives import parse_collectives
    from deskpod.comm.cost import predict
    from deskpod.comm.rings import build_rings
    from deskpod.errors import UsageError
    from deskpod.hardware.catalog import machine

    topo = machine(args.machine)
    devices = None
    if args.devices:
        try:
            devices = [int(d) for d in args.devices.split(",") if d.strip()]
        except ValueError:
            raise UsageError(f"bad --devices {args.devices!r}; write indices like 0,1,2,3") from None
    (collective,) = parse_collectives(args.collective)[:1]
    rings = build_rings(topo, devices)
    sizes = [1 << s for s in range(3, 31, 3)]
    rows = [
        predict(topo, collective, s, devices=devices, nodes=args.nodes, network=_network(args.network)) for s in sizes
    ]
    if args.json:
        print(json.dumps({"rings": [list(r) for r in rings.rings], "ring_bandwidth": rings.bandwidth,
                          "predictions": [{"size": p.size, "time_us": p.time_s * 1e6, "algbw": p.algbw,
                                           "busbw": p.busbw, "algorithm": p.algorithm, "protocol": p.protocol}
                                          for p in rows]}, indent=2))  # fmt: skip
        return 0
    print("\n".join(rings.describe(topo)))
    print(
        f"# predicted {collective}, {len(rings.devices)} devices x {args.nodes} node(s) (alpha-beta model, link-rate bound)"
    )
    print(f"# {'size(B)':>12}{'time(us)':>12}{'algbw(GB/s)':>13}{'busbw(GB/s)':>13}  algorithm")
    for p in rows:
        print(f"  {p.size:>12}{p.time_s * 1e6:>12.1f}{p.algbw:>13.3f}{p.busbw:>13.3f}  {p.algorithm}/{p.protocol}")
    return 0


def run_fit(args: argparse.Namespace) -> int:
    from dataclasses import asdict

    from deskpod.plan.calibration import CPU_SOURCE, fit_stack, stack_table
    from deskpod.plan.stacks import STACKS, find_stack

    names = [find_stack(args.stack).name] if args.stack else list(STACKS)
    out: list[dict[str, Any]] = []
    for name in names:
        factors = fit_stack(name)
        s = STACKS[name]
        out.append({"stack": name, "title": s.title, "fitted_to": s.fitted_to, "not_fitted": s.not_fitted,
                    "cpu_source": CPU_SOURCE, "factors": asdict(factors), "points": stack_table(name, factors)})  # fmt: skip
    if args.json:
        print(json.dumps(out, indent=2))
        return 0
    for o in out:
        print(f"stack {o['stack']}: {o['title']}")
        print(f"fitted to {o['fitted_to']}; cpu_compute_efficiency to {o['cpu_source']}; not fitted: {o['not_fitted']}")
        for k, v in o["factors"].items():
            print(f"  {k} = {v}")
        print(f"{'machine':<19}{'model':<10}{'dev':>4}{'prec':>6}{'batch':>6}{'data':>11}{'published':>11}"
              f"{'predicted':>11}{'ratio':>7}  fitted")  # fmt: skip
        for r in o["points"]:
            print(
                f"{r['machine']:<19}{r['model']:<10}{r['devices']:>4}{r['precision']:>6}{r['batch']:>6}{r['data']:>11}"
                f"{r['published']:>11}{r['predicted']:>11}{r['ratio']:>7}  {'yes' if r['fitted'] else 'no'}"
            )
        print()
    return 0


def run_report(args: argparse.Namespace) -> int:
    from pathlib import Path

    from deskpod.errors import UsageError
    from deskpod.plan.report import write_report

    out = Path(args.out)
    if out.exists() and not out.is_dir():
        raise UsageError(f"--out {out} exists and is not a folder")
    path = write_report(out)
    print(path.read_text())
    print(f"wrote {path}, {out / 'claims.png'}, {out / 'calibration.png'}")
    return 0


def run_root(args: argparse.Namespace) -> int:
    """``deskpod plan --calibrate`` (with no WHAT): calibrate with the defaults of ``plan calibrate``."""
    from deskpod.errors import UsageError

    if not args.calibrate:
        raise UsageError("deskpod plan needs WHAT: predict, compare, match, nodes, comm, report, calibrate or fit")
    defaults = {"model": "resnet18", "shape": "3x112x112", "batch": 8, "steps": 3, "from_json": None, "out": None,
                "json": False}  # fmt: skip
    return run_calibrate(argparse.Namespace(**{**defaults, **vars(args)}))


def run_calibrate(args: argparse.Namespace) -> int:
    from pathlib import Path

    from deskpod.environment import Environment
    from deskpod.hardware.placement import local_topology
    from deskpod.plan.local import fit_local, measure, read_measurements, save, summary

    if args.from_json:
        measured = read_measurements(Path(args.from_json))
    else:
        measured = measure(args.model, args.shape, args.batch, args.steps,
                           log=lambda text: None if args.json else print(text, flush=True))  # fmt: skip
    cal = fit_local(measured, local_topology())
    if args.out:
        path = Path(args.out)
        path.write_text(cal.to_json())
    else:
        path = save(cal, Environment.read().home)
    if args.json:
        print(json.dumps(summary(cal), indent=2))
        return 0
    m = cal.measurements
    print(f"measured: {m.devices} {m.kind} device(s): {m.peak_tflops:.4g} TFLOP/s fp32 and {m.memory_bandwidth_gbs:.4g} GB/s "
          f"each; {m.model} {m.shape[1]}x{m.shape[2]} batch {m.batch}: {m.images_per_s:.4g} images/s; "
          f"all-reduce busbw {m.comm_busbw_gbs:.4g} GB/s (ring model {cal.ring_bandwidth:g} GB/s)")  # fmt: skip
    if m.kind == "cpu":
        print(f"fitted: cpu_compute_efficiency {cal.factors.cpu_compute_efficiency}, "
              f"comm_efficiency {cal.factors.comm_efficiency} (overlap as fitted on the DGX-1: {cal.factors.overlap})")  # fmt: skip
    else:
        print(f"fitted: compute_efficiency {cal.factors.compute_efficiency}, comm_efficiency {cal.factors.comm_efficiency} "
              f"(others as fitted on the DGX-1: memory_passes {cal.factors.memory_passes}, overlap {cal.factors.overlap})")  # fmt: skip
    print(f"stored in {path}; use it with: deskpod plan predict --machine local (stack 'local': this box's software)")
    return 0
