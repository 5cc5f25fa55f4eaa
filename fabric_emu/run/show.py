"""Print a plan for people: switches, hosts, links, rates and equal-cost paths."""

from __future__ import annotations

from collections import Counter

from rich.console import Console
from rich.table import Table

from fabric_emu.spec.experiment import ExperimentSpec
from fabric_emu.spec.workloads import AllReduceWorkload, IncastWorkload
from fabric_emu.workloads.jobs import build_program, placement_rows, resolve_jobs, uses_program
from fabric_emu.topo.plan import FabricPlan
from fabric_emu.workloads.training import bubble_fraction
from fabric_emu.workloads.flows import flows_line_rate_s, workload_flows
from fabric_emu.workloads.program import SCALE_UP
from fabric_emu.spec.units import format_rate, format_size


def print_plan(out: Console, plan: FabricPlan, exp: ExperimentSpec | None, ranks: list[str] | None) -> None:
    out.print(f"[bold]{plan.name}[/] ({plan.kind}): {layers(plan)}, dilation {plan.dilation:g}")
    out.print(f"host links {link_rates(plan, 'host', ' modelled / ', ' emulated')}; fabric links "
              f"{link_rates(plan, 'fabric', ' / ', '')}; "
              f"oversubscription {tiers_text(plan)}; MTU {plan.mtu} (RoCE {plan.roce_mtu}); "
              f"port buffer {plan.port_buffer} B")
    if dp := plan.extra.get("datapath"):
        out.print(f"OVS datapath: {dp['datapath']} ({dp['reason']})", soft_wrap=True, highlight=False,
                  markup=False)
    if "dilation_auto" in plan.extra:
        print_dilation_auto(out, plan.extra["dilation_auto"])

    t = Table("switch", "role", "dpid", "ports (port:peer)", title="switches")
    for sw in plan.switches:
        t.add_row(sw.name, sw.role, f"{sw.dpid:#x}",
                  " ".join(f"{p.port}:{p.peer}" for p in plan.ports(sw.name)))
    out.print(t)

    t = Table("host", "ip", "mac", "attached to", title="hosts")
    for h in plan.hosts:
        t.add_row(h.name, h.ip, h.mac, f"{h.leaf} port {h.leaf_port}")
    out.print(t)
    print_servers(out, plan)
    print_leaf_paths(out, plan)
    print_placement(out, plan)

    if exp is None or ranks is None:
        return
    print_ports(out, plan, exp)
    if uses_program(exp):
        print_jobs(out, plan, exp, ranks)
        return
    w = exp.workload
    if isinstance(w, AllReduceWorkload):
        out.print(f"experiment [bold]{exp.name}[/]: {w.type} {w.algorithm} of {w.size} B x {w.iterations} "
                  f"over {len(ranks)} ranks, {w.qps_per_peer} QP(s) per peer, load balancing {exp.load_balancing}, seed {exp.seed}")
        t = Table("rank", "host", "sends to", "equal-cost paths", title="ring")
        for i, r in enumerate(ranks):
            nxt = ranks[(i + 1) % len(ranks)]
            t.add_row(str(i), r, nxt, str(len(plan.paths(r, nxt))))
        out.print(t)
        return
    hosts = [h.name for h in plan.hosts]
    flows = workload_flows(w, hosts)
    if isinstance(w, IncastWorkload):
        what = (f"incast of {format_size(w.size)} x {w.iterations} from {len(flows)} senders to "
                f"{w.receiver}, {w.qps_per_sender} QP(s) per sender")
    else:
        what = f"{len(flows)} flows"
    out.print(f"experiment [bold]{exp.name}[/]: {what}, {len(ranks)} hosts run an agent, "
              f"load balancing {exp.load_balancing}, seed {exp.seed}")
    t = Table("flow", "src", "dst", "bytes", "QPs", "start (fabric)", "start (emulated)",
              "equal-cost paths", title="flows")
    for k, f in enumerate(flows):
        t.add_row(str(k), f.src, f.dst, format_size(f.total_bytes), str(f.qps), f"{f.start_s * 1e6:g} us",
                  f"{f.start_s * plan.dilation:g} s", str(len(plan.paths(f.src, f.dst))))
    out.print(t)
    rate = plan.host_rate_bps(ranks[0])
    t_line = flows_line_rate_s(flows, rate, plan.dilation)
    out.print(f"at line rate (busiest host link, payload only, plus the latest start): "
              f"{t_line / plan.dilation * 1e6:,.0f} us modelled, {t_line:.2f} s emulated")


