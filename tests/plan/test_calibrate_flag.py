"""``deskpod plan --calibrate`` is ``deskpod plan calibrate`` with its defaults; bare ``plan`` says what to add."""

from __future__ import annotations

import argparse

import pytest

from deskpod.cli import main
from deskpod.cli import plan as plan_cli


def test_calibrate_flag_runs_calibrate_with_defaults(monkeypatch: pytest.MonkeyPatch) -> None:
    seen: list[argparse.Namespace] = []
    monkeypatch.setattr(plan_cli, "run_calibrate", lambda a: seen.append(a) or 0)
    assert main(["plan", "--calibrate"]) == 0
    assert (seen[0].model, seen[0].shape, seen[0].batch, seen[0].steps, seen[0].from_json) == (
        "resnet18",
        "3x112x112",
        8,
        3,
        None,
    )


def test_plan_without_what(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["plan"]) == 2
    assert "needs WHAT: predict" in capsys.readouterr().err
