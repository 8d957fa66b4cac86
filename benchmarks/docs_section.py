"""Write a benchmark's results into its own subsection of docs/benchmarks.md.

Each area owns a ``## Area`` section; each benchmark owns a ``### Title`` subsection in it. Running
a benchmark again replaces its subsection and leaves everything else as it was.
"""

from __future__ import annotations

import contextlib
import platform
import re
from pathlib import Path

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


def cpu_model() -> str:
    """The processor's name (``/proc/cpuinfo``), for the machine line of a results section."""
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    return platform.processor() or "unknown CPU"
