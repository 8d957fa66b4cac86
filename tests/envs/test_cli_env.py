"""``deskpod env build|list|show|prune``: outputs, exit codes, and the one line of a failed build."""

from __future__ import annotations

import json
import os
import pwd
from collections.abc import Callable
from pathlib import Path

import pytest

from deskpod import cli

from .test_cache import LOCAL, SIX_HASH, sources

Run = Callable[..., tuple[int, str, str]]


@pytest.fixture
def run_cli(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], tmp_path: Path) -> Run:
    """Run ``deskpod ARGS`` in-process in ``tmp_path``; packages from the local index when there is one."""
    monkeypatch.setattr(cli, "COMMAND_MODULES", ("deskpod.cli.env",))
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("DESKPOD_ENV_CACHE", raising=False)
    if sources() is LOCAL:
        monkeypatch.setenv("PIP_CONFIG_FILE", "/dev/null")
        monkeypatch.setenv("PIP_INDEX_URL", LOCAL.index_url or "")

    def run(*args: str) -> tuple[int, str, str]:
        code = cli.main(list(args))
        out, err = capsys.readouterr()
        return code, out, err

    return run


def test_build_list_show_prune(run_cli: Run, tmp_path: Path) -> None:
    (tmp_path / "job.toml").write_text(
        'command = ["python", "-c", "import six"]\n[environment]\npython = "3.11"\nrequirements = "requirements.txt"\n'
    )
    (tmp_path / "requirements.txt").write_text(f"six==1.17.0 --hash={SIX_HASH}\n")
    code, out, err = run_cli("env", "build", "job.toml", "--cache", "envs", "--log", "build.log")
    assert (code, err) == (0, "")
    path = Path(out.strip())
    assert path.is_absolute() and path.parent.parent == tmp_path / "envs" and (path / "bin" / "python").exists()
    assert "deskpod: building environment" in (tmp_path / "build.log").read_text()

    code, out, err = run_cli("env", "build", "job.toml", "--cache", "envs")  # the installer's output: stderr
    assert code == 0 and Path(out.strip()) == path
    assert "nothing to install" in err and "building" not in err

    code, out, err = run_cli("env", "list", "--cache", "envs")
    assert (code, err) == (0, "")
    head, row, total = out.splitlines()
    assert head.split() == ["KEY", "ACCOUNT", "STATE", "PYTHON", "SIZE", "LAST", "USED", "WHAT"]
    key12 = path.parent.name[:12]
    me = pwd.getpwuid(os.geteuid()).pw_name  # the cache's own root: the account that owns it
    assert row.split()[:3] == [key12, me, "ready"] and row.endswith("requirements requirements.txt (1 requirement)")
    assert total.startswith("total: 1 environment, ") and "(uv cache " in total and str(tmp_path / "envs") in total
    listed = json.loads(run_cli("env", "list", "--cache", "envs", "--json")[1])
    [entry] = listed["environments"]
    assert entry["state"] == "ready" and entry["python"].startswith("3.11.") and entry["in_use"] is False
    assert entry["account"] == ""
    assert listed["total_bytes"] > 0 and listed["uv_cache_bytes"] > 0

    code, out, err = run_cli("env", "show", key12[:6], "--cache", "envs")
    assert code == 0
    assert out.splitlines()[:2] == [f"key:        {entry['key']}", f"account:    {me}"]
    assert f"path:       {path}" in out.splitlines()
    assert out.endswith("freeze.txt:\n  six==1.17.0\n")
    shown = json.loads(run_cli("env", "show", key12, "--cache", "envs", "--json")[1])
    assert shown["meta"]["key"] == entry["key"] and shown["freeze"] == "six==1.17.0\n"
    assert shown["meta"]["definition"]["requirements"]["text"] == (tmp_path / "requirements.txt").read_text()

    code, out, _ = run_cli("env", "prune", "--cache", "envs", "--max-size", "1G")
    assert code == 0 and out.startswith("nothing to remove: the cache is within 1.0G\nleft: 1 environment, ")
    code, out, _ = run_cli("env", "prune", "--cache", "envs", "--max-size", "1K", "--dry-run")
    assert out.startswith(f"would remove {key12}  {me}  ready ") and "left: 0 environments, 0B of at most 1.0K" in out
    assert path.exists()
    code, out, _ = run_cli("env", "prune", "--cache", "envs", "--max-size", "0")
    assert code == 0 and out.startswith(f"removed {key12}  {me}  ready ") and "left: 0 environments, 0B" in out
    assert not path.exists()
    assert run_cli("env", "list", "--cache", "envs")[1].startswith("no environments in ")


