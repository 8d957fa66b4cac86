"""``deskpod doctor --cluster`` against the real test cluster, a machine without Slurm, and a dead controller."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import pytest

from deskpod import cli
from deskpod.cluster import doctor
from deskpod.cluster.doctor import KNOWN_BUGS, ClusterReport, bug_checks, check_cluster
from deskpod.cluster.slurm import NTASKS_PER_NODE_BUG, Version, parse_version
from tests.cluster.slurm import GPUS_PER_NODE, NODES, SlurmCluster, missing

Run = Callable[..., tuple[int, str, str]]


@pytest.fixture
def run_cli(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> Run:
    """Run ``deskpod ARGS`` in-process with only the doctor command; returns (code, stdout, stderr)."""
    monkeypatch.setattr(cli, "COMMAND_MODULES", ("deskpod.cli.doctor",))

    def run(*args: str) -> tuple[int, str, str]:
        code = cli.main(list(args))
        out, err = capsys.readouterr()
        return code, out, err

    return run


def statuses(report: ClusterReport) -> dict[str, str]:
    return {c.name: c.status for c in report.checks if c.name != "known bug"}


def test_the_test_cluster_passes_or_warns_where_expected(slurm: SlurmCluster) -> None:
    report = check_cluster(timeout=30)
    assert statuses(report) == {
        "clients": "pass",
        "config": "pass",
        "version": "pass",
        "controller": "pass",
        "munge": "pass",
        "partitions": "pass",
        "gpu gres": "pass",
        "squeue json": "pass",
        "scontrol text": "pass",
        "sacct": "warn",  # no slurmdbd here
        "node names": "pass",
    }, report.to_table()
    assert not report.failed
    version = slurm_version(report)
    assert report.check("version").detail.startswith(f"slurm-wlm {version}")
    assert report.check("config").detail == f"SLURM_CONF={slurm.conf}"
    assert " is UP" in report.check("controller").detail
    assert report.check("munge").detail.startswith("munge -n | unmunge: Success")
    assert report.check("partitions").detail.startswith(f"debug (default): {len(NODES)} nodes up")  # default first
    assert report.check("gpu gres").detail.startswith(f"debug: {len(NODES)} nodes, up to {GPUS_PER_NODE} GPUs per node")
    assert report.check("squeue json").detail.startswith("squeue --json works (")
    sacct = report.check("sacct").detail
    assert "AccountingStorageType=accounting_storage/none" in sacct
    assert "scontrol show job, which forgets a job MinJobAge=3600 s after it ends" in sacct
    assert report.check("node names").detail == f"{', '.join(NODES)} resolve (127.0.0.1)"
    # the known-bug lines are the table's, for this version and this cluster's config (PrologFlags unset)
    bugs = [c for c in report.checks if c.name == "known bug"]
    assert bugs == bug_checks(version, {"PrologFlags": "(null)"})
    assert len(bugs) == sum(b.applies(version) for b in KNOWN_BUGS)


def slurm_version(report: ClusterReport) -> Version:
    assert report.version is not None
    return parse_version(report.version)


def test_cli_cluster_table_and_json(slurm: SlurmCluster, run_cli: Run) -> None:
    code, out, err = run_cli("doctor", "--cluster", "--json")
    data = json.loads(out)
    assert (code, err) == (0, "")
    assert data["schema"] == "deskpod.doctor.cluster/1" and data["ok"] is True
    assert {c["name"] for c in data["checks"]} >= {"clients", "controller", "gpu gres", "sacct", "node names"}
    assert all(c["source"] for c in data["checks"] if c["name"] == "known bug")
    code, out, _ = run_cli("doctor", "--cluster")
    lines = out.splitlines()
    assert code == 0 and lines[0].split() == ["check", "status", "detail"]
    assert lines[-1].startswith("OK: ") and f"Slurm {data['slurm_version']}" in lines[-1]


def test_no_slurm_on_this_machine(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, run_cli: Run) -> None:
    """A report whose clients line fails and says what to install; exit code 1 (a failed check)."""
    monkeypatch.setenv("PATH", str(tmp_path))  # a folder with no Slurm client (and no munge) in it
    report = check_cluster(timeout=5)
    clients = report.check("clients")
    assert clients.status == "fail"
    assert clients.detail.startswith(
        "no Slurm on this machine: sbatch, squeue, scontrol, scancel, sinfo, srun not on PATH"
    )
    assert "apt-get install slurm-client" in clients.detail
    assert report.check("munge").status == "warn" and "not on PATH" in report.check("munge").detail
    others = [c for c in report.checks if c.name not in ("clients", "munge")]
    assert others and all(c.status == "skip" for c in others)
    assert report.failed and report.version is None
    code, out, err = run_cli("doctor", "--cluster")
    assert (code, err) == (1, "")
    assert "no Slurm on this machine" in out and out.splitlines()[-1].startswith("FAIL: ")


def test_unreachable_controller_fails_its_check(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A real slurm.conf whose controller port nothing listens on (no daemon started): the controller check
    fails and what needs the controller is skipped, every command under a short timeout."""
    why = missing()
    if why:
        pytest.fail(f"this test needs Slurm's clients here: {why}")
    dead = SlurmCluster(tmp_path)
    dead.write_config()  # free ports, chosen and released: no slurmctld behind them
    monkeypatch.setenv("SLURM_CONF", str(dead.conf))
    report = check_cluster(timeout=5)
    controller = report.check("controller")
    assert controller.status == "fail"
    assert controller.detail.startswith("the Slurm controller is unreachable: ") and "DOWN" in controller.detail
    assert report.check("version").status == "pass"  # sbatch --version reads the config only
    for name in ("partitions", "gpu gres", "squeue json", "scontrol text", "node names"):
        assert report.check(name).status == "skip" and "controller" in report.check(name).detail
    assert report.failed


