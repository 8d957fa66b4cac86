"""The fleet's forwards under way, written ahead (`deskpod.fleet.forwards`), in a real SQLite file."""

from __future__ import annotations

from pathlib import Path

import pytest

from deskpod.fleet.forwards import Forwards


def test_a_forward_is_kept_until_settled_across_reopening_and_each_attempt_gets_a_new_key(tmp_path: Path) -> None:
    forwards = Forwards(tmp_path / "pod.db")
    f = forwards.begin(12, "box-a", 100.0)
    assert (f.job, f.member, f.attempt, f.at) == (12, "box-a", 1, 100.0) and f.key.startswith("12.1.")
    with pytest.raises(ValueError, match="under way already"):
        forwards.begin(12, "box-b", 101.0)
    del forwards

    reopened = Forwards(tmp_path / "pod.db")  # a fleet that restarted finds it
    assert reopened.pending() == [f]
    reopened.settle(12)
    assert reopened.pending() == []
    g = reopened.begin(12, "box-b", 102.0)
    assert g.attempt == 2 and g.key.startswith("12.2.") and g.key != f.key
    assert [p.job for p in reopened.pending()] == [12]
