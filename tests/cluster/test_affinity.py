"""NIC and CPU affinity per local rank: every catalog machine, the DGX-1's pairs, bad input, the CLI."""

from __future__ import annotations

import json
import os
import re
from collections import Counter
from collections.abc import Callable
from pathlib import Path

import pytest

from deskpod import cli
from deskpod.errors import DeviceError, UsageError
from deskpod.hardware.affinity import (
    format_cpu_list,
    node_affinity,
    parse_cpu_list,
    rank_affinity,
    rank_devices,
)
from deskpod.hardware.catalog import machine, machines
from deskpod.hardware.topo_matrix import matrix_to_topology, parse_topo_matrix

Run = Callable[..., tuple[int, str, str]]

# A 2-GPU matrix in the nvidia-smi 5xx format, once with its NIC Legend and once without.
TWO_GPUS = """\
\tGPU0\tGPU1\tNIC0\tNIC1\tCPU Affinity\tNUMA Affinity
GPU0\t X \tNV4\tPIX\tSYS\t0-7\t0
GPU1\tNV4\t X \tSYS\tPIX\t8-15\t1
NIC0\tPIX\tSYS\t X \tSYS
NIC1\tSYS\tPIX\tSYS\t X
"""
LEGEND = "\nNIC Legend:\n\n  NIC0: mlx5_4\n  NIC1: mlx5_7\n"


