"""Unit parsing: tables of value -> expected or error, and fuzzing (never a traceback)."""

import pytest
from hypothesis import given
from hypothesis import strategies as st

from labctl.errors import ConfigError
from labctl.spec.units import (
    format_bytes,
    format_rate,
    parse_loss_pct,
    parse_rate,
    parse_size,
    parse_size_range,
    parse_time_us,
)


@pytest.mark.parametrize("text, bps", [
    ("100mbit", 100_000_000), ("100Mbit", 100_000_000), ("1gbit", 10**9), ("1GBIT", 10**9),
    ("1.5gbit", 1_500_000_000), ("500kbit", 500_000), ("8kbit", 8_000), ("100gbit", 10**11), (" 10mbit ", 10**7),
])
def test_rates(text, bps):
    assert parse_rate(text) == bps


@pytest.mark.parametrize("text, fragment", [
    ("100mbps", "megaBYTES per second (100mbps = 800mbit)"),
    ("1gbps", "gigaBYTES"),
    ("10kbps", "kiloBYTES"),
    ("100", "must be a rate"),
    ("0mbit", "from 8kbit to 100gbit"),
    ("-1mbit", "must be a rate"),
    ("200gbit", "from 8kbit to 100gbit"),
    ("1kbit", "from 8kbit"),
    ("fast", "must be a rate"),
    ("100 mbit", "must be a rate"),
    ("nanmbit", "must be a rate"),
])
def test_bad_rates(text, fragment):
    with pytest.raises(ConfigError, match="invalid --bw") as info:
        parse_rate(text)
    assert fragment in str(info.value)


def test_mbps_hint_gives_both_readings():
    with pytest.raises(ConfigError) as info:
        parse_rate("100mbps")
    assert "write 100mbit" in info.value.hint and "800mbit" in info.value.hint


def test_bare_number_hint():
    with pytest.raises(ConfigError) as info:
        parse_rate("100")
    assert "add a unit" in info.value.hint


@pytest.mark.parametrize("text, us", [("10ms", 10_000), ("500us", 500), ("0.5ms", 500), ("1s", 1_000_000),
                                      ("0ms", 0), ("10S", 10_000_000)])
def test_times(text, us):
    assert parse_time_us(text, "--delay") == us


@pytest.mark.parametrize("text, fragment", [("10", "must be a time"), ("11s", "from 0 to 10s"), ("-1ms", "must be a time"),
                                            ("10 ms", "must be a time"), ("1h", "must be a time")])
def test_bad_times(text, fragment):
    with pytest.raises(ConfigError, match=fragment):
        parse_time_us(text, "--delay")


@pytest.mark.parametrize("text, pct", [("1", 1.0), ("0.5%", 0.5), ("100", 100.0), ("0", 0.0)])
def test_loss(text, pct):
    assert parse_loss_pct(text) == pct


@pytest.mark.parametrize("text", ["101", "-1", "lots", "nan", "inf"])
def test_bad_loss(text):
    with pytest.raises(ConfigError, match="--loss"):
        parse_loss_pct(text)


def test_sizes():
    assert parse_size("4K") == 4096 and parse_size("16M") == 16 * 2**20 and parse_size("16MiB") == 16 * 2**20
    assert parse_size_range("1K:8K") == [1024, 2048, 4096, 8192]
    assert parse_size_range("4M,16M") == [4 * 2**20, 16 * 2**20]
    assert parse_size_range("3K:8K") == [3072, 6144]
    for bad, fragment in (("8K:1K", "smaller size"), ("2", "multiple of 4"), ("1X", "sizes are bytes"), ("4:4096G", "40 doublings")):
        with pytest.raises(ConfigError, match=fragment):
            parse_size_range(bad)


def test_formatting():
    assert format_rate(10**9) == "1gbit" and format_rate(1_500_000_000) == "1500mbit" and format_rate(12_345) == "12345bit"


@given(st.text(max_size=20))
def test_fuzz_every_parser_raises_only_config_errors(text):
    for parse in (parse_rate, lambda t: parse_time_us(t, "--delay"), parse_loss_pct, parse_size, parse_size_range):
        try:
            parse(text)
        except ConfigError:
            pass


@given(st.integers(min_value=8_000, max_value=10**11))
def test_rate_round_trip(bps):
    assert parse_rate(format_rate(bps)) == bps


def test_sizes_are_shown_as_docker_shows_images():
    assert [format_bytes(n) for n in (0, 999, 1000, 3_000_512, 1_169_242_100, 8_060_000_000)] == \
        ["0 B", "999 B", "1.0 kB", "3.0 MB", "1.2 GB", "8.1 GB"]
