"""How the fabric steered traffic while the run went on, for results: summary.json's `events`
(when each scheduled event fired, how long the switches took) and `failover` (when the
controller had every leaf routed around a link), `dlb` (the flowlet stage's counters) and the
live load-balancing changes. Pure: inputs are what the event runner and controller reported."""

from __future__ import annotations

from fabric_emu.fabric.events import failovers


def routing_section(events: list[dict], lb: dict, dilation: float) -> dict:
    """The keys among events, failover, dlb, load_balancing_changes and load_balancing_final
    that have something to say. lb: the controller's report (link_changes, dlb, changes, mode)."""
    out: dict = {}
    if events:
        out["events"] = events
        moved = failovers(events, lb.get("link_changes", []), dilation)
        if moved:
            out["failover"] = moved
    dlb_uplinks = (lb.get("dlb") or {}).get("uplinks") or {}
    if any(u["flowlets"] for ups in dlb_uplinks.values() for u in ups.values()):
        # the flowlet stage's counters, per leaf and uplink: flowlets started, moves, bytes
        out["dlb"] = dlb_uplinks
    if lb.get("changes"):  # live changes (events and `fabric-emu lb`)
        out["load_balancing_changes"] = lb["changes"]
        out["load_balancing_final"] = lb["mode"]
    return out