def link_rates(plan: FabricPlan, kind: str, between: str, after: str) -> str:
    """The modelled and emulated rate of a kind of link ('host', 'fabric'); the lowest to the
    highest when they differ (a custom fabric's links may), 'none' when there is none."""
    rates = sorted({ln.emulated_bps for ln in plan.links if ln.kind == kind})
    if not rates:
        return "none"
    def span(scale: float) -> str:
        return "-".join(dict.fromkeys(format_rate(r * scale) for r in (rates[0], rates[-1])))
    return f"{span(plan.dilation)}{between}{span(1.0)}{after}"


ROLE_NAMES = {"leaf": "leaves", "spine": "spines", "agg": "aggregation", "core": "core"}


def role_name(plan: FabricPlan, role: str) -> str:
    """How a tier is called: a fat-tree's leaves are its edge switches."""
    if plan.kind == "fat-tree" and role == "leaf":
        return "edge"
    return ROLE_NAMES.get(role, role)


def layers(plan: FabricPlan) -> str:
    """Switch counts per role from the hosts up, e.g. '8 leaves, 8 aggregation, 4 core, 16 hosts'."""
    parts = [f"{len(sws)} {role_name(plan, role)}" for role, sws in plan.roles.items()]
    return ", ".join(parts + [f"{len(plan.hosts)} hosts"])


def tiers_text(plan: FabricPlan) -> str:
    """Oversubscription per tier: its capacity toward the hosts over its capacity upward (in a
    custom fabric, per leaf: its hosts' capacity over its links to other switches)."""
    if plan.kind == "custom":
        xs = sorted(set(plan.leaf_oversubscription().values()))
        if not xs:
            return "none (one switch)"
        return " to ".join(f"{x:.3g}:1" for x in dict.fromkeys((xs[0], xs[-1]))) + " at the leaves"
    return ", ".join(f"{x:g}:1 at the {role_name(plan, role)}"
                     for role, x in plan.tier_oversubscription().items()) or "none (one tier)"


MAX_PATH_ROWS = 32


def print_leaf_paths(out: Console, plan: FabricPlan) -> None:
    """Equal-cost paths between leaves: every pair in a small fabric, else how many pairs have
    how many paths of what length."""
    pairs = [(a.name, b.name) for a in plan.leaves for b in plan.leaves if a is not b]
    if len(pairs) > MAX_PATH_ROWS:
        counts = Counter((len(ps), len(ps[0]) - 1) for ps in (plan.paths(a, b) for a, b in pairs))
        t = Table("leaf pairs", "equal-cost paths", "switch hops", title="leaf-to-leaf paths")
        for (n, hops), pairs_n in sorted(counts.items()):
            t.add_row(str(pairs_n), str(n), str(hops))
        out.print(t)
        return
    t = Table("from", "to", "equal-cost paths", title="leaf-to-leaf paths")
    for a, b in pairs:
        paths = plan.paths(a, b)
        t.add_row(a, b, f"{len(paths)}: " + ", ".join(">".join(p[1:-1]) or "direct" for p in paths))
    out.print(t)


def print_ports(out: Console, plan: FabricPlan, exp: ExperimentSpec) -> None:
    """The traffic classes and the ECN and PFC thresholds every switch port will get."""
    from fabric_emu.cc.pfc import pause_seconds
    from fabric_emu.ports.model import host_settings, settings_of, switch_settings

    ecn, pfc = settings_of(exp)
    sw = switch_settings(plan, ecn, pfc)
    nic = host_settings(plan)
    t = Table("class", "DSCP", "switch egress limit", "host NIC queue", "ECN (switch egress)", "PFC",
              title="traffic classes (every port: HTB at the link rate, one queue per class)")
    marks = (f"kmin {format_size(ecn.kmin)}, kmax {format_size(ecn.kmax)}, pmax {ecn.pmax:g}"
             if ecn.enabled else "off")
    lossless = (f"xoff {format_size(pfc.xoff)}, xon {format_size(pfc.xon)}, headroom "
                f"{format_size(pfc.headroom)} per ingress port" if pfc.enabled else "off (lossy)")
    t.add_row("3 RoCE", "26", "none: admitted per ingress port" if pfc.enabled else format_size(sw.limits[3]),
              format_size(nic.limits[3]), marks, lossless)
    t.add_row("6 CNP (strict priority)", "48", format_size(sw.limits[6]), format_size(nic.limits[6]), "", "")
    t.add_row("0 other", "any other", format_size(sw.limits[0]), format_size(nic.limits[0]), "", "")
    out.print(t)
    if pfc.enabled:
        gbps = max(ln.gbps for ln in plan.links)
        pause = pause_seconds(pfc.quanta, gbps, plan.dilation)
        out.print(f"a pause of {pfc.quanta} quanta lasts {pause / plan.dilation * 1e6:.2f} us at {gbps:g} Gb/s"
                  f" ({pause:.3f} s emulated), refreshed every half of it while a port stays above xon")
    print_watchdog(out, plan, exp)


