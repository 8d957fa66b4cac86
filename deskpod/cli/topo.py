"""``deskpod topo``: show a machine's topology — this box, a catalog machine, or an nvidia-smi file.

deskpod topo                          this box (NVML, or CPU slots without a GPU)
deskpod topo --machine dgx1-v100      a reference machine (deskpod topo --list shows them)
deskpod topo --from topo.txt          the saved output of `nvidia-smi topo -m`
deskpod topo --machine dgx1 --place 4 --free 0,1,2,3,5    where placement would put a 4-device job
... --json                            the description as JSON (schema deskpod.topo/1)
... --png links.png                   a picture of the link graph
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from deskpod.hardware.topology import Topology


def register(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    p = sub.add_parser("topo", help="show a machine's GPU/NIC topology and where jobs would be placed")
    src = p.add_mutually_exclusive_group()
    src.add_argument("--machine", metavar="NAME", help="a reference machine from the catalog")
    src.add_argument("--from", dest="from_file", metavar="FILE", help="a file holding `nvidia-smi topo -m` output")
    src.add_argument("--list", action="store_true", help="list the catalog of reference machines")
    p.add_argument("--gpu", metavar="GPU", help="GPU generation for --from bandwidths (P100, V100, A100, H100, H200)")
    p.add_argument("--json", action="store_true", help="print JSON instead of text")
    p.add_argument("--png", metavar="FILE", help="also draw the link graph to FILE")
    p.add_argument("--place", type=int, metavar="K", help="ask placement for K devices")
    p.add_argument("--free", metavar="LIST", help="free devices for --place, e.g. 0,1,4 (default: all)")
    p.add_argument("--policy", default="best", help="placement policy: best, pack, partition:<name>")
    p.add_argument("--rings", action="store_true", help="also show the rings a collective over all devices would use")
    p.set_defaults(func=run)


def find_topology(machine: str | None, topo_file: str | None, *, gpu: str | None = None) -> Topology:
    """The topology asked for: a catalog machine, an nvidia-smi file (its GPUs' generation ``gpu``, for their
    bandwidths), or this box (``deskpod topo``, ``deskpod cluster env``)."""
    if machine:
        from deskpod.hardware.catalog import find_machine

        return find_machine(machine).topology()
    if topo_file:
        from pathlib import Path

        from deskpod.hardware.topo_matrix import matrix_to_topology, read_topo_matrix

        path = Path(topo_file)
        matrix = read_topo_matrix(path)
        for note in matrix.notes:
            print(f"deskpod: warning: {note}", file=sys.stderr)
        return matrix_to_topology(matrix, path.stem, gpu=gpu, source=f"file:{path}")
    from deskpod.hardware.placement import local_topology

    return local_topology()


def run(args: argparse.Namespace) -> int:
    from deskpod.errors import UsageError
    from deskpod.hardware.catalog import machines

    if args.list:
        return _list(args.json, machines())
    if args.gpu and not args.from_file:
        raise UsageError("--gpu applies to --from FILE only (catalog machines and this box know their GPUs)")
    topology = find_topology(args.machine, args.from_file, gpu=args.gpu)
    if args.place is not None:
        return _place(args, topology)
    if args.free is not None or args.policy != "best":
        raise UsageError("--free and --policy go with --place K")
    from deskpod.hardware.summary import describe, format_summary
    from deskpod.hardware.topo_matrix import format_topo_matrix

    info = describe(topology)
    ring_lines: list[str] = []
    if args.rings:
        # Rings come from the collectives layer (deskpod.comm), which builds them on this topology like NCCL.
        from deskpod.comm.rings import build_rings

        ring_set = build_rings(topology)  # type: ignore[arg-type]
        info["rings"] = {"kind": ring_set.kind, "rings": [list(r) for r in ring_set.rings],
                         "bandwidths": list(ring_set.bandwidths), "total_bandwidth": ring_set.bandwidth}  # fmt: skip
        ring_lines = ring_set.describe(topology)  # type: ignore[arg-type]
    if args.png:
        from deskpod.hardware.diagram import render_png

        render_png(topology, args.png)
    if args.json:
        print(json.dumps(info, indent=2))
    else:
        print(format_topo_matrix(topology, legend=False))
        print(format_summary(info), end="")
        if ring_lines:
            print("  rings (as NCCL would build them for all devices):")
            print("\n".join("    " + line for line in ring_lines))
        if args.png:
            print(f"link graph written to {args.png}")
    return 0


def _place(args: argparse.Namespace, topology: Topology) -> int:
    from deskpod.errors import UsageError
    from deskpod.hardware.placement import Placement, place

    n = topology.device_count
    if args.free is None:
        free = list(range(n))
    else:
        parts = [x.strip() for x in args.free.split(",") if x.strip()]
        if not all(x.isascii() and x.isdigit() for x in parts):
            raise UsageError(f"--free {args.free!r}: not a device list; use indices like 0,2,3")
        free = [int(x) for x in parts]
    result = place(topology, free, args.place, policy=args.policy)
    if isinstance(result, Placement):
        out = {"devices": list(result.devices), "ring_bandwidth_gbps": result.ring_bandwidth, "reason": result.reason}
        if args.json:
            print(json.dumps(out, indent=2))
        else:
            devs = ",".join(map(str, result.devices))
            print(f"{devs}: ring {result.ring_bandwidth:g} GB/s per direction; {result.reason}")
        return 0
    if not result.ever:
        raise UsageError(result.reason)
    if args.json:
        print(json.dumps({"unplaceable": result.reason, "ever": result.ever}, indent=2))
    else:
        print(f"cannot place now: {result.reason}")
    return 1


def _list(as_json: bool, catalog: object) -> int:
    from deskpod.hardware.catalog import Machine

    assert isinstance(catalog, tuple)
    rows: list[Machine] = list(catalog)
    if as_json:
        print(
            json.dumps(
                [
                    {
                        "name": m.name,
                        "title": m.title,
                        "aliases": list(m.aliases),
                        "kind": m.kind,
                        "devices": m.device_count,
                        "topology_source": m.topology_source,
                    }
                    for m in rows
                ],
                indent=2,
            )
        )
        return 0
    width = max(len(m.name) for m in rows)
    for m in rows:
        print(f"{m.name:<{width}}  {m.title}")
    return 0
