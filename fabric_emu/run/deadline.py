"""The traffic phase's default deadline (an experiment's `timeout` when it sets none).

A lossless run needs about its time at line rate: the default is 30 s of wall time (a stalled
rank waits for it, so it must not be minutes long) plus 10x that time. A run that can lose
packets also needs time for the transport to repair them, and with RoCE's retransmission timer
(4.2 ms modelled by default, 10x a lossless run's line-rate time of a few MB) that time is
mostly retransmission timeouts, which the line rate says nothing about. What
fabric_emu.nic.transport does:

- A NAK is sent once per gap, so a retransmission that is lost again, or a lost tail, waits for
  the timer; the timer has no backoff (every timeout is `retransmit_timeout` long) and the QP
  fails at the (retry_limit + 1)-th timeout in a row without progress.
- A timeout rewinds the QP to its oldest unacknowledged packet and resends everything from it
  at line rate. In an incast the senders' timers expire together (their losses came together),
  so they resend together into the bottleneck queue, which starts the round empty (it drained
  during the timeout): each round delivers in order at least the bytes the queue takes before
  it overflows, a port buffer's worth.

So the bottleneck's bytes take at most ceil(bytes / port_buffer) rounds of one timeout each
(observed: 7 x 1 MB into a 400 KB buffer took 6 rounds, the bound says 18), and the allowance
adds retry_limit rounds more: a flow stuck for good then fails with the transport's own error
(retry limit exceeded) before the deadline cuts the run short.
"""

from __future__ import annotations

import math

# A stalled rank waits for the timeout, so the default scales with the workload instead of
# being minutes long.
DEFAULT_TIMEOUT_BASE_S = 30.0
LINE_RATE_FACTOR = 10  # the deadline allows 10x the workload's time at line rate


def timeout_rounds(bottleneck_bytes: float, port_buffer: int, retry_limit: int) -> int:
    """Retransmission timeouts one after another that a lossy run may need: one per port
    buffer's worth of the bottleneck's bytes (the least a round of go-back-N delivers), plus
    retry_limit (the most in a row before a QP fails)."""
    return math.ceil(max(bottleneck_bytes, 0) / port_buffer) + retry_limit


def loss_allowance_s(bottleneck_bytes: float, port_buffer: int, retransmit_timeout_s: float,
                     retry_limit: int) -> float:
    """Modelled seconds of retransmission timeouts a lossy run may spend (see the module)."""
    return timeout_rounds(bottleneck_bytes, port_buffer, retry_limit) * retransmit_timeout_s


def default_timeout_s(line_rate_s: float, dilation: float, *, lossy: bool = False,
                      bottleneck_bytes: float = 0.0, port_buffer: int = 1,
                      retransmit_timeout_s: float = 0.0, retry_limit: int = 0) -> float:
    """The wall-clock deadline of the traffic phase: 30 s + 10x the line-rate time (line_rate_s,
    wall seconds) and, when packets can be lost (lossy), the retransmission timeouts' allowance
    (modelled, so x dilation)."""
    base = DEFAULT_TIMEOUT_BASE_S + LINE_RATE_FACTOR * line_rate_s
    if not lossy:
        return base
    return base + loss_allowance_s(bottleneck_bytes, port_buffer, retransmit_timeout_s, retry_limit) * dilation


def losses_possible(pfc_enabled: bool, watchdog_enabled: bool = False, watchdog_action: str = "drop") -> bool:
    """Whether RoCE packets may be dropped by design: PFC off (the class tail-drops like any
    other), or a PFC watchdog that drops or forwards a stormed queue's packets (the class is
    then lossy on that port)."""
    return not pfc_enabled or (watchdog_enabled and watchdog_action != "alert")
