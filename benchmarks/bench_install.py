"""The core install beside every extra: time and size of ``pip install .`` and ``pip install '.[all]'``.

    .venv/bin/python benchmarks/bench_install.py            # table + JSON, updates docs/benchmarks.md
    .venv/bin/python benchmarks/bench_install.py --no-docs

Each goes into a fresh virtual environment under /var/tmp, from a copy of this checkout, with torch pinned as the
Makefile pins it (its wheels lie on local disk here) and pip's cache off, so that each downloads and builds what a
first install does (pyradiomics-bhklab is an sdist: a C compiler builds it). Size: the environment's
site-packages on disk; torch, torchvision and what they require (CUDA's libraries), the same in both, are
also given apart.
"""

from __future__ import annotations

import argparse
import json
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from docs_section import cpu_model, replace_subsection

REPO = Path(__file__).resolve().parents[1]
SECTION = "## Install"
INTRO = "What `pip install` costs: the core (`deskpod train`, `deskpod up` and the rest) and each extra."
SUB = "### The core beside every extra (bench_install.py)"
TORCH_PINS = re.search(r"^TORCH_PINS := (.+)$", (REPO / "Makefile").read_text(), re.M)[1].split()  # type: ignore[index]
SIZES = """import importlib.metadata as md, json, os, sys
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name as canon
sizes, needs = {}, {}
for d in md.distributions():
    name = canon(d.metadata["Name"])
    total = 0
    for f in d.files or []:
        try:
            total += os.stat(d.locate_file(f)).st_blocks * 512
        except OSError:
            pass
    sizes[name] = total
    needs[name] = [Requirement(r) for r in d.requires or []]
torch, seen, todo = set(), set(), [("torch", ""), ("torchvision", "")]
while todo:  # what torch and torchvision require, and what that requires, extras of a requirement included
    n, extra = todo.pop()
    if n not in sizes or (n, extra) in seen:
        continue
    seen.add((n, extra))
    torch.add(n)
    for r in needs[n]:
        if r.marker is None or r.marker.evaluate({"extra": extra}):
            todo += [(canon(r.name), e) for e in ("", *r.extras)]
print(json.dumps({"sizes": sizes, "torch": sorted(torch)}))
"""
"""Each installed distribution's size on disk, and the ones torch and torchvision need (their closure)."""


def disk_bytes(folder: Path) -> int:
    return sum(p.lstat().st_blocks * 512 for p in folder.rglob("*"))


def install(root: Path, src: Path, extras: str) -> dict[str, Any]:
    venv = root / f"venv{extras or '-core'}"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    python = str(venv / "bin" / "python")
    argv = [python, "-m", "pip", "install", "-q", "--no-cache-dir", *TORCH_PINS, f"{src}{extras}"]
    start = time.monotonic()
    subprocess.run(argv, check=True, cwd=root)
    seconds = time.monotonic() - start
    site = next((venv / "lib").glob("python3*/site-packages"))
    got = json.loads(subprocess.run([python, "-c", SIZES], check=True, capture_output=True, text=True).stdout)
    dists = got["sizes"]
    return {
        "seconds": round(seconds, 1),
        "site_packages_mib": round(disk_bytes(site) / 2**20),
        "torch_mib": round(sum(dists[n] for n in got["torch"]) / 2**20),
        "torch_dists": got["torch"],
        "distributions": len(dists),
        "mib": {n: round(b / 2**20, 1) for n, b in sorted(dists.items())},
    }


def write_docs(core: dict[str, Any], full: dict[str, Any], command: str) -> None:
    when = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    added = sorted(set(full["mib"]) - set(core["mib"]), key=lambda n: -full["mib"][n])
    adds = ", ".join(f"{n} {full['mib'][n]:g}" for n in added)
    block = f"""{SUB}

Command: `{command}` ({when}; {cpu_model()}, the shared 2-core box with other work running, so the times are
loose). Each into a fresh virtual environment, torch pinned (`{" ".join(TORCH_PINS)}`, from local disk: the CUDA build,
whose NVIDIA libraries are most of the size), pip's cache off:

    python3 -m venv V && V/bin/python -m pip install --no-cache-dir {" ".join(TORCH_PINS)} .          # core
    python3 -m venv V && V/bin/python -m pip install --no-cache-dir {" ".join(TORCH_PINS)} '.[all]'   # every extra

| install | time s | site-packages MiB | of it torch, torchvision and their requirements MiB | the rest MiB | distributions |
|---|---|---|---|---|---|
| core (`pip install .`) | {core["seconds"]:.0f} | {core["site_packages_mib"]} | {core["torch_mib"]} | {core["site_packages_mib"] - core["torch_mib"]} | {core["distributions"]} |
| all (`pip install '.[all]'`) | {full["seconds"]:.0f} | {full["site_packages_mib"]} | {full["torch_mib"]} | {full["site_packages_mib"] - full["torch_mib"]} | {full["distributions"]} |

What `[all]` adds to the core, {len(added)} distributions (MiB on disk): {adds}.
"""
    replace_subsection(SECTION, SUB, block, intro=INTRO)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--no-docs", action="store_true")
    args = parser.parse_args()
    root = Path(tempfile.mkdtemp(prefix="deskpod-bench-install-", dir="/var/tmp"))
    try:
        src = root / "src"
        shutil.copytree(REPO / "deskpod", src / "deskpod", ignore=shutil.ignore_patterns("__pycache__"))
        for name in ("pyproject.toml", "README.md"):
            shutil.copy2(REPO / name, src / name)
        core = install(root, src, "")
        full = install(root, src, "[all]")
    finally:
        shutil.rmtree(root, ignore_errors=True)
    for name, r in (("core", core), ("all", full)):
        print(f"{name}: {r['seconds']:.0f} s, site-packages {r['site_packages_mib']} MiB "
              f"(torch and its requirements {r['torch_mib']} MiB), {r['distributions']} distributions")  # fmt: skip
    print(json.dumps({"benchmark": "install", "core": core, "all": full}))
    if not args.no_docs:
        write_docs(core, full, ".venv/bin/python benchmarks/bench_install.py")
    return 0


if __name__ == "__main__":
    sys.exit(main())
