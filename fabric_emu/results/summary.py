"""Turn measurements (agent timestamps, port counters) into summary.json and the terminal table.

Pure functions: everything here comes from counters and timestamps the run measured, never from
the configuration echoed back. Bandwidths are in Gb/s (bits) so they compare with link rates.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import asdict
from pathlib import Path

from rich.console import Console
from rich.table import Table

from fabric_emu.workloads import jobs
from fabric_emu.workloads.collectives import allreduce_busbw
from fabric_emu.spec.experiment import ExperimentSpec
from fabric_emu.spec.workloads import AllReduceWorkload
from fabric_emu.measure.counters import totals
from fabric_emu.fabric.events import failovers
from fabric_emu.measure.fidelity import verdict
from fabric_emu.topo.plan import FabricPlan
from fabric_emu.ports.model import settings_of
from fabric_emu.results.lossless import daemon_warnings, lossless_warnings, reaction_summary
from fabric_emu.workloads.traffic import Flow, workload_flows


def iteration_times(agents: dict[str, dict]) -> list[dict]:
    """Per iteration: end = when the last rank finished it; time = end - previous end.

    Ranks run iterations back to back (as nccl-tests loops do), so iteration i's time is the
    gap between the moments the whole ring finished i-1 and i; the first one starts when the
    first rank started.
    """
    per_rank = [a["iterations"] for a in agents.values()]
    n_iter = min(len(it) for it in per_rank)
    prev_end = min(it[0]["start"] for it in per_rank)
    out = []
    for i in range(n_iter):
        if any(it[i].get("end") is None for it in per_rank):
            break
        end = max(it[i]["end"] for it in per_rank)
        out.append({"iteration": i, "start": prev_end, "end": end, "time_s": end - prev_end})
        prev_end = end
    return out


def bandwidths(size_bytes: int, time_s: float, n_ranks: int, dilation: float) -> dict:
    """nccl-tests algbw and busbw, emulated and modelled (x dilation), in Gb/s."""
    algbw = size_bytes * 8 / time_s / 1e9
    busbw = allreduce_busbw(algbw, n_ranks)
    return {
        "algbw_gbps": algbw * dilation, "busbw_gbps": busbw * dilation,
        "algbw_emulated_gbps": algbw, "busbw_emulated_gbps": busbw,
    }


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
        "acks_sent": sum(q.get("acks_sent", 0) for q in recv),
        "ecn_ce_received": sum(q.get("ecn_ce", 0) for q in recv),
        # DCQCN: CNPs the receivers sent for CE marks, CNPs the senders got, the QPs it slowed
        "cnp_sent": sum(q.get("cnp_sent", 0) for q in recv),
        "cnp_received": sum(q.get("cnp_received", 0) for q in send),
        "qps_rate_limited": sum(1 for q in send if q.get("rate_cuts")),
        "min_qp_rate_gbps": min(rates) / 1e9 if rates else None,
    }


def nic_rows(agents: dict[str, dict]) -> dict[str, dict]:
    """Per host: CNPs sent and received, and RC recovery counters."""
    rows = {}
    for h, a in agents.items():
        send, recv = a.get("send_qps", []), a.get("recv_qps", [])
        rows[h] = {"cnp_sent": sum(q.get("cnp_sent", 0) for q in recv),
                   "cnp_received": sum(q.get("cnp_received", 0) for q in send),
                   "retransmitted": sum(q.get("retransmitted", 0) for q in send),
                   "naks": sum(q.get("naks", 0) for q in send),
                   "timeouts": sum(q.get("timeouts", 0) for q in send)}
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


def engine_lateness(agents: dict[str, dict]) -> dict[int, float]:
    """Per NIC engine: the fraction of its wake-ups that came more than a tick late."""
    out = {}
    for a in agents.values():
        e = a.get("engine") or {}
        if e.get("wakes"):
            out[e["engine"]] = e["late_wakes"] / e["wakes"]
    return out


def build_summary(spec: ExperimentSpec, plan: FabricPlan, ranks: list[str], traffic: dict,
                  state: dict) -> dict:
    w = spec.workload
    host_gbps = spec.topology.host_link.gbps
    program = jobs.uses_program(spec)
    summary: dict = {
        "status": state["status"],
        "experiment": spec.name,
        "load_balancing": spec.load_balancing,
        "congestion_control": spec.congestion_control,
        "workload": " + ".join(_workload_name(j) for j in spec.jobs),
        "ranks": len(ranks),
        **({"size_bytes": w.size} if w is not None and hasattr(w, "size") else {}),
        "dilation": plan.dilation,
        "host_link_gbps": host_gbps,
    }
    if state.get("error"):
        summary["error"] = state["error"]
    agents = traffic.get("agents") or {}
    iters = iteration_times(agents) if agents and all(a.get("iterations") for a in agents.values()) else []
    if program:
        summary.update(jobs_section(spec, plan, agents, traffic.get("alone") or {}))
    elif not isinstance(w, AllReduceWorkload):
        flows = workload_flows(w, [h.name for h in plan.hosts])
        summary["bytes_planned"] = sum(f.total_bytes for f in flows)
        if agents:
            summary.update(flows_metrics(flows, agents, plan.dilation))
            if w.type == "incast" and "aggregate_goodput_gbps" in summary:
                # The receiver's link is the bottleneck: how much of it the incast used.
                summary["receiver_link_fraction"] = summary["aggregate_goodput_gbps"] / host_gbps
    elif iters:
        jct = iters[-1]["end"] - iters[0]["start"]
        mean_t = jct / len(iters)
        bw = bandwidths(w.size, mean_t, len(ranks), plan.dilation)
        summary.update({
            "iterations_completed": len(iters),
            "jct_s": jct,
            "jct_fabric_s": jct / plan.dilation,
            "iteration_time_s": mean_t,
            "iteration_time_fabric_s": mean_t / plan.dilation,
            **bw,
            "busbw_fraction": bw["busbw_gbps"] / host_gbps,
            "per_iteration": [
                {**it, "time_fabric_s": it["time_s"] / plan.dilation,
                 **bandwidths(w.size, it["time_s"], len(ranks), plan.dilation)}
                for it in iters
            ],
        })
    if traffic.get("background"):
        summary["background"] = traffic["background"]
    if agents:
        summary["transport"] = transport_totals(agents)
    ecmp = ecmp_load(plan, agents)
    if ecmp:
        summary["ecmp"] = ecmp
    ports = traffic.get("ports")
    if ports:
        summary["switch"] = totals(ports, plan.dilation)
        # what left the leaves upward: the traffic that crossed the upper tiers (spines)
        leaves = {sw.name for sw in plan.leaves}
        summary["switch"]["leaf_uplink_tx_bytes"] = sum(
            r.tx_bytes for r in ports if r.switch in leaves and r.kind == "fabric")
    if traffic.get("nics"):
        summary["nic"] = traffic["nics"]
    lb = traffic.get("lb") or {}
    if traffic.get("events"):  # scheduled events: when each fired, how long the switches took
        summary["events"] = traffic["events"]
        moved = failovers(traffic["events"], lb.get("link_changes", []), plan.dilation)
        if moved:
            summary["failover"] = moved
    dlb_uplinks = (lb.get("dlb") or {}).get("uplinks") or {}
    if any(u["flowlets"] for ups in dlb_uplinks.values() for u in ups.values()):
        # the flowlet stage's counters, per leaf and uplink: flowlets started, moves, bytes
        summary["dlb"] = dlb_uplinks
    if lb.get("changes"):  # live changes (events and `fabric-emu lb`)
        summary["load_balancing_changes"] = lb["changes"]
        summary["load_balancing_final"] = lb["mode"]
    reaction = reaction_summary(traffic.get("pfc_daemon") or {}, plan.dilation)
    if reaction:
        summary["pfc_reaction"] = reaction
    unexplained = 0
    if ports and agents:
        # Data packets no receiver saw that no switch queue counted as dropped.
        unexplained = max(0, summary["transport"]["lost_packets"] - summary["switch"]["drops"])
        summary["transport"]["unexplained_loss_packets"] = unexplained
    if agents:
        summary["transport"]["by_host"] = nic_rows(agents)
    cpu = traffic.get("cpu") or {}
    late = engine_lateness(agents)
    links_failed = any(e.get("kind") == "link" and e.get("state") == "down" and e.get("ok")
                       for e in traffic.get("events") or [])
    # A link taken down loses what was on it, where no switch queue counts it: expected.
    warnings = verdict(cpu, list(late.values()), 0 if links_failed else unexplained)
    if ports:
        ecn, pfc = settings_of(spec)
        warnings += lossless_warnings(ports, asdict(ecn), pfc, reaction)
        warnings += daemon_warnings(traffic.get("pfc_daemon") or {})
    note = None
    if links_failed and unexplained:
        note = (f"{unexplained} packet(s) were lost where no switch counter saw them: on the "
                "link(s) taken down, with what their queues held (RC resent them)")
    machine = {k: v for k, v in cpu.items() if k.startswith("cpu_")}
    summary["fidelity"] = {**machine, "nic_engine_late_wakes_max": max(late.values()) if late else None,
                           "trusted": not warnings, "warnings": warnings,
                           "notes": [note] if note else []}
    if cpu:
        summary["cpu"] = cpu_section(cpu)
    if "dilation_auto" in plan.extra:
        summary["dilation_auto"] = plan.extra["dilation_auto"]
    return summary


def _workload_name(w) -> str:
    algo = getattr(w, "algorithm", None)
    return f"{w.type}/{algo}" if w.type == "allreduce" else w.type


def jobs_section(spec: ExperimentSpec, plan: FabricPlan, agents: dict[str, dict], alone: dict) -> dict:
    """The `jobs` of a program run, each with its results (fabric_emu.workloads.jobs); a single job's
    headline figures (completion, busbw, step time) also at the top level, as for the ring.
    alone: job name -> its completion time when it ran by itself (several jobs)."""
    js = jobs.resolve_jobs(spec, plan)
    program = jobs.build_program(js)
    times = jobs.op_times(program, {h: a.get("ops") or [] for h, a in agents.items()})
    leaf_of = {h.name: h.leaf for h in plan.hosts}
    out = [jobs.job_results(j, program, times, plan.dilation, spec.topology.host_link.gbps, leaf_of)
           for j in js]
    for r in out:
        if r["name"] in alone and "jct_fabric_s" in r:
            r["jct_alone_fabric_s"] = alone[r["name"]]
            r["slowdown"] = r["jct_fabric_s"] / alone[r["name"]]
    section: dict = {"jobs": out}
    if len(out) == 1:
        section.update({k: v for k, v in out[0].items() if k in HEADLINE_KEYS})
    return section


HEADLINE_KEYS = ("jct_s", "jct_fabric_s", "algbw_gbps", "busbw_gbps", "busbw_fraction",
                 "iteration_time_fabric_s", "step_time_fabric_s", "bubble_fraction")


def cpu_section(cpu: dict) -> dict:
    """summary.json's `cpu`: the machine (busy_mean, busy_max, saturated_fraction of all
    cores), `threads`, the busiest thread of each watched process (busy fractions of one
    core), busiest first, OVS's average output batch (packets waiting at each poll) and its
    flow cache's packets and upcalls over the run."""
    return {"cores": cpu.get("cores"), "samples": cpu.get("samples"), "interval_s": cpu.get("interval_s"),
            "busy_mean": cpu.get("cpu_busy_mean"), "busy_max": cpu.get("cpu_busy_max"),
            "saturated_fraction": cpu.get("cpu_saturated_fraction"),
            "watched": cpu.get("watched", []), "threads": cpu.get("threads", []),
            "ovs_output_batch": cpu.get("ovs_output_batch"), "ovs_datapath": cpu.get("ovs_datapath")}


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


