"""A run cut short by its deadline (`timeout`): were its flows still progressing, and what to set.

From the agents' own measurements: each receive QP's rx_series (bytes accepted in order, over
time), each send QP's last_tx and timeouts, and each agent's go and end. Flows that still
delivered bytes in the run's last two retransmission timeouts were progressing (a flow that
recovers by timeouts delivers something at least once per timeout): the run needed more time,
or, without PFC, a shorter retransmission timer. Flows that delivered nothing for that long were
stuck, and a longer deadline would not have helped (a PFC deadlock says so in `deadlocks`).

Pure: plain dicts in, plain data out.
"""

from __future__ import annotations

import math

# What lossy scenarios set (4.096 us x 2^6): far above a round trip with full queues, and
# without PFC nothing else holds a packet (fabric_emu.spec.transport).
LOSSY_RETRANSMIT_TIMEOUT_S = 4.096e-6 * 2 ** 6
WINDOW_TIMEOUTS = 2  # "recently": within this many retransmission timeouts of the end


def cut_by_deadline(agents: dict[str, dict]) -> bool:
    """Some agent stopped at the deadline (status incomplete, error "timeout")."""
    return any(a.get("status") != "ok" and a.get("error") == "timeout" for a in agents.values())


def _bytes_at(series: list, t: float) -> float:
    """Bytes of an rx_series ([time, bytes] points, time-ordered) by time t (0 before any)."""
    out = 0.0
    for when, b in series:
        if when > t:
            break
        out = b
    return out


def _last_growth(series: list) -> float | None:
    """When an rx_series reached its final bytes (None: it never received a byte)."""
    if not series or not series[-1][1]:
        return None
    final = series[-1][1]
    return next(t for t, b in series if b == final)


def _ceil2(x: float) -> float:
    """x rounded up to two significant digits (250.3 -> 260, 37.2 -> 38)."""
    if x <= 0:
        return 0.0
    step = 10.0 ** (math.floor(math.log10(x)) - 1)
    return math.ceil(x / step - 1e-9) * step


def _size(b: float) -> str:
    if b >= 1e6:
        return f"{b / 1e6:.2f} MB"
    return f"{b / 1e3:.1f} KB" if b >= 1e3 else f"{b:.0f} B"


def _ms(s: float) -> str:
    return f"{s * 1e3:.1f} ms"


def _timer(s: float) -> str:
    return f"{s * 1e3:.3g} ms" if s >= 1e-3 else f"{s * 1e6:.3g} us"


def _seconds(s: float) -> str:
    return f"{s:g}s"


def deadline_report(agents: dict[str, dict], *, timeout_s: float, dilation: float,
                    retransmit_timeout_s: float, lossy: bool, planned_bytes: int | None = None,
                    deadlocked_at_end: bool = False) -> dict | None:
    """summary.json's `deadline` block and its `error` line ("message") for a run its deadline
    cut short; None when none of its agents was stopped by the deadline.

    timeout_s: the deadline (wall seconds); retransmit_timeout_s: modelled; lossy: packets can
    be dropped (PFC off), so a shorter retransmission timer is worth suggesting."""
    if not cut_by_deadline(agents):
        return None
    gos = [a["go"] for a in agents.values() if a.get("go")]
    ends = [a["end"] for a in agents.values() if a.get("end") and a.get("status") != "ok"]
    if not gos or not ends:  # stopped before traffic started: nothing to judge
        return {"timeout_s": timeout_s, "progressing": False,
                "message": f"the traffic did not start within its deadline ({_seconds(round(timeout_s, 1))})"}
    go, end = min(gos), max(ends)
    window = WINDOW_TIMEOUTS * retransmit_timeout_s * dilation  # wall seconds
    series = [q.get("rx_series") or [] for a in agents.values() for q in a.get("recv_qps") or []]
    delivered = sum(q.get("bytes", 0) for a in agents.values() for q in a.get("recv_qps") or [])
    recent = sum((s[-1][1] if s else 0) - _bytes_at(s, end - window) for s in series)
    growth = [t for t in map(_last_growth, series) if t is not None]
    idle = end - max(growth, default=go)  # wall seconds since the last byte was delivered
    unfinished = [a for a in agents.values() if a.get("status") != "ok"]
    sent = [q.get("last_tx") for a in unfinished for q in a.get("send_qps") or [] if q.get("last_tx")]
    sending = bool(sent) and max(sent) >= end - window
    timeouts = sum(q.get("timeouts", 0) for a in agents.values() for q in a.get("send_qps") or [])
    elapsed = end - go
    out: dict = {"timeout_s": timeout_s, "timeout_fabric_s": timeout_s / dilation,
                 "progressing": recent > 0, "window_fabric_s": window / dilation,
                 "bytes_in_window": int(recent), "idle_fabric_s": idle / dilation,
                 "hosts_unfinished": len(unfinished), "timeouts": timeouts}
    cut = (f"cut short by its deadline ({_seconds(round(timeout_s, 1))} wall, "
           f"{_ms(timeout_s / dilation)} modelled)")
    done = f"{delivered / planned_bytes:.0%} of the planned bytes delivered, " if planned_bytes else ""
    if recent > 0:
        # the rest at the rate of the last window, with half again as margin; at least double
        rest = (planned_bytes - delivered) * window / recent if planned_bytes and planned_bytes > delivered else elapsed
        out["suggested_timeout_s"] = suggest = _ceil2(max(2 * timeout_s, 1.5 * (elapsed + rest)))
        msg = (f"{cut} while flows were still progressing: {_size(recent)} delivered in its last "
               f"{_ms(window / dilation)} modelled ({done}{timeouts} retransmission timeouts, "
               f"{len(unfinished)} of {len(agents)} hosts unfinished); give it more time: "
               f"--set timeout={_seconds(suggest)}")
        if lossy and timeouts and retransmit_timeout_s > LOSSY_RETRANSMIT_TIMEOUT_S * 1.001:
            out["suggested_retransmit_timeout_s"] = LOSSY_RETRANSMIT_TIMEOUT_S
            msg += (f", or, as nothing holds a packet long without PFC, a shorter retransmission timer than "
                    f"{_timer(retransmit_timeout_s)}: --set transport.retransmit_timeout=262.144us")
        out["message"] = msg
        return out
    quiet = f"nothing was delivered in its last {_ms(idle / dilation)} modelled"
    if deadlocked_at_end:
        out["message"] = f"{cut}: {quiet}; it ended deadlocked (see deadlocks): more time would not help"
    elif sending:
        out["message"] = (f"{cut}: {quiet}, though QPs were still sending ({timeouts} retransmission timeouts): "
                          f"the flows were retrying without progress (see logs/ and flows.csv)")
    else:
        out["message"] = (f"{cut}: {quiet} and no packet was sent in its last {_ms(window / dilation)} "
                          f"modelled: the flows were stuck, not slow, and more time would not help")
    return out
