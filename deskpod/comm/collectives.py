"""The five collectives deskpod measures and models, with nccl-tests' bandwidth definitions.

From NVIDIA/nccl-tests ``doc/PERFORMANCE.md`` (and ``src/alltoall.cu`` for all-to-all):

* **size** ``S``: bytes of the largest buffer a rank holds — the buffer for all-reduce and
  broadcast, the gathered output for all-gather, the input for reduce-scatter, the whole send
  buffer for all-to-all (``S/n`` to each peer).
* **time** ``t``: seconds for one collective.
* **algbw** ``= S / t``: the algorithm bandwidth.
* **busbw** ``= algbw × factor``: what each rank's link had to carry, so that it compares with the
  hardware's peak whatever the rank count ``n``:

  =============== ============== =====================================================
  collective      factor         why
  =============== ============== =====================================================
  all-reduce      2(n−1)/n       a ring reduce-scatter then all-gather: 2(n−1) steps of S/n
  all-gather      (n−1)/n        each rank receives the n−1 chunks it lacks
  reduce-scatter  (n−1)/n        each rank sends n−1 chunks it does not keep
  broadcast       1              every byte crosses every hop of a pipelined chain once
  all-to-all      (n−1)/n        each rank sends n−1 of its n chunks to peers
  =============== ============== =====================================================

Each collective also knows how to fill its inputs with a pattern and the exact result every rank
must then hold, so the benchmark checks correctness outside its timed loop (nccl-tests' ``#wrong``).
Patterns are small integers, exact in float32, bfloat16 and float16 for up to 8 ranks (``% 4``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

from deskpod.errors import UsageError

CollectiveName = Literal["all_reduce", "all_gather", "reduce_scatter", "broadcast", "all_to_all"]
COLLECTIVES: tuple[CollectiveName, ...] = ("all_reduce", "all_gather", "reduce_scatter", "broadcast", "all_to_all")
ALIASES = {
    **{name.replace("_", sep): name for name in COLLECTIVES for sep in ("-", "")},  # all-reduce, allreduce, ...
    **{"ar": "all_reduce", "ag": "all_gather", "rs": "reduce_scatter", "bcast": "broadcast", "a2a": "all_to_all"},
}


def parse_collectives(text: str) -> tuple[CollectiveName, ...]:
    """``all`` or a comma list such as ``all_reduce,all-gather`` → canonical names, in order."""
    if text.strip() in ("", "all"):
        return COLLECTIVES
    out: list[CollectiveName] = []
    for part in text.split(","):
        key = part.strip().lower()
        name = ALIASES.get(key, key)
        if name not in COLLECTIVES:
            raise UsageError(f"unknown collective {part.strip()!r}; valid: all, {', '.join(COLLECTIVES)}")
        if name not in out:
            out.append(name)  # type: ignore[arg-type]
    return tuple(out)


def bus_factor(name: CollectiveName, n: int) -> float:
    """busbw / algbw for ``n`` ranks (nccl-tests doc/PERFORMANCE.md; all-to-all: src/alltoall.cu)."""
    if n < 1:
        raise UsageError(f"rank count must be at least 1, got {n}")
    if name == "all_reduce":
        return 2 * (n - 1) / n
    if name in ("all_gather", "reduce_scatter", "all_to_all"):
        return (n - 1) / n
    if name == "broadcast":
        return 1.0
    raise UsageError(f"unknown collective {name!r}; valid: {', '.join(COLLECTIVES)}")


def algbw(size_bytes: int, seconds: float) -> float:
    """Algorithm bandwidth in GB/s (1e9 bytes, as nccl-tests prints)."""
    return size_bytes / seconds / 1e9 if seconds > 0 else 0.0


def busbw(name: CollectiveName, n: int, size_bytes: int, seconds: float) -> float:
    """Bus bandwidth in GB/s."""
    return algbw(size_bytes, seconds) * bus_factor(name, n)


def element_count(name: CollectiveName, size_bytes: int, itemsize: int, n: int) -> int:
    """Elements in the size-defining buffer: a multiple of ``n`` where the collective splits it, at least 1 chunk."""
    count = max(1, size_bytes // itemsize)
    if name in ("all_gather", "reduce_scatter", "all_to_all"):
        count = max(n, count - count % n)
    return count


@dataclass(slots=True)
class Buffers:
    """A rank's buffers for one collective and size; ``expected`` is what ``output`` must hold after one call."""

    input: Any
    output: Any
    expected: Any


def make_buffers(torch: Any, name: CollectiveName, count: int, rank: int, n: int, dtype: Any, device: Any) -> Buffers:
    """Fill inputs with a rank-dependent pattern and compute the exact expected result."""
    idx = torch.arange(count, device=device, dtype=torch.int64) % 4

    def pattern(r: int) -> Any:
        return ((idx + r) % 4 + 1).to(dtype)

    if name == "all_reduce":
        buf = pattern(rank)
        expected = sum(((idx + r) % 4 + 1) for r in range(n)).to(dtype)
        return Buffers(buf, buf, expected)
    if name == "broadcast":
        buf = pattern(0) if rank == 0 else torch.zeros(count, dtype=dtype, device=device)
        return Buffers(buf, buf, pattern(0))
    chunk = count // n
    if name == "all_gather":
        inp = pattern(rank)[:chunk].clone()
        out = torch.zeros(count, dtype=dtype, device=device)
        expected = torch.cat([pattern(r)[:chunk] for r in range(n)])
        return Buffers(inp, out, expected)
    if name == "reduce_scatter":
        inp = pattern(rank)
        out = torch.zeros(chunk, dtype=dtype, device=device)
        total = sum(((idx + r) % 4 + 1) for r in range(n)).to(dtype)
        return Buffers(inp, out, total[rank * chunk : (rank + 1) * chunk].clone())
    if name == "all_to_all":
        # Chunk p of rank r's input is (r + p) % 4 + 1 everywhere; rank r then holds (p + r) % 4 + 1 in chunk p.
        inp = torch.cat([torch.full((chunk,), (rank + p) % 4 + 1, dtype=dtype, device=device) for p in range(n)])
        out = torch.zeros(count, dtype=dtype, device=device)
        expected = torch.cat([torch.full((chunk,), (p + rank) % 4 + 1, dtype=dtype, device=device) for p in range(n)])
        return Buffers(inp, out, expected)
    raise UsageError(f"unknown collective {name!r}; valid: {', '.join(COLLECTIVES)}")


def run_once(dist: Any, name: CollectiveName, b: Buffers) -> None:
    """Issue one collective through ``torch.distributed`` (the calls NCCL and Gloo both implement)."""
    if name == "all_reduce":
        dist.all_reduce(b.output)
    elif name == "broadcast":
        dist.broadcast(b.output, src=0)
    elif name == "all_gather":
        gather = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
        gather(b.output, b.input)
    elif name == "reduce_scatter":
        scatter = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor
        scatter(b.output, b.input)
    elif name == "all_to_all":
        dist.all_to_all_single(b.output, b.input)
    else:
        raise UsageError(f"unknown collective {name!r}; valid: {', '.join(COLLECTIVES)}")
