"""The DCQCN state machines, event by event (fabric_emu/cc/dcqcn.py)."""

from __future__ import annotations

import pytest

from fabric_emu.cc.dcqcn import PRESETS, NotificationPoint, ReactionPoint, preset

G100 = 100e9
US = 1e-6


def paper(**kw) -> ReactionPoint:
    return ReactionPoint(preset("paper", **kw), G100)


def test_first_cnp_halves_the_rate_and_remembers_the_target() -> None:
    rp = paper()
    assert rp.next_deadline() is None  # idle at line rate: no timers
    rp.on_cnp(0.0)
    assert rp.rate == pytest.approx(50e9) and rp.target == G100
    assert rp.next_deadline() == pytest.approx(55 * US)


def test_alpha_rises_on_cnps_and_decays_every_k_without_them() -> None:
    rp = paper()
    rp.on_cnp(0.0)
    rp.on_cnp(10 * US)
    g = 1 / 256
    assert rp.alpha == pytest.approx((1 - g) * 1 + g)
    a = rp.alpha
    rp.on_timer(10 * US + 3 * 55 * US + 1e-9)  # three alpha periods, no CNP
    assert rp.alpha == pytest.approx(a * (1 - g) ** 3)


def test_fast_recovery_halves_the_distance_to_the_target_each_stage() -> None:
    rp = paper(byte_counter=0)
    rp.on_cnp(0.0)
    rates = []
    for k in range(1, 5):  # F = 5: stages 1..4 are fast recovery
        rp.on_timer(k * 55 * US + 1e-9)
        rates.append(rp.rate)
    assert rates == pytest.approx([75e9, 87.5e9, 93.75e9, 96.875e9])
    assert rp.target == G100


def test_additive_then_hyper_increase_after_f_stages() -> None:
    p = preset("paper", fast_recovery_stages=1, byte_counter=1000, rate_ai_bps=1e9, rate_hai_bps=5e9)
    rp = ReactionPoint(p, G100)
    rp.on_cnp(0.0)
    rp.on_cnp(1 * US)  # a second CNP to lower the target too
    t0 = rp.target
    rp.on_timer(1 * US + 55 * US + 1e-9)  # timer stage 1, byte stage 0: F=1 -> additive
    assert rp.target == pytest.approx(t0 + 1e9)
    rp.on_sent(1000)  # byte stage 1
    rp.on_sent(1000)  # byte stage 2: timer stage 1 is not > F: additive
    assert rp.target == pytest.approx(t0 + 3e9)
    rp.on_timer(1 * US + 2 * 55 * US + 1e-9)  # timer stage 2: both > F=1 -> hyper, i = 2 - 1 + 1
    assert rp.target == pytest.approx(t0 + 3e9 + 2 * 5e9)


def test_rate_is_bounded_by_min_rate_and_line_rate_and_released_at_line_rate() -> None:
    rp = paper(rate_reduce_period_s=0.0)
    for k in range(200):
        rp.on_cnp(k * US)
    assert rp.rate == 100e6  # rate_min of the paper preset
    rp = paper(byte_counter=0, rate_ai_bps=50e9, fast_recovery_stages=0)
    rp.on_cnp(0.0)
    rp.on_timer(10 * 55 * US)
    assert rp.rate == G100 and not rp.active and rp.next_deadline() is None


def test_cuts_are_spaced_by_the_rate_reduce_period() -> None:
    rp = ReactionPoint(PRESETS["mlx5"], G100)
    rp.on_cnp(0.0)
    r = rp.rate
    rp.on_cnp(2 * US)  # within the 4 us monitor period: alpha moves, the rate does not
    assert rp.rate == r and rp.cuts == 1
    rp.on_cnp(5 * US)
    assert rp.rate < r and rp.cuts == 2


def test_timers_run_in_emulated_time_under_dilation() -> None:
    rp = ReactionPoint(PRESETS["paper"], G100, dilation=2000)
    rp.on_cnp(0.0)
    assert rp.next_deadline() == pytest.approx(55 * US * 2000)  # 110 ms emulated
    rp.on_timer(0.1)
    assert rp.rate == pytest.approx(50e9)  # not yet
    rp.on_timer(0.111)
    assert rp.rate == pytest.approx(75e9)