def test_a_slurm_conf_that_does_not_exist(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Slurm's clients retry a missing SLURM_CONF for 60 s; the doctor says so at once and runs none."""
    monkeypatch.setenv("SLURM_CONF", str(tmp_path / "nowhere.conf"))
    report = check_cluster(timeout=5)
    if report.check("clients").status == "fail":
        pytest.fail(f"this test needs Slurm's clients here: {report.check('clients').detail}")
    config = report.check("config")
    assert config.status == "fail" and config.detail.startswith(f"SLURM_CONF={tmp_path / 'nowhere.conf'}: no such file")
    assert all(c.status == "skip" for c in report.checks if c.name not in ("clients", "config", "munge"))


def test_known_bugs_by_version_and_config() -> None:
    def lines(v: Version, config: dict[str, str]) -> list[tuple[str, str]]:
        return [(c.status, c.detail.split(":")[0]) for c in bug_checks(v, config)]

    contained = {"PrologFlags": "Alloc,Contain"}
    assert lines(Version(22, 5, 8), contained) == [
        ("pass", "since 22.05.5, fixed in 22.05.9"),  # --ntasks-per-node: deskpod avoids it
        ("warn", "since 22.05.7, fixed in 22.05.9"),  # srun outside a node
        ("pass", "since 21.08.0, fixed in 24.05.1"),  # squeue --json filters: deskpod filters itself
        ("warn", "fixed in 24.11.6"),  # --signal and the extern step: exposed with Contain
    ]
    assert lines(Version(22, 5, 4), {"PrologFlags": "(null)"}) == [
        ("pass", "since 21.08.0, fixed in 24.05.1"),
        ("pass", "fixed in 24.11.6"),
    ]
    assert [c.status for c in bug_checks(Version(24, 5, 1), {})] == ["warn"]  # cannot tell without the config
    assert "cannot tell" in bug_checks(Version(24, 5, 1), {})[0].detail
    assert bug_checks(Version(24, 11, 6), contained) == [] == bug_checks(Version(25, 5, 4), contained)
    x11 = bug_checks(Version(23, 11, 10), {"PrologFlags": "X11"})
    assert [c.status for c in x11] == ["pass", "warn"] and "signal_before_s = 0" in x11[1].detail
    for bug in KNOWN_BUGS:
        assert bug.source.startswith("https://github.com/SchedMD/slurm/blob/master/CHANGELOG/slurm-")
        assert "SchedMD bug" in bug.source or "SchedMD ticket" in bug.source
    assert (KNOWN_BUGS[0].first, KNOWN_BUGS[0].fixed) == NTASKS_PER_NODE_BUG


def test_report_verdict_and_table() -> None:
    report = ClusterReport(
        [doctor.ClusterCheck("clients", "pass", "all there"), doctor.ClusterCheck("sacct", "warn", "no slurmdbd")],
        "22.05.8",
        0.5,
    )
    assert not report.failed
    assert report.to_table().splitlines()[-1] == (
        "OK: 2 checks (0 failed, 1 warnings, 0 skipped), Slurm 22.05.8, in 0.5 s"
    )
    report.checks.append(doctor.ClusterCheck("controller", "fail", "DOWN"))
    assert report.failed and json.loads(report.to_json())["ok"] is False
    with pytest.raises(KeyError, match="no check 'munge'; checks: clients, sacct, controller"):
        report.check("munge")
