"""Byte sizes as people write them, as the tools print them, and link times
(planner/units.py)."""

import re

import pytest

from pipestudio.planner.units import format_bytes, gbps_to_bytes_per_ms, parse_size, transfer_ms


@pytest.mark.parametrize(
    "text,expected",
    [
        ("16GiB", 16 * 2**30),
        ("1.5GB", 1_500_000_000),
        ("512 MiB", 512 * 2**20),
        ("1000", 1000),
        ("2tib", 2 * 2**40),
        ("80GB", 80 * 10**9),
    ],
)
def test_parse_size(text: str, expected: int) -> None:
    assert parse_size(text) == expected


@pytest.mark.parametrize("text", ["", "lots", "16 GiBs", "-1GB", "1e999GB"])
def test_parse_size_errors(text: str) -> None:
    with pytest.raises(ValueError, match=re.escape(repr(text))):
        parse_size(text)


def test_format_bytes() -> None:
    assert format_bytes(512) == "512 B"
    assert format_bytes(1.5 * 2**30) == "1.50 GiB"


def test_a_gigabit_link_moves_125_kilobytes_a_millisecond() -> None:
    assert gbps_to_bytes_per_ms(1.0) == 125_000
    assert transfer_ms(250_000, 1.0) == pytest.approx(2.0)
    # a free link (no bandwidth) and an empty tensor take no time
    assert transfer_ms(10**9, None) == 0.0
    assert transfer_ms(0, 0.001) == 0.0
