"""A sharded index: one database per node of a Slurm job, searched as one.

A video job with ``nodes = N`` on Slurm runs one indexer per node (``deskpod video index ... --shard K/N``), and
each writes its own database beside the job's ``DB``: ``<stem>.shard<K>.db`` (``video.db`` → ``video.shard0.db``,
``video.shard1.db``, ...), each with its own ``.thumbs/`` and ``.faces`` as any database has. No two nodes write
one SQLite file (SQLite's locks are not to be trusted across hosts on a network file system), and a node that dies
takes only its own shard's last batch with it.

Which node indexes which stream (`deal`): the sources after folders are expanded into their files, sorted by
location, dealt round-robin by node rank — stream ``i`` of the sorted list goes to shard ``i mod N``. The same
sources give the same assignment on every node and on every attempt of the job, so a requeued node resumes its own
streams from its own shard. (A file added to a watched folder between two attempts shifts the files after it in the
order: those are then indexed again in their new shard; give fixed files, or a folder per node, when that matters.)

`databases` is what ``search`` reads: ``DB`` itself when it is a file, and every ``<stem>.shard<K>.db`` beside it.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from pathlib import Path
from typing import TypeVar

from deskpod.errors import UsageError
from deskpod.video.sources import Source

MAX_SHARDS = 4096
"""The most shards (nodes) a job may have: far above any cluster deskpod drives, low enough to catch a typo."""

T = TypeVar("T", bound=Source)


def parse_shard(text: str) -> tuple[int, int]:
    """``"K/N"`` → ``(K, N)``, shard K of N (K from 0); `UsageError` naming what is valid."""
    m = re.fullmatch(r"\s*(\d{1,9})\s*/\s*(\d{1,9})\s*", text)
    if m is None:
        raise UsageError(f"--shard {text!r}: give this node's shard and the number of shards as K/N, e.g. 0/2")
    k, n = int(m.group(1)), int(m.group(2))
    if not 1 <= n <= MAX_SHARDS:
        raise UsageError(f"--shard {text}: the number of shards must be 1 to {MAX_SHARDS}")
    if not 0 <= k < n:
        raise UsageError(f"--shard {text}: the shard must be 0 to {n - 1} (shards count from 0)")
    return k, n


def shard_path(db: Path, shard: int) -> Path:
    """The database of shard ``shard`` of ``db``: ``<stem>.shard<K><suffix>`` beside it."""
    return db.with_name(f"{db.stem}.shard{shard}{db.suffix}")


def shard_paths(db: Path) -> list[Path]:
    """The shard databases beside ``db`` that exist, by shard number."""
    pattern = re.compile(rf"{re.escape(db.stem)}\.shard(\d+){re.escape(db.suffix)}")
    found: list[tuple[int, Path]] = []
    if db.parent.is_dir():
        for p in db.parent.iterdir():
            m = pattern.fullmatch(p.name)
            if m is not None and p.is_file():
                found.append((int(m.group(1)), p))
    return [p for _, p in sorted(found)]


def databases(db: Path) -> list[Path]:
    """What a search of ``db`` reads: ``db`` when it is a file, then its shards (`shard_paths`); [] when none is."""
    return ([db] if db.is_file() else []) + shard_paths(db)


def deal(sources: Sequence[T], shard: int, shards: int) -> list[T]:
    """Shard ``shard``'s share of ``sources``: sorted by location, every ``shards``-th from the ``shard``-th."""
    ordered = sorted(sources, key=lambda s: (s.location, s.name))
    return ordered[shard::shards]
