"""FabricPlan: the pure description of a fabric built from a topology spec.

Names, datapath ids, port numbers, addresses, link rates and equal-cost paths are all decided
here, with no root and no Mininet, so every other part (fabric builder, controller, agents,
reports) reads the same facts. The plan round-trips through JSON for the processes that need it.

Naming (documented for users, like Mininet's):
  spines spine1..spineS, leaves leaf1..leafL, hosts h1..hN numbered leaf by leaf;
  interfaces <node>-eth<port>. Leaf ports 1..H face its hosts, H+1..H+S face spine1..spineS;
  spine port j faces leafj; every host has one interface, hK-eth0.

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

from fabric_emu.config import TopologySpec

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


@dataclass(frozen=True)
class Switch:
    name: str
    role: str  # "spine" | "leaf"
    index: int  # 1-based within its role
    dpid: int


@dataclass(frozen=True)
class Host:
    name: str
    index: int  # 1-based, leaf by leaf
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
    kind: str  # "host" (host-leaf) | "fabric" (leaf-spine)
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

    # ------------------------------------------------------------------ lookups
    @cached_property
    def switch_by_name(self) -> dict[str, Switch]:
        return {s.name: s for s in self.switches}

    @cached_property
    def host_by_name(self) -> dict[str, Host]:
        return {h.name: h for h in self.hosts}

    @property
    def spines(self) -> list[Switch]:
        return [s for s in self.switches if s.role == "spine"]

    @property
    def leaves(self) -> list[Switch]:
        return [s for s in self.switches if s.role == "leaf"]

    @property
    def roce_mtu(self) -> int:
        return roce_path_mtu(self.mtu)

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
        return [p for p in self.ports(leaf) if p.kind == "fabric"]

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

    @property
    def oversubscription(self) -> float:
        """Per leaf: host-facing capacity over uplink capacity (1.0 = non-blocking)."""
        leaf = self.leaves[0].name
        down = sum(p.emulated_bps for p in self.ports(leaf) if p.kind == "host")
        up = sum(p.emulated_bps for p in self.uplinks(leaf))
        return down / up

    # ------------------------------------------------------------------ JSON hand-off
    def to_dict(self) -> dict:
        return {
            "name": self.name, "kind": self.kind, "dilation": self.dilation, "mtu": self.mtu,
            "port_buffer": self.port_buffer, "subnet": self.subnet, "extra": self.extra,
            "switches": [asdict(s) for s in self.switches],
            "hosts": [asdict(h) for h in self.hosts],
            "links": [asdict(ln) for ln in self.links],
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
        )


def build_plan(topo: TopologySpec, dilation: float | None = None) -> FabricPlan:
    """Plan a leaf-spine fabric: every leaf connects to every spine. `dilation` overrides the
    topology's (which must be a number by now: fabric_emu.capacity resolves 'auto')."""
    if topo.kind != "leaf-spine":
        raise ValueError(f"unsupported kind {topo.kind}")
    d = topo.dilation if dilation is None else dilation
    if d == "auto":
        raise ValueError("dilation 'auto' is not resolved yet (fabric_emu.capacity.resolve_auto)")
    host_bps = topo.host_link.gbps * 1e9 / d
    fabric_bps = topo.fabric_link.gbps * 1e9 / d
    hpl = topo.hosts_per_leaf

    spines = [Switch(f"spine{i}", "spine", i, 0x5000 + i) for i in range(1, topo.spines + 1)]
    leaves = [Switch(f"leaf{j}", "leaf", j, 0x1000 + j) for j in range(1, topo.leaves + 1)]
    hosts: list[Host] = []
    links: list[Link] = []
    for leaf in leaves:
        for k in range(1, hpl + 1):
            n = (leaf.index - 1) * hpl + k
            h = Host(
                name=f"h{n}", index=n, leaf=leaf.name, leaf_port=k,
                ip=f"10.0.{leaf.index}.{k}", mac=f"02:fe:00:00:{leaf.index:02x}:{k:02x}",
                intf=f"h{n}-eth0",
            )
            hosts.append(h)
            links.append(Link(h.name, 0, leaf.name, k, "host", topo.host_link.gbps, host_bps))
    for leaf in leaves:
        for spine in spines:
            links.append(Link(leaf.name, hpl + spine.index, spine.name, leaf.index, "fabric",
                              topo.fabric_link.gbps, fabric_bps))
    return FabricPlan(
        name=topo.name, kind=topo.kind, dilation=d, mtu=topo.mtu, port_buffer=topo.port_buffer,
        switches=spines + leaves, hosts=hosts, links=links,
    )


def resolve_ranks(plan: FabricPlan, ranks: str | list[str]) -> list[str]:
    """Host names of the ranks in rank order; raises KeyError naming an unknown host."""
    if ranks == "all":
        return [h.name for h in plan.hosts]
    for r in ranks:
        if r not in plan.host_by_name:
            raise KeyError(r)
    return list(ranks)
