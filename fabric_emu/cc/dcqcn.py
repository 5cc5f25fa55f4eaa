"""DCQCN (Zhu et al., SIGCOMM 2015) as pure state machines: the reaction point (a sender's queue
pair) and the notification point (a receiver's CNP pacing). They take `now` and events; the NIC
model applies the rate they decide (fabric_emu.nic.host_nic, one per sender queue pair).

Units: rates in MODELLED bits/s, times in MODELLED seconds in the parameters; every state machine
takes the dilation and runs its timers in emulated seconds (DESIGN.md §2), the clock its `now`
comes from. Algorithm and parameter sources: docs/reference/protocol_facts.md §3,
docs/reference/deployed_parameters.md §4.1-4.2.

Reaction point, per queue pair:
* on a CNP: alpha <- (1 - g) alpha + g; if no cut happened in the last rate_reduce_period, the
  target rate remembers the current one (always with clamp_target; with clamp_after_time_inc only
  if the timer raised the rate since the last cut) and the current rate is cut by alpha/2 (at most
  min_dec_factor), never below rate_min; the stage counters, byte counter and both timers restart.
* every alpha_timer without a CNP: alpha <- (1 - g) alpha.
* every rate_timer, and every byte_counter bytes sent: one more stage of that counter, then a rate
  increase: fast recovery (R <- (R_T + R)/2) while both counters are below F; hyper increase
  (R_T += i R_HAI, i = min(stages) - F + 1) once both exceed F; additive (R_T += R_AI) otherwise.
  Rates never exceed the line rate.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

MBPS = 1e6
US = 1e-6


@dataclass(frozen=True)
class DcqcnParams:
    g: float  # alpha gain
    alpha_timer_s: float  # K: alpha decays once per K without a CNP
    rate_timer_s: float  # T: one rate-increase stage per T without a CNP
    byte_counter: int  # B: one rate-increase stage per B bytes sent (0: off)
    fast_recovery_stages: int  # F
    rate_ai_bps: float
    rate_hai_bps: float
    rate_min_bps: float
    min_dec_factor: float  # the largest cut of one event (0.5: halve at most)
    rate_reduce_period_s: float  # the least time between two cuts (0: every CNP cuts)
    initial_alpha: float  # alpha at the first CNP
    rate_on_first_cnp_bps: float  # current and target rate at the first CNP (0: keep)
    clamp_target: bool  # a cut always sets R_T <- R_C
    clamp_after_time_inc: bool  # ... or only after the timer raised the rate
    min_time_between_cnps_s: float  # notification point: CNP pacing
    cnp_pacing_per_port: bool  # one CNP pacer for the whole NIC (mlx5) or one per QP (paper)


PRESETS: dict[str, DcqcnParams] = {
    # The paper's values as secondary sources report them (protocol_facts §3.1/§3.4: the paper's
    # PDF was not readable): K = T = 55 us, g = 1/256, F = 5, R_AI = 40 Mb/s, B = 10 MB, CNPs at
    # most every 50 us per flow. R_HAI is not given there; 200 Mb/s is the authors' ns-3 config.
    "paper": DcqcnParams(
        g=1 / 256, alpha_timer_s=55 * US, rate_timer_s=55 * US, byte_counter=10_000_000,
        fast_recovery_stages=5, rate_ai_bps=40 * MBPS, rate_hai_bps=200 * MBPS,
        rate_min_bps=100 * MBPS, min_dec_factor=0.5, rate_reduce_period_s=0.0, initial_alpha=1.0,
        rate_on_first_cnp_bps=0.0, clamp_target=True, clamp_after_time_inc=True,
        min_time_between_cnps_s=50 * US, cnp_pacing_per_port=False),
    # NVIDIA ConnectX (mlx5) firmware defaults as mlxconfig reports them (deployed_parameters
    # §4.1): DCE_TCP_G 1019/1024 (g = 5/1024), DCE_TCP_RTT 1 us, RPG_TIME_RESET 300 us,
    # RPG_BYTE_RESET 32767 in 64-byte units (2 MB; the unit is disputed: mstflint's text says
    # bytes, Google's isekai simulator reads 64-byte units; as bytes, a stage every 32 KB sent,
    # 2.6 us at 100 Gb/s, regrows a cut rate faster than CNPs, 4 us apart, can cut it, and the
    # incast scenarios saw DCQCN hardly slow anyone), RPG_THRESHOLD 1, AI 5 Mb/s,
    # HAI 50 Mb/s, MIN_RATE 1 Mb/s, MIN_DEC_FAC 50%, RATE_REDUCE_MONITOR_PERIOD 4 us,
    # INITIAL_ALPHA 1023/1024, CLAMP_TGT_RATE off, CLAMP_TGT_RATE_AFTER_TIME_INC on,
    # MIN_TIME_BETWEEN_CNPS 4 us, which paces the CNPs of the whole port, not of each QP.
    "mlx5": DcqcnParams(
        g=5 / 1024, alpha_timer_s=1 * US, rate_timer_s=300 * US, byte_counter=32767 * 64,
        fast_recovery_stages=1, rate_ai_bps=5 * MBPS, rate_hai_bps=50 * MBPS, rate_min_bps=1 * MBPS,
        min_dec_factor=0.5, rate_reduce_period_s=4 * US, initial_alpha=1023 / 1024,
        rate_on_first_cnp_bps=0.0, clamp_target=False, clamp_after_time_inc=True,
        min_time_between_cnps_s=4 * US, cnp_pacing_per_port=True),
}


def preset(name: str, **overrides: float | int | bool) -> DcqcnParams:
    """A preset with some parameters replaced (unknown names raise TypeError)."""
    return replace(PRESETS[name], **overrides)


class ReactionPoint:
    """The rate of one sending queue pair."""

    def __init__(self, p: DcqcnParams, line_rate_bps: float, dilation: float = 1.0):
        self.p = p
        self.line = line_rate_bps
        self.d = dilation
        self.rate = self.target = line_rate_bps
        self.alpha = p.initial_alpha
        self.active = False  # no CNP yet: the QP sends at line rate, no timer runs
        self.timer_stage = self.byte_stage = 0
        self.bytes_since = 0
        self.next_alpha: float | None = None
        self.next_increase: float | None = None
        self.last_cut: float | None = None
        self._raised_by_timer = False
        self.cnps = self.cuts = 0

    def next_deadline(self) -> float | None:
        """When on_timer next has something to do (emulated seconds), None when idle."""
        times = [t for t in (self.next_alpha, self.next_increase) if t is not None]
        return min(times, default=None)

    def on_cnp(self, now: float) -> None:
        p = self.p
        self.cnps += 1
        if not self.active:
            self.active = True
            self.alpha = p.initial_alpha
            if p.rate_on_first_cnp_bps:
                self.rate = self.target = min(self.line, p.rate_on_first_cnp_bps)
        else:
            self.alpha = (1 - p.g) * self.alpha + p.g
        if self.last_cut is None or now - self.last_cut >= p.rate_reduce_period_s * self.d:
            if p.clamp_target or (p.clamp_after_time_inc and self._raised_by_timer):
                self.target = self.rate
            cut = min(self.alpha / 2, p.min_dec_factor)
            self.rate = max(p.rate_min_bps, self.rate * (1 - cut))
            self.last_cut = now
            self.cuts += 1
            self._raised_by_timer = False
        self.timer_stage = self.byte_stage = 0
        self.bytes_since = 0
        self.next_alpha = now + p.alpha_timer_s * self.d
        self.next_increase = now + p.rate_timer_s * self.d

    def on_sent(self, nbytes: int) -> None:
        """Bytes this QP sent: the byte counter's stages."""
        if not self.active or not self.p.byte_counter:
            return
        self.bytes_since += nbytes
        while self.bytes_since >= self.p.byte_counter and self.active:
            self.bytes_since -= self.p.byte_counter
            self.byte_stage += 1
            self._increase(by_timer=False)

    def on_timer(self, now: float) -> None:
        """Run the alpha and rate-increase timers that are due (call at next_deadline())."""
        p = self.p
        while self.next_alpha is not None and now >= self.next_alpha:
            self.alpha *= 1 - p.g
            self.next_alpha += p.alpha_timer_s * self.d
        while self.next_increase is not None and now >= self.next_increase:
            self.timer_stage += 1
            self.next_increase += p.rate_timer_s * self.d
            self._increase(by_timer=True)

    def _increase(self, by_timer: bool) -> None:
        p, f = self.p, self.p.fast_recovery_stages
        stages = (self.timer_stage, self.byte_stage) if p.byte_counter else (self.timer_stage,)
        if max(stages) < f:
            pass  # fast recovery: towards the rate before the cut
        elif min(stages) > f and len(stages) == 2:
            self.target += (min(stages) - f + 1) * p.rate_hai_bps
        else:
            self.target += p.rate_ai_bps
        self.target = min(self.target, self.line)
        self.rate = min(self.line, (self.target + self.rate) / 2)
        self._raised_by_timer |= by_timer
        # Halving the distance never quite arrives: within one AI step (or 0.1%) of the line
        # rate with the target there, the limiter is released and the QP is idle again.
        if self.target >= self.line and self.line - self.rate <= max(p.rate_ai_bps, 1e-3 * self.line):
            self.rate = self.target = self.line
            self.active = False
            self.next_alpha = self.next_increase = None


class NotificationPoint:
    """CNP pacing at a receiver: at most one CNP per interval for one QP, or for the whole port
    (cnp_pacing_per_port: the NIC then shares one NotificationPoint among its QPs)."""

    def __init__(self, p: DcqcnParams, dilation: float = 1.0):
        self.interval = p.min_time_between_cnps_s * dilation
        self.last: float | None = None
        self.sent = self.suppressed = 0

    def on_ce(self, now: float) -> bool:
        """A CE-marked packet arrived: True when a CNP goes out for it."""
        if self.last is not None and now - self.last < self.interval:
            self.suppressed += 1
            return False
        self.last = now
        self.sent += 1
        return True
