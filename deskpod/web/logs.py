"""A job's logs: the tail the Job page starts from, and a search across every rank's log with context.

The files of a job (`log_files`): its ``output.log`` (what the job printed, every attempt appended),
and for a train job every ``*.stderr`` and ``*.log`` in the run's ``logs/`` — each worker's
``rank<R>.attempt<N>.stderr`` and the elastic agent's error files. `search` reads them line by line
(never whole into memory), like ``grep -i -C N``: a case-insensitive substring, or a regular
expression, and N lines of context around each match, adjacent matches sharing one block. Results
stop at a cap, and say so. Every line is returned as text; the page escapes it (and marks the
matches with ``<mark>`` built from the returned spans, never from the line's own markup).
"""

from __future__ import annotations

import os
import re
from collections import deque
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from deskpod.envs.userfiles import RefusedFile, open_path, scandir_path, stat_path
from deskpod.errors import ConfigError
from deskpod.jobs import joblog

MAX_HITS = 200
"""Matching lines returned by one search; the answer says when there were more."""
MAX_CONTEXT = 10
MAX_QUERY = 200
MAX_LINE = 2000
"""Characters of a line kept (and searched); a longer line is cut and marked as cut."""
MAX_SCAN_BYTES = 512 * 1024 * 1024
"""Bytes one search reads in all; past it the answer says which files were not read to their end."""
TAIL_BYTES = 128 * 1024
TAIL_LINES = 2000


@dataclass(frozen=True, slots=True)
class LogFile:
    label: str
    """How the page names it: ``output.log``, ``logs/rank1.attempt0.stderr``."""
    path: Path


def _natural(name: str) -> list[Any]:
    """``rank2`` before ``rank10``."""
    return [int(p) if p.isdigit() else p for p in re.split(r"(\d+)", name)]


def log_files(job_folder: Path, run_dir: Path | None) -> list[LogFile]:
    """The job's output log (or its attempts' logs) first, then the run's worker and agent logs in natural order.
    Every file is reached as `deskpod.envs.userfiles.open_path` reaches it (no link the job's user planted is
    followed, no FIFO waited on): what is refused is left out."""
    out = [LogFile("output.log", job_folder / "output.log")]
    # A job run by Slurm (deskpod up --backend slurm) writes one log per attempt instead.
    out += [LogFile(f"logs/{p.name}", p) for p in joblog.log_files(job_folder) if p.parent.name == "logs"]
    if run_dir is not None:
        logs = run_dir / "logs"
        found = sorted(_walk_logs(logs), key=lambda p: _natural(str(p.relative_to(logs))))
        out += [LogFile(f"logs/{p.relative_to(logs)}", p) for p in found]
    return [f for f in out if stat_path(f.path) is not None]


def _walk_logs(folder: Path, depth: int = 0) -> list[Path]:
    """The ``*.stderr`` and ``*.log`` files under ``folder``, no link followed, at most 8 folders deep."""
    out: list[Path] = []
    for entry in scandir_path(folder):
        if entry.is_dir(follow_symlinks=False) and depth < 8:
            out += _walk_logs(folder / entry.name, depth + 1)
        elif entry.is_file(follow_symlinks=False) and Path(entry.name).suffix in (".stderr", ".log"):
            out.append(folder / entry.name)
    return out


def matcher(query: str, *, regex: bool) -> re.Pattern[str]:
    """The compiled search: the text as typed (case-insensitive), or a regular expression; `ConfigError` if bad."""
    if not query:
        raise ConfigError("search: type some text to look for (e.g. Traceback)")
    if len(query) > MAX_QUERY:
        raise ConfigError(f"search: the query has {len(query)} characters; at most {MAX_QUERY}")
    if not regex:
        return re.compile(re.escape(query), re.IGNORECASE)
    try:
        return re.compile(query, re.IGNORECASE)
    except re.error as e:
        raise ConfigError(
            f"search: {query!r} is not a valid regular expression ({e}); fix it, or untick 'regular expression' "
            "to search for the text as typed"
        ) from None


