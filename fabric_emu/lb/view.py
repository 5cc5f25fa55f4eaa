"""`fabric-emu lb` without a mode: the running fabric's load balancing, as its controller sees it."""

from __future__ import annotations

from rich.console import Console
from rich.table import Table


def print_lb_state(out: Console, run_id: str, state: dict) -> None:
    entropies = state.get("spray_entropies") or 0
    out.print(f"{run_id}: load balancing {state['mode']} (modes: {', '.join(state.get('modes', []))}; "
              f"NIC entropy values per QP: {entropies or 1})", highlight=False)
    t = Table(title=f"leaf uplinks (OpenFlow port stats, every {state.get('load_interval_s', 1):g} s, wall clock)")
    for col in ("leaf", "spine", "port", "tx bytes", "tx now"):
        t.add_column(col, justify="right" if col.startswith("tx") or col == "port" else "left")
    for leaf, ups in state.get("uplinks", {}).items():
        for spine, u in ups.items():
            t.add_row(leaf, spine, str(u["port"]), f"{u['tx_bytes']:,}", f"{u['tx_bps'] / 1e6:.2f} Mb/s")
    out.print(t)
    if state.get("links_down"):
        out.print(f"links down: {', '.join(state['links_down'])}", highlight=False)
    dlb = state.get("dlb") or {}
    if dlb.get("ready") and any(u["flowlets"] for ups in dlb["uplinks"].values() for u in ups.values()):
        d = Table(title="DLB flowlet stage (since the run started)")
        for col in ("leaf", "spine", "flowlets", "moves", "packets"):
            d.add_column(col, justify="left" if col in ("leaf", "spine") else "right")
        for leaf, ups in dlb["uplinks"].items():
            for spine, u in ups.items():
                d.add_row(leaf, spine, f"{u['flowlets']:,}", f"{u['moves']:,}", f"{u['packets']:,}")
        out.print(d)
    for c in state.get("changes", []):
        out.print(f"changed to {c['mode']} (applied in {c['applied_s'] * 1e3:.1f} ms)", highlight=False)
