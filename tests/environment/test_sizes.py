"""`deskpod.environment.sizes.parse_size`: the one reader of ``20G`` and ``512M`` (the env cache, job limits, bench comm)."""

from __future__ import annotations

import re

import pytest

from deskpod.environment.sizes import parse_duration, parse_size
from deskpod.errors import ConfigError


@pytest.mark.parametrize(
    ("text", "size"),
    [("4096", 4096), ("64K", 1 << 16), ("500M", 500 << 20), ("20G", 20 << 30), ("1tb", 1 << 40), ("2GiB", 2 << 30),
     ("1.5k", 1536), (" 16 G ", 16 << 30)],
)  # fmt: skip
def test_a_size_is_bytes_in_powers_of_1024(text: str, size: int) -> None:
    assert parse_size(text) == size


@pytest.mark.parametrize("text", ["20X", "lots", "", "G", "-1G", "1.G", "٣G", "²M", "1e3"])
def test_what_is_not_a_size_is_refused_naming_the_value_and_what_is_valid(text: str) -> None:
    with pytest.raises(ConfigError) as e:
        parse_size(text, "--max-size")
    assert str(e.value) == f"--max-size {text!r}: not a size; use a number with K, M, G or T, e.g. 500M or 20G"


@pytest.mark.parametrize(("text", "seconds"), [("4h", 14400.0), ("90m", 5400.0), ("1h30m", 5400.0), ("45s", 45.0),
                                              ("3600", 3600.0), ("2d", 172800.0), (" 2.5M ", 150.0)])  # fmt: skip
def test_durations_as_people_write_them(text: str, seconds: float) -> None:
    assert parse_duration(text) == seconds


@pytest.mark.parametrize("text", ["soon", "", "4x", "h4", "0", "0m", "-1h", "1h-30m"])
def test_a_bad_duration_names_the_flag_and_the_value(text: str) -> None:
    with pytest.raises(ConfigError, match=rf"^--time {re.escape(repr(text))}: expected a duration"):
        parse_duration(text)
