"""PNG plots of a results folder: queue depth, PFC pauses, per-flow receive rates, DCQCN rates,
the PFC deadlock's cycle on the fabric.

`write_plots(run_dir)` reads only the files of the folder (queues.csv, pauses.csv, rates.csv,
deadlocks.csv, agents/<host>.json, summary.json, experiment.yaml, plan.json), so it also
redraws an old run. A plot
whose input is missing, empty or unreadable is skipped, never an error. Times are fabric
(modelled) microseconds, rates modelled Gb/s, depths KB (1000 bytes).
"""

from __future__ import annotations

import csv
import io
import json
import logging
import math
import os
import re
from collections import defaultdict
from pathlib import Path

import matplotlib

matplotlib.use("Agg")  # no display; must precede pyplot

import matplotlib.pyplot as plt  # noqa: E402
import networkx as nx  # noqa: E402
from matplotlib.figure import Figure  # noqa: E402

from fabric_emu.cc.deadlock import Cycle, egresses, parse_cycle  # noqa: E402
from fabric_emu.spec.units import format_time, parse_size  # noqa: E402
from fabric_emu.topo.plan import FabricPlan  # noqa: E402
from fabric_emu.results.transport import arrival_curve  # noqa: E402

log = logging.getLogger(__name__)

QUEUE_PORTS = 6  # busiest egress ports drawn in queue_depth.png
MAX_FLOWS = 16  # busiest flows drawn in flow_rates.png
MAX_PAUSE_ROWS = 40  # ports drawn in pauses.png (most paused time first)
LOSSLESS_PRIORITY = 3


# ---------------------------------------------------------------------------- reading
def _rows(path: Path) -> list[dict]:
    try:
        with open(path, newline="") as f:
            return list(csv.DictReader(f))
    except (OSError, csv.Error, UnicodeDecodeError):
        return []


def _json(path: Path) -> dict:
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def _yaml(path: Path) -> dict:
    try:
        from ruamel.yaml import YAML

        data = YAML(typ="safe").load(path.read_text())
    except Exception:  # noqa: BLE001 - a broken spec only costs the threshold lines
        return {}
    return data if isinstance(data, dict) else {}


def _num(value: object) -> float | None:
    try:
        return float(value)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        return None


def _bytes(value: object) -> float | None:
    try:
        return float(parse_size(value))
    except (TypeError, ValueError):
        return None


def _natural(text: str) -> list:
    """Sort key so leaf2 comes before leaf10."""
    return [int(t) if t.isdigit() else t for t in re.split(r"(\d+)", text)]


def _save(fig: Figure, path: Path) -> None:
    """Render to memory, then temporary name + rename: readers never see half a PNG."""
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=110)
    plt.close(fig)
    tmp = path.with_name(f".{path.name}.tmp{os.getpid()}")
    with open(tmp, "wb") as f:
        f.write(buf.getvalue())
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


