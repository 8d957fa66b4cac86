"""Write a benchmark's results into its own subsection of docs/benchmarks.md.

Each area owns a ``## Area`` section; each benchmark owns a ``### Title`` subsection in it. Running
a benchmark again replaces its subsection and leaves everything else as it was.
"""

from __future__ import annotations

import contextlib
import json
import platform
import re
import shlex
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

DOCS = Path(__file__).resolve().parents[1] / "docs" / "benchmarks.md"


def replace_subsection(section: str, subsection: str, block: str, *, intro: str = "", docs: Path = DOCS) -> None:
    """Put ``block`` (which starts with the ``subsection`` heading) in place of that subsection of ``section``."""
    text = docs.read_text() if docs.exists() else "# Benchmarks\n"
    if section not in text:
        text = text.rstrip("\n") + f"\n\n{section}\n\n" + (intro + "\n" if intro else "")
    head, _, rest = text.partition(section)
    nxt = re.search(r"^## ", rest, re.M)
    mine, tail = (rest[: nxt.start()], rest[nxt.start() :]) if nxt else (rest, "")
    block = block.rstrip("\n") + "\n"
    pattern = re.compile(rf"^{re.escape(subsection)}\n.*?(?=^### |\Z)", re.S | re.M)
    mine = pattern.sub(lambda _: block + "\n", mine) if pattern.search(mine) else mine.rstrip("\n") + "\n\n" + block
    docs.write_text(head + section + mine.rstrip("\n") + "\n" + ("\n" + tail if tail else ""))


def publish(res: dict[str, Any], met: bool, *, only: bool, docs: bool, report: Callable[[dict[str, Any], str], str],
            section: str, subsection: str, intro: str) -> int:  # fmt: skip
    """Print a benchmark's results, put its report in its subsection unless ``docs`` is off, and return its exit
    status (1 when a target was missed). A partial run (``only``) prints its JSON alone and writes no docs."""
    command = f".venv/bin/python benchmarks/{Path(sys.argv[0]).name} " + shlex.join(sys.argv[1:])
    text = "" if only else report(res, command.strip())
    if text:
        print(text)
    print(json.dumps(res))
    if text and docs:
        replace_subsection(section, subsection, text, intro=intro)
    return 0 if met else 1


def cpu_model() -> str:
    """The processor's name (``/proc/cpuinfo``), for the machine line of a results section."""
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    return platform.processor() or "unknown CPU"
