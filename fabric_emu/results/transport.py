"""What the queue pairs did, for results: summary.json's `transport` block (delivery, RC
recovery, ECN and DCQCN, per host) and `ecmp` (how they spread over the leaves' uplinks), the
incast and flows workloads' results (per workload flow and over all: completion, goodput, Jain's
fairness), and the rows of flows.csv and rates.csv.

Pure functions of what the NIC agents reported. Bandwidths are in Gb/s (bits) so they compare
with link rates.
"""

from __future__ import annotations

from collections import Counter

from fabric_emu.spec.workloads import FlowsWorkload, IncastWorkload
from fabric_emu.topo.plan import FabricPlan
from fabric_emu.workloads.flows import Flow, workload_flows


def transport_section(plan: FabricPlan, agents: dict[str, dict], switch_drops: int | None) -> dict:
    """summary.json's `transport` (with `by_host`) and `ecmp` keys, those there are.

    switch_drops: what the switch queues counted as dropped (None without port counters), so
    that loss no counter saw stands out."""
    out: dict = {}
    if agents:
        tr = transport_totals(agents)
        tr.update(scale_up_totals(agents))
        if switch_drops is not None:
            # Data packets no receiver saw that no switch queue counted as dropped.
            tr["unexplained_loss_packets"] = max(0, tr["lost_packets"] - switch_drops)
        tr["by_host"] = nic_rows(agents)
        out["transport"] = tr
    ecmp = ecmp_load(plan, agents)
    if ecmp:
        out["ecmp"] = ecmp
    return out


def flows_section(w: IncastWorkload | FlowsWorkload, plan: FabricPlan, agents: dict[str, dict],
                  host_gbps: float) -> dict:
    """An incast's or flows workload's results: the bytes planned and, once agents reported,
    flows_metrics; for an incast also the share of the receiver's link its goodput used."""
    flows = workload_flows(w, [h.name for h in plan.hosts])
    out: dict = {"bytes_planned": sum(f.total_bytes for f in flows)}
    if agents:
        out.update(flows_metrics(flows, agents, plan.dilation))
        if w.type == "incast" and "aggregate_goodput_gbps" in out:
            # The receiver's link is the bottleneck: how much of it the incast used.
            out["receiver_link_fraction"] = out["aggregate_goodput_gbps"] / host_gbps
    return out


def ecmp_load(plan: FabricPlan, agents: dict[str, dict]) -> dict | None:
    """How the queue pairs that leave their leaf spread over its uplinks (OVS's choice)."""
    per_uplink: Counter[tuple[str, str]] = Counter()
    for src, a in agents.items():
        for q in a.get("send_qps", []):
            if q.get("uplink"):
                per_uplink[(plan.host_by_name[src].leaf, q["uplink"])] += 1
    if not per_uplink:
        return None
    return {
        "crossing_qps": sum(per_uplink.values()),
        "uplinks_used": len(per_uplink),
        "max_qps_per_uplink": max(per_uplink.values()),
        "shared_uplinks": sum(1 for n in per_uplink.values() if n > 1),
    }


def transport_totals(agents: dict[str, dict]) -> dict:
    """What the NICs counted: delivery, RC recovery, ECN and DCQCN.

    RC delivers every byte in order or fails the QP, so loss shows as recovery work: NAKs
    (go-back-N after a gap), timeouts (a lost tail) and the packets sent again. lost_packets
    are data packets sent that no receiver saw (sent - accepted - discarded at the receiver).
    """
    recv = [q for a in agents.values() for q in a.get("recv_qps", [])]
    send = [q for a in agents.values() for q in a.get("send_qps", [])]
    acked = sum(q["bytes"] for q in send)
    received = sum(q["bytes"] for q in recv)
    rates = [q["min_rate_bps"] for q in send if q.get("min_rate_bps")]
    sent_packets = sum(q["packets"] for q in send)
    arrived = sum(q["packets"] + q.get("duplicates", 0) + q.get("out_of_sequence", 0) for q in recv)
    return {
        "delivered_fraction": received / acked if acked else None,
        "bytes_received": received,
        "packets_sent": sent_packets,
        "packets_received": sum(q["packets"] for q in recv),
        "lost_packets": max(0, sent_packets - arrived),
        "retransmitted_packets": sum(q.get("retransmitted", 0) for q in send),
        "naks": sum(q.get("naks", 0) for q in send),
        "timeouts": sum(q.get("timeouts", 0) for q in send),
        "duplicates": sum(q.get("duplicates", 0) for q in recv),
        "out_of_sequence": sum(q.get("out_of_sequence", 0) for q in recv),
        # spraying: packets that arrived ahead of a gap and were placed by PSN (reordering, not
        # loss: they count as received, and nothing is resent for them)
        "out_of_order": sum(q.get("out_of_order", 0) for q in recv),
        # single-path modes: NAKed gaps a late packet filled (each cost a go-back-N resend), and
        # the flows (receive QPs) that had any
        "reordered": sum(q.get("reordered", 0) for q in recv),
        "reordered_flows": sum(1 for q in recv if q.get("reordered")),
        "acks_sent": sum(q.get("acks_sent", 0) for q in recv),
        "ecn_ce_received": sum(q.get("ecn_ce", 0) for q in recv),
        # DCQCN: CNPs the receivers sent for CE marks, CNPs the senders got, the QPs it slowed
        "cnp_sent": sum(q.get("cnp_sent", 0) for q in recv),
        "cnp_received": sum(q.get("cnp_received", 0) for q in send),
        "qps_rate_limited": sum(1 for q in send if q.get("rate_cuts")),
        "min_qp_rate_gbps": min(rates) / 1e9 if rates else None,
    }