# ---------------------------------------------------------------------------- plots
def plot_queue_depth(run_dir: Path, out: Path) -> bool:
    """Egress backlog of the busiest switch ports (lossless class when the CSV has it)."""
    rows = _rows(run_dir / "queues.csv")
    if not rows or "t_fabric_us" not in rows[0]:
        return False
    per_class = "p3_bytes" in rows[0]
    column = "p3_bytes" if per_class else "backlog_bytes"
    series: dict[str, list[tuple[float, float, bool]]] = defaultdict(list)
    for r in rows:
        t, depth = _num(r.get("t_fabric_us")), _num(r.get(column))
        if t is None or depth is None:
            continue
        port = f"{r.get('switch', '?')}-eth{r.get('port', '?')}"
        peer = r.get("peer")
        series[f"{port} \u2192 {peer}" if peer else port].append(
            (t, depth / 1e3, (r.get("paused") or "0").strip() in ("1", "true", "True")))
    if not series:
        return False
    busiest = sorted(series, key=lambda k: (-max(d for _, d, _ in series[k]), _natural(k)))[:QUEUE_PORTS]
    fig, ax = plt.subplots(figsize=(12, 5))
    paused_labelled = False
    for name in busiest:
        pts = sorted(series[name])
        line, = ax.plot([p[0] for p in pts], [p[1] for p in pts], label=name, linewidth=1.2)
        paused = [p for p in pts if p[2]]
        if paused:
            ax.plot([p[0] for p in paused], [p[1] for p in paused], "o", markersize=4,
                    color=line.get_color(), markeredgecolor="black", markeredgewidth=0.5,
                    label=None if paused_labelled else "sample while paused by PFC")
            paused_labelled = True
    spec = _yaml(run_dir / "experiment.yaml")
    ecn = spec.get("ecn") if isinstance(spec.get("ecn"), dict) else {}
    pfc = spec.get("pfc") if isinstance(spec.get("pfc"), dict) else {}
    if ecn.get("enabled"):
        for key, style in (("kmin", ":"), ("kmax", "--")):
            v = _bytes(ecn.get(key))
            if v is not None:
                ax.axhline(v / 1e3, color="dimgray", linestyle=style, linewidth=1,
                           label=f"ECN {key} {v / 1e3:g} KB (egress)")
    if pfc.get("enabled"):
        v = _bytes(pfc.get("xoff"))
        if v is not None:
            ax.axhline(v / 1e3, color="black", linestyle="-.", linewidth=1,
                       label=f"PFC xoff {v / 1e3:g} KB (per ingress port, not egress)")
    what = f"priority {LOSSLESS_PRIORITY} (lossless RoCE)" if per_class else "all classes"
    ax.set_title(f"Egress queue depth, {what}: the {len(busiest)} deepest switch ports")
    ax.set_xlabel("fabric time (\u00b5s)")
    ax.set_ylabel("egress backlog (KB)")
    ax.set_ylim(0, ax.get_ylim()[1] * 1.05)
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1))  # outside: never hides data
    fig.tight_layout()
    _save(fig, out)
    return True


def plot_pauses(run_dir: Path, out: Path) -> bool:
    """PFC pause intervals of priority 3, one timeline row per port that was ever paused."""
    rows = _rows(run_dir / "pauses.csv")
    spans: dict[str, list[tuple[float, float | None]]] = defaultdict(list)
    for r in rows:
        start = _num(r.get("start_fabric_us"))
        if start is None:
            continue
        name = r.get("intf") or f"{r.get('node', '?')}-eth{r.get('port', '?')}"
        peer = r.get("peer")
        spans[f"{name} \u2192 {peer}" if peer else name].append((start, _num(r.get("end_fabric_us"))))
    if not spans:
        return False
    summary = _json(run_dir / "summary.json")
    storms = [st for st in summary.get("pfc_storms") or [] if isinstance(st, dict)]
    latest = max(max(s, e if e is not None else s) for v in spans.values() for s, e in v)
    bars = {k: [(s, max(0.0, (e if e is not None else latest) - s)) for s, e in v] for k, v in spans.items()}
    names = sorted(bars, key=lambda k: -sum(w for _, w in bars[k]))[:MAX_PAUSE_ROWS]
    # the port paused first at the top: a pause that spreads reads downwards, hop by hop
    names.sort(key=lambda k: (-min(s for s, _ in bars[k]), _natural(k)))
    fig, ax = plt.subplots(figsize=(10, max(2.5, 0.6 + 0.3 * (len(names) + len(storms)))))
    for i, name in enumerate(names):
        # An edge in the face colour keeps zero-length pauses visible as a thin line.
        ax.broken_barh(bars[name], (i - 0.35, 0.7), facecolors="tab:red", edgecolors="tab:red",
                       linewidth=0.6)
    stormed = _stormed_spans(summary, latest)
    for i, name in enumerate(names):
        if name.split(" ")[0] in stormed:  # the watchdog held it: a black band along the row
            ax.broken_barh(stormed[name.split(" ")[0]], (i - 0.08, 0.16), facecolors="black",
                           label="watchdog: stormed" if i == min(j for j, n in enumerate(names)
                                                                 if n.split(" ")[0] in stormed) else None)
    labels = list(names)
    for k, st in enumerate(storms):  # each NIC storm as a row of its own, above the ports
        on, off = _num(st.get("on_fabric_us")), _num(st.get("off_fabric_us"))
        if on is not None:
            ax.broken_barh([(on, (off if off is not None else latest) - on)], (len(names) + k - 0.35, 0.7),
                           facecolors="tab:orange")
            labels.append(f"{st.get('nic', '?')} NIC storm")
    ax.set_yticks(range(len(labels)), labels, fontsize=8)
    ax.set_ylim(-0.6, len(labels) - 0.4)
    if stormed:
        ax.legend(fontsize=7, loc="lower right")
    pause_tx = summary.get("switch", {})
    pause_tx = pause_tx.get("pause_tx") if isinstance(pause_tx, dict) else None
    shown = f" ({len(names)} of {len(bars)} shown)" if len(names) < len(bars) else ""
    title = f"PFC pauses of priority {LOSSLESS_PRIORITY}: {len(bars)} port(s) paused{shown}"
    if pause_tx is not None:
        title += f", {int(pause_tx):,} pause frames sent by switches"
    ax.set_title(title)
    ax.set_xlabel("fabric time (\u00b5s)")
    ax.grid(True, axis="x", alpha=0.3)
    fig.tight_layout()
    _save(fig, out)
    return True


