"""FabricPlan: the pure description of a fabric built from a topology spec.

Names, datapath ids, port numbers, addresses, link rates and equal-cost paths are all decided
here, with no root and no Mininet, so every other part (fabric builder, controller, agents,
reports) reads the same facts. The plan round-trips through JSON for the processes that need it.

Naming (documented for users, like Mininet's): interfaces <node>-eth<port>; every host has one
interface, <host>-eth0, and the address 10.0.<n>.<p> where n numbers its leaf (the host-attached
switch; one /24 per leaf, the controller routes by them) and p is the leaf's port to it.
  leaf-spine: spines spine1..spineS, leaves leaf1..leafL, hosts h1..hN numbered leaf by leaf.
    Leaf ports 1..H face its hosts, H+1..H+S face spine1..spineS; spine port j faces leafj.
  fat-tree (k): core1..core(k/2)^2, agg1..agg(k^2/2) and edge1..edge(k^2/2) (role leaf),
    numbered pod by pod; hosts h1..h(k^3/4) edge by edge (see _fat_tree for the ports).
  rail-optimized: spine1..spineS; rail leaves g<group>rail<r>; server s's NIC r is host
    srv<s>n<r>, on rail leaf r of its group (see _rail_optimized).
  custom: the spec's names. Switches with hosts are leaves, numbered 1.. in the listed order
    (leaf n holds 10.0.<n>.0/24), the others spines; dpid 0x7000 + the switch's position in
    the list. A switch's ports 1..H face its hosts (in the listed order), then one port per
    link in the order the links are listed (see _custom).

  leaf-spine, 2 spines x 2 leaves x 2 hosts:

        spine1      spine2
          |  \\      /  |
          |    \\  /    |
          |    /  \\    |
        leaf1        leaf2
        /   \\        /   \\
      h1    h2     h3    h4
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from functools import cached_property

import networkx as nx

from fabric_emu.spec.topology import (MAX_IFNAME, CustomSpec, FatTreeSpec, LeafSpineSpec, RailOptimizedSpec,
                                      TopologyBase, servers_of)

# Bytes that RoCEv2 adds around the payload inside an IP packet: IPv4 20, UDP 8, BTH 12,
# RETH 16 (first packet of a WRITE), ICRC 4. Used to pick the RoCE path MTU (iboe_get_mtu).
ROCE_IP_OVERHEAD = 20 + 8 + 12 + 16 + 4
ETH_HEADER = 14


def roce_path_mtu(eth_mtu: int) -> int:
    """The IB MTU a RoCE NIC picks for this Ethernet MTU (4096 if it fits, else down to 256)."""
    for ib_mtu in (4096, 2048, 1024, 512, 256):
        if ib_mtu + ROCE_IP_OVERHEAD <= eth_mtu:
            return ib_mtu
    raise ValueError(f"mtu {eth_mtu} cannot carry a RoCE packet")


# Tiers from the hosts up. Leaves are the host-attached switches of every kind (fat-tree edges
# too), so code that works on leaves and their uplinks works on every kind.
TIER_OF_ROLE = {"leaf": 1, "agg": 2, "spine": 2, "core": 3}


@dataclass(frozen=True)
class Switch:
    name: str
    role: str  # "leaf" (host-attached) | "spine" | fat-tree "agg" | "core"
    index: int  # 1-based within its role
    dpid: int


@dataclass(frozen=True)
class Host:
    name: str
    index: int  # 1-based, in plan order (leaf by leaf but in a custom fabric: as listed)
    leaf: str
    leaf_port: int
    ip: str
    mac: str
    intf: str


@dataclass(frozen=True)
class Link:
    a: str
    a_port: int
    b: str
    b_port: int
    kind: str  # "host" (host-leaf) | "fabric" (between two switches)
    gbps: float  # modelled rate
    emulated_bps: float  # modelled rate / dilation

    @property
    def a_intf(self) -> str:
        return f"{self.a}-eth{self.a_port}"

    @property
    def b_intf(self) -> str:
        return f"{self.b}-eth{self.b_port}"


@dataclass(frozen=True)
class Port:
    """One end of a link, seen from its node."""

    node: str
    port: int
    intf: str
    peer: str
    peer_port: int
    kind: str
    emulated_bps: float


@dataclass(frozen=True)
class Server:
    """A multi-GPU server: its GPUs' NICs (hosts, GPU 0 first) share a scale-up domain
    (NVLink/NVSwitch-class) whose transfers the NIC engines model instead of sending packets."""

    name: str  # srv1, srv2, ...
    hosts: tuple[str, ...]  # one per GPU, in GPU order
    gbps: float  # scale-up bandwidth per GPU and direction, modelled
    latency_s: float  # one transfer's start-up latency, modelled


@dataclass
class FabricPlan:
    name: str
    kind: str
    dilation: float
    mtu: int
    port_buffer: int
    switches: list[Switch]
    hosts: list[Host]
    links: list[Link]
    subnet: str = "10.0.0.0/16"
    extra: dict = field(default_factory=dict)
    servers: list[Server] = field(default_factory=list)  # empty: every host is a server of its own

    # ------------------------------------------------------------------ lookups
    @cached_property
    def switch_by_name(self) -> dict[str, Switch]:
        return {s.name: s for s in self.switches}

    @cached_property
    def host_by_name(self) -> dict[str, Host]:
        return {h.name: h for h in self.hosts}

    @cached_property
    def server_of(self) -> dict[str, Server]:
        """The server of each host that has one (hosts of single-NIC fabrics have none)."""
        return {h: srv for srv in self.servers for h in srv.hosts}

    def same_server(self, a: str, b: str) -> bool:
        """Whether two hosts are GPUs of one server (so a transfer between them is scale-up)."""
        srv = self.server_of.get(a)
        return srv is not None and b in srv.hosts

    @property
    def spines(self) -> list[Switch]:
        return [s for s in self.switches if s.role == "spine"]

    @property
    def leaves(self) -> list[Switch]:
        return [s for s in self.switches if s.role == "leaf"]

    @property
    def roce_mtu(self) -> int:
        return roce_path_mtu(self.mtu)

    def link_ends(self, a: str, b: str) -> list[Port]:
        """Both ends of the links between nodes a and b (a's first); raises if there are none."""
        ends = [p for p in self.ports(a) if p.peer == b] + [p for p in self.ports(b) if p.peer == a]
        if not ends:
            raise RuntimeError(f"no link between {a} and {b} in plan {self.name}")
        return ends

    def ports(self, node: str) -> list[Port]:
        """Every port of a node, in port-number order."""
        out = []
        for ln in self.links:
            if ln.a == node:
                out.append(Port(node, ln.a_port, ln.a_intf, ln.b, ln.b_port, ln.kind, ln.emulated_bps))
            if ln.b == node:
                out.append(Port(node, ln.b_port, ln.b_intf, ln.a, ln.a_port, ln.kind, ln.emulated_bps))
        return sorted(out, key=lambda p: p.port)

    def uplinks(self, leaf: str) -> list[Port]:
        """A host-attached switch's ports toward the switches above it (every kind). Bytes sent
        on them by all leaves are the bytes that entered the upper tiers."""
        return [p for p in self.ports(leaf) if p.kind == "fabric"]

    def tier(self, node: str) -> int:
        """0 for hosts, 1 for leaves, up to the top tier (TIER_OF_ROLE)."""
        sw = self.switch_by_name.get(node)
        return 0 if sw is None else TIER_OF_ROLE[sw.role]

    def up_ports(self, switch: str) -> list[Port]:
        """A switch's ports toward a higher tier (none for the top tier)."""
        return [p for p in self.ports(switch) if self.tier(p.peer) > self.tier(switch)]

    @property
    def roles(self) -> dict[str, list[Switch]]:
        """Switches by role, from the leaves up."""
        out: dict[str, list[Switch]] = {}
        for sw in sorted(self.switches, key=lambda s: TIER_OF_ROLE[s.role]):
            out.setdefault(sw.role, []).append(sw)
        return out

    def tier_oversubscription(self) -> dict[str, float]:
        """Per role with switches above it: the capacity of its ports toward lower tiers and
        hosts over the capacity of its ports toward higher ones (1.0 = non-blocking)."""
        out = {}
        for role, switches in self.roles.items():
            up = sum(p.emulated_bps for sw in switches for p in self.up_ports(sw.name))
            if up:
                down = sum(p.emulated_bps for sw in switches for p in self.ports(sw.name)
                           if self.tier(p.peer) < self.tier(sw.name))
                out[role] = down / up
        return out

    def host_rate_bps(self, host: str) -> float:
        """Emulated line rate of a host's NIC."""
        return self.ports(host)[0].emulated_bps

    @cached_property
    def graph(self) -> nx.Graph:
        g = nx.Graph()
        for n in self.switches:
            g.add_node(n.name, role=n.role)
        for h in self.hosts:
            g.add_node(h.name, role="host")
        for ln in self.links:
            g.add_edge(ln.a, ln.b, kind=ln.kind)
        return g

    def paths(self, src: str, dst: str) -> list[list[str]]:
        """All equal-cost shortest paths, sorted so every choice is deterministic."""
        return sorted(nx.all_shortest_paths(self.graph, src, dst))

    def leaf_oversubscription(self) -> dict[str, float]:
        """Per leaf with links to other switches: its host-facing capacity over the capacity of
        those links (1.0 = non-blocking; in a custom fabric they may carry transit traffic too)."""
        out = {}
        for leaf in self.leaves:
            up = sum(p.emulated_bps for p in self.uplinks(leaf.name))
            if up:
                out[leaf.name] = sum(p.emulated_bps for p in self.ports(leaf.name) if p.kind == "host") / up
        return out

    @property
    def oversubscription(self) -> float:
        """The first leaf's leaf_oversubscription (every leaf's in the generated kinds); 0.0 in a
        fabric whose leaves have no links to other switches (one switch)."""
        return next(iter(self.leaf_oversubscription().values()), 0.0)

    # ------------------------------------------------------------------ JSON hand-off
    def to_dict(self) -> dict:
        return {
            "name": self.name, "kind": self.kind, "dilation": self.dilation, "mtu": self.mtu,
            "port_buffer": self.port_buffer, "subnet": self.subnet, "extra": self.extra,
            "switches": [asdict(s) for s in self.switches],
            "hosts": [asdict(h) for h in self.hosts],
            "links": [asdict(ln) for ln in self.links],
            "servers": [asdict(srv) for srv in self.servers],
        }

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=1)

    @classmethod
    def from_dict(cls, d: dict) -> "FabricPlan":
        return cls(
            name=d["name"], kind=d["kind"], dilation=d["dilation"], mtu=d["mtu"],
            port_buffer=d["port_buffer"], subnet=d["subnet"], extra=d.get("extra", {}),
            switches=[Switch(**s) for s in d["switches"]],
            hosts=[Host(**h) for h in d["hosts"]],
            links=[Link(**ln) for ln in d["links"]],
            servers=[Server(**{**srv, "hosts": tuple(srv["hosts"])}) for srv in d.get("servers", [])],
        )