def scale_up_totals(agents: dict[str, dict]) -> dict:
    """Transfers inside servers, modelled by the NIC engines (no packets): their count and
    bytes, as the receivers counted them; nothing when no host is a GPU of a server."""
    su = [a["scale_up"] for a in agents.values() if a.get("scale_up")]
    if not su:
        return {}
    return {"scale_up_transfers": sum(s.get("received", 0) for s in su),
            "scale_up_bytes": sum(s.get("received_bytes", 0) for s in su)}


def nic_rows(agents: dict[str, dict]) -> dict[str, dict]:
    """Per host: CNPs sent and received, RC recovery counters, and for a GPU of a server its
    scale-up bytes sent and received (modelled)."""
    rows = {}
    for h, a in agents.items():
        send, recv = a.get("send_qps", []), a.get("recv_qps", [])
        rows[h] = {"cnp_sent": sum(q.get("cnp_sent", 0) for q in recv),
                   "cnp_received": sum(q.get("cnp_received", 0) for q in send),
                   "retransmitted": sum(q.get("retransmitted", 0) for q in send),
                   "naks": sum(q.get("naks", 0) for q in send),
                   "timeouts": sum(q.get("timeouts", 0) for q in send)}
        if su := a.get("scale_up"):
            rows[h].update(scale_up_bytes_sent=su.get("sent_bytes", 0),
                           scale_up_bytes_received=su.get("received_bytes", 0))
    return rows


def rate_rows(agents: dict[str, dict], dilation: float) -> list[dict]:
    """Every DCQCN rate change of every send QP (rates.csv): time from GO, modelled rate."""
    rows = []
    for h, a in agents.items():
        go = a.get("go") or 0.0
        for q in a.get("send_qps", []):
            for t, rate in q.get("rates") or []:
                rows.append({"host": h, "qpn": q["qpn"], "dst": q["dst"], "flow": q.get("flow"),
                             "time_s": round(t - go, 6), "time_fabric_us": round((t - go) / dilation * 1e6, 3),
                             "rate_gbps": rate / 1e9})
    return rows


def arrival_curve(points: list[tuple[float, float]], link_bytes_per_s: float) -> list[tuple[float, float]]:
    """A receive QP's bytes over time as the link delivered them, from its rx_series.

    An engine reads its socket in batches and stamps each batch when it reads it, so bytes that
    waited while it was off a CPU show up at once: a rate far above the link's. They crossed the
    link earlier, at most at the link's rate. The curve returned is the least one at or above
    what was read (nothing is read before it arrived) that never rises faster than the link:
    A(t_i) = max over j >= i of B(t_j) - L (t_j - t_i). Every byte is kept, at its own time or
    earlier; a point is added in front when bytes must have arrived before the first read.
    points: (time, bytes read by then), sorted by time, in any one time unit that
    link_bytes_per_s is per."""
    if not points or link_bytes_per_s <= 0:
        return list(points)
    out = [points[-1]]
    for t, b in reversed(points[:-1]):  # backwards: A_i = max(B_i, A_(i+1) - L (t_(i+1) - t_i))
        t_next, a_next = out[-1]
        out.append((t, max(b, a_next - link_bytes_per_s * (t_next - t))))
    out.reverse()
    (t0, a0), b0 = out[0], points[0][1]
    if a0 > b0:  # the first batch read held bytes that arrived before it: they started earlier
        out.insert(0, (t0 - (a0 - b0) / link_bytes_per_s, b0))
    return out


def goodput_gbps(nbytes: int, seconds: float, dilation: float) -> float:
    """Payload rate in modelled Gb/s of nbytes delivered in `seconds` of emulated time."""
    return nbytes * 8 / seconds * dilation / 1e9


def jain_index(values: list[float]) -> float | None:
    """Jain's fairness index (sum x)^2 / (n sum x^2): 1 when all are equal, 1/n when one has all."""
    squares = sum(x * x for x in values)
    return sum(values) ** 2 / (len(values) * squares) if squares else None


def _span(first: list, last: list) -> tuple[float, float] | None:
    """(earliest of first, latest of last) when every timestamp is there and time passed."""
    if not first or not last or None in first or None in last or max(last) <= min(first):
        return None
    return min(first), max(last)