def _stormed_spans(summary: dict, latest: float) -> dict[str, list[tuple[float, float]]]:
    """The PFC watchdog's episodes per interface: (detected, duration) in fabric us."""
    out: dict[str, list[tuple[float, float]]] = defaultdict(list)
    wd = summary.get("pfcwd")
    for e in (wd.get("episodes") or []) if isinstance(wd, dict) else []:
        start, end = _num(e.get("detected_fabric_us")), _num(e.get("restored_fabric_us"))
        if start is not None:
            out[str(e.get("intf"))].append((start, (end if end is not None else latest) - start))
    return out


def flow_rate_steps(run_dir: Path) -> tuple[list[tuple[str, list[float], list[float]]], float | None, int]:
    """What flow_rates.png draws: for the busiest queue pairs, (label, x in fabric us since the
    first flow started, mean receive rate in modelled Gb/s over the interval ending at x); the
    host link rate; how many queue pairs there were. Rates come from each receiver's rx_series
    through arrival_curve, so a batch the engine read late is spread back over the time the
    link needed to carry it and no step exceeds the link rate."""
    summary = _json(run_dir / "summary.json")
    dilation = _num(summary.get("dilation")) or 1.0
    link = _num(summary.get("host_link_gbps"))
    link_bytes_per_s = link * 1e9 / 8 / dilation if link else 0.0  # emulated bytes per second
    flows: list[tuple[str, list[tuple[float, float]]]] = []
    for path in sorted((run_dir / "agents").glob("*.json"), key=lambda p: _natural(p.name)):
        agent = _json(path)
        for q in agent.get("recv_qps") or []:
            if not isinstance(q, dict):
                continue
            pts = []
            for p in q.get("rx_series") or []:
                if isinstance(p, (list, tuple)) and len(p) >= 2:
                    t, b = _num(p[0]), _num(p[1])
                    if t is not None and b is not None:
                        pts.append((t, b))
            if len(pts) >= 2:
                qpn = q.get("remote_qpn", q.get("qpn", "?"))  # the sender's, as in flows.csv
                flows.append((f"{q.get('src', '?')}\u2192{path.stem} qp{qpn}",
                              arrival_curve(sorted(pts), link_bytes_per_s)))
    if not flows:
        return [], link, 0
    t0 = min(pts[0][0] for _, pts in flows)
    flows.sort(key=lambda f: -(f[1][-1][1] - f[1][0][1]))
    steps = []
    for label, pts in flows[:MAX_FLOWS]:
        xs, ys = [(pts[0][0] - t0) / dilation * 1e6], []
        for (ta, ba), (tb, bb) in zip(pts, pts[1:]):
            if tb > ta:
                xs.append((tb - t0) / dilation * 1e6)
                ys.append((bb - ba) * 8 / (tb - ta) * dilation / 1e9)
        if ys:
            steps.append((label, xs, [ys[0], *ys]))  # the first x repeats the first rate (steps-pre)
    return steps, link, len(flows)


