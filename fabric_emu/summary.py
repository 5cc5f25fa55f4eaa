"""Turn measurements (agent timestamps, port counters) into summary.json and the terminal table.

Pure functions: everything here comes from counters and timestamps the run measured, never from
the configuration echoed back. Bandwidths are in Gb/s (bits) so they compare with link rates.
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path

from rich.console import Console
from rich.table import Table

from fabric_emu.collectives import allreduce_busbw
from fabric_emu.config import ExperimentSpec
from fabric_emu.counters import totals
from fabric_emu.fidelity import loss_note, verdict
from fabric_emu.plan import FabricPlan


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
    """What the receivers counted, against what the senders sent."""
    recv = [q for a in agents.values() for q in a.get("recv_qps", [])]
    sent = sum(q["bytes"] for a in agents.values() for q in a.get("send_qps", []))
    received = sum(q["bytes"] for q in recv)
    return {
        "delivered_fraction": received / sent if sent else None,
        "bytes_received": received,
        "packets_received": sum(q["packets"] for q in recv),
        "missing_packets": sum(q["missing"] for q in recv),
        "out_of_order_packets": sum(q["out_of_order"] for q in recv),
        "ecn_ce_received": sum(q.get("ecn_ce", 0) for q in recv),
    }


def build_summary(spec: ExperimentSpec, plan: FabricPlan, ranks: list[str], traffic: dict,
                  state: dict) -> dict:
    w = spec.workload
    host_gbps = spec.topology.host_link.gbps
    summary: dict = {
        "status": state["status"],
        "experiment": spec.name,
        "load_balancing": spec.load_balancing,
        "workload": f"{w.type}/{w.algorithm}",
        "ranks": len(ranks),
        "size_bytes": w.size,
        "dilation": plan.dilation,
        "host_link_gbps": host_gbps,
    }
    if state.get("error"):
        summary["error"] = state["error"]
    agents = traffic.get("agents") or {}
    iters = iteration_times(agents) if agents and all(a.get("iterations") for a in agents.values()) else []
    if iters:
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
    if agents:
        summary["transport"] = transport_totals(agents)
    ecmp = ecmp_load(plan, agents)
    if ecmp:
        summary["ecmp"] = ecmp
    ports = traffic.get("ports")
    if ports:
        summary["switch"] = totals(ports)
    unexplained = 0
    if ports and agents:
        # Packets receivers never got that no switch queue or socket counted as dropped.
        unexplained = max(0, summary["transport"]["missing_packets"] - summary["switch"]["drops"])
        summary["transport"]["unexplained_loss_packets"] = unexplained
    missing = summary.get("transport", {}).get("missing_packets", 0)
    if missing and summary["status"] == "ok":
        # Receivers close a message whose packets were lost so the schedule goes on; without
        # RC retransmission (not emulated yet) the collective did not really complete.
        summary["status"] = "incomplete"
        summary["error"] = (f"{missing} packets never arrived and RC retransmission is not emulated "
                            "yet: the times and bandwidths above include damaged messages")
    cpu = traffic.get("cpu") or {}
    pacing = [a["pacing"]["achieved_bps"] / a["pacing"]["rate_bps"] for a in agents.values()
              if a.get("pacing", {}).get("achieved_bps")]
    drops = summary.get("switch", {}).get("drops", 0)
    warnings = verdict(cpu, pacing, unexplained, drops)
    note = loss_note(unexplained, drops)
    summary["fidelity"] = {**cpu, "agent_pacing_ratio_min": min(pacing) if pacing else None,
                           "trusted": not warnings, "warnings": warnings,
                           "notes": [note] if note else []}
    return summary


def flow_rows(plan: FabricPlan, agents: dict[str, dict]) -> list[dict]:
    """One row per queue pair, seen from its sender, with what its receiver counted.

    qpn is the sender's QP number, dest_qpn the receiver's (the BTH DestQP on the wire)."""
    received = {(q["src"], dst, q["qpn"]): q for dst, a in agents.items() for q in a.get("recv_qps", [])}
    rows = []
    for src, a in agents.items():
        for q in a.get("send_qps", []):
            r = received.get((src, q["dst"], q["remote_qpn"]), {})
            first, last = q.get("first_tx"), q.get("last_tx")
            rows.append({
                "src": src, "dst": q["dst"], "qpn": q["qpn"], "dest_qpn": q["remote_qpn"],
                "udp_src": q["udp_src"],
                "bytes": q["bytes"], "packets": q["packets"],
                "duration_s": (last - first) if first and last else None,
                "rx_bytes": r.get("bytes"), "rx_missing": r.get("missing"),
                "rx_out_of_order": r.get("out_of_order"), "rx_ecn_ce": r.get("ecn_ce"),
                "uplink": q.get("uplink", ""),
            })
    return rows


def print_summary(out: Console, s: dict, run_dir: Path) -> None:
    t = Table(title=f"{s['experiment']}: {s['workload']}, {s['ranks']} ranks, {s['load_balancing']}",
              show_header=True)
    t.add_column("metric")
    t.add_column("fabric (modelled)", justify="right")
    t.add_column("emulated", justify="right")
    t.add_row("status", s["status"], "")
    if "jct_s" in s:
        t.add_row("completion time", f"{s['jct_fabric_s'] * 1e6:,.0f} us", f"{s['jct_s']:.3f} s")
        t.add_row("per iteration", f"{s['iteration_time_fabric_s'] * 1e6:,.0f} us",
                  f"{s['iteration_time_s']:.3f} s")
        t.add_row("algbw", f"{s['algbw_gbps']:.1f} Gb/s", f"{s['algbw_emulated_gbps'] * 1e3:.1f} Mb/s")
        t.add_row("busbw", f"{s['busbw_gbps']:.1f} Gb/s", f"{s['busbw_emulated_gbps'] * 1e3:.1f} Mb/s")
        t.add_row("busbw / host link", f"{s['busbw_fraction']:.3f}", "")
    if "ecmp" in s:
        e = s["ecmp"]
        t.add_row("ECMP: most QPs on one uplink",
                  f"{e['max_qps_per_uplink']} ({e['shared_uplinks']} shared of {e['uplinks_used']})", "")
    if "switch" in s:
        t.add_row("switch tx packets", f"{s['switch']['tx_packets']:,}", "")
        t.add_row("switch drops", f"{s['switch']['drops']:,}", "")
    if "transport" in s:
        t.add_row("missing / out-of-order pkts",
                  f"{s['transport']['missing_packets']} / {s['transport']['out_of_order_packets']}", "")
    fid = s.get("fidelity", {})
    if fid.get("cpu_busy_max") is not None:
        t.add_row("CPU busy (mean / max)", f"{fid['cpu_busy_mean']:.0%} / {fid['cpu_busy_max']:.0%}", "")
    out.print(t)
    for w in fid.get("warnings", []):
        out.print(f"[yellow]fidelity warning:[/] {w}", soft_wrap=True)
    for n in fid.get("notes", []):
        out.print(f"note: {n}", soft_wrap=True)
    out.print(f"results: {run_dir}", soft_wrap=True)