MAX_FLOWS_SHOWN = 16  # per-flow rows in the terminal; flows.csv and summary.json have them all
Row = tuple[str, str, str]  # a row of the summary table: metric, fabric (modelled), emulated


def _job_rows(j: dict, d: float) -> list[Row]:
    """A job's rows in the summary table (modelled and emulated)."""
    name = f"{j['name']} ({j['type']})"
    if j.get("status") != "ok":
        return [(name, "did not finish", "")]
    rows: list[Row] = [(f"{name}: completion", f"{j['jct_fabric_s'] * 1e6:,.0f} us", f"{j['jct_s']:.3f} s")]
    if "jct_alone_fabric_s" in j:
        rows.append((f"{name}: alone / slowdown together",
                     f"{j['jct_alone_fabric_s'] * 1e6:,.0f} us / {j['slowdown']:.2f}x", ""))
    if "busbw_fraction" in j:
        rows.append((f"{name}: busbw", f"{j['busbw_gbps']:.1f} Gb/s ({j['busbw_fraction']:.3f} of link)",
                     f"{j['busbw_gbps'] / d * 1e3:.1f} Mb/s"))
    if "step_time_fabric_s" in j:
        split = ", ".join(f"{k} {v * 1e6:,.0f}" for k, v in j["split_fabric_s"].items())
        rows += [(f"{name}: step time", f"{j['step_time_fabric_s'] * 1e6:,.0f} us",
                  f"{j['step_time_fabric_s'] * d:.3f} s"),
                 (f"{name}: split (us)", split, "")]
        if j["type"] == "pipeline":
            rows.append((f"{name}: bubble (ideal)",
                         f"{j['bubble_fraction']:.3f} ({j['bubble_fraction_ideal']:.3f})", ""))
        else:  # training: idle time includes TP and DP communication, not only the bubble
            rows.append((f"{name}: idle share (pipeline bubble alone)",
                         f"{j['bubble_fraction']:.3f} ({j['bubble_fraction_ideal']:.3f})", ""))
        if "bytes_across_leaves_planned" in j:
            rows.append((f"{name}: bytes across leaves", f"{j['bytes_across_leaves_planned'] / 1e6:,.1f} MB", ""))
    return rows


