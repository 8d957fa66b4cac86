"""The extras of pyproject.toml: `deskpod.errors.EXTRAS` names the modules of each, and a command (or a pod job)
whose extra is missing stops at once with one line saying what to install. The extras are taken away here by
naming a module that does not exist; tests/test_install.py installs the real core without them."""

from __future__ import annotations

import importlib.metadata
import tomllib
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

from deskpod import cli, errors
from deskpod.errors import ConflictError
from deskpod.hardware.placement import Unplaceable
from deskpod.jobs.local import LocalExecutor
from deskpod.jobs.pod import Pod, PodConfig
from deskpod.jobs.store import Store, User

PYPROJECT = Path(__file__).resolve().parents[1] / "pyproject.toml"
ABSENT = "deskpod_test_no_such_module"


def extras() -> dict[str, list[str]]:
    """Each feature's extra in pyproject.toml: the distributions it installs (``all`` and ``dev`` left out)."""
    declared = tomllib.loads(PYPROJECT.read_text())["project"]["optional-dependencies"]
    return {
        name: [canonicalize_name(Requirement(r).name) for r in reqs]
        for name, reqs in declared.items()
        if name not in ("all", "dev")
    }


def test_each_extra_is_looked_for_by_the_modules_of_its_distributions() -> None:
    """`EXTRAS` and pyproject.toml say the same: each module looked for comes from a distribution of its extra,
    and each distribution has a module looked for. All are installed here (the dev install has every extra)."""
    owners = importlib.metadata.packages_distributions()
    assert sorted(errors.EXTRAS) == sorted(extras())
    for extra, dists in extras().items():
        found = {canonicalize_name(d) for m in errors.EXTRAS[extra] for d in owners.get(m.split(".")[0], [])}
        assert found == set(dists), (extra, found, dists)
        errors.require_extra(extra, "this test")  # raises if a module is misspelt


@pytest.mark.parametrize(
    ("argv", "extra", "command"),
    [
        (["lung", "analyze", "scan.mhd"], "lung", "deskpod lung"),
        (["lung", "phantom", "--out", "x"], "lung", "deskpod lung"),
        (["serve", "models"], "serve", "deskpod serve"),
        (["export", "runs/r"], "serve", "deskpod export"),
        (["bench", "serve", "--model", "m"], "serve", "deskpod bench serve"),
        (["video", "index", "clip.mp4", "--db", "v.db"], "video", "deskpod video"),
        (["video", "search", "--face", "me.jpg", "--db", "v.db"], "video", "deskpod video"),
    ],
)
def test_a_command_without_its_extra_says_which_to_install(
    argv: list[str], extra: str, command: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setitem(errors.EXTRAS, extra, (*errors.EXTRAS[extra], ABSENT))
    assert cli.main(argv) == 2
    out, err = capsys.readouterr()
    assert out == ""
    assert (
        err
        == f"deskpod: {command} needs the {extra} extra ({ABSENT} is not installed): pip install 'deskpod[{extra}]'\n"
    )


def test_a_core_command_needs_no_extra(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    for extra in list(errors.EXTRAS):
        monkeypatch.setitem(errors.EXTRAS, extra, (ABSENT,))
    assert cli.main(["devices", "--json"]) == 0
    assert "extra" not in capsys.readouterr().err


def test_a_pod_without_the_serve_extra_refuses_a_serve_job(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Refused when submitted (409: a valid spec this box cannot take), not failed later by the job."""
    store = Store(tmp_path / "pod.db")
    store.add_user("alice", False)
    alice = User("alice", admin=False)
    never = Unplaceable("no device in this test", ever=False)
    config = PodConfig(home=tmp_path / "home")
    local = LocalExecutor(config, device_count=1, device_kind="cpu", place=lambda *_: never)
    pod = Pod(config, store, local, device_count=1, device_kind="cpu", place=local.place)
    serve = {"serve": {"run": str(tmp_path / "runs" / "r")}}
    with pytest.raises(ConflictError, match="is not a run folder"):  # with the extra: the next check speaks
        pod.submit(alice, serve)
    monkeypatch.setitem(errors.EXTRAS, "serve", (ABSENT,))
    with pytest.raises(ConflictError) as e:
        pod.submit(alice, serve)
    assert str(e.value) == (
        f"job spec: a serve job needs the serve extra ({ABSENT} is not installed): pip install 'deskpod[serve]'"
    )
    with pytest.raises(ConflictError, match="can never fit"):  # other kinds go on to the box's own checks
        pod.submit(alice, {"command": ["true"]})
    assert store.jobs() == []