def build_plan(topo: TopologyBase, dilation: float | None = None) -> FabricPlan:
    """Plan a fabric of any kind. `dilation` overrides the topology's (which must be a number
    by now: fabric_emu.measure.capacity resolves 'auto')."""
    d = topo.dilation if dilation is None else dilation
    if d == "auto":
        raise ValueError("dilation 'auto' is not resolved yet (fabric_emu.measure.capacity.resolve_auto)")
    wiring = {"leaf-spine": _leaf_spine, "fat-tree": _fat_tree, "rail-optimized": _rail_optimized,
              "custom": _custom}
    if topo.kind not in wiring:
        raise ValueError(f"unsupported kind {topo.kind}")
    w = _Wiring(topo, d)
    wiring[topo.kind](topo, w)
    long = [ln.a_intf for ln in w.links if len(ln.a_intf) > MAX_IFNAME]
    long += [ln.b_intf for ln in w.links if len(ln.b_intf) > MAX_IFNAME]
    if long:
        raise ValueError(f"interface names longer than {MAX_IFNAME} characters: {', '.join(long[:3])}")
    return FabricPlan(
        name=topo.name, kind=topo.kind, dilation=d, mtu=topo.mtu, port_buffer=topo.port_buffer,
        switches=w.switches, hosts=w.hosts, links=w.links, servers=_servers(topo, w.hosts),
    )