def summary_title(s: dict) -> str:
    who = "hosts" if s["workload"] in ("incast", "flows") else "ranks"
    return f"{s['experiment']}: {s['workload']}, {s['ranks']} {who}, {s['load_balancing']}"


def summary_rows(s: dict) -> list[Row]:
    """The headline figures as (metric, fabric (modelled), emulated) text: the terminal's table
    and the HTML report (fabric_emu.results.report) show the same rows."""
    rows: list[Row] = []

    def add(metric: str, modelled: str, emulated: str) -> None:
        rows.append((metric, modelled, emulated))

    add("status", s["status"], "")
    if "jct_s" in s and s["workload"] in ("incast", "flows"):
        d = s["dilation"]
        add("completion time", f"{s['jct_fabric_s'] * 1e6:,.0f} us", f"{s['jct_s']:.3f} s")
        add("aggregate goodput", f"{s['aggregate_goodput_gbps']:.1f} Gb/s",
            f"{s['aggregate_goodput_gbps'] / d * 1e3:.1f} Mb/s")
        if "receiver_link_fraction" in s:
            add("goodput / receiver link", f"{s['receiver_link_fraction']:.3f}", "")
        add("sender goodput min / max",
            f"{s['goodput_min_gbps']:.1f} / {s['goodput_max_gbps']:.1f} Gb/s",
            f"{s['goodput_min_gbps'] / d * 1e3:.1f} / {s['goodput_max_gbps'] / d * 1e3:.1f} Mb/s")
        add("Jain fairness (senders)", f"{s['jain_fairness']:.3f}", "")
    elif "iteration_time_s" in s:  # the ring all-reduce
        add("completion time", f"{s['jct_fabric_s'] * 1e6:,.0f} us", f"{s['jct_s']:.3f} s")
        add("per iteration", f"{s['iteration_time_fabric_s'] * 1e6:,.0f} us",
            f"{s['iteration_time_s']:.3f} s")
        add("algbw", f"{s['algbw_gbps']:.1f} Gb/s", f"{s['algbw_emulated_gbps'] * 1e3:.1f} Mb/s")
        add("busbw", f"{s['busbw_gbps']:.1f} Gb/s", f"{s['busbw_emulated_gbps'] * 1e3:.1f} Mb/s")
        add("busbw / host link", f"{s['busbw_fraction']:.3f}", "")
    for j in s.get("jobs", []):
        rows += _job_rows(j, s["dilation"])
    for b in s.get("background", []):
        got = f"{b['gbps']:.1f} Gb/s" if b.get("gbps") is not None else b.get("error", "no result")
        add(f"background {b['protocol']} {b['src']} -> {b['dst']}", got, "")
    if "ecmp" in s:
        e = s["ecmp"]
        add("ECMP: most QPs on one uplink",
            f"{e['max_qps_per_uplink']} ({e['shared_uplinks']} shared of {e['uplinks_used']})", "")
    if "switch" in s:
        add("switch tx packets", f"{s['switch']['tx_packets']:,}", "")
        add("switch drops", f"{s['switch']['drops']:,}", "")
        sw = s["switch"]
        if "ecn_marked" in sw:
            add("ECN-marked packets", f"{sw['ecn_marked']:,}", "")
            add("PFC pause frames sent / received", f"{sw['pause_tx']:,} / {sw['pause_rx']:,}", "")
            add("time paused (all ports)", f"{sw['paused_fabric_us']:,.1f} us",
                f"{sw['paused_fabric_us'] * s['dilation'] / 1e6:.3f} s")
            add("lossless-class drops", f"{sw['lossless_drops']:,}", "")
            if sw.get("headroom_overruns"):  # only when fabric-emu paused late: see the fidelity warning
                add("frames past the PFC headroom (late pauses)", f"{sw['headroom_overruns']:,}", "")
    if "transport" in s:
        tr = s["transport"]
        add("RC: retransmitted pkts / NAKs / timeouts",
            f"{tr['retransmitted_packets']:,} / {tr['naks']:,} / {tr['timeouts']:,}", "")
        if s.get("load_balancing") == "spray":
            add("packets out of order (placed by PSN)", f"{tr.get('out_of_order', 0):,}", "")
        add("CE received / CNPs sent / received",
            f"{tr['ecn_ce_received']:,} / {tr['cnp_sent']:,} / {tr['cnp_received']:,}", "")
        if tr["min_qp_rate_gbps"] is not None:
            add("DCQCN: QPs slowed, lowest rate",
                f"{tr['qps_rate_limited']}, {tr['min_qp_rate_gbps']:.1f} Gb/s", "")
    fid = s.get("fidelity", {})
    if fid.get("cpu_busy_max") is not None:
        add("CPU busy (mean / max)", f"{fid['cpu_busy_mean']:.0%} / {fid['cpu_busy_max']:.0%}", "")
    for th in s.get("cpu", {}).get("threads", [])[:3]:
        add(f"busiest thread: {th['label']} ({th['thread']})",
            f"{th['busy_mean']:.0%} / {th['busy_max']:.0%} of a core", "")
    return rows


