"""The Makefile's install stops at a failed ``pip install``, with pip's own message (its output is filtered for
noise, and the filter once hid the failure). A copy of the Makefile and pyproject.toml with a requirement that
cannot be installed (a wheel file that does not exist: no index is asked) is installed into a fresh venv."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow  # a fresh virtual environment

REPO = Path(__file__).resolve().parents[1]
BOGUS = "deskpod-bogus @ file:///nonexistent/deskpod_bogus-1.0-py3-none-any.whl"


@pytest.mark.skipif(shutil.which("make") is None, reason="no make on this machine")
def test_a_requirement_that_cannot_be_installed_stops_make_demo_with_pips_message(tmp_path: Path) -> None:
    shutil.copy2(REPO / "Makefile", tmp_path / "Makefile")
    pyproject = (REPO / "pyproject.toml").read_text()
    assert "dependencies = [\n" in pyproject
    (tmp_path / "pyproject.toml").write_text(
        pyproject.replace("dependencies = [\n", f'dependencies = [\n    "{BOGUS}",\n', 1)
    )
    (tmp_path / "README.md").write_text("a copy\n")
    (tmp_path / "deskpod").mkdir()
    (tmp_path / "deskpod" / "__init__.py").write_text("")
    venv = tmp_path / "venv"
    done = subprocess.run(["make", "demo", f"VENV={venv}", f"PYTHON={sys.executable}"], cwd=tmp_path,
                          capture_output=True, text=True, timeout=600)  # fmt: skip
    out = done.stdout + done.stderr
    assert done.returncode != 0, out
    assert "ERROR:" in out and "/nonexistent/deskpod_bogus-1.0-py3-none-any.whl" in out, out  # pip's own words
    assert not (venv / ".core").exists()  # stopped at pip: the install is not marked done
    assert "import torch, torchvision, deskpod" not in done.stdout  # nor did make go on to the next line
