"""The plain reference for `bench_lung_train.py`: a hand-written torchrun + DDP loop around MONAI's detector.

What a MONAI user writes without deskpod: the same RetinaNet (built by MONAI's classes, as
`deskpod.lung.detect.build_detector` configures them), the same crops of the same cached scans,
DistributedDataParallel, SGD, autocast, and nothing else — no checkpoints, metrics, stop agreement or
progress. Rank 0 prints one JSON line: {"crops_per_s": ..., "world_size": ...}.

    torchrun --standalone --nproc_per_node 2 benchmarks/reference_lung_detector.py --data PATH \
        --spacing 1.4x1.4x2.5 --patch 64x64x32 --model retinanet3d-small --batch-size 2 --steps 20 --warmup 3
"""

from __future__ import annotations

import argparse
import json
import os
import time

import numpy as np
import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

from deskpod.lung.detect import DetectorModel
from deskpod.lung.luna16 import PatchSource, cache_folder, ensure_cache, read_layout, samples_of, split


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--data", required=True)
    p.add_argument("--spacing", default="1.4x1.4x2.5")
    p.add_argument("--patch", default="64x64x32")
    p.add_argument("--model", default="retinanet3d-small")
    p.add_argument("--cache", default="")
    p.add_argument("--batch-size", type=int, default=2)
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--lr", type=float, default=0.01)
    args = p.parse_args()

    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "1")))
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    spacing = tuple(float(v) for v in args.spacing.split("x"))
    patch = tuple(int(v) for v in args.patch.split("x"))
    layout = read_layout(args.data)
    train, _ = split(layout, -1)
    folder = cache_folder(layout.root, spacing, args.cache)  # type: ignore[arg-type]
    ensure_cache(layout, train, spacing, folder, rank, world)  # type: ignore[arg-type]
    source = PatchSource(layout, samples_of(layout, train, 1, 20), folder, patch, 0, augment=True)  # type: ignore[arg-type]

    torch.manual_seed(0)
    model = DDP(DetectorModel(args.model, spacing))  # type: ignore[arg-type]
    opt = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=0.9, weight_decay=5e-4)
    order = np.random.default_rng(rank).permutation(len(source))
    batches = source.batches(iter(order[i : i + args.batch_size].tolist()
                                  for i in range(0, len(order) - args.batch_size + 1, args.batch_size)), 0)  # fmt: skip
    t0 = 0.0
    for step in range(args.steps):
        if step == args.warmup:
            dist.barrier()
            t0 = time.perf_counter()
        b = next(batches)
        opt.zero_grad(set_to_none=True)
        loss = model(b.images, b.targets)
        loss.backward()
        opt.step()
    dist.barrier()
    elapsed = time.perf_counter() - t0
    if rank == 0:
        crops = (args.steps - args.warmup) * args.batch_size * world
        print(json.dumps({"crops_per_s": crops / elapsed, "world_size": world, "elapsed_s": elapsed}), flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