def flows_metrics(flows: list[Flow], agents: dict[str, dict], dilation: float) -> dict:
    """Per workload flow (queue pairs carry its index, "flow"): bytes, and from its first packet
    sent to its last byte received, completion time and goodput. Over all flows: completion
    time from the earliest send to the last byte delivered, and Jain's fairness of the senders'
    goodputs (each sender's bytes over its own first send to last delivery)."""
    rows, spans = [], []
    for k, f in enumerate(flows):
        src, dst = agents.get(f.src, {}), agents.get(f.dst, {})
        sent = [q for q in src.get("send_qps", []) if q.get("flow") == k]
        recv = [q for q in dst.get("recv_qps", []) if q.get("flow") == k]
        span = _span([q.get("first_tx") for q in sent], [q.get("last_rx") for q in recv])
        row = {"flow": k, "src": f.src, "dst": f.dst, "bytes_planned": f.total_bytes,
               "bytes_sent": sum(q["bytes"] for q in sent),
               "bytes_received": sum(q["bytes"] for q in recv),
               "start_s": None, "start_fabric_us": None, "completion_s": None,
               "completion_fabric_us": None, "goodput_gbps": None}
        if span:
            t = span[1] - span[0]
            if src.get("go"):
                row.update(start_s=span[0] - src["go"], start_fabric_us=(span[0] - src["go"]) / dilation * 1e6)
            row.update(completion_s=t, completion_fabric_us=t / dilation * 1e6,
                       goodput_gbps=goodput_gbps(row["bytes_received"], t, dilation))
        rows.append(row)
        spans.append(span)
    out: dict = {"flows": rows}
    if not rows or not all(spans):
        return out
    start, end = min(sp[0] for sp in spans), max(sp[1] for sp in spans)
    delivered = sum(r["bytes_received"] for r in rows)
    out.update({"jct_s": end - start, "jct_fabric_s": (end - start) / dilation,
                "aggregate_goodput_gbps": goodput_gbps(delivered, end - start, dilation)})
    senders: dict[str, tuple[int, float, float]] = {}
    for r, (t0, t1) in zip(rows, spans):
        b, s0, s1 = senders.get(r["src"], (0, t0, t1))
        senders[r["src"]] = (b + r["bytes_received"], min(s0, t0), max(s1, t1))
    rates = {h: goodput_gbps(b, t1 - t0, dilation) for h, (b, t0, t1) in senders.items()}
    out.update({"sender_goodput_gbps": rates, "jain_fairness": jain_index(list(rates.values())),
                "goodput_min_gbps": min(rates.values()), "goodput_max_gbps": max(rates.values())})
    return out


def flow_rows(plan: FabricPlan, agents: dict[str, dict]) -> list[dict]:
    """One row per queue pair, seen from its sender, with what its receiver counted.

    qpn is the sender's QP number, dest_qpn the receiver's (the BTH DestQP on the wire); flow
    the index of the workload flow it carries (incast and flows). start_s counts from GO;
    completion_s runs from its first packet sent to its last byte received (emulated), and
    goodput_gbps is the bytes received over it, in modelled Gb/s."""
    received = {(q["src"], dst, q["qpn"]): q for dst, a in agents.items() for q in a.get("recv_qps", [])}
    rows = []
    for src, a in agents.items():
        for q in a.get("send_qps", []):
            r = received.get((src, q["dst"], q["remote_qpn"]), {})
            first, last = q.get("first_tx"), q.get("last_tx")
            end = r.get("last_rx")
            done = end - first if first and end and end > first else None
            go = a.get("go")
            rows.append({
                "src": src, "dst": q["dst"], "flow": q.get("flow"), "qpn": q["qpn"],
                "dest_qpn": q["remote_qpn"], "udp_src": q["udp_src"],
                "bytes": q["bytes"], "packets": q["packets"],
                "duration_s": (last - first) if first and last else None,
                "rx_bytes": r.get("bytes"), "rx_duplicates": r.get("duplicates"),
                "rx_out_of_sequence": r.get("out_of_sequence"), "rx_out_of_order": r.get("out_of_order"),
                "rx_reordered": r.get("reordered"),
                "rx_ecn_ce": r.get("ecn_ce"),
                "retransmitted": q.get("retransmitted", 0), "naks": q.get("naks", 0),
                "timeouts": q.get("timeouts", 0),
                "start_s": first - go if first and go else None,
                "completion_s": done,
                "completion_fabric_us": done / plan.dilation * 1e6 if done else None,
                "goodput_gbps": goodput_gbps(r.get("bytes") or 0, done, plan.dilation) if done else None,
                "cnp_received": q.get("cnp_received", 0),
                "min_rate_gbps": q["min_rate_bps"] / 1e9 if q.get("min_rate_bps") else None,
                "uplink": q.get("uplink", ""),
            })
    return rows