def _servers(topo: TopologyBase, hosts: list[Host]) -> list[Server]:
    """The spec's multi-GPU servers, srv1.. in host order: `gpus` consecutive hosts each (under
    one leaf: the spec checks); on rail-optimized fabrics server s's NICs srv<s>n1.. (GPU r-1
    is NIC r, on rail r)."""
    spec = servers_of(topo)
    if spec is None:
        return []
    gbps, latency = spec.scale_up.gbps, spec.scale_up.latency
    if isinstance(topo, RailOptimizedSpec):
        n = topo.nics_per_server
        return [Server(f"srv{s}", tuple(f"srv{s}n{r}" for r in range(1, n + 1)), gbps, latency)
                for s in range(1, topo.groups * topo.servers_per_group + 1)]
    g = spec.gpus
    return [Server(f"srv{i // g + 1}", tuple(h.name for h in hosts[i:i + g]), gbps, latency)
            for i in range(0, len(hosts), g)]


class _Wiring:
    """Switches, hosts and links as a kind's wiring adds them (rates from the spec)."""

    def __init__(self, topo: TopologyBase, dilation: float):
        self.topo = topo
        self.dilation = dilation
        self.switches: list[Switch] = []
        self.hosts: list[Host] = []
        self.links: list[Link] = []

    def tier(self, prefix: str, role: str, count: int, dpid_base: int) -> list[Switch]:
        tier = [Switch(f"{prefix}{i}", role, i, dpid_base + i) for i in range(1, count + 1)]
        self.switches += tier
        return tier

    def host(self, name: str, leaf: Switch, number: int, port: int, gbps: float | None = None) -> None:
        """Host on leaf's port; leaf `number` n gives it 10.0.<n>.<port> (one /24 per leaf). Its
        link runs at `gbps`, or host_link's rate."""
        h = Host(name=name, index=len(self.hosts) + 1, leaf=leaf.name, leaf_port=port,
                 ip=f"10.0.{number}.{port}", mac=f"02:fe:00:00:{number:02x}:{port:02x}",
                 intf=f"{name}-eth0")
        self.hosts.append(h)
        gbps = gbps or self.topo.host_link.gbps
        self.links.append(Link(h.name, 0, leaf.name, port, "host", gbps, gbps * 1e9 / self.dilation))

    def fabric(self, a: Switch, a_port: int, b: Switch, b_port: int, gbps: float | None = None) -> None:
        """A link between two switches, at `gbps` or fabric_link's rate."""
        gbps = gbps or self.topo.fabric_link.gbps
        self.links.append(Link(a.name, a_port, b.name, b_port, "fabric", gbps, gbps * 1e9 / self.dilation))


