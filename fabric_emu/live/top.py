"""`fabric-emu top`: a running fabric's ports, queues, pauses and busiest QPs, refreshed about
once a second (rich). Rendering is pure (two snapshots in, a renderable out); the loop reads a
LiveReader."""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from dataclasses import asdict

from rich.console import Console, Group
from rich.live import Live
from rich.table import Table
from rich.text import Text

from fabric_emu.live.snapshot import (LOSSLESS, DeadlockCycle, PortSample, Snapshot, StormSummary, busiest_qps,
                                      deadlocked_ports, port_rates, qp_gbps, storm_summary, totals)

TOP_QPS = 10
PLAIN_WIDTH = 160


def _fmt_bytes(n: float) -> str:
    for unit in ("B", "KB", "MB", "GB"):
        if abs(n) < 1000 or unit == "GB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1000
    return f"{n:.1f} GB"


def header(snap: Snapshot) -> Text:
    f = snap.fidelity
    cpu = f"CPU {f['cpu_busy']:.0%}" if "cpu_busy" in f else "CPU ?"
    if "ovs_thread_busy" in f:
        cpu += f", OVS thread {f['ovs_thread_busy']:.0%}"
    trust = "[red]SATURATED: results not trusted[/]" if f.get("saturated") else "[green]ok[/]"
    t = Text.from_markup(
        f"[bold]{snap.run_id}[/] {snap.experiment}  phase [bold]{snap.phase}[/]  "
        f"LB [bold]{snap.load_balancing}[/]  CC [bold]{snap.congestion_control}[/]  dilation {snap.dilation:g}\n"
        f"modelled {snap.modelled_s * 1e6:,.1f} us  (emulated {snap.emulated_s:.1f} s)  "
        f"fidelity: {cpu} {trust}")
    return t


def _pfc_cell(p: PortSample, deadlocked: bool = False) -> str:
    """PAUSED while PFC holds the RoCE class; STORMED while the watchdog holds it (then its
    pauses may be ignored: both can show); DEADLOCK while its paused egress is on a cycle."""
    marks = ((["[red]PAUSED[/]"] if p.paused.get(LOSSLESS) else []) + (["[bold magenta]STORMED[/]"] if p.stormed else [])
             + (["[bold red]DEADLOCK[/]"] if deadlocked else []))
    return " ".join(marks)


def _peer_cell(p: PortSample) -> str:
    return f"{p.peer} [bold magenta]storming[/]" if p.peer_storming else p.peer


def _plural(n: int, word: str) -> str:
    return f"{n} {word}" + ("" if n == 1 else "s")


def storm_line(s: StormSummary) -> str:
    """The footer's watchdog and NIC storm line, e.g. "PFC watchdog: 1 queue stormed now
    (leaf2-eth1), 1 storm detected / 0 restored; NIC storming: h4"."""
    parts = []
    if s.stormed or s.detected:
        now = f" ({', '.join(s.stormed)})" if s.stormed else ""
        parts.append(f"PFC watchdog: {_plural(len(s.stormed), 'queue')} stormed now{now}, "
                     f"{_plural(s.detected, 'storm')} detected / {s.restored} restored")
    if s.nics_storming:
        parts.append(f"NIC storming: {', '.join(s.nics_storming)}")
    return "; ".join(parts)


def deadlock_line(c: DeadlockCycle) -> str:
    """A footer line per cycle now, e.g. "DEADLOCK  r1.in(r4) -> r2.in(r1) -> r3.in(r2) ->
    r4.in(r3)  (4 buffers, 399.0 KB held)"."""
    return f"DEADLOCK  {c.text}  ({_plural(len(c.members), 'buffer')}, {_fmt_bytes(c.held_bytes)} held)"


