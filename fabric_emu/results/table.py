"""The terminal's summary table and the rows the HTML report shows: summary.json's headline
figures as text, modelled beside emulated. Formatting only: every figure comes from the summary
(fabric_emu.results.summary)."""

from __future__ import annotations

from pathlib import Path

from rich.console import Console
from rich.table import Table

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
    if j["type"] == "parameter-server" and "step_time_fabric_s" in j:
        rows += [(f"{name}: step time", f"{j['step_time_fabric_s'] * 1e6:,.0f} us",
                  f"{j['step_time_fabric_s'] * d:.3f} s"),
                 (f"{name}: algbw (S / step)", f"{j['algbw_gbps']:.1f} Gb/s", ""),
                 (f"{name}: {len(j['workers'])} workers, servers {', '.join(j['servers'])}",
                  f"{j['bytes_pushed'] / 1e6:,.1f} MB pushed, {j['bytes_pulled'] / 1e6:,.1f} MB pulled", "")]
        return rows
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
            rows += _pause_rows(sw, s.get("nic"), s["dilation"])
            add("lossless-class drops", f"{sw['lossless_drops']:,}", "")
            if sw.get("headroom_overruns"):  # only when fabric-emu paused late: see the fidelity warning
                add("frames past the PFC headroom (late pauses)", f"{sw['headroom_overruns']:,}", "")
    rows += _storm_rows(s)
    for o in s.get("controller_outages", []):
        if o.get("resynced"):
            w = o["warm_start"]
            add(f"controller outage ({o['cause']}, at {o['down_fabric_us']:,.0f} us)",
                f"{o['outage_fabric_us']:,.0f} us",
                f"{o['outage_s']:.2f} s; resync sent {w['messages']} msgs, {w['flows_deleted']} flow deletions")
        else:
            add(f"controller outage ({o['cause']}, at {o['down_fabric_us']:,.0f} us)", "not back by the end", "")
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
        if "scale_up_bytes" in tr:  # inside servers: modelled, no packets (docs/scale-up.md)
            add("scale-up transfers / bytes (modelled)",
                f"{tr['scale_up_transfers']:,} / {tr['scale_up_bytes']:,}", "")
    fid = s.get("fidelity", {})
    if fid.get("cpu_busy_max") is not None:
        add("CPU busy (mean / max)", f"{fid['cpu_busy_mean']:.0%} / {fid['cpu_busy_max']:.0%}", "")
    threads = s.get("cpu", {}).get("threads", [])
    if kd := s.get("cpu", {}).get("kernel_datapath"):
        # No thread forwards on the kernel datapath: its figure is the busiest CPU's softirq.
        if kd.get("softirq_busiest_cpu_max") is not None:
            add("kernel datapath: busiest CPU in softirq",
                f"{kd['softirq_busiest_cpu_mean']:.0%} / {kd['softirq_busiest_cpu_max']:.0%} of a core", "")
        threads = [th for th in threads if th["label"] != "ovs-vswitchd"]
    for th in threads[:3]:
        add(f"busiest thread: {th['label']} ({th['thread']})",
            f"{th['busy_mean']:.0%} / {th['busy_max']:.0%} of a core", "")
    return rows


def _storm_rows(s: dict) -> list[Row]:
    """NIC storms and the PFC watchdog: what stormed, what the watchdog declared and dropped
    (its egress drops are among "switch drops"; docs/pfc-watchdog.md)."""
    rows: list[Row] = []
    if (s.get("nic") or {}).get("pause_tx"):  # NICs that paused their leaf (storms, slow receivers)
        rows.append(("PFC pauses sent by NICs", f"{s['nic']['pause_tx']:,}", ""))
    if s.get("nic_receive"):
        nr = s["nic_receive"].values()
        rows.append(("NIC receive buffers: xoff crossings / drops",
                     f"{sum(v['xoffs'] for v in nr):,} / {sum(v['drops'] for v in nr):,}", ""))
    for st in s.get("pfc_storms") or []:
        on, off = st.get("on_fabric_us"), st.get("off_fabric_us")
        span = f"{on:,.0f} to {off:,.0f} us" if on is not None and off is not None else "?"
        rows.append((f"PFC storm of {st['nic']}'s NIC", f"{span}, {st['pause_frames_sent']:,} pauses", ""))
    wd = s.get("pfcwd")
    if wd:
        rows.append((f"PFC watchdog ({wd['action']}): storms detected / restored",
                     f"{wd['storms_detected']} / {wd['storms_restored']}", ""))
        if wd["queues_stormed"]:
            rows.append(("PFC watchdog: queues stormed", ", ".join(wd["queues_stormed"]), ""))
            rows.append(("PFC watchdog: packets dropped out / in",
                         f"{wd['tx_dropped_packets']:,} / {wd['rx_dropped_packets']:,}", ""))
    rows += _deadlock_rows(s)
    return rows


def _deadlock_rows(s: dict) -> list[Row]:
    """Persistent PFC deadlock cycles (docs/pfc-deadlocks.md): each cycle, how often it formed,
    when first, and whether the run ended in it."""
    rows: list[Row] = []
    dl = s.get("deadlocks") or {}
    for p in dl.get("persistent") or []:
        first = p["first_formed_s"] * 1e6
        fate = "never broke" if p["unbroken_at_end"] else f"formed {p['formations']}x"
        if p.get("period_s"):
            fate += f", every {p['period_s'] * 1e6:,.0f} us"
        rows.append((f"PFC deadlock: {p['length']}-buffer cycle", f"at {first:,.0f} us, {fate}", ""))
    return rows


def _pause_rows(sw: dict, nic: dict | None, dilation: float) -> list[Row]:
    """PFC from both sides of each link: the frames switch ports sent go to the NICs or to other
    switches, so "sent" and "received by switch ports" differ whenever the NICs were paused, and
    the time paused of each side is its own row (a sum over ports, or over NICs)."""
    def both(switches: float, nics: float | None, fmt: str) -> str:
        return f"{switches:{fmt}} / " + ("?" if nics is None else f"{nics:{fmt}}")

    nic = nic or {}  # older summaries have no NIC side
    nic_us = nic.get("paused_fabric_us")
    return [
        ("PFC pauses sent by switches", f"{sw['pause_tx']:,}", ""),
        ("PFC pauses received: switches / NICs", both(sw["pause_rx"], nic.get("pause_rx"), ","), ""),
        ("time paused (sum): switches / NICs", both(sw["paused_fabric_us"], nic_us, ",.1f") + " us",
         both(sw["paused_fabric_us"] * dilation / 1e6, None if nic_us is None else nic_us * dilation / 1e6, ".3f")
         + " s"),
    ]


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
    if s.get("datapath"):
        out.print(f"OVS datapath: {s['datapath']} ({s.get('datapath_reason', '')})", soft_wrap=True,
                  highlight=False, markup=False)
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
