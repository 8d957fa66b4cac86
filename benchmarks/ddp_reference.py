"""The plain reference for `deskpod bench train`: a minimal hand-written torchrun + DDP loop.

Nothing deskpod: torchvision's model, one fixed synthetic batch on the device, SGD, autocast,
DistributedDataParallel. `deskpod bench train` runs it beside deskpod's trainer with the same
model, input shape, batch and devices, so the table shows deskpod's overhead as a ratio.

    torchrun --standalone --nproc_per_node 2 benchmarks/ddp_reference.py --model resnet18 \
        --shape 3x64x64 --batch-size 32 --steps 30 --warmup 5

Rank 0 prints one JSON line: {"images_per_s": ..., "world_size": ..., ...}.
"""

from __future__ import annotations

import argparse
import json
import time

import torch
import torch.distributed as dist
import torchvision
from reference_ddp import join_ddp
from torch.nn.parallel import DistributedDataParallel as DDP


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--model", default="resnet18")
    p.add_argument("--shape", default="3x64x64")
    p.add_argument("--num-classes", type=int, default=1000)
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--steps", type=int, default=30)
    p.add_argument("--warmup", type=int, default=5)
    p.add_argument("--precision", default="fp32", choices=["fp32", "bf16", "fp16"])
    args = p.parse_args()

    device, local_rank, cuda = join_ddp()
    world = dist.get_world_size()

    torch.manual_seed(0)
    c, h, w = (int(v) for v in args.shape.split("x"))
    model = getattr(torchvision.models, args.model)(weights=None, num_classes=args.num_classes)
    fmt = torch.channels_last if cuda else torch.contiguous_format
    model = model.to(device, memory_format=fmt)
    model = DDP(model, device_ids=[local_rank] if cuda else None, gradient_as_bucket_view=True)
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9, weight_decay=5e-4)
    x = torch.randn(args.batch_size, c, h, w, device=device).contiguous(memory_format=fmt)
    y = torch.randint(0, args.num_classes, (args.batch_size,), device=device)
    dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}.get(args.precision)
    scaler = torch.amp.GradScaler("cuda", enabled=args.precision == "fp16" and cuda)

    def sync() -> None:
        if cuda:
            torch.cuda.synchronize()
        dist.barrier()

    start = 0.0
    for i in range(args.warmup + args.steps):
        if i == args.warmup:
            sync()
            start = time.perf_counter()
        opt.zero_grad(set_to_none=True)
        with torch.autocast(device.type, dtype=dtype or torch.float32, enabled=dtype is not None):
            loss = torch.nn.functional.cross_entropy(model(x), y)
        scaler.scale(loss).backward()
        scaler.step(opt)
        scaler.update()
    sync()
    elapsed = time.perf_counter() - start
    if dist.get_rank() == 0:
        rate = args.steps * args.batch_size * world / elapsed
        print(json.dumps({"images_per_s": rate, "world_size": world, "elapsed_s": elapsed, "loss": float(loss)}))
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
