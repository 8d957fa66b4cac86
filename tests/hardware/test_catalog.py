"""The catalog: every machine loads, every number has a source, unknown names get a suggestion."""

from __future__ import annotations

import pytest

from deskpod.errors import ConfigError, UsageError
from deskpod.hardware.catalog import find_machine, machine, machine_names, machines, parse_machine
from deskpod.hardware.topology import GPU_LINK_MODELS

EXPECTED = {
    "dgx1-p100": 8, "dgx1-v100": 8, "dgx-station": 4, "dgx-2": 16, "dgx-a100": 8, "dgx-a100-80gb": 8,
    "dgx-h100": 8, "hgx-h200": 8, "pcie-8gpu": 8, "xeon-e5-2697v3-2s": 2,
    "xeon-e5-2699v4-2s": 2, "digits-devbox": 4, "gce-k80-8": 8,
}  # fmt: skip


def test_every_reference_machine_loads_with_its_device_count() -> None:
    assert set(machine_names()) == set(EXPECTED)
    for name, count in EXPECTED.items():
        assert machine(name).device_count == count == find_machine(name).device_count


def test_every_number_is_sourced_and_link_rates_match_the_generation_table() -> None:
    for m in machines():
        for section in m.specs.values():
            for spec in section.values():
                assert spec.source.strip(), m.name
        if m.gpu:
            model, table = m.link_model(), GPU_LINK_MODELS[m.gpu]
            assert (model.nvlink_gbps, model.pcie_gen, model.pcie_gbps) == (
                table.nvlink_gbps,
                table.pcie_gen,
                table.pcie_gbps,
            )


def test_published_figures() -> None:
    h200 = find_machine("hgx-h200")
    assert h200.peak_tflops("bf16") is not None and h200.peak_tflops("bf16").value == 989.4  # type: ignore[union-attr]
    assert h200.spec("device", "memory_bandwidth_gbs").value == 4800  # type: ignore[union-attr]
    v100 = find_machine("dgx1-v100")
    assert v100.peak_tflops("fp32").value == 15.7  # type: ignore[union-attr]
    assert v100.spec("nics", "count").value == 4  # type: ignore[union-attr]
    assert find_machine("dgx-2").spec("machine", "nvswitches").value == 12  # type: ignore[union-attr]


def test_aliases_and_suggestions() -> None:
    assert find_machine("DGX1").name == "dgx1-v100"
    assert find_machine("station").name == "dgx-station"
    with pytest.raises(UsageError, match="unknown machine 'dgx1-v10'; did you mean 'dgx1-v100'"):
        find_machine("dgx1-v10")
    with pytest.raises(UsageError, match="did you mean 'dgx-a100'"):
        machine("dgx-a10")
    with pytest.raises(UsageError, match="known: dgx-2, "):
        find_machine("zzzzzz")


def _minimal() -> dict[str, object]:
    return {
        "name": "x", "title": "X", "kind": "cpu",
        "device": {"count": {"value": 2, "source": "s"}},
    }  # fmt: skip


def test_a_number_without_source_or_an_unknown_key_is_refused() -> None:
    parse_machine(_minimal(), "x.toml")
    bad = _minimal()
    bad["device"] = {"count": {"value": 2, "source": "s"}, "memory_gb": {"value": 16}}
    with pytest.raises(ConfigError, match=r"memory_gb: a number must be written"):
        parse_machine(bad, "x.toml")
    bad["device"] = {"count": {"value": 2, "source": "  "}}
    with pytest.raises(ConfigError, match="every number needs a source"):
        parse_machine(bad, "x.toml")
    typo = _minimal()
    typo["devices"] = {}
    with pytest.raises(ConfigError, match="unknown key 'devices'; valid: name, title"):
        parse_machine(typo, "x.toml")
