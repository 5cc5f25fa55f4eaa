"""What the switch ports did, for results: summary.json's `switch` block (their counters added
up) and `pfc_reaction` (how fast pauses took effect), the lossless class's pause intervals
(pauses.csv) and the checks that say when ECN or PFC did not behave. Pure: inputs are counters
and the PFC daemon's log."""

from __future__ import annotations

from fabric_emu.cc.pfc import RECONCILE_S
from fabric_emu.measure.counters import PortCounters, totals
from fabric_emu.topo.plan import FabricPlan
from fabric_emu.ports.model import PfcSettings, port_ends


def switch_section(plan: FabricPlan, ports: list[PortCounters]) -> dict:
    """summary.json's `switch` key (none without port counters): every port's counters added up,
    and the bytes that left the leaves upward."""
    if not ports:
        return {}
    switch = totals(ports, plan.dilation)
    # what left the leaves upward: the traffic that crossed the upper tiers (spines)
    leaves = {sw.name for sw in plan.leaves}
    switch["leaf_uplink_tx_bytes"] = sum(r.tx_bytes for r in ports if r.switch in leaves and r.kind == "fabric")
    return {"switch": switch}


def pause_rows(plan: FabricPlan, daemon: dict, t0: float) -> list[dict]:
    """pauses.csv: one row per interval a port's lossless class was paused, in seconds from t0
    (the agents' common start, on the monotonic clock); end is empty for a pause still running
    when the daemon stopped."""
    ends = {e.intf: e for e in port_ends(plan)}
    by_id = {e.id: e for e in ends.values()}
    rows = []
    for intf, intervals in sorted(daemon.get("intervals", {}).items()):
        end = ends.get(intf)
        if end is None:
            continue
        for start, stop in intervals:
            s = start - t0
            e = None if stop is None else stop - t0
            rows.append({
                "node": end.node, "port": end.port, "intf": intf, "peer": by_id[end.peer_id].node,
                "start_s": round(s, 6), "end_s": "" if e is None else round(e, 6),
                "start_fabric_us": round(s / plan.dilation * 1e6, 3),
                "end_fabric_us": "" if e is None else round(e / plan.dilation * 1e6, 3)})
    return rows


def reaction_summary(daemon: dict, dilation: float) -> dict | None:
    """How fast pauses took effect: from the byte that crossed xoff (in the kernel) to the
    upstream port's queue closed, emulated and modelled."""
    r = sorted(daemon.get("reaction_s", []))
    if not r:
        return None
    p50, worst = r[len(r) // 2], r[-1]
    out = {"pauses_measured": len(r), "p50_s": round(p50, 6), "max_s": round(worst, 6),
           "p50_fabric_us": round(p50 / dilation * 1e6, 3), "max_fabric_us": round(worst / dilation * 1e6, 3)}
    split = daemon.get("worst_reaction")
    if split:  # where the slowest one went: ring buffer, frame, tc change
        out["slowest_ms"] = {k.removesuffix("_s"): round(v * 1e3, 3) for k, v in split.items()}
    if daemon.get("longest_call_ms"):  # the daemon's longest frame send, kick, tc change and round
        out["longest_call_ms"] = daemon["longest_call_ms"]
    if daemon.get("late_wake"):  # how late the daemon woke for its own timers: this machine's stalls
        out["late_wake"] = daemon["late_wake"]
    if (daemon.get("late_pauses") or {}).get("count"):  # the pauses past 1 ms, with what the daemon was doing
        out["late"] = daemon["late_pauses"]
    if daemon.get("gc_full"):  # the daemon's full garbage collections while it served pauses
        out["gc_full"] = daemon["gc_full"]
    if daemon.get("responder"):  # its threads, the gates it closed before the daemon, changes it refused
        out["responder"] = daemon["responder"]
    stages = daemon.get("stage_max")
    if stages:  # each stage's longest over all pauses, whichever pause it was
        out["stage_max_ms"] = {k.removesuffix("_s"): round(v * 1e3, 3) for k, v in stages.items()}
    return out


def daemon_warnings(daemon: dict) -> list[str]:
    """The PFC daemon's own troubles: it died during the run, or failed to act on events."""
    out = []
    if daemon.get("died"):
        out.append(f"the PFC daemon stopped during the run ({daemon['died']}): pauses after that were"
                   " neither sent nor obeyed; see logs/pfcd.log")
    if daemon.get("events_lost"):
        out.append(f"the PFC daemon fell behind: {daemon['events_lost']} threshold or pause event(s) found"
                   " its ring buffer full; it caught up from the ports' state within"
                   f" {RECONCILE_S * 1e3:.0f} ms each time, so some pauses started or ended late")
    if daemon.get("errors"):
        out.append(f"the PFC daemon failed to act on {len(daemon['errors'])} event(s), the first:"
                   f" {daemon['errors'][0]}")
    return out


def lossless_warnings(rows: list[PortCounters], ecn: dict, pfc: PfcSettings | None,
                      reaction: dict | None) -> list[str]:
    """Reasons the lossless class's results cannot be trusted.

    ecn: the spec's ecn section as plain data (enabled, kmin, kmax). A slow pause alone is not
    one: what it costs is measured, as the frames that came in past the headroom (a pause late
    while its upstream had little to send changed nothing)."""
    out = []
    pfc_on = pfc is not None and pfc.enabled
    lossless_drops = sum(r.lossless_drops + r.queue_drops_p3 for r in rows) if pfc_on else 0
    if lossless_drops:
        out.append(f"{lossless_drops} packet(s) dropped in the lossless class with PFC on: an ingress"
                   " port's buffer overflowed while its pause was not in effect")
    if ecn.get("enabled"):
        # Past the middle of the ramp a packet is marked with at least pmax/2: a queue that got
        # there and not one mark means marking is broken (just above kmin, none can be chance).
        middle = (ecn["kmin"] + ecn["kmax"]) // 2
        deep = [r for r in rows if r.max_backlog_p3 > middle]
        if deep and not any(r.ecn_marked_p3 for r in rows):
            worst = max(deep, key=lambda r: r.max_backlog_p3)
            out.append(f"ECN is on and {worst.intf}'s RoCE queue reached {worst.max_backlog_p3} B (kmin"
                       f" {ecn['kmin']} B, kmax {ecn['kmax']} B), yet no packet was marked")
    overruns = sum(r.headroom_overruns for r in rows) if pfc_on else 0
    if overruns:
        worst = max(rows, key=lambda r: r.headroom_overruns)
        said = [f"the slowest took {reaction['max_s'] * 1e3:.1f} ms"] if reaction else []
        late = (reaction or {}).get("late_wake") or {}
        if late.get("over_1ms"):  # the machine's share of the lateness, which no dilation setting removes
            said.append(f"this machine left the PFC daemon waiting up to {late['max_ms']:.1f} ms past its own"
                        f" timers, {late['over_1ms']} time(s)")
        slowest = f" ({'; '.join(said)})" if said else ""
        out.append(f"{overruns} RoCE frame(s) arrived beyond xoff + headroom, most by {worst.intf}:"
                   f" fabric-emu put a pause into effect later than the modelled link would{slowest};"
                   " they were kept, not dropped, so the pauses and queues around them are not to be"
                   " trusted; raise the dilation")
    if pfc_on:
        full = [r for r in rows if r.max_held_p3 >= pfc.xoff]
        if full and not any(r.pause_tx_p3 for r in rows):
            out.append(f"PFC is on and {full[0].intf} held {full[0].max_held_p3} B of RoCE (xoff {pfc.xoff} B),"
                       " yet no pause frame was sent")
    return out