@pytest.fixture
def run_cli(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> Run:
    """Run ``deskpod ARGS`` in-process with only the cluster command; returns (code, stdout, stderr)."""
    monkeypatch.setattr(cli, "COMMAND_MODULES", ("deskpod.cli.cluster",))

    def run(*args: str) -> tuple[int, str, str]:
        code = cli.main(list(args))
        out, err = capsys.readouterr()
        return code, out, err

    return run


@pytest.mark.parametrize("name", [m.name for m in machines()])
def test_every_catalog_machine_every_local_rank(name: str) -> None:
    topo = machine(name)
    ranks = node_affinity(topo)
    assert [r.local_rank for r in ranks] == list(range(topo.device_count))
    assert [r.device for r in ranks] == list(range(topo.device_count))
    load = Counter(r.nic for r in ranks if r.nic is not None)
    for r in ranks:
        assert r == rank_affinity(topo, r.local_rank)
        assert r.reason.startswith(f"local rank {r.local_rank}: {topo.devices[r.device].label}, ")
        if not topo.nics:
            assert r.nic is None and r.env == {} and "no NIC" in r.reason
            continue
        assert r.nic in topo.nearest_nics(r.device) and r.nearest_nics == topo.nearest_nics(r.device)
        assert r.env == {"NCCL_IB_HCA": f"={r.nic}", "UCX_NET_DEVICES": f"{r.nic}:1"}
        assert r.nic_path == next(n for n in topo.nics if n.name == r.nic).paths[r.device]
        # No equally near NIC carries two ranks fewer than the one chosen: ties are spread.
        assert load[r.nic] - min(load[n] for n in r.nearest_nics) <= 1
        if topo.devices[r.device].cpu_affinity:
            assert r.cpus == parse_cpu_list(topo.devices[r.device].cpu_affinity) and r.cpus
        else:
            assert r.cpus == () and "CPUs unknown" in r.reason


def test_dgx1_pairs_share_the_nic_of_their_pcie_switch() -> None:
    for name in ("dgx1-v100", "dgx1-p100"):
        nics = [r.nic for r in node_affinity(machine(name))]
        assert nics == ["mlx5_0", "mlx5_0", "mlx5_1", "mlx5_1", "mlx5_2", "mlx5_2", "mlx5_3", "mlx5_3"], name
    r3 = rank_affinity(machine("dgx1-v100"), 3)
    assert (r3.device, r3.nic, r3.nic_path, r3.numa_node) == (3, "mlx5_1", "PIX", None)
    assert r3.cpus == tuple(range(0, 20)) + tuple(range(40, 60))
    assert r3.reason == "local rank 3: GPU3, nearest NIC mlx5_1 (PIX), CPUs 0-19,40-59"
    assert rank_affinity(machine("dgx1-v100"), 6).cpus == tuple(range(20, 40)) + tuple(range(60, 80))


def test_dgx_a100_spreads_each_gpu_pair_over_its_two_equally_near_nics() -> None:
    ranks = node_affinity(machine("dgx-a100"))
    assert [r.nic for r in ranks] == ["mlx5_0", "mlx5_1", "mlx5_2", "mlx5_3", "mlx5_6", "mlx5_7", "mlx5_8", "mlx5_9"]
    assert ranks[1].nearest_nics == ("mlx5_0", "mlx5_1") and "as near as mlx5_0" in ranks[1].reason
    assert ranks[0].numa_node == 3 and format_cpu_list(ranks[0].cpus) == "48-63,176-191"
    # Exact match: a bare prefix mlx5_1 would also take mlx5_10 and mlx5_11 of this box.
    assert ranks[1].env["NCCL_IB_HCA"] == "=mlx5_1"


def test_nvswitch_boxes_give_each_gpu_its_own_nic() -> None:
    for name in ("dgx-h100", "hgx-h200"):
        nics = [r.nic for r in node_affinity(machine(name))]
        assert len(set(nics)) == 8, (name, nics)


def test_explicit_device_list_and_balance_within_the_job() -> None:
    topo = machine("dgx-a100")
    # Ranks 0 and 1 run on GPU1 and GPU0: the tie is spread over the job's ranks, in rank order.
    ranks = node_affinity(topo, [1, 0])
    assert [(r.device, r.nic) for r in ranks] == [(1, "mlx5_0"), (0, "mlx5_1")]
    r = rank_affinity(machine("dgx1-v100"), 1, [4, 5, 6, 7])
    assert (r.local_rank, r.device, r.nic) == (1, 5, "mlx5_2")


def test_machines_without_nics_set_no_nic_variables() -> None:
    for name in ("dgx-station", "digits-devbox", "xeon-e5-2697v3-2s"):
        for r in node_affinity(machine(name)):
            assert r.nic is None and r.nearest_nics == () and r.env == {}


def test_nic_names_come_from_the_legend_and_placeholders_are_never_exported() -> None:
    named = matrix_to_topology(parse_topo_matrix(TWO_GPUS + LEGEND), "two")
    assert [(r.nic, r.cpus, r.numa_node) for r in node_affinity(named)] == [
        ("mlx5_4", tuple(range(8)), 0),
        ("mlx5_7", tuple(range(8, 16)), 1),
    ]
    bare = matrix_to_topology(parse_topo_matrix(TWO_GPUS), "bare")
    r = rank_affinity(bare, 0)
    assert r.nic is None and r.env == {} and "no NIC Legend" in r.reason


def test_parse_and_format_cpu_lists() -> None:
    assert parse_cpu_list("0-3,8,10-11") == (0, 1, 2, 3, 8, 10, 11)
    assert parse_cpu_list(" 5 ") == (5,)
    assert parse_cpu_list("2-3,0-2") == (0, 1, 2, 3)
    assert format_cpu_list(parse_cpu_list("0-19,40-59")) == "0-19,40-59"
    assert format_cpu_list([7, 1, 2, 3, 5]) == "1-3,5,7"
    assert format_cpu_list([]) == ""


@pytest.mark.parametrize(("text", "named"), [("", "''"), ("N/A", "'N/A'"), ("0-", "'0-'"), ("5-3", "'5-3'"),
                                             ("0,,2", "''"), ("1-4:2", "'1-4:2'"), ("a", "'a'")])  # fmt: skip
def test_bad_cpu_lists_name_the_bad_item(text: str, named: str) -> None:
    with pytest.raises(UsageError, match="CPU list") as e:
        parse_cpu_list(text)
    assert named in str(e.value)


@pytest.mark.parametrize(
    ("rank", "devices", "message"),
    [
        (8, None, "local rank 8 is out of range on 'dgx1-v100': its 8 devices give local ranks 0-7"),
        (-1, None, "local rank -1 is out of range .* 0-7"),
        (2, [0, 1], r"local rank 2 .* the device list \[0, 1\] gives local ranks 0-1"),
        (0, [0, 8], "device 8 is not on 'dgx1-v100': it has 8 devices, valid 0-7"),
        (0, [3, 3], r"device 3 appears twice in the device list \[3, 3\]"),
        (0, [], "empty device list for 'dgx1-v100'; give indices in 0-7"),
    ],
)
def test_bad_ranks_and_device_lists_name_the_value(rank: int, devices: list[int] | None, message: str) -> None:
    with pytest.raises(DeviceError, match=message):
        rank_affinity(machine("dgx1-v100"), rank, devices)


def test_rank_devices_defaults_to_every_device() -> None:
    assert rank_devices(machine("dgx-station")) == (0, 1, 2, 3)
    assert rank_devices(machine("dgx-station"), [3, 1]) == (3, 1)


def test_cli_env_prints_exports_and_the_reason(run_cli: Run) -> None:
    code, out, err = run_cli("cluster", "env", "--machine", "dgx1-v100", "--local-rank", "3")
    assert (code, err) == (0, "")
    assert out.splitlines() == [
        "# local rank 3: GPU3, nearest NIC mlx5_1 (PIX), CPUs 0-19,40-59",
        "export NCCL_IB_HCA='=mlx5_1'",
        "export UCX_NET_DEVICES=mlx5_1:1",
    ]
    code, out, _ = run_cli("cluster", "env", "--machine", "dgx1", "--local-rank", "1", "--devices", "6,7")
    assert code == 0 and "export UCX_NET_DEVICES=mlx5_3:1" in out and "GPU7" in out


def test_cli_env_json(run_cli: Run) -> None:
    code, out, _ = run_cli("cluster", "env", "--machine", "dgx-a100", "--local-rank", "1", "--json")
    info = json.loads(out)
    assert code == 0 and info["machine"] == "dgx-a100" and info["source"] == "catalog:dgx-a100"
    assert (info["local_rank"], info["device"], info["nic"], info["nic_path"]) == (1, 1, "mlx5_1", "PXB")
    assert info["nearest_nics"] == ["mlx5_0", "mlx5_1"] and info["cpu_list"] == "48-63,176-191"
    assert info["env"] == {"NCCL_IB_HCA": "=mlx5_1", "UCX_NET_DEVICES": "mlx5_1:1"} and info["numa_node"] == 3


def test_cli_env_without_nics_and_from_a_topo_file(run_cli: Run, tmp_path: Path) -> None:
    code, out, _ = run_cli("cluster", "env", "--machine", "dgx-station", "--local-rank", "0")
    assert code == 0 and "export" not in out and out.startswith("# local rank 0: GPU0, no NIC")
    path = tmp_path / "two.txt"
    path.write_text(TWO_GPUS + LEGEND)
    code, out, _ = run_cli("cluster", "env", "--topo", str(path), "--local-rank", "1")
    assert code == 0 and "export NCCL_IB_HCA='=mlx5_7'" in out and "CPUs 8-15, NUMA node 1" in out


def test_cli_env_on_this_box(run_cli: Run) -> None:
    code, out, err = run_cli("cluster", "env", "--local-rank", "0")
    assert (code, err) == (0, "") and out.startswith("# local rank 0: ")


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--machine", "dgx1-v100", "--local-rank", "8"], "local rank 8 is out of range"),
        (["--machine", "dgx1-v100", "--local-rank", "0", "--devices", "0,x"], "--devices '0,x': not a device list"),
        (["--machine", "dgx1-v100", "--local-rank", "0", "--devices", "9"], "device 9 is not on 'dgx1-v100'"),
        (["--machine", "dgx-1000", "--local-rank", "0"], "unknown machine 'dgx-1000'.*known: dgx-2"),
        (["--topo", "/nonexistent/topo.txt", "--local-rank", "0"], "cannot read topology file"),
    ],
)
def test_cli_env_bad_input_exits_2(run_cli: Run, args: list[str], message: str) -> None:
    code, out, err = run_cli("cluster", "env", *args)
    assert code == 2 and out == ""
    assert err.startswith("deskpod: ") and len(err.splitlines()) == 1
    assert re.search(message, err), err


