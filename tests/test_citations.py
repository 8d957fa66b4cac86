"""Every citation in the code leads somewhere a reader of the repository can go.

Comments, docstrings, the machine catalog and the figures' source strings cite either a file of the
repository (``docs/reference/hardware.md#gpus``: the path must exist, and the section must be one of its
headings) or a public source. Notes kept outside the repository (the hardware and calibration notes next
to it, anything under ``../shared``) and issue numbers are neither: a reader has no way to open them.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SCANNED = ("deskpod", "tests", "benchmarks")
SUFFIXES = {".py", ".toml", ".txt"}
"""Code, and the catalog's data files whose comments and ``source`` fields cite figures."""

OUTSIDE = re.compile(r"(?<![\w/.-])(?:hardware|calibration|cluster|serving|data)\.md\b|shared[/]reference|\.\./shared/")
"""The notes that lived beside the repository, by the names the code once cited them with."""
ISSUE = re.compile(r"\bissues? #?\d+", re.IGNORECASE)
DOCS_PATH = re.compile(r"(?<![\w/.-])docs/[\w/.-]*\w(?:#[\w-]+)?")
MD_LINK = re.compile(r"\]\(([^)\s]+)\)")


def anchors(doc: Path) -> set[str]:
    """The ``#section`` names of a Markdown file as GitHub makes them from its headings (code blocks skipped)."""
    found, fenced = set(), False
    for line in doc.read_text(encoding="utf-8").splitlines():
        if line.startswith("```"):
            fenced = not fenced
        elif not fenced and (m := re.match(r"#{1,6}\s+(.*)", line)):
            found.add(re.sub(r"[^\w\- ]", "", m.group(1).strip().lower()).replace(" ", "-"))
    return found


def bad_target(target: str, base: Path) -> str | None:
    """Why ``path#section`` (relative to `base`) leads nowhere, or None."""
    path, _, section = target.partition("#")
    file = (base / path).resolve() if path else base
    if not file.exists() or not file.is_relative_to(ROOT):
        return f"{target}: no such file in the repository"
    if section and file.suffix == ".md" and section not in anchors(file):
        return f"{target}: {file.relative_to(ROOT)} has no section #{section}"
    return None


def problems(text: str) -> list[str]:
    """What in one file's text cites something a reader cannot open."""
    found = [f"cites notes outside the repository: {m.group(0)!r}" for m in OUTSIDE.finditer(text)]
    found += [f"cites an issue number: {m.group(0)!r}" for m in ISSUE.finditer(text)]
    found += [why for m in DOCS_PATH.finditer(text) if (why := bad_target(m.group(0), ROOT))]
    return found


def scanned_files() -> list[Path]:
    files = [p for d in SCANNED for p in (ROOT / d).rglob("*") if p.suffix in SUFFIXES and "__pycache__" not in p.parts]
    return sorted(p for p in files if p != Path(__file__).resolve())


def test_the_code_cites_only_what_the_repository_holds() -> None:
    files = scanned_files()
    assert len(files) > 100, "the scan found too few files to mean anything"
    found = [f"{p.relative_to(ROOT)}: {why}" for p in files for why in problems(p.read_text(encoding="utf-8"))]
    assert not found, "\n".join(found)


def test_the_docs_cite_no_outside_notes_and_their_links_resolve() -> None:
    docs = sorted([*(ROOT / "docs").rglob("*.md"), ROOT / "README.md"])
    found = []
    for doc in docs:
        text = doc.read_text(encoding="utf-8")
        found += [
            f"{doc.relative_to(ROOT)}: cites {m.group(0)!r}"
            for m in re.finditer(r"shared[/]reference|\.\./shared/", text)
        ]
        for m in MD_LINK.finditer(text):
            # Files only: a section of a page that a benchmark rewrites may come and go with its run.
            if not re.match(r"[a-z]+:", m.group(1)) and (why := bad_target(m.group(1).partition("#")[0], doc.parent)):
                found.append(f"{doc.relative_to(ROOT)}: {why}")
    assert ROOT / "docs/reference/hardware.md" in docs and not found, "\n".join(found)


@pytest.mark.parametrize(
    ("text", "caught"),
    [
        # The first four are f-strings so that a grep of the tree for dead citations finds none here.
        (f"# 25 GB/s per link ({'hardware'}.md 2.1)", "outside the repository"),
        (f'"""see ../{"shared"}/reference/{"cluster"}.md"""', "outside the repository"),
        (f"# the attack of issue {30}, item 6", "issue number"),
        (f"# the findings of Issue #{14}", "issue number"),
        ("# docs/reference/hardware.md#no-such-section", "no section #no-such-section"),
        ("# docs/reference/nowhere.md", "no such file"),
    ],
)
def test_each_kind_of_dead_citation_is_caught(text: str, caught: str) -> None:
    assert any(caught in why for why in problems(text)), problems(text)


def test_live_citations_pass() -> None:
    text = (
        "# docs/reference/hardware.md#gpus: 900 GB/s; docs/cluster.md; tensorflow/docs site/en/r1/benchmarks.md;\n"
        "# https://github.com/NVIDIA/nccl/issues/1505; mila-iqia/mila-docs/pull/176; NVIDIA/nccl #671"
    )
    assert problems(text) == []