def search(
    files: list[LogFile], query: str, *, regex: bool = False, context: int = 2, max_hits: int = MAX_HITS
) -> dict[str, Any]:
    """Matching lines with ``context`` lines around them, grouped per file into blocks like ``grep -C``.

    ``{"query", "regex", "context", "files": [labels searched], "hits": n, "capped": bool,
    "blocks": [{"file", "lines": [{"line": n, "text", "match": bool, "spans": [[a, b], ...]}]}],
    "partial": [labels not read to the end]}``
    """
    if not 0 <= context <= MAX_CONTEXT:
        raise ConfigError(f"search: context {context} is not valid; use 0 to {MAX_CONTEXT} lines")
    pattern = matcher(query, regex=regex)
    blocks: list[dict[str, Any]] = []
    hits, capped, budget, partial = 0, False, MAX_SCAN_BYTES, []
    for f in files:
        if capped:
            break
        try:  # bytes, so a bad UTF-8 byte costs one character; closed below
            fh = os.fdopen(open_path(f.path), "rb")
        except OSError:
            continue
        with fh:
            before: deque[tuple[int, str]] = deque(maxlen=context)
            block: list[dict[str, Any]] | None = None
            after = 0  # context lines still owed to the current block
            for n, raw in enumerate(fh, 1):
                budget -= len(raw)
                if budget < 0:
                    partial.append(f.label)
                    capped = True
                    break
                text = raw.decode("utf-8", "replace").rstrip("\r\n")
                if len(text) > MAX_LINE:
                    text = text[:MAX_LINE] + " …"
                spans = [[m.start(), m.end()] for m in pattern.finditer(text) if m.end() > m.start()]
                if spans and hits >= max_hits:
                    capped = True
                    break
                if spans:
                    hits += 1
                    if block is None:
                        lead: list[dict[str, Any]] = [
                            {"line": k, "text": t, "match": False, "spans": []} for k, t in before
                        ]
                        last = blocks[-1] if blocks and blocks[-1]["file"] == f.label else None
                        first = lead[0]["line"] if lead else n
                        if last is not None and last["lines"][-1]["line"] == first - 1:
                            block = last["lines"]  # touching the previous block: one block, as grep does
                            block.extend(lead)
                        else:
                            block = lead
                            blocks.append({"file": f.label, "lines": block})
                    block.append({"line": n, "text": text, "match": True, "spans": spans})
                    before.clear()
                    after = context
                elif block is not None and after > 0:
                    block.append({"line": n, "text": text, "match": False, "spans": []})
                    after -= 1
                else:
                    block = None
                    before.append((n, text))
    return {
        "query": query,
        "regex": regex,
        "context": context,
        "files": [f.label for f in files],
        "hits": hits,
        "capped": capped,
        "max_hits": max_hits,
        "blocks": blocks,
        "partial": partial,
    }


def tail(path: Path, *, max_bytes: int = TAIL_BYTES, max_lines: int = TAIL_LINES) -> tuple[str, int, bool]:
    """(text, offset, cut): the last lines of a log; the offset just past them (where a live reader goes on
    from); whether earlier lines were left out. A log the job's user replaced with a link, a FIFO or someone
    else's file is not read, and the text says so."""
    try:
        with os.fdopen(open_path(path), "rb") as f:
            size = f.seek(0, 2)
            start = max(0, size - max_bytes)
            f.seek(start)
            data = f.read(size - start)
    except RefusedFile as e:
        return f"deskpod: {path.name} {e.why}; not shown\n", 0, False
    except OSError:
        return "", 0, False
    base, cut = start, start > 0
    if cut:  # drop the partial first line
        nl = data.find(b"\n")
        skip = nl + 1 if nl >= 0 else len(data)
        data, base = data[skip:], base + skip
    lines = data.split(b"\n")
    if len(lines) > max_lines + 1:  # (the last element is what follows the last newline)
        drop = sum(len(x) + 1 for x in lines[: len(lines) - max_lines - 1])
        data, base, cut = data[drop:], base + drop, True
    keep = utf8_cut(data)
    return data[:keep].decode("utf-8", "replace"), base + keep, cut


def utf8_cut(data: bytes) -> int:
    """How many bytes of ``data`` end on a whole UTF-8 character (a live reader sends the rest later)."""
    n = len(data)
    for back in range(1, min(4, n) + 1):
        b = data[n - back]
        if b < 0x80:  # ASCII: whole
            return n
        if b >= 0xC0:  # a lead byte: whole only if its sequence is complete
            need = 2 if b < 0xE0 else 3 if b < 0xF0 else 4
            return n if back >= need else n - back
    return n
