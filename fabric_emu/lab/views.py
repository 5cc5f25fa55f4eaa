"""What the lab's `ports`, `queues`, `flows`, `knobs`, `pfcwd show` and `deadlocks` print: rich tables from the live
snapshot (fabric_emu.live.reader), the installed thresholds and the last run's measurements."""

from __future__ import annotations

from pathlib import Path

from rich.console import Console
from rich.table import Table

from fabric_emu.live.snapshot import DeadlockCycle, Snapshot
from fabric_emu.spec.units import format_time


def read_csv_rows(path: Path) -> list[dict]:
    import csv

    try:
        with open(path) as f:
            return list(csv.DictReader(f))
    except OSError:
        return []


def _kb(n: float) -> str:
    return f"{n / 1e3:,.1f}"


def operstate(intf: str) -> str:
    """up or down; a cut link's port is up without carrier (fabric_emu.fabric.wires): down."""
    try:
        state = Path(f"/sys/class/net/{intf}/operstate").read_text().strip()
    except OSError:
        return "?"
    return "down" if state == "lowerlayerdown" else state


def print_ports(out: Console, snap: Snapshot, switch: str | None) -> None:
    """Every switch port's counters: of the last run when it is over (its ports.csv), live
    while one runs, from the ports' creation before the first."""
    since = {"done": "of the last run", "traffic": "of the run going on",
             "setup": "since the fabric was built"}[snap.phase]
    t = Table(title=f"switch ports, counters {since}", title_justify="left")
    # Named from the port's side: it sends pauses to its peer (a NIC, when the peer is a host),
    # receives them from it, and is held (its egress paused) by the peer's.
    t.caption = "PFC: pauses this port sent to its peer / received from it; us its own egress was held paused"
    for col in ("port", "peer", "link", "tx MB", "tx pkts", "drops", "ECN marked", "pauses to peer",
                "pauses from peer", "held paused us"):
        t.add_column(col, justify="left" if col in ("port", "peer", "link") else "right")
    for p in snap.ports:
        if switch and p.switch != switch:
            continue
        c = p.get
        t.add_row(p.intf, p.peer, operstate(p.intf), f"{c('tx_bytes') / 1e6:,.2f}", f"{c('tx_packets'):,}",
                  f"{c('drops'):,}", f"{c('ecn_marked'):,}", f"{c('pause_tx_p3'):,}", f"{c('pause_rx_p3'):,}",
                  f"{p.counters.get('paused_fabric_us_p3', 0):,.0f}")
    out.print(t)


def print_queues(out: Console, last_run: Path | None, thresholds: list[dict]) -> None:
    """The RoCE class's queues: the thresholds installed now, and the deepest each switch port's
    queue got in the last run (ports.csv max_backlog_bytes)."""
    if thresholds:
        th = thresholds[0]
        ecn = f"ECN on, kmin {_kb(th['kmin'])} KB, kmax {_kb(th['kmax'])} KB, pmax {th['pmax']:g}" if th["ecn"] else "ECN off"
        pfc = f"PFC on, xoff {_kb(th['xoff'])} KB, xon {_kb(th['xon'])} KB" if th["pfc"] else "PFC off"
        out.print(f"switch ports now: {ecn}; {pfc}; buffer {_kb(th['limit_p0'])} KB per queue", highlight=False)
    if last_run is None:
        out.print("no run yet: `run` something, then `queues` shows how deep each queue got")
        return
    rows = read_csv_rows(last_run / "ports.csv")
    busy = [r for r in rows if int(float(r.get("max_backlog_bytes") or 0)) > 0]
    t = Table(title=f"queues of the last run ({last_run.name}): ports that queued", title_justify="left")
    for col in ("port", "peer", "max queue KB", "ECN marked", "drops", "pauses to peer", "pauses from peer"):
        t.add_column(col, justify="left" if col in ("port", "peer") else "right")
    for r in sorted(busy, key=lambda r: -float(r["max_backlog_bytes"])):
        marked = sum(int(float(r.get(f"ecn_marked_p{p}") or 0)) for p in (0, 3, 6))
        t.add_row(r["intf"], r["peer"], _kb(float(r["max_backlog_bytes"])), f"{marked:,}", r.get("drops", "0"),
                  r.get("pause_tx_p3", "0"), r.get("pause_rx_p3", "0"))
    out.print(t if busy else "no queue built up in the last run")