def plot_flow_rates(run_dir: Path, out: Path) -> bool:
    """Receive rate of each queue pair over time, from the receivers' rx_series."""
    steps, link, n = flow_rate_steps(run_dir)
    if not steps:
        return False
    fig, ax = plt.subplots(figsize=(12, 5))
    for label, xs, ys in steps:
        # Each value is the mean rate over the interval that ends at its x.
        ax.plot(xs, ys, drawstyle="steps-pre", label=label, linewidth=1)
    more = f" (the {len(steps)} busiest of {n})" if n > len(steps) else ""
    _finish_rates(fig, ax, out, link, "host link",
                  f"Receive rate per queue pair{more}; bytes read late spread back at no more than the link rate",
                  "fabric time since the first flow started (\u00b5s)")
    return True


def _finish_rates(fig: Figure, ax, out: Path, link: float | None, link_label: str, title: str,
                  xlabel: str) -> None:
    """The common frame of the rate plots: the link rate line, labels, legend; then save."""
    if link:
        ax.axhline(link, color="black", linestyle="--", linewidth=0.8, label=f"{link_label} {link:g} Gb/s")
    ax.set_title(title)
    ax.set_xlabel(xlabel)
    ax.set_ylabel("rate (Gb/s, modelled)")
    ax.set_ylim(0, ax.get_ylim()[1] * 1.05)
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1))
    fig.tight_layout()
    _save(fig, out)


def plot_dcqcn_rates(run_dir: Path, out: Path) -> bool:
    """DCQCN's rate of each queue pair over time, from rates.csv (one step per change)."""
    summary = _json(run_dir / "summary.json")
    series: dict[str, list[tuple[float, float]]] = defaultdict(list)
    for r in _rows(run_dir / "rates.csv"):
        t, rate = _num(r.get("time_fabric_us")), _num(r.get("rate_gbps"))
        if t is not None and rate is not None:
            series[f"{r.get('host', '?')}\u2192{r.get('dst', '?')} qp{r.get('qpn', '?')}"].append((t, rate))
    if not series:
        return False
    link = _num(summary.get("host_link_gbps"))
    end = max(t for pts in series.values() for t, _ in pts)
    shown = sorted(series.items(), key=lambda kv: (min(v for _, v in kv[1]), _natural(kv[0])))[:MAX_FLOWS]
    fig, ax = plt.subplots(figsize=(12, 5))
    for label, pts in shown:
        pts.sort()
        xs = [t for t, _ in pts] + [end]
        ys = [v for _, v in pts] + [pts[-1][1]]
        ax.plot(xs, ys, drawstyle="steps-post", label=label, linewidth=1)
    more = f" (the {len(shown)} slowest of {len(series)})" if len(series) > len(shown) else ""
    _finish_rates(fig, ax, out, link, "line rate", f"DCQCN rate per queue pair{more}",
                  "fabric time since GO (\u00b5s)")
    return True


