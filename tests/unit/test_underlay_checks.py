"""The preflight's judgments of a run over several machines (fabric_emu.spec.machines)."""

from __future__ import annotations

from fabric_emu.spec.machines import clock_problem, underlay_delay_problem


def test_the_underlay_delay_must_fit_in_the_modelled_cable_once_dilated() -> None:
    # 100 m of cable: 500 ns. A veth's 30 us at dilation 2000 is 15 ns: fine.
    assert underlay_delay_problem(30e-6, 2000, 100) is None
    # A WAN's 5 ms at dilation 2000 is 2.5 us: refused, with the dilation that would do.
    msg = underlay_delay_problem(5e-3, 2000, 100)
    assert msg is not None and "2500 ns" in msg and "500 ns" in msg and "dilation of at least 10000" in msg
    assert underlay_delay_problem(5e-3, 10000, 100) is None
    assert underlay_delay_problem(1e-6, 2000, 0) is None  # a 0 m cable still counts its 1 m of optics


def test_clocks_must_agree_within_a_quarter_of_the_start_delay() -> None:
    assert clock_problem(0.002, 0.0005, 0.5) is None
    assert clock_problem(0.2, 0.001, 0.5) is not None and "+200.0 ms" in clock_problem(0.2, 0.001, 0.5)
    assert clock_problem(-0.2, 0.1, 0.5) is None  # as far off as the measurement can tell: not refused


def test_the_cut_links_must_fit_in_half_the_measured_underlay() -> None:
    from fabric_emu.spec.machines import underlay_bandwidth_problem

    # quickstart split in two: 4 cut links of 100 Gb/s at dilation 2000, 200 Mb/s each way
    assert underlay_bandwidth_problem(200e6, 10e9, 2000) is None
    msg = underlay_bandwidth_problem(200e6, 300e6, 2000)
    assert msg is not None and "200 Mb/s" in msg and "300 Mb/s" in msg and "dilation of at least 2667" in msg