def print_watchdog(out: Console, plan: FabricPlan, exp: ExperimentSpec) -> None:
    """The PFC watchdog's timers, modelled and as wall time at this run's dilation."""
    wd = exp.pfcwd
    if not wd.enabled:
        out.print("PFC watchdog: off (pfcwd.enabled: true turns it on)")
        return
    timers = ", ".join(f"{name} {t * 1e6:g} us ({t * plan.dilation:.3f} s emulated)" for name, t in (
        ("detection", wd.detection_time), ("restoration", wd.restoration_time), ("poll", wd.poll_interval)))
    out.print(f"PFC watchdog ({wd.preset} preset): action {wd.action} on {wd.ports} switch ports' lossless"
              f" queues; {timers}")


def print_dilation_auto(out: Console, auto: dict) -> None:
    """How `dilation: auto` was (or will be) chosen: planned packet rates against capacity."""
    planned = auto.get("planned_at_dilation_1")
    if auto.get("dilation") is None:
        out.print(f"dilation auto: not chosen yet: {auto['reason']}; the figures below use the "
                  f"provisional dilation {auto['provisional_dilation']:g}", soft_wrap=True, highlight=False)
        if planned:
            out.print(f"this workload asks for {planned['switch_pps']:,} frame-hops/s of switching and "
                      f"{planned['nic_pps']:,} NIC packets/s (sent + received) at dilation 1; "
                      "at dilation D, 1/D of that", soft_wrap=True, highlight=False)
        return
    d, cap, use = auto["dilation"], auto["capacity"], auto["utilisation"]
    at_d = auto["planned_at_dilation"]
    lines = [
        f"dilation auto: {d:g}, the lowest of 1, 2, 5 x 10^k keeping each part of this machine at most "
        f"{auto['margin']:.0%} busy (planned at dilation 1 -> at {d:g}, against the measured capacity):",
        f"  OVS switching, {'kernel datapath (softirq), taken as one core' if cap.get('datapath') == 'kernel' else 'one thread'}: {planned['switch_pps']:,} -> {at_d['switch_pps']:,} frame-hops/s, "
        f"of {cap['ovs_pps_per_core']:,}/s per core: {use['ovs']:.0%}",
        f"  NIC engines, {auto['engines']} on {cap['cores']} cores less OVS's {auto['ovs_cores']:g}: "
        f"{planned['nic_pps']:,} -> {at_d['nic_pps']:,} packets/s sent + received, "
        f"of {cap['nic_pps_per_core']:,}/s per core: {use['nic']:.0%}",
        f"  busiest NIC engine (one process, one core): {use['busiest_engine']:.0%}",
    ]
    for line in lines:
        out.print(line, soft_wrap=True, highlight=False, markup=False)
    ovs = auto.get("capacity_details", {}).get("ovs", {})
    nic = auto.get("capacity_details", {}).get("nic", {})
    if ovs.get("datapath") == "kernel":
        out.print(f"  OVS kernel datapath: {ovs['forwarded_pps']:,} frames/s of {ovs['frame_bytes']} B forwarded "
                  f"(offered {ovs['offered_pps']:,}/s), {ovs['hop_us']:g} us of kernel CPU (softirq and system) "
                  "per frame and hop", soft_wrap=True, highlight=False, markup=False)
    elif ovs:
        out.print(f"  OVS: {ovs['forwarded_pps']:,} frames/s of {ovs['frame_bytes']} B forwarded by thread "
                  f"{ovs['thread']} at {ovs['thread_busy']:.0%} busy (offered {ovs['offered_pps']:,}/s"
                  f"{'; the generator may have limited it' if ovs.get('generator_limited') else ''}); "
                  f"a frame arriving alone costs it {cap['ovs_wakeup_us']:g} us", soft_wrap=True, highlight=False,
                  markup=False)
    if nic:
        out.print(f"  NIC: {nic['what']}", soft_wrap=True, highlight=False, markup=False)


