"""PFC from the NICs' side and the switches' watchdog in the results: summary.json's `pfcwd`,
`pfc_storms` and `nic_receive` blocks and pfcwd.csv (SONiC's counters per queue). Pure: the input is the PFC daemon's log,
whose times are on the monotonic clock; t0 is the agents' GO on that clock."""

from __future__ import annotations

from collections.abc import Sequence

from fabric_emu.cc.deadlock import Episode, label_watchdog_event
from fabric_emu.ports.watchdog import PREFIX


def _at(t: float | None, t0: float, dilation: float) -> dict:
    """A monotonic time as seconds after GO and as modelled microseconds."""
    if t is None:
        return {"s": None, "fabric_us": None}
    return {"s": round(t - t0, 6), "fabric_us": round((t - t0) / dilation * 1e6, 3)}


def _episode(e: dict, t0: float, dilation: float) -> dict:
    out: dict = {"intf": e["intf"], "queue": e["queue"], "action": e["action"]}
    for key in ("paused_since", "detected", "mitigated", "last_pause", "restored"):
        at = _at(e.get(f"{key}_s"), t0, dilation)
        out[f"{key}_s"], out[f"{key}_fabric_us"] = at["s"], at["fabric_us"]
    if e.get("paused_since_s") is not None:  # continuously paused since, to detected: the latency
        out["detection_latency_fabric_us"] = round((e["detected_s"] - e["paused_since_s"]) / dilation * 1e6, 3)
    for k in ("tx_packets", "tx_dropped_packets", "rx_packets", "rx_dropped_packets"):
        out[k] = e.get(k, 0)
    return out


def pfcwd_section(daemon: dict, t0: float, dilation: float, traffic_fabric_s: float | None) -> dict:
    """summary.json's `pfcwd` (when the watchdog ran) and `pfc_storms` (when a NIC stormed)."""
    out: dict = {}
    wd = daemon.get("watchdog")
    if wd:
        episodes = [_episode(e, t0, dilation) for e in wd.get("episodes", [])]
        queues = wd.get("queues", {})
        detected = sum(q[f"{PREFIX}DEADLOCK_DETECTED"] for q in queues.values())
        out["pfcwd"] = {
            "action": wd["action"], "detection_fabric_us": wd["detection_ns"] / 1e3,
            "restoration_fabric_us": wd["restoration_ns"] / 1e3, "poll_fabric_us": wd["poll_ns"] / 1e3,
            "polls": wd.get("polls", 0),
            "storms_detected": detected,
            "storms_restored": sum(q[f"{PREFIX}DEADLOCK_RESTORED"] for q in queues.values()),
            "queues_stormed": sorted({e["intf"] for e in episodes}),
            "storms_per_fabric_s": (round(detected / traffic_fabric_s, 3) if traffic_fabric_s else None),
            "tx_dropped_packets": sum(q[f"{PREFIX}TX_DROPPED_PACKETS"] for q in queues.values()),
            "rx_dropped_packets": sum(q[f"{PREFIX}RX_DROPPED_PACKETS"] for q in queues.values()),
            "episodes": episodes,
        }
    storms = daemon.get("storms") or []
    nic_drops = daemon.get("storm_nic_drops") or {}
    if storms:
        out["pfc_storms"] = [{"nic": s["nic"], "intf": s["intf"],
                              "on_fabric_us": _at(s["on_s"], t0, dilation)["fabric_us"],
                              "off_fabric_us": _at(s["off_s"], t0, dilation)["fabric_us"],
                              "pause_frames_sent": s["frames"],
                              **({"guard_stopped_fabric_us": _at(s["guard_stopped_s"], t0, dilation)["fabric_us"],
                                  "tx_pause_storm_error_events": s["tx_pause_storm_error_events"]}
                                 if s.get("guard_stopped_s") is not None else {})}
                             for s in storms]
        out["pfc_storm_nic_drops"] = {intf.split("-")[0]: n for intf, n in sorted(nic_drops.items())}
    if daemon.get("nic_receive") is not None:  # slow receivers: the NICs' receive buffers
        out["nic_receive"] = {intf.split("-")[0]: v for intf, v in sorted(daemon["nic_receive"].items())}
    return out


def pfcwd_rows(daemon: dict) -> list[dict]:
    """pfcwd.csv: one row per watched queue, as `pfcwd show stats` has them (SONiC's names)."""
    wd = daemon.get("watchdog") or {}
    rows = []
    for intf, q in sorted(wd.get("queues", {}).items()):
        rows.append({"queue": f"{intf}:3", "intf": intf, "status": q["status"], "pause_rx": q["pause_rx"],
                     **{k: v for k, v in q.items() if k.startswith(PREFIX)}})
    return rows


def drops_counted_off_the_switches(daemon: dict) -> int:
    """Lost packets that counters saw outside the switches' drop counters: frames a storming NIC
    dropped (it had stopped draining) and the watchdog's drops on a stormed queue's ingress
    (made at the peer's egress; its egress drops are in the switch's own)."""
    wd = daemon.get("watchdog") or {}
    rx = sum(q.get(f"{PREFIX}RX_DROPPED_PACKETS", 0) for q in (wd.get("queues") or {}).values())
    nic_rx = sum(v["drops"] for v in (daemon.get("nic_receive") or {}).values())
    return sum((daemon.get("storm_nic_drops") or {}).values()) + rx + nic_rx


def label_storm_episodes(summary: dict, deadlocks: Sequence[Episode], plan) -> None:
    """Label each of the summary's watchdog episodes (in place): `storm source` when the queue's
    peer is a NIC storming then, `deadlock member` when its egress is on a deadlock cycle then,
    else `victim` (it was paused by a storm or a deadlock further on)."""
    episodes = (summary.get("pfcwd") or {}).get("episodes") or []
    if not episodes:
        return
    peer_of = {p.intf: (sw.name, p.peer) for sw in plan.switches for p in plan.ports(sw.name)}
    storms = summary.get("pfc_storms") or []
    for e in episodes:
        if e.get("detected_fabric_us") is None or e["intf"] not in peer_of:
            continue
        at = e["detected_fabric_us"] / 1e6
        storming = {s["nic"] for s in storms if s["on_fabric_us"] is not None and s["on_fabric_us"] / 1e6 <= at
                    and (s["off_fabric_us"] is None or at <= s["off_fabric_us"] / 1e6)}
        switch, peer = peer_of[e["intf"]]
        e["label"] = label_watchdog_event(switch, peer, at, deadlocks, storming)