def test_a_failed_build_exits_1_with_one_line(run_cli: Run, tmp_path: Path) -> None:
    (tmp_path / "env.json").write_text(json.dumps({"packages": ["nosuchpkg-deskpod==1.0"], "python": "3.11"}))
    code, out, err = run_cli("env", "build", "--definition", "env.json", "--cache", "envs", "--log", "build.log")
    assert code == 1 and out == ""
    [line] = err.splitlines()
    assert line.startswith("deskpod: environment build failed (uv pip install): No solution found when resolving")
    assert "nosuchpkg-deskpod was not found" in line
    assert "nosuchpkg-deskpod" in (tmp_path / "build.log").read_text()
    code, out, _ = run_cli("env", "list", "--cache", "envs")
    assert out.splitlines()[1].split()[2] == "broken"
    code, out, _ = run_cli("env", "show", out.splitlines()[1].split()[0], "--cache", "envs")
    assert "freeze.txt: none (the build did not finish; see the build log)" in out


@pytest.mark.parametrize(
    ("files", "args", "message"),
    [
        ({}, ("prune", "--max-size", "20X"),
         "deskpod: --max-size '20X': not a size; use a number with K, M, G or T, e.g. 500M or 20G"),
        ({}, ("show", "abc123"), "deskpod: no environment 'abc123' in "),
        ({}, ("show", "zz"), "deskpod: environment 'zz': expected a key or its first characters (hex)"),
        ({}, ("build",), "deskpod: give a job spec (SPEC.toml) or --definition FILE.json to build, one of them"),
        ({"a.toml": 'command = ["x"]\n'}, ("build", "a.toml", "--definition", "a.json"), "deskpod: give a job spec"),
        ({"a.toml": 'command = ["x"]\n'}, ("build", "a.toml"), "deskpod: job spec 'a.toml' has no [environment] table"),
        ({"a.toml": '[environment]\npackages = ["six"]\npython = "3.99"\n'}, ("build", "a.toml"),
         "deskpod: job spec: environment.python '3.99' is not available on this box; available: "),
        ({"a.toml": '[environment]\nrequirements = "nope.txt"\n'}, ("build", "a.toml"),
         "deskpod: job spec: environment.requirements 'nope.txt': cannot read"),
        ({"a.toml": '[environment]\nimage = "docker.io/library/python:3.11"\n'}, ("build", "a.toml"),
         "deskpod: job spec: environment.image 'docker.io/library/python:3.11' "),  # needs a runtime / is run by
        ({"a.json": "{"}, ("build", "--definition", "a.json"), "deskpod: --definition 'a.json': not valid JSON"),
        ({"a.json": "{}"}, ("build", "--definition", "a.json"), "deskpod: job spec: environment: give exactly one of"),
        ({"a.json": '{"packages": ["six"]}'}, ("build", "--definition", "a.json", "--log", "/nonexistent/x.log"),
         "deskpod: --log '/nonexistent/x.log': cannot open it (No such file or directory)"),
    ],
)  # fmt: skip
def test_bad_input_exits_2(run_cli: Run, tmp_path: Path, files: dict[str, str], args: tuple[str, ...],
                           message: str) -> None:  # fmt: skip
    for name, text in files.items():
        (tmp_path / name).write_text(text)
    code, out, err = run_cli("env", *args, "--cache", "envs")
    assert code == 2 and out == ""
    assert err.startswith(message) and len(err.splitlines()) == 1, err
