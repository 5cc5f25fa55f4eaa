"""Packet spraying's entropy values and their mapping onto uplinks (fabric_emu.lb.spray)."""

from __future__ import annotations

import pytest

from fabric_emu.lb import spray


@pytest.mark.parametrize("uplinks,want", [(1, 1), (2, 2), (4, 4), (8, 8), (3, 32), (6, 64), (12, 64)])
def test_default_entropies(uplinks, want):
    assert spray.default_entropies(uplinks) == want


def test_a_power_of_two_of_uplinks_gets_an_exact_split():
    assert spray.shares(4, 4) == [0.25] * 4
    assert spray.shares(16, 4) == [0.25] * 4


def test_other_uplink_counts_get_a_split_within_an_eighth():
    for uplinks in (3, 5, 6, 7):
        n = spray.default_entropies(uplinks)
        fair = 1 / uplinks
        assert all(abs(s - fair) <= fair / 8 + 1e-9 for s in spray.shares(n, uplinks)), uplinks


def test_entropy_ports_keep_the_qps_high_bits_and_rotate_the_low_ones():
    ports = spray.entropy_ports(0xC0DE, 4)
    assert ports == [0xC0DC, 0xC0DD, 0xC0DE, 0xC0DF]
    assert [p & 3 for p in ports] == [0, 1, 2, 3]
    assert spray.entropy_ports(0xC0DE, 1) == [0xC0DE]


@pytest.mark.parametrize("bad", [0, 3, 128])
def test_entropies_must_be_a_power_of_two_up_to_64(bad):
    with pytest.raises(ValueError, match="power of two"):
        spray.entropy_ports(0xC000, bad)


def test_plan_entropies_takes_the_request_or_the_widest_leaf():
    assert spray.plan_entropies([4, 4], None) == 4
    assert spray.plan_entropies([2, 3], None) == 32
    assert spray.plan_entropies([4], 16) == 16
