"""Fixtures shared by the test packages: a real Slurm cluster (slurmctld + two slurmd on 127.0.0.1), started once
for the session (the cluster tests and the executor tests of tests/jobs use the same one)."""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest

from tests.cluster.slurm import SlurmCluster, missing


@pytest.fixture(scope="session")
def slurm(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SlurmCluster]:
    """The cluster; ``SLURM_CONF`` points at it for the whole session (deskpod's code reads it like any client)."""
    why = missing()
    if why:
        pytest.fail(f"the Slurm tests need a real Slurm here: {why}")
    cluster = SlurmCluster(tmp_path_factory.mktemp("slurm")).start()
    saved = os.environ.get("SLURM_CONF")
    os.environ["SLURM_CONF"] = str(cluster.conf)
    yield cluster
    cluster.stop()
    if saved is None:
        os.environ.pop("SLURM_CONF", None)
    else:
        os.environ["SLURM_CONF"] = saved
