"""Which samples each rank sees: global batches cut from one seeded permutation per epoch.

Every micro-step takes the next ``global_batch`` indices of the epoch's permutation, and rank r
takes slice r of them. So the set of samples in a step does not depend on the number of workers
(2 workers × 8 see exactly the samples 1 worker × 16 sees: the parity test relies on it), every
epoch is reshuffled, and resuming at micro-step s of an epoch is just starting the slice there.
The last partial global batch of an epoch is dropped, as DistributedSampler(drop_last=True) does.
"""

from __future__ import annotations

from collections.abc import Iterator

import torch

from deskpod.errors import ConfigError


class GlobalBatchSampler:
    def __init__(self, size: int, per_rank: int, world: int, rank: int, *, seed: int, shuffle: bool = True) -> None:
        if not 0 <= rank < world:
            raise ValueError(f"rank {rank} not in world of {world}")
        self.size, self.per_rank, self.world, self.rank = size, per_rank, world, rank
        self.seed, self.shuffle = seed, shuffle
        self.global_batch = per_rank * world
        if self.global_batch > size:
            raise ConfigError(
                f"batch_size {per_rank} × {world} devices = {self.global_batch} samples per step, but the dataset has "
                f"only {size} training samples; use a smaller --batch-size"
            )

    @property
    def steps_per_epoch(self) -> int:
        """Micro-steps per epoch."""
        return self.size // self.global_batch

    def permutation(self, epoch: int) -> torch.Tensor:
        if not self.shuffle:
            return torch.arange(self.size)
        g = torch.Generator().manual_seed(self.seed * 7919 + epoch)
        return torch.randperm(self.size, generator=g)

    def batches(self, epoch: int, start: int = 0) -> Iterator[list[int]]:
        """This rank's index lists for micro-steps ``start..steps_per_epoch-1`` of ``epoch``."""
        perm = self.permutation(epoch)
        lo = self.rank * self.per_rank
        for step in range(start, self.steps_per_epoch):
            base = step * self.global_batch
            yield perm[base + lo : base + lo + self.per_rank].tolist()


def run_length(size: int, global_batch: int, grad_accum: int, steps: int, epochs: int) -> tuple[int, int]:
    """(optimizer steps per epoch, optimizer steps of the run): ``steps`` when set, else whole epochs."""
    per_epoch = size // global_batch // grad_accum
    return per_epoch, steps if steps else epochs * per_epoch


def shard_indices(size: int, world: int, rank: int, batch: int) -> Iterator[list[int]]:
    """Validation: rank r takes samples r, r+world, …, in batches; every sample is seen exactly once."""
    mine = list(range(rank, size, world))
    for i in range(0, len(mine), batch):
        yield mine[i : i + batch]
