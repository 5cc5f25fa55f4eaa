"""Which ports a fabric has and what each is configured with: ids, peers, class limits, ECN and
PFC thresholds. Pure (no root): the datapath installs it, `show` prints it, and the results
record it as installed.

Buffer model (static thresholds, documented in docs/lossless-ports.md):
* lossy classes (priority 0, CNPs in 6, and RoCE in 3 when PFC is off): each egress queue holds at
  most `port_buffer` bytes, tail drop beyond;
* the lossless class (priority 3 with PFC on) is admitted per INGRESS port: each switch port
  holds the priority-3 bytes that entered through it, whatever egress queue they wait in, and
  the egress queue has no limit of its own (SONiC's lossless egress profile has dynamic_th 7,
  i.e. infinite). Above xoff the port pauses its upstream. The headroom above xoff is sized for
  the modelled pause response (cc/headroom.py), so bytes beyond xoff + headroom can only come
  from the emulator pausing late (a stalled CPU): they are admitted and counted as
  headroom_overruns, which the fidelity check reports. Beyond `port_buffer` the port has no room
  left: the switch drops, counted as a lossless drop.
* a host NIC's queues hold what its driver has accepted: NIC_QUEUE_FRAMES frames of RoCE, which
  is what the agent can push before a paused NIC refuses more (ENOBUFS, retried later).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, replace

from fabric_emu.cc.pfcwd import Timers
from fabric_emu.cc.red import pmax_scaled
from fabric_emu.topo.plan import ETH_HEADER, FabricPlan
from fabric_emu.kernel.ovs_datapath import datapath_of
from fabric_emu.ports.layout import MAX_PORTS, NO_PORT, NPRIO, PORT_ECN, PORT_ORPHAN, PORT_PFC, PORT_SWITCH

NIC_QUEUE_FRAMES = 16
SLACK_FRAMES = 4  # kernel FIFOs above the BPF limit: the BPF program always drops first


@dataclass(frozen=True)
class PortEnd:
    """One end of a link. Switch ports and host NICs share one id space (the BPF map index)."""

    id: int
    node: str
    port: int
    intf: str
    peer_id: int
    role: str  # "switch" | "host"
    gbps: float  # modelled rate
    emulated_bps: float


@dataclass(frozen=True)
class EcnSettings:
    enabled: bool
    kmin: int
    kmax: int
    pmax: float


@dataclass(frozen=True)
class PfcSettings:
    enabled: bool
    xoff: int
    xon: int
    headroom: int
    quanta: int


@dataclass(frozen=True)
class PortSettings:
    """What one port gets: BPF admission limits, kernel FIFO backstops, ECN and PFC."""

    limits: dict[int, int]  # priority -> egress bytes (BPF tail drop); lossless with PFC: held per ingress port
    fifo_limits: dict[int, int]  # priority -> kernel FIFO bytes
    ecn: EcnSettings | None  # switch ports only
    pfc: PfcSettings | None  # switch ports only (as ingress ports)

    def row(self) -> dict:
        """Flat, for thresholds.csv and `show`."""
        out = {f"limit_p{p}": v for p, v in sorted(self.limits.items())}
        if self.ecn:
            out.update({f"ecn_{k}": v for k, v in asdict(self.ecn).items()})
        if self.pfc:
            out.update({f"pfc_{k}": v for k, v in asdict(self.pfc).items()})
        return out


def port_ends(plan: FabricPlan) -> list[PortEnd]:
    """Every link end, switch ports first (plan order), then host NICs; ids from 0."""
    ends: list[tuple[str, int, str, str, int, float, float]] = []
    for ln in plan.links:
        ends.append((ln.a, ln.a_port, ln.a_intf, ln.b_intf, ln.b_port, ln.gbps, ln.emulated_bps))
        ends.append((ln.b, ln.b_port, ln.b_intf, ln.a_intf, ln.a_port, ln.gbps, ln.emulated_bps))
    switches = set(plan.switch_by_name)
    ends.sort(key=lambda e: (e[0] not in switches, e[2]))
    if len(ends) >= min(MAX_PORTS, NO_PORT):
        raise ValueError(f"{len(ends)} link ends; the port map holds {MAX_PORTS - 1}")
    id_of = {e[2]: i for i, e in enumerate(ends)}
    return [PortEnd(id_of[intf], node, port, intf, id_of[peer], "switch" if node in switches else "host",
                    gbps, bps)
            for node, port, intf, peer, _, gbps, bps in ends]


def switch_settings(plan: FabricPlan, ecn: EcnSettings, pfc: PfcSettings) -> PortSettings:
    """The settings of every switch port (they are all alike in a leaf-spine fabric)."""
    buf, frame = plan.port_buffer, plan.mtu + ETH_HEADER
    slack = SLACK_FRAMES * frame
    max_ports = max(len(plan.ports(s.name)) for s in plan.switches)
    # every ingress port may hold up to its buffer of lossless bytes, all in one egress queue
    lossless_fifo = (max_ports * buf if pfc.enabled else buf) + slack
    return PortSettings(
        limits={0: buf, 3: buf, 6: buf},
        fifo_limits={0: buf + slack, 3: lossless_fifo, 6: buf + slack},
        ecn=ecn, pfc=pfc)


def host_settings(plan: FabricPlan) -> PortSettings:
    frame = plan.mtu + ETH_HEADER
    nic = NIC_QUEUE_FRAMES * frame
    return PortSettings(limits={0: plan.port_buffer, 3: nic, 6: nic},
                        fifo_limits={0: plan.port_buffer, 3: nic, 6: nic}, ecn=None, pfc=None)


def bpf_config(settings: PortSettings, orphan: bool = False) -> dict[str, int | list[int]]:
    """The config fields of `struct port` (layout.FIELDS) for a switch port (`orphan`: one that
    takes a host's frames off their socket, PortPlan.orphan_host_frames)."""
    limits = [settings.limits.get(p, settings.limits[0]) for p in range(NPRIO)]
    ecn, pfc = settings.ecn, settings.pfc
    flags = (PORT_SWITCH | (PORT_ECN if ecn and ecn.enabled else 0) | (PORT_PFC if pfc and pfc.enabled else 0)
             | (PORT_ORPHAN if orphan else 0))
    return {
        "flags": flags, "limit": limits,
        "kmin": ecn.kmin if ecn else 0, "kmax": ecn.kmax if ecn else 1,
        "pmax32": pmax_scaled(ecn.pmax) if ecn else 0,
        "xoff": pfc.xoff if pfc else 0, "xon": pfc.xon if pfc else 0,
        "headroom": pfc.headroom if pfc else 0,
    }


@dataclass(frozen=True)
class PortPlan:
    """Every link end of a fabric and what it gets: the input of the port datapath."""

    ends: list[PortEnd]
    switch: PortSettings
    host: PortSettings
    dilation: float
    mtu: int
    watchdog: Timers | None = None  # the switches' PFC watchdog, when it runs
    watchdog_ports: str = "all"  # or "host-facing"
    watchdog_seed: int = 0  # each switch's poll phase (fabric_emu.ports.watchdog.poll_phase)
    nic_stall_guard_s: float | None = None  # modelled: a storming NIC stops pausing after this long
    nic_receive: tuple[float, int, int, int] | None = None  # NICs' drain (modelled b/s), buffer, xoff, xon
    # Open vSwitch's kernel datapath: a host's frames leave their socket at the switch port they
    # enter by (bpf/port.c orphan()), as a packet socket makes them on the userspace datapath
    orphan_host_frames: bool = False

    def settings(self, end: PortEnd) -> PortSettings:
        return self.switch if end.role == "switch" else self.host

    def watched(self) -> list[PortEnd]:
        """The switch ports whose lossless queue the watchdog watches."""
        if self.watchdog is None:
            return []
        roles = {e.id: e.role for e in self.ends}
        return [e for e in self.ends if e.role == "switch"
                and (self.watchdog_ports == "all" or roles.get(e.peer_id) == "host")]


def port_plan(plan: FabricPlan, ecn: EcnSettings, pfc: PfcSettings, watchdog: Timers | None = None,
              watchdog_ports: str = "all", seed: int = 0, nic_stall_guard_s: float | None = None,
              nic_receive: tuple[float, int, int, int] | None = None) -> PortPlan:
    return PortPlan(port_ends(plan), switch_settings(plan, ecn, pfc), host_settings(plan),
                    plan.dilation, plan.mtu, watchdog if pfc.enabled else None, watchdog_ports, seed,
                    nic_stall_guard_s, nic_receive if pfc.enabled else None,
                    orphan_host_frames=datapath_of(plan.extra) == "kernel")


def nic_receive_config(plan: PortPlan) -> dict[str, int]:
    """The nic_rx_* config words of a switch port facing a host (zeros: not modelled)."""
    if plan.nic_receive is None:
        return {"nic_rx_rate": 0, "nic_rx_limit": 0, "nic_rx_xoff": 0}
    bps, buffer, xoff, _ = plan.nic_receive
    return {"nic_rx_rate": max(1, round(bps / 8 / plan.dilation)), "nic_rx_limit": buffer, "nic_rx_xoff": xoff}


def default_settings(plan: FabricPlan) -> tuple[EcnSettings, PfcSettings]:
    """The spec's defaults for this plan, for callers without an experiment (benchmarks, tests)."""
    from fabric_emu.cc.headroom import headroom_bytes
    from fabric_emu.spec.lossless import EcnSpec, PfcSpec, resolve_thresholds

    e, p = EcnSpec(), PfcSpec()
    need = headroom_bytes(plan.mtu + ETH_HEADER, max(ln.gbps for ln in plan.links), p.cable_length)
    kmin, kmax, headroom, xoff, xon = resolve_thresholds(e, p, plan.port_buffer, need)
    return (EcnSettings(e.enabled, kmin, kmax, e.pmax),
            PfcSettings(p.enabled, max(1, xoff), xon, headroom, p.quanta))


def settings_of(spec) -> tuple[EcnSettings, PfcSettings]:
    """An ExperimentSpec's ECN and PFC settings (its headroom is filled in by validation)."""
    e, p = spec.ecn, spec.pfc
    return (EcnSettings(e.enabled, e.kmin, e.kmax, e.pmax),
            PfcSettings(p.enabled, p.xoff, p.xon, p.headroom, p.quanta))


def watchdog_timers(spec) -> Timers | None:
    """An ExperimentSpec's PFC watchdog in modelled nanoseconds, or None when it is off."""
    wd = spec.pfcwd
    if not wd.enabled:
        return None
    return Timers(round(wd.detection_time * 1e9), round(wd.restoration_time * 1e9),
                  round(wd.poll_interval * 1e9), wd.action)


def share_of(ports: PortPlan, machine_of: dict[str, str], machine: str) -> PortPlan:
    """One machine's share of a fabric's ports (issue 19): the link ends of its nodes."""
    return replace(ports, ends=[e for e in ports.ends if machine_of[e.node] == machine])


def remote_peers(ports: PortPlan, machine_of: dict[str, str], machine: str) -> dict[int, int]:
    """Ports on other machines whose peer is on this one (the cut links' far ends): far id -> id here."""
    node = {e.id: e.node for e in ports.ends}
    return {e.peer_id: e.id for e in ports.ends
            if machine_of[e.node] == machine and machine_of[node[e.peer_id]] != machine}


def port_args(spec) -> dict:
    """What an ExperimentSpec decides of its ports, as plain JSON (port_plan_from_args makes the
    PortPlan of it): the run builds its ports from it, and sends it to each machine of a fabric
    over several machines (fabric_emu.run.machine), which builds its share the same way."""
    ecn, pfc = settings_of(spec)
    timers, receive = watchdog_timers(spec), spec.pfc.nic_receive
    return {"ecn": asdict(ecn), "pfc": asdict(pfc), "watchdog": asdict(timers) if timers else None,
            "watchdog_ports": spec.pfcwd.ports, "seed": spec.seed, "nic_stall_guard_s": spec.pfc.nic_stall_guard,
            "nic_receive": [receive.drain, receive.buffer, receive.xoff, receive.xon] if receive else None}


def port_plan_from_args(plan: FabricPlan, args: dict) -> PortPlan:
    return port_plan(plan, EcnSettings(**args["ecn"]), PfcSettings(**args["pfc"]),
                     watchdog=Timers(**args["watchdog"]) if args.get("watchdog") else None,
                     watchdog_ports=args.get("watchdog_ports", "all"), seed=args.get("seed", 0),
                     nic_stall_guard_s=args.get("nic_stall_guard_s"),
                     nic_receive=tuple(args["nic_receive"]) if args.get("nic_receive") else None)
