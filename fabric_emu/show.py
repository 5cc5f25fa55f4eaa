"""Print a plan for people: switches, hosts, links, rates and equal-cost paths."""

from __future__ import annotations

from rich.console import Console
from rich.table import Table

from fabric_emu.config import ExperimentSpec
from fabric_emu.plan import FabricPlan
from fabric_emu.units import format_rate


def print_plan(out: Console, plan: FabricPlan, exp: ExperimentSpec | None, ranks: list[str] | None) -> None:
    host_link = plan.ports(plan.hosts[0].name)[0]
    fabric = plan.uplinks(plan.leaves[0].name)[0]
    out.print(f"[bold]{plan.name}[/] ({plan.kind}): {len(plan.spines)} spines, {len(plan.leaves)} leaves, "
              f"{len(plan.hosts)} hosts, dilation {plan.dilation:g}")
    out.print(f"host links {format_rate(host_link.emulated_bps * plan.dilation)} modelled / "
              f"{format_rate(host_link.emulated_bps)} emulated; fabric links "
              f"{format_rate(fabric.emulated_bps * plan.dilation)} / {format_rate(fabric.emulated_bps)}; "
              f"oversubscription {plan.oversubscription:g}:1; MTU {plan.mtu} (RoCE {plan.roce_mtu}); "
              f"port buffer {plan.port_buffer} B")

    t = Table("switch", "role", "dpid", "ports (port:peer)", title="switches")
    for sw in plan.switches:
        t.add_row(sw.name, sw.role, f"{sw.dpid:#x}",
                  " ".join(f"{p.port}:{p.peer}" for p in plan.ports(sw.name)))
    out.print(t)

    t = Table("host", "ip", "mac", "attached to", title="hosts")
    for h in plan.hosts:
        t.add_row(h.name, h.ip, h.mac, f"{h.leaf} port {h.leaf_port}")
    out.print(t)

    t = Table("from", "to", "equal-cost paths", title="leaf-to-leaf paths")
    leaves = plan.leaves
    for a in leaves:
        for b in leaves:
            if a is b:
                continue
            paths = plan.paths(a.name, b.name)
            t.add_row(a.name, b.name, f"{len(paths)}: " + ", ".join(p[1] for p in paths if len(p) > 2))
    out.print(t)

    if exp is not None and ranks is not None:
        w = exp.workload
        out.print(f"experiment [bold]{exp.name}[/]: {w.type} {w.algorithm} of {w.size} B x {w.iterations} "
                  f"over {len(ranks)} ranks, {w.qps_per_peer} QP(s) per peer, load balancing {exp.load_balancing}, seed {exp.seed}")
        t = Table("rank", "host", "sends to", "equal-cost paths", title="ring")
        for i, r in enumerate(ranks):
            nxt = ranks[(i + 1) % len(ranks)]
            t.add_row(str(i), r, nxt, str(len(plan.paths(r, nxt))))
        out.print(t)