def print_servers(out: Console, plan: FabricPlan) -> None:
    """Multi-GPU servers: each one's GPUs (hosts, GPU 0 first), their leaves and scale-up domain."""
    if not plan.servers:
        return
    t = Table("server", "GPUs (hosts, GPU 0 first)", "leaves", "scale-up (modelled)", title="servers")
    for srv in plan.servers:
        leaves = list(dict.fromkeys(plan.host_by_name[h].leaf for h in srv.hosts))
        t.add_row(srv.name, " ".join(srv.hosts), " ".join(leaves),
                  f"{format_rate(srv.gbps * 1e9)} per GPU each way, {srv.latency_s * 1e6:g} us")
    out.print(t)


def print_jobs(out: Console, plan: FabricPlan, exp: ExperimentSpec, ranks: list[str]) -> None:
    """The jobs of a program run: what each does, on which hosts; a grid job's placement as a
    table of hosts per leaf."""
    js = resolve_jobs(exp, plan)
    program = build_program(js)
    leaf_of = {h.name: h.leaf for h in plan.hosts}
    out.print(f"experiment [bold]{exp.name}[/]: {len(js)} job(s) over {len(ranks)} hosts, "
              f"load balancing {exp.load_balancing}, seed {exp.seed}")
    for j in js:
        w = j.workload
        sends = [(o, program.channels[o.channel]) for o in program.ops if o.job == j.name and o.kind == "send"]
        sent = sum(o.nbytes for o, c in sends if not c.relay)  # a PXN relay forwards a message sent
        across = sum(o.nbytes for o, c in sends if c.via != SCALE_UP and leaf_of[c.src] != leaf_of[c.dst])
        inside = sum(o.nbytes for o, c in sends if c.via == SCALE_UP)
        if j.roles is not None:
            workers, servers = j.roles
            what = (f"{w.type} ({w.mode}, staleness {w.staleness_bound}): {len(workers)} workers push "
                    f"{format_size(w.size)} to {len(servers)} server(s) ({', '.join(servers)}) and pull it "
                    f"back, {w.iterations} step(s)")
        elif j.grid is None:
            what = f"{w.type}/{w.algorithm} of {format_size(w.size)} x {w.iterations} over {len(j.hosts)} ranks"
        else:
            dims = (f"tp {w.tp} x pp {w.pp} x dp {w.dp}, placement "
                    f"{w.placement if isinstance(w.placement, str) else 'explicit'}, "
                    if w.type == "training" else f"{len(w.stages)} stages, ")
            what = (f"{w.type}: {dims}{w.microbatches} microbatches ({w.schedule}), "
                    f"{w.iterations} step(s); ideal bubble {bubble_fraction(len(j.grid[0]), w.microbatches):.3f}")
        scale_up = f", {format_size(inside)} inside servers (scale-up)" if j.domains is not None else ""
        out.print(f"job [bold]{j.name}[/]: {what}; {format_size(sent)} sent, "
                  f"{format_size(across)} across leaves{scale_up}")
        if j.grid is not None:
            servers = j.domains is not None
            t = Table("leaf", *(["server"] if servers else []), "host", "dp", "pp (stage)", "tp",
                      title=f"{j.name}: placement")
            for r in placement_rows(j, leaf_of):
                t.add_row(r["leaf"], *([r["server"]] if servers else []), r["host"], str(r["dp"]), str(r["pp"]),
                          str(r["tp"]))
            out.print(t)


def print_placement(out: Console, plan: FabricPlan) -> None:
    """A partitioned fabric (machines:): what each machine runs, and the links between machines."""
    p = plan.extra.get("placement")
    if p is None:
        return
    where = p["machine_of"]
    t = Table("machine", "address", "switches", "hosts", "cut links", title="placement by fabric unit")
    for i, m in enumerate(p["machines"]):
        switches = [s.name for s in plan.switches if where[s.name] == m]
        hosts = [h.name for h in plan.hosts if where[h.name] == m]
        ends = sum(1 for c in p["cut"] for end in c.split(":") if where[end.rsplit("-eth", 1)[0]] == m)
        t.add_row(m + (" (head)" if i == 0 else ""), p["addresses"][m], " ".join(switches),
                  f"{len(hosts)}: {' '.join(hosts[:8])}{' ...' if len(hosts) > 8 else ''}", str(ends))
    out.print(t)
    fabric = sum(1 for ln in plan.links if ln.kind == "fabric")
    out.print(f"{len(p['cut'])} of {fabric} fabric links cross machines ({len(p['units'])} units kept whole); "
              f"each crosses the underlay in a VXLAN tunnel of its own, which needs an underlay MTU of at least "
              f"{p['underlay_mtu']} (fabric MTU {plan.mtu} + 50)", soft_wrap=True, highlight=False, markup=False)