def print_flows(out: Console, last_run: Path | None, snap: Snapshot | None) -> None:
    """The last run's queue pairs (flows.csv): path, bytes, completion and rates."""
    if snap is not None and snap.phase == "traffic" and snap.qps:
        out.print(f"{len(snap.qps)} QPs sending now (see `fabric-emu top`)")
    if last_run is None:
        out.print("no run yet")
        return
    rows = read_csv_rows(last_run / "flows.csv")
    t = Table(title=f"queue pairs of the last run ({last_run.name})", title_justify="left")
    for col in ("src", "dst", "qpn", "udp src", "uplink", "MB", "completion us", "goodput Gb/s",
                "min rate Gb/s", "CNPs rx", "retx"):
        t.add_column(col, justify="left" if col in ("src", "dst", "uplink") else "right")

    def num(v: str | None, fmt: str) -> str:
        return format(float(v), fmt) if v not in (None, "") else "-"

    for r in rows:
        t.add_row(r["src"], r["dst"], r["qpn"], r["udp_src"], r.get("uplink") or "-",
                  f"{float(r['bytes']) / 1e6:.2f}",
                  num(r.get("completion_fabric_us"), ",.0f"), num(r.get("goodput_gbps"), ".1f"),
                  num(r.get("min_rate_gbps"), ".1f"), r.get("cnp_received", "0"), r.get("retransmitted", "0"))
    out.print(t)


def print_knobs(out: Console, spec, lb_mode: str, links_down: list[str]) -> None:
    """The settings the next run gets."""
    e, p = spec.ecn, spec.pfc
    dq = {k: v for k, v in spec.dcqcn.model_dump(exclude={"preset"}).items() if v is not None}
    rows = [
        ("load balancing", f"{lb_mode} (controller, live)"),
        ("ECN", f"{'on' if e.enabled else 'off'}: kmin {e.kmin} B, kmax {e.kmax} B, pmax {e.pmax:g}"),
        ("PFC", f"{'on' if p.enabled else 'off'}: xoff {p.xoff} B, xon {p.xon} B, headroom {p.headroom} B"),
        ("congestion control", spec.congestion_control),
        ("DCQCN", f"preset {spec.dcqcn.preset}" + "".join(f", {k}={v}" for k, v in dq.items())),
        ("workload", " + ".join(w.type for w in spec.jobs)),
        ("links down", ", ".join(links_down) or "none"),
        ("PFC watchdog", f"{spec.pfcwd.action} on {spec.pfcwd.ports} switch ports" if spec.pfcwd.enabled else "off"),
        ("PFC storms", ", ".join(f"{e.nic} {e.pfc_storm} at {e.at * 1e6:g} us" for e in spec.events
                                 if e.kind == "pfc_storm") or "none"),
    ]
    t = Table(show_header=False, box=None)
    for k, v in rows:
        t.add_row(k, v)
    out.print(t)


def _sonic_table(headers: list[str], rows: list[list[str]]) -> str:
    """A table as SONiC's CLI prints it (tabulate's "simple" layout, right-aligned)."""
    widths = [max(len(h), *(len(r[i]) for r in rows)) if rows else len(h) for i, h in enumerate(headers)]
    line = lambda cells: "  ".join(c.rjust(w) for c, w in zip(cells, widths))  # noqa: E731
    return "\n".join([line(headers), "  ".join("-" * w for w in widths), *(line(r) for r in rows)])


def print_pfcwd_config(out: Console, spec, ports) -> None:
    """`pfcwd show config`: the watched ports with their action and timers (modelled time), as
    SONiC lays it out; `ports` is the running PortPlan (what the PFC daemon watches)."""
    wd = spec.pfcwd
    if ports.watchdog is None:
        out.print("PFC watchdog is not running (pfcwd start)", highlight=False)
        return
    out.print(f"Changed polling interval to {format_time(wd.poll_interval)} (modelled; "
              f"{wd.poll_interval * ports.dilation:.3f} s emulated)", markup=False, highlight=False)
    rows = [[e.intf, wd.action, format_time(wd.detection_time), format_time(wd.restoration_time)] for e in ports.watched()]
    out.print(_sonic_table(["PORT", "ACTION", "DETECTION TIME", "RESTORATION TIME"], rows),
              markup=False, highlight=False)