def _leaf_spine(topo: LeafSpineSpec, w: _Wiring) -> None:
    """Every leaf connects to every spine. Leaf ports 1..H face hosts, H+s spine s; spine
    port j faces leaf j."""
    hpl = topo.hosts_per_leaf
    spines = w.tier("spine", "spine", topo.spines, 0x5000)
    leaves = w.tier("leaf", "leaf", topo.leaves, 0x1000)
    for leaf in leaves:
        for k in range(1, hpl + 1):
            w.host(f"h{(leaf.index - 1) * hpl + k}", leaf, leaf.index, k)
    for leaf in leaves:
        for spine in spines:
            w.fabric(leaf, hpl + spine.index, spine, leaf.index)


def _fat_tree(topo: FatTreeSpec, w: _Wiring) -> None:
    """Al-Fares' k-ary fat-tree, numbered pod by pod (pod p holds agg and edge switches
    (p-1)*k/2+1 .. p*k/2). Edge ports 1..k/2 face hosts, k/2+a the pod's a-th agg; agg ports
    1..k/2 face the pod's edges, k/2+c its c-th core; core ((a-1)*k/2 + c) port p faces pod p's
    a-th agg, so core group a joins the a-th aggs of every pod."""
    k, half = topo.k, topo.k // 2
    cores = w.tier("core", "core", half * half, 0x3000)
    aggs = w.tier("agg", "agg", k * half, 0x2000)
    edges = w.tier("edge", "leaf", k * half, 0x1000)
    for edge in edges:
        for port in range(1, half + 1):
            w.host(f"h{(edge.index - 1) * half + port}", edge, edge.index, port)
    for pod in range(k):
        pod_aggs, pod_edges = aggs[pod * half:(pod + 1) * half], edges[pod * half:(pod + 1) * half]
        for e, edge in enumerate(pod_edges, 1):
            for a, agg in enumerate(pod_aggs, 1):
                w.fabric(edge, half + a, agg, e)
        for a, agg in enumerate(pod_aggs, 1):
            for c in range(1, half + 1):
                w.fabric(agg, half + c, cores[(a - 1) * half + c - 1], pod + 1)