def plot_comparison(rows: list[dict], labels: list[str], xlabel: str, out: Path) -> bool:
    """A sweep's points side by side: completion time and busbw, the mean of each point's runs
    as a bar, their min to max as the error bar (rows as in comparison.csv, one label each)."""
    panels = [(metric, title, scale) for metric, title, scale in (
        ("jct_fabric_s", "completion time (fabric \u00b5s)", 1e6),
        ("busbw_fraction", "busbw / host link", 1.0))
        if any(_num(r.get(f"{metric}_mean")) is not None for r in rows)]
    if not panels:
        return False
    fig, axes = plt.subplots(len(panels), 1, sharex=True, squeeze=False,
                             figsize=(max(7.5, 0.9 * len(rows) + 3), 1.5 + 2.8 * len(panels)))
    xs = list(range(len(rows)))
    for ax, (metric, title, scale) in zip(axes[:, 0], panels):
        stats = [[_num(r.get(f"{metric}_{s}")) for s in ("mean", "min", "max")] for r in rows]
        means = [m * scale if m is not None else 0.0 for m, _, _ in stats]
        # A point with no finished run gets no bar and no error bar.
        low = [(m - lo) * scale if None not in (m, lo) else 0.0 for m, lo, _ in stats]
        high = [(hi - m) * scale if None not in (m, hi) else 0.0 for m, _, hi in stats]
        ax.bar(xs, means, color="tab:blue", alpha=0.8, yerr=[low, high], capsize=4,
               error_kw={"elinewidth": 1})
        if metric == "busbw_fraction":
            ax.axhline(1.0, color="black", linestyle="--", linewidth=0.8, label="host link rate")
            ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1))  # never over a bar
        ax.set_ylabel(title)
        ax.grid(True, axis="y", alpha=0.3)
    fig.suptitle("Each point: mean of its runs that finished ok (bar), min to max (error bar)", fontsize=10)
    slanted = max(map(len, labels)) > 12  # long labels would overlap side by side
    axes[-1, 0].set_xticks(xs, labels, fontsize=8, rotation=20 if slanted else 0,
                           ha="right" if slanted else "center")
    axes[-1, 0].set_xlabel(xlabel)
    fig.tight_layout()
    _save(fig, out)
    return True


CLOS_KINDS = ("leaf-spine", "fat-tree", "rail-optimized")  # drawn tier above tier
MAX_HOST_LABELS = 32  # more hosts than this are drawn as unnamed dots
CYCLE_COLOURS = ("red", "darkred", "orangered", "crimson")
MAX_TITLE_CYCLES = 3


def _true(value: object) -> bool:
    return str(value).strip().lower() in ("true", "1", "yes")


def _run_plan(run_dir: Path) -> FabricPlan | None:
    """The run's fabric: plan.json when the folder keeps one, else planned again from
    experiment.yaml's topology (the same pure planning, so the same names and links)."""
    data = _json(run_dir / "plan.json")
    if data:
        try:
            return FabricPlan.from_dict(data)
        except (KeyError, TypeError, ValueError):
            pass
    topo = _yaml(run_dir / "experiment.yaml").get("topology")
    if not isinstance(topo, dict):
        return None
    try:
        from pydantic import TypeAdapter

        from fabric_emu.spec.topology import Topology
        from fabric_emu.topo.plan import build_plan

        # dilation only scales the rates; 'auto' in an old spec must not cost the drawing
        return build_plan(TypeAdapter(Topology).validate_python(topo), dilation=1.0)
    except Exception:  # noqa: BLE001 - an unplannable spec only costs the rest of the fabric
        return None


