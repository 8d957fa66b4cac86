"""Another copy of deskpod for A/B runs: ``deskpod/`` at a git revision, and the command that runs its CLI.

Used by plan_startup_ab.py and serve_ab.py, which judge a change against the code it replaces in the same run.
"""

from __future__ import annotations

import subprocess
import sys
import tarfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
_CLI = """
import sys
sys.meta_path = [f for f in sys.meta_path if "editable" not in repr(f).lower()]
sys.path.insert(0, {tree!r})
import deskpod
assert deskpod.__file__.startswith({tree!r}), deskpod.__file__
from deskpod.cli import main
sys.exit(main(sys.argv[1:]))
"""


def tree_at(rev: str, into: Path) -> Path:
    """``deskpod/`` as it is at ``rev`` (``git archive``), extracted under ``into``; returns ``into``."""
    archive = subprocess.run(["git", "-C", str(ROOT), "archive", rev, "deskpod"], check=True, capture_output=True)
    into.mkdir(parents=True, exist_ok=True)
    (into / "rev.tar").write_bytes(archive.stdout)
    with tarfile.open(into / "rev.tar") as tar:
        tar.extractall(into, filter="data")
    return into


def cli(tree: Path = ROOT) -> list[str]:
    """The command prefix that runs ``deskpod`` (its CLI) importing the package from ``tree`` alone (the
    editable-install finder removed so that the path decides); append the CLI's arguments."""
    return [sys.executable, "-c", _CLI.format(tree=str(tree))]
