"""The plain reference for `benchmarks/bench_cluster.py`: a hand-written DDP loop for ``srun torchrun``.

Nothing of deskpod: torchvision's model (random init), a pool of 64 synthetic images made once and
indexed like deskpod's synthetic data, SGD with momentum, DistributedDataParallel over Gloo (NCCL on
GPUs). The batch script that runs it is plain Slurm, one torchrun agent per node::

    srun --nodes=2 --ntasks=2 torchrun --nnodes 2 --nproc-per-node 1 --rdzv-backend c10d \
        --rdzv-endpoint node1:PORT --rdzv-id $SLURM_JOB_ID benchmarks/reference_ddp.py \
        --model resnet18 --shape 3x64x64 --global-batch 16 --steps 10 --first-step-file first-step.json

As soon as the first optimizer step is done, global rank 0 writes ``{"first_step_at": time.time(),
"worker_started_at": ...}`` (when its own code began, after torch's import) to ``--first-step-file``,
atomically; at the end it prints one JSON line: images/s over the steps after the first, the world
size and the last loss.
"""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

POOL = 64  # synthetic images made once and reused, as deskpod's synthetic data does


def write_atomic(path: Path, text: str) -> None:
    tmp = path.with_name(f".{path.name}.{os.getpid()}")
    tmp.write_text(text)
    os.replace(tmp, path)


def join_ddp() -> tuple[torch.device, int, bool]:
    """This torchrun worker's device, local rank and whether it is a GPU, in the joined process group: its GPU
    and NCCL, or the CPU (``OMP_NUM_THREADS`` threads) and Gloo. Both plain references start this way."""
    cuda = torch.cuda.is_available() and os.environ.get("CUDA_VISIBLE_DEVICES", "x") != ""
    local_rank = int(os.environ["LOCAL_RANK"])
    if cuda:
        torch.cuda.set_device(local_rank)
        device = torch.device("cuda", local_rank)
    else:
        torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "1")))
        device = torch.device("cpu")
    dist.init_process_group("nccl" if cuda else "gloo")
    return device, local_rank, cuda


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default="resnet18", help="a torchvision model name")
    p.add_argument("--shape", default="3x64x64", help="synthetic input CxHxW")
    p.add_argument("--num-classes", type=int, default=1000)
    p.add_argument("--global-batch", type=int, default=16, help="samples per step over all workers")
    p.add_argument("--steps", type=int, default=10)
    p.add_argument("--seed", type=int, default=3)
    p.add_argument("--first-step-file", type=Path, required=True)
    args = p.parse_args()
    started = time.time()  # after torch's import: where deskpod's worker writes its pid file
    import torchvision  # after it, as deskpod's worker imports it when it builds the model

    device, local_rank, cuda = join_ddp()
    rank, world = dist.get_rank(), dist.get_world_size()
    if args.global_batch % world:
        raise SystemExit(f"--global-batch {args.global_batch} does not divide by {world} workers")
    per_worker = args.global_batch // world

    torch.manual_seed(args.seed)
    c, h, w = (int(v) for v in args.shape.split("x"))
    model = getattr(torchvision.models, args.model)(weights=None, num_classes=args.num_classes).to(device)
    model = DDP(model, device_ids=[local_rank] if cuda else None, gradient_as_bucket_view=True)
    opt = torch.optim.SGD(model.parameters(), lr=0.1 * args.global_batch / 256, momentum=0.9, weight_decay=5e-4)
    g = torch.Generator().manual_seed(args.seed + 7)
    images = torch.randn(POOL, c, h, w, generator=g).to(device)
    labels = torch.randint(0, args.num_classes, (POOL,), generator=g).to(device)
    loss_fn = torch.nn.CrossEntropyLoss()

    model.train()
    start = 0.0
    loss = torch.zeros(())
    for step in range(1, args.steps + 1):
        first = (step - 1) * args.global_batch + rank * per_worker
        idx = torch.arange(first, first + per_worker, device=device) % POOL
        x, y = images.index_select(0, idx), labels.index_select(0, idx)
        opt.zero_grad(set_to_none=True)
        loss = loss_fn(model(x), y)
        loss.backward()
        opt.step()
        if step == 1:
            if cuda:
                torch.cuda.synchronize()
            if rank == 0:
                done = time.time()
                write_atomic(args.first_step_file, json.dumps({"first_step_at": done, "worker_started_at": started}))
            start = time.perf_counter()
    if cuda:
        torch.cuda.synchronize()
    dist.barrier()
    elapsed = time.perf_counter() - start
    if rank == 0:
        timed = (args.steps - 1) * args.global_batch
        print(json.dumps({"images_per_s": timed / elapsed if timed else None, "world_size": world,
                          "elapsed_s": elapsed, "loss": float(loss.detach())}), flush=True)  # fmt: skip
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