def _rail_optimized(topo: RailOptimizedSpec, w: _Wiring) -> None:
    """Group g has one leaf per rail, g<g>rail<r>; NIC r of each of its servers connects to
    it. Servers are numbered across groups, their NICs srv<s>n<r> (hosts, in server order).
    Rail-leaf ports 1..S face the group's servers, S+i spine i; spine port j faces the j-th
    rail leaf (group by group)."""
    per_group, nics = topo.servers_per_group, topo.nics_per_server
    spines = w.tier("spine", "spine", topo.spines, 0x5000)
    leaves = [Switch(f"g{g}rail{r}", "leaf", (g - 1) * nics + r, 0x1000 + (g - 1) * nics + r)
              for g in range(1, topo.groups + 1) for r in range(1, nics + 1)]
    w.switches += leaves
    for g in range(topo.groups):
        for s in range(1, per_group + 1):
            server = g * per_group + s
            for r in range(1, nics + 1):
                leaf = leaves[g * nics + r - 1]
                w.host(f"srv{server}n{r}", leaf, leaf.index, s)
    for leaf in leaves:
        for spine in spines:
            w.fabric(leaf, per_group + spine.index, spine, leaf.index)


def _custom(topo: CustomSpec, w: _Wiring) -> None:
    """The spec's switches, hosts and links. Switches with hosts are leaves, numbered in the
    listed order (leaf n: 10.0.<n>.0/24), the others spines (numbered likewise); dpid 0x7000 +
    position in `switches`. A switch's ports: its hosts first (1..H, in the listed order), then
    one per link, in the order `links` lists them."""
    with_hosts = {h.switch for h in topo.hosts}
    counts = {"leaf": 0, "spine": 0}
    by_name: dict[str, Switch] = {}
    for pos, name in enumerate(topo.switches, 1):
        role = "leaf" if name in with_hosts else "spine"
        counts[role] += 1
        by_name[name] = Switch(name, role, counts[role], 0x7000 + pos)
    w.switches += by_name.values()
    next_port = dict.fromkeys(topo.switches, 1)
    for h in topo.hosts:
        leaf = by_name[h.switch]
        w.host(h.name, leaf, leaf.index, next_port[leaf.name], h.gbps)
        next_port[leaf.name] += 1
    for ln in topo.links:
        a, b = by_name[ln.a], by_name[ln.b]
        w.fabric(a, next_port[a.name], b, next_port[b.name], ln.gbps)
        next_port[a.name] += 1
        next_port[b.name] += 1


def resolve_ranks(plan: FabricPlan, ranks: str | list[str]) -> list[str]:
    """Host names of the ranks in rank order; raises KeyError naming an unknown host."""
    if ranks == "all":
        return [h.name for h in plan.hosts]
    for r in ranks:
        if r not in plan.host_by_name:
            raise KeyError(r)
    return list(ranks)
