import pytest

from fabric_emu.spec.units import parse_rate_bps, parse_size, parse_time_s


@pytest.mark.parametrize("text,expected", [
    ("8MB", 8_000_000), ("8MiB", 8 * 2**20), ("64KB", 64_000), ("1GiB", 2**30),
    ("4096", 4096), (4096, 4096), ("1.5KB", 1500), ("10 b", 10),
])
def test_sizes(text, expected):
    assert parse_size(text) == expected


@pytest.mark.parametrize("bad", ["8XB", "MB", "-1MB", "1.0001B", True, None, [1]])
def test_bad_sizes(bad):
    with pytest.raises(ValueError):
        parse_size(bad)


def test_rates_and_times():
    assert parse_rate_bps("100Gbps") == 100e9
    assert parse_rate_bps("400Mbps") == 400e6
    assert parse_time_s("50us") == pytest.approx(50e-6)
    assert parse_time_s("2ms") == pytest.approx(2e-3)
    assert parse_time_s("1.5s") == 1.5
    with pytest.raises(ValueError):
        parse_time_s("5 minutes")