def render(prev: Snapshot | None, cur: Snapshot, max_ports: int | None = None) -> Group:
    rates = port_rates(prev, cur) if prev is not None else {}
    ports = Table(title="switch ports" + ("" if cur.baseline else " (counting from port creation)"),
                  title_justify="left", expand=False)
    for col in ("switch", "port", "peer", "tx Gb/s", "util", "rx Gb/s", "tx bytes", "drops",
                "RoCE queue", "ECN marks", "PFC", "pauses to/from peer"):
        ports.add_column(col, justify="left" if col in ("switch", "peer", "PFC") else "right")
    shown = cur.ports
    locked = deadlocked_ports(cur)
    if max_ports is not None:  # stormed and deadlocked ones, then the busiest, when they do not all fit (they may send nothing)
        shown = sorted(cur.ports, key=lambda p: (not (p.stormed or p.peer_storming or p.intf in locked),
                                                 -(rates[p.intf].tx_gbps if p.intf in rates else 0)))[:max_ports]
    for p in shown:
        r = rates.get(p.intf)
        ports.add_row(
            p.switch, str(p.port), _peer_cell(p),
            f"{r.tx_gbps:6.1f}" if r else "-", f"{r.tx_util:4.0%}" if r else "-",
            f"{r.rx_gbps:6.1f}" if r else "-", f"{p.get('tx_bytes'):,}", f"{p.get('drops'):,}",
            _fmt_bytes(p.queue_bytes.get(LOSSLESS, 0)), f"{p.get('ecn_marked'):,}",
            _pfc_cell(p, p.intf in locked),
            f"{p.get('pause_tx_p3')}/{p.get('pause_rx_p3')}")
    qps = Table(title=f"busiest queue pairs (of {len(cur.qps)})", title_justify="left")
    for col in ("host", "qpn", "dst", "udp src", "Gb/s", "DCQCN limit", "sent", "CNPs rx", "CE at dst", "retx"):
        qps.add_column(col, justify="left" if col in ("host", "dst") else "right")
    for q in busiest_qps(cur, TOP_QPS):
        limit = "-" if q.dcqcn_rate_bps is None else f"{q.dcqcn_rate_bps / 1e9:.1f}"
        qps.add_row(q.host, f"{q.qpn:#x}", q.dst, str(q.udp_src), f"{qp_gbps(q, cur.dilation):.1f}", limit,
                    _fmt_bytes(q.frame_bytes), f"{q.cnp_received:,}", f"{q.ecn_ce:,}", f"{q.retransmitted:,}")
    tot = totals(cur)
    to_nics = sum(p.get("pause_tx_p3") for p in cur.ports if p.kind == "host")  # what the NICs received
    foot = Text(f"fabric: {tot['tx_bytes']:,} bytes sent by switch ports, {tot['drops']:,} drops, "
                f"{tot['ecn_marked']:,} ECN marks, {tot['pause_tx_p3']:,} PFC pauses sent by switch ports"
                f" ({to_nics:,} of them to NICs)", style="dim")
    storms = storm_summary(cur)
    storm = [Text(storm_line(storms), style="bold magenta")] if storms else []  # only once something stormed
    deadlocks = [Text(deadlock_line(c), style="bold red") for c in cur.deadlocks]
    notes = [Text(n, style="yellow") for n in cur.notes]
    return Group(header(cur), ports, qps, foot, *storm, *deadlocks, *notes)


def json_view(prev: Snapshot | None, cur: Snapshot) -> dict:
    """What --json prints: the snapshot (each port's stormed, storms_detected, storms_restored,
    peer_storming among its fields; deadlocks: the cycles now, members and edge_bytes), its port
    rates, the watchdog and NIC storms summed as the footer has them, the interfaces on a
    deadlock cycle (deadlocked_ports) and its busiest QPs (modelled Gb/s)."""
    rates = port_rates(prev, cur) if prev is not None else {}
    return {**cur.to_dict(), "rates": {k: asdict(v) for k, v in rates.items()}, "storms": asdict(storm_summary(cur)),
            "deadlocked_ports": sorted(deadlocked_ports(cur)),
            "busiest_qps": [{**asdict(q), "gbps": qp_gbps(q, cur.dilation)} for q in busiest_qps(cur, TOP_QPS)]}


def run_top(read: Callable[[], Snapshot], out: Console, interval_s: float = 1.0, once: bool = False,
            as_json: bool = False, alive: Callable[[], bool] = lambda: True) -> None:
    """Refresh every interval_s until Ctrl-C or the run goes away; --once/--json: one view
    (rates need two reads, interval_s apart)."""
    prev = read()
    if once or as_json:
        if prev.phase != "done":
            time.sleep(interval_s)
        cur = read()
        if as_json:
            out.file.write(json.dumps(json_view(prev, cur)) + "\n")
        else:  # a pipe or a file gets every column, not an 80-column squeeze
            wide = out if out.is_terminal else Console(file=out.file, width=PLAIN_WIDTH)
            wide.print(render(prev, cur))
        return
    with Live(render(None, prev), console=out, refresh_per_second=4, screen=False) as live:
        try:
            while alive():
                time.sleep(interval_s)
                cur = read()
                live.update(render(prev, cur, max_ports=max(8, out.size.height - 24)))
                prev = cur
        except KeyboardInterrupt:
            pass
