"""Shared helpers for the hardware tests."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from deskpod import cli

DATA = Path(__file__).with_name("data")
REFERENCE = Path(__file__).resolve().parents[2] / "deskpod" / "hardware" / "machines" / "topo"
"""Both given real outputs live in the package (copied verbatim from the public sources each file's first line names)."""


@pytest.fixture
def run_cli(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> Callable[..., tuple[int, str, str]]:
    """Run ``deskpod ARGS`` in-process with only this area's subcommands; returns (code, stdout, stderr)."""
    monkeypatch.setattr(cli, "COMMAND_MODULES", ("deskpod.cli.topo", "deskpod.cli.doctor"))

    def run(*args: str) -> tuple[int, str, str]:
        code = cli.main(list(args))
        out, err = capsys.readouterr()
        return code, out, err

    return run