def print_summary(out: Console, s: dict, run_dir: Path) -> None:
    t = Table(title=summary_title(s), show_header=True)
    t.add_column("metric")
    t.add_column("fabric (modelled)", justify="right")
    t.add_column("emulated", justify="right")
    for row in summary_rows(s):
        t.add_row(*row)
    out.print(t)
    fid = s.get("fidelity", {})
    if 0 < len(s.get("flows", [])) <= MAX_FLOWS_SHOWN:
        out.print(_flows_table(s["flows"]))
    for w in fid.get("warnings", []):
        out.print(f"[yellow]fidelity warning:[/] {w}", soft_wrap=True)
    for n in fid.get("notes", []):
        out.print(f"note: {n}", soft_wrap=True)
    if auto := s.get("dilation_auto"):
        out.print(f"dilation {s['dilation']:g} was chosen automatically: {auto.get('reason', '')}",
                  soft_wrap=True, highlight=False)
    out.print(f"results: {run_dir}", soft_wrap=True)


def _flows_table(flows: list[dict]) -> Table:
    t = Table("flow", "src > dst", "received", "start (us)", "completion (us)", "goodput (Gb/s)",
              title="flows (modelled fabric time)")
    for f in flows:
        def cell(key: str, fmt: str) -> str:
            return format(f[key], fmt) if f[key] is not None else "-"
        t.add_row(str(f["flow"]), f"{f['src']} > {f['dst']}",
                  f"{f['bytes_received']:,} / {f['bytes_planned']:,} B", cell("start_fabric_us", ",.0f"),
                  cell("completion_fabric_us", ",.0f"), cell("goodput_gbps", ".1f"))
    return t