def test_notification_point_paces_cnps() -> None:
    np_ = NotificationPoint(PRESETS["paper"])  # 50 us per flow
    sent = [np_.on_ce(t * 10 * US) for t in range(12)]  # a CE every 10 us for 110 us
    assert sent == [True, False, False, False, False, True, False, False, False, False, True, False]
    assert (np_.sent, np_.suppressed) == (3, 9)
    assert NotificationPoint(PRESETS["mlx5"], dilation=1000).interval == pytest.approx(4e-3)


def test_overrides_are_checked() -> None:
    assert preset("mlx5", rate_ai_bps=1e6).rate_ai_bps == 1e6
    with pytest.raises(TypeError):
        preset("mlx5", no_such_parameter=1)


def test_mlx5_paces_cnps_per_port_and_the_paper_per_qp() -> None:
    assert PRESETS["mlx5"].cnp_pacing_per_port and not PRESETS["paper"].cnp_pacing_per_port


def test_scripted_sequence_matches_the_papers_equations_step_by_step() -> None:
    """One reaction point through CNPs, rate-timer and byte-counter events, checked after each
    against the paper's equations computed here by hand (Zhu et al. 2015, Sec. 3 and Fig. 6):
    cut: alpha <- (1-g) alpha + g (after the first), R_T <- R_C, R_C <- R_C (1 - alpha/2);
    alpha timer: alpha <- (1-g) alpha; increase: fast recovery R_C <- (R_T + R_C)/2 while both
    stages < F, additive R_T += R_AI once one reaches F, hyper R_T += i R_HAI once both pass F."""
    g, F, B, ai, hai, T = 1 / 16, 2, 1_000_000, 1e9, 4e9, 55 * US
    rp = ReactionPoint(preset("paper", g=g, fast_recovery_stages=F, byte_counter=B,
                              rate_ai_bps=ai, rate_hai_bps=hai, alpha_timer_s=T, rate_timer_s=T,
                              rate_min_bps=1e6), G100)
    rc, rt, alpha = G100, G100, 1.0

    def check() -> None:
        assert (rp.rate, rp.target, rp.alpha) == pytest.approx((rc, rt, alpha))

    # t=0: first CNP, alpha = initial (1): R_T = 100G, R_C = 50G
    rp.on_cnp(0.0)
    rt, rc = rc, rc * (1 - alpha / 2)
    check()
    # t=10us: second CNP: alpha = (1-g) + g = 1 still; R_T = 50G; R_C = 25G; timers restart
    rp.on_cnp(10 * US)
    alpha = (1 - g) * alpha + g
    rt, rc = rc, rc * (1 - alpha / 2)
    check()
    # t=10us+T: alpha timer (decay) and rate timer stage 1 (< F: fast recovery)
    rp.on_timer(10 * US + T + 1e-9)
    alpha *= 1 - g
    rc = (rt + rc) / 2
    check()
    # B bytes sent: byte stage 1 (< F): fast recovery again
    rp.on_sent(B)
    rc = (rt + rc) / 2
    check()
    # t=10us+2T: timer stage 2 = F: additive increase
    rp.on_timer(10 * US + 2 * T + 1e-9)
    alpha *= 1 - g
    rt += ai
    rc = (rt + rc) / 2
    check()
    # 2B more bytes: byte stage 2 (= F, timer 2 = F: not both > F): additive; byte stage 3
    # (> F, timer stage 2 = F): additive
    rp.on_sent(B)
    rt += ai
    rc = (rt + rc) / 2
    check()
    rp.on_sent(B)
    rt += ai
    rc = (rt + rc) / 2
    check()
    # t=10us+3T: timer stage 3 > F and byte stage 3 > F: hyper, i = min(3, 3) - F + 1 = 2
    rp.on_timer(10 * US + 3 * T + 1e-9)
    alpha *= 1 - g
    rt += 2 * hai
    rc = (rt + rc) / 2
    check()
    # a third CNP: alpha rises, the target clamps to the current rate, the rate is cut
    t3 = 10 * US + 3 * T + 5 * US
    rp.on_cnp(t3)
    alpha = (1 - g) * alpha + g
    rt, rc = rc, rc * (1 - alpha / 2)
    check()
    assert rp.cuts == 3 and rp.next_deadline() == pytest.approx(t3 + T)