def print_pfcwd_stats(out: Console, last_run: Path | None, every_queue: bool) -> None:
    """`pfcwd show stats`: the last run's watchdog counters per queue (its pfcwd.csv), as SONiC
    prints them; queues that never stormed are left out unless every_queue (SONiC's -e)."""
    rows = read_csv_rows(last_run / "pfcwd.csv") if last_run is not None else []
    if not rows:
        out.print("no watchdog counters: no run yet with the PFC watchdog on (pfcwd start, then run)",
                  highlight=False)
        return
    w = "PFC_WD_QUEUE_STATS_"

    def pair(r: dict, a: str, b: str) -> str:
        return f"{r[w + a]}/{r[w + b]}"

    shown = [r for r in rows if every_queue or int(r[w + "DEADLOCK_DETECTED"])]
    table = [[r["queue"], r["status"], pair(r, "DEADLOCK_DETECTED", "DEADLOCK_RESTORED"),
              pair(r, "TX_PACKETS", "TX_DROPPED_PACKETS"), pair(r, "RX_PACKETS", "RX_DROPPED_PACKETS"),
              pair(r, "TX_PACKETS_LAST", "TX_DROPPED_PACKETS_LAST"),
              pair(r, "RX_PACKETS_LAST", "RX_DROPPED_PACKETS_LAST")] for r in shown]
    out.print(_sonic_table(["QUEUE", "STATUS", "STORM DETECTED/RESTORED", "TX OK/DROP", "RX OK/DROP",
                            "TX LAST OK/DROP", "RX LAST OK/DROP"], table), markup=False, highlight=False)
    if len(shown) < len(rows):
        out.print(f"({len(rows) - len(shown)} queues that never stormed left out: pfcwd show stats -e)",
                  highlight=False)


def _us(s: float | None) -> str:
    return "-" if s is None else f"{s * 1e6:,.1f} us"


def print_deadlocks_now(out: Console, cycles: list[DeadlockCycle], paused: list[str]) -> None:
    """`deadlocks now`: every cycle of lossless buffers waiting on each other now, and the bytes
    each holds for (and waits on) the next; without one, the egresses paused now."""
    if not cycles:
        out.print("no deadlock now" + (f" ({len(paused)} lossless egress{'es' if len(paused) != 1 else ''} "
                                       f"paused: {', '.join(paused)})" if paused else " (no lossless egress paused)"),
                  markup=False, highlight=False, soft_wrap=True)
        return
    out.print(f"DEADLOCK now: {len(cycles)} cycle{'s' if len(cycles) != 1 else ''} of lossless buffers "
              "(X.in(Y): switch X's bytes from Y)", style="bold red", markup=False, highlight=False)
    for c in cycles:
        out.print(f"  {c.text}  ({len(c.members)} buffers, {_kb(c.held_bytes)} KB held)",
                  markup=False, highlight=False, soft_wrap=True)
        for i, (member, n, (sw, peer)) in enumerate(zip(c.members, c.edge_bytes, c.egresses())):
            nxt = c.members[(i + 1) % len(c.members)]
            out.print(f"    {member} holds {_kb(n)} KB for {sw}->{peer}, paused by {peer}: waits on {nxt}",
                      markup=False, highlight=False, soft_wrap=True)


def print_deadlocks_last(out: Console, name: str | None, summary: dict | None) -> None:
    """`deadlocks last`: the last run's summary.json deadlocks: formations, when the first
    formed, the period between formations, whether one held at the end; per persistent cycle."""
    if name is None:
        out.print("no run yet: `run` something, then `deadlocks last` sums up its deadlocks", highlight=False)
        return
    d = (summary or {}).get("deadlocks")
    if not d:
        out.print(f"{name}: no deadlock figures (the run measured none)", highlight=False)
        return
    if not d.get("formations"):
        out.print(f"{name}: no deadlock formed", highlight=False)
        return
    out.print(f"{name}: {d['formations']} formation{'s' if d['formations'] != 1 else ''} of {d['cycles_seen']} "
              f"cycle{'s' if d['cycles_seen'] != 1 else ''}, {d['persistent_formations']} persistent "
              f"(held >= {_us(d['min_duration_s'])}); first formed at {_us(d['first_formed_s'])}, period "
              f"{_us(d['period_s'])}; deadlocked at the end: {'yes' if d['deadlocked_at_end'] else 'no'}",
              markup=False, highlight=False, soft_wrap=True)
    for p in d.get("persistent", []):
        out.print(f"  {p['cycle']}  ({p['length']} buffers): {p['formations']} formation"
                  f"{'s' if p['formations'] != 1 else ''}, first at {_us(p['first_formed_s'])}, longest "
                  f"{_us(p['longest_s'])}, most held {_kb(p['max_bytes'])} KB, period {_us(p['period_s'])}"
                  + (", unbroken at the end" if p["unbroken_at_end"] else ", broken"),
                  markup=False, highlight=False, soft_wrap=True)