def test_cli_cluster_needs_a_subcommand_and_a_rank(run_cli: Run) -> None:
    for args in (
        ["cluster"],
        ["cluster", "env", "--machine", "dgx1"],
        ["cluster", "env", "--local-rank", "x"],
        ["cluster", "env", "--machine", "dgx1", "--topo", "t.txt", "--local-rank", "0"],
    ):
        with pytest.raises(SystemExit) as e:
            run_cli(*args)
        assert e.value.code == 2


def test_the_launcher_writes_each_local_ranks_nic_and_cores_for_its_workers(monkeypatch: pytest.MonkeyPatch) -> None:
    """On a GPU node the launcher puts every local rank's affinity in launch.json (here the node is the
    catalog's recorded DGX-1 matrix, the one thing this machine cannot give: its GPUs and NICs)."""
    from deskpod.hardware import placement
    from deskpod.hardware.catalog import find_machine
    from deskpod.hardware.devices import Device
    from deskpod.train import launcher

    monkeypatch.setattr(placement, "local_topology", lambda: find_machine("dgx1-v100").topology())
    devices = tuple(Device("cuda", i, "Tesla V100-SXM2-32GB", 32 << 30) for i in (2, 3))
    plan = launcher.Plan(None, None, devices, "cuda", None, 32, False)  # type: ignore[arg-type]
    got = launcher._affinity(plan)
    assert got["0"]["env"] == {"NCCL_IB_HCA": "=mlx5_1", "UCX_NET_DEVICES": "mlx5_1:1"}
    assert got["1"]["env"]["NCCL_IB_HCA"] == "=mlx5_1" and got["1"]["cpus"][:2] == [0, 1]
    assert launcher._affinity(launcher.Plan(None, None, devices, "cpu", None, 32, False)) == {}  # type: ignore[arg-type]


def test_a_worker_pins_itself_before_nccl_starts(tmp_path: Path) -> None:
    import subprocess
    import sys

    code = (
        "import os; from deskpod.hardware.affinity import pin_rank; "
        "pin_rank({'env': {'NCCL_IB_HCA': '=mlx5_3', 'UCX_NET_DEVICES': 'mlx5_3:1'}, 'cpus': [0, 999]}); "
        "print(os.environ['NCCL_IB_HCA'], os.environ['UCX_NET_DEVICES'], sorted(os.sched_getaffinity(0)))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                         env={**os.environ, "UCX_NET_DEVICES": "mine:1"}).stdout.strip().split(maxsplit=2)  # fmt: skip
    assert out == ["=mlx5_3", "mine:1", "[0]"]  # a variable the user set wins; cores it may not use are dropped