def _fabric_layout(plan: FabricPlan | None, cycles: list[Cycle]) -> tuple[nx.Graph, dict, set[str]]:
    """The graph to draw, node positions and the switches' names. Clos kinds tier above tier
    (hosts at the bottom); other fabrics, or none known (only the cycles' switches), in a circle
    with each host just outside its switch."""
    g = nx.Graph()
    if plan is not None:
        g = plan.graph.copy()
        switches = {s.name for s in plan.switches}
    else:
        switches = {b.switch for c in cycles for b in c}
        g.add_nodes_from(sorted(switches, key=_natural))
        for c in cycles:
            g.add_edges_from(egresses(c))
    if plan is not None and plan.kind in CLOS_KINDS:
        try:
            tiers: dict[int, list[str]] = defaultdict(list)
            for n in sorted(g, key=_natural):  # in name order along each tier
                tiers[plan.tier(n)].append(n)
        except KeyError:  # a role without a tier: the circle below
            tiers = {}
        if tiers.get(0) and tiers.get(1):  # hosts under their own leaf
            leaf_at = {n: i for i, n in enumerate(tiers[1])}
            leaf_of = {h.name: h.leaf for h in plan.hosts}
            tiers[0].sort(key=lambda h: (leaf_at.get(leaf_of.get(h, ""), -1), _natural(h)))
        pos: dict = {}
        for tier, names in tiers.items():  # every tier as wide as the others, centred
            pos.update({n: ((i + 0.5) / len(names) * 2 - 1, tier) for i, n in enumerate(names)})
        if pos:
            return g, pos, switches
    ring = sorted((n for n in g if n in switches), key=_natural)
    pos = dict(nx.circular_layout(ring)) if len(ring) > 1 else {n: (0.0, 0.0) for n in ring}
    for sw in ring:
        hosts = sorted((n for n in g[sw] if n not in switches), key=_natural)
        x, y = pos[sw]
        base = math.atan2(y, x) if (x, y) != (0.0, 0.0) else -math.pi / 2
        for i, h in enumerate(hosts):
            a = base + (i - (len(hosts) - 1) / 2) * 0.25 / max(1, len(ring) / 4)
            pos[h] = (1.3 * math.cos(a), 1.3 * math.sin(a))
    for n in g:  # a node left over (a host of no switch) still gets a place
        pos.setdefault(n, (0.0, 0.0))
    return g, pos, switches


def _cycle_title(text: str, eps: list[dict]) -> str:
    first = eps[0]
    formed, broken = _num(first.get("formed_s")), _num(first.get("broken_s"))
    when = f"formed at {format_time(formed or 0.0)}, " + (
        f"broke at {format_time(broken)}" if broken is not None else "never broke")
    if len(eps) > 1:
        last = _num(eps[-1].get("broken_s"))
        when += (f"; persisted {len(eps)} times, the last " +
                 (f"broke at {format_time(last)}" if last is not None else "never broke"))
    held = max(int(_num(e.get("max_bytes")) or 0) for e in eps)
    return f"{text}\n{when}; up to {held / 1e3:,.1f} KB held on the cycle"


def plot_deadlock(run_dir: Path, out: Path) -> bool:
    """The persistent PFC deadlock cycle(s) of deadlocks.csv drawn on the fabric: thick red
    arrows X->Z along each paused egress, labelled with the bytes X held for Z."""
    persistent: dict[str, list[dict]] = defaultdict(list)
    for r in _rows(run_dir / "deadlocks.csv"):
        if _true(r.get("persisted")) and r.get("cycle"):
            persistent[r["cycle"]].append(r)
    members: dict[str, Cycle] = {}
    for text in persistent:
        try:
            members[text] = parse_cycle(text)
        except ValueError:
            log.warning("deadlocks.csv: not a cycle: %r", text)
    if not members:
        return False
    plan = _run_plan(run_dir)
    g, pos, switches = _fabric_layout(plan, list(members.values()))
    fig, ax = plt.subplots(figsize=(11, 8))
    for a, b in g.edges:
        (xa, ya), (xb, yb) = pos[a], pos[b]
        ax.plot([xa, xb], [ya, yb], color="lightgray", linewidth=0.8, zorder=1)
    hosts = [n for n in g if n not in switches]
    if hosts:
        ax.scatter([pos[h][0] for h in hosts], [pos[h][1] for h in hosts], s=12, color="dimgray", zorder=2)
        if len(hosts) <= MAX_HOST_LABELS:
            for h in hosts:
                ax.annotate(h, pos[h], xytext=(0, -9), textcoords="offset points", ha="center",
                            va="top", fontsize=6, color="dimgray")
    on_cycle = {b.switch for c in members.values() for b in c}
    for sw in switches:
        ax.text(*pos[sw], sw, ha="center", va="center", fontsize=8, zorder=4,
                bbox={"boxstyle": "square,pad=0.4", "facecolor": "mistyrose" if sw in on_cycle else "white",
                      "edgecolor": "red" if sw in on_cycle else "black"})
    titles = []
    for k, (text, cycle) in enumerate(sorted(members.items())):
        eps = sorted(persistent[text], key=lambda r: _num(r.get("formed_s")) or 0.0)
        colour = CYCLE_COLOURS[k % len(CYCLE_COLOURS)]
        biggest = max(eps, key=lambda r: _num(r.get("max_bytes")) or 0.0)
        per_edge = [int(v) for v in str(biggest.get("edge_bytes") or "").split() if v.isdigit()]
        edges = egresses(cycle)
        # edge_bytes lists the bytes leaving each member, egresses the egress each member waits on
        for i, (x, z) in enumerate(edges):
            if x not in pos or z not in pos:
                continue
            ax.annotate("", xy=pos[z], xytext=pos[x], zorder=3,
                        arrowprops={"arrowstyle": "-|>,head_length=0.8,head_width=0.4", "color": colour,
                                    "linewidth": 3.5, "shrinkA": 16, "shrinkB": 16,
                                    "connectionstyle": "arc3,rad=0.12"})
            if len(per_edge) == len(edges):
                (xa, ya), (xb, yb) = pos[x], pos[z]
                # just beyond the arc's bulge (arc3 bends to the right of X->Z)
                mx, my = (xa + xb) / 2 + 0.08 * (yb - ya), (ya + yb) / 2 - 0.08 * (xb - xa)
                ax.text(mx, my, f"{per_edge[i] / 1e3:,.1f} KB", color=colour, fontsize=8, ha="center",
                        va="center", zorder=5, bbox={"boxstyle": "round,pad=0.2", "facecolor": "white",
                                                     "edgecolor": "none", "alpha": 0.8})
        if k < MAX_TITLE_CYCLES:
            titles.append(_cycle_title(text, eps))
    more = f"\n(and {len(members) - MAX_TITLE_CYCLES} more cycle(s))" if len(members) > MAX_TITLE_CYCLES else ""
    heading = f"PFC deadlock: {len(members)} persistent cycle(s) of paused lossless buffers"
    ax.set_title("\n".join([heading, *titles]) + more, fontsize=9)
    if plan is None or plan.kind not in CLOS_KINDS:
        ax.set_aspect("equal", adjustable="datalim")  # a circle stays round
    ax.margins(0.08)
    ax.axis("off")
    fig.tight_layout()
    _save(fig, out)
    return True


PLOTS = {
    "queue_depth.png": plot_queue_depth,
    "pauses.png": plot_pauses,
    "flow_rates.png": plot_flow_rates,
    "dcqcn_rates.png": plot_dcqcn_rates,
    "deadlock.png": plot_deadlock,
}


def write_plots(run_dir: Path) -> list[Path]:
    """Write run_dir/plots/*.png from the folder's files; returns the paths written.

    Missing or empty inputs skip their plot; a plot that fails for another reason is logged
    and skipped, so one bad file never costs the others."""
    run_dir = Path(run_dir)
    written: list[Path] = []
    if not run_dir.is_dir():
        return written
    for name, plot in PLOTS.items():
        out = run_dir / "plots" / name
        try:
            out.parent.mkdir(exist_ok=True)
            if plot(run_dir, out):
                written.append(out)
        except Exception as e:  # noqa: BLE001 - plots are a convenience, never a failure
            plt.close("all")
            log.warning("plot %s skipped: %s: %s", name, type(e).__name__, e)
    try:  # no empty plots/ folder when there was nothing to draw
        if not written:
            (run_dir / "plots").rmdir()
    except OSError:
        pass
    return written
