"""Topology models: the fabric's kind (leaf-spine, fat-tree, rail-optimized, or custom: any
switches, hosts and links), its links, dilation, MTU and port buffers, and the switch names
every kind uses."""

from __future__ import annotations

import re
from typing import Annotated, Any, Literal, Optional, Union

from pydantic import BeforeValidator, Discriminator, Field, Tag, WithJsonSchema, field_validator, model_validator

from fabric_emu.spec.errors import problem_at
from fabric_emu.spec.fields import NAME_HELP, NAME_RE, Bytes, Seconds, Strict


class LinkSpec(Strict):
    """A class of links (every host link, or every link between switches)."""

    gbps: float = Field(gt=0, le=1600, description="modelled link rate in Gb/s")


MAX_DILATION = 1_000_000


def _dilation(v: Any) -> Any:
    """A number from 1 to MAX_DILATION, or 'auto' (left for fabric_emu.measure.dilation to resolve)."""
    if v == "auto":
        return v
    allowed = f"a number from 1 to {MAX_DILATION:,}, or auto"
    if isinstance(v, bool):
        raise ValueError(f"got {v!r} ({allowed})")
    try:
        d = float(v)
    except (TypeError, ValueError):
        raise ValueError(f"got {v!r} ({allowed})") from None
    if not 1 <= d <= MAX_DILATION:  # also rejects nan
        raise ValueError(f"{v!r} is out of range ({allowed})")
    return d


Dilation = Annotated[Union[float, Literal["auto"]], BeforeValidator(_dilation), WithJsonSchema(
    {"anyOf": [{"type": "number", "minimum": 1, "maximum": MAX_DILATION}, {"const": "auto"}]})]


class TopologyBase(Strict):
    """What every kind of fabric has: links, dilation, MTU and port buffers."""

    name: str = Field(pattern=NAME_RE, description=f"the fabric's name: {NAME_HELP}")
    host_link: LinkSpec = Field(default=LinkSpec(gbps=100), description="every link between a host and its leaf")
    fabric_link: LinkSpec = Field(default=LinkSpec(gbps=100), description="every link between two switches")
    dilation: Dilation = Field(
        default=2000.0, description="emulated = modelled / dilation; 'auto': the lowest that this "
        "machine's measured capacity carries with a margin (fabric_emu.measure.dilation)")
    mtu: int = Field(default=4200, ge=1280, le=9000, description="Ethernet MTU of every link")
    port_buffer: Bytes = Field(default=1_000_000, ge=10_000, le=1_000_000_000,
                               description="egress buffer per switch port, bytes")

    @property
    def fastest_link_gbps(self) -> float:
        """The highest modelled rate of any link (PFC headroom is sized for it)."""
        return max(self.host_link.gbps, self.fabric_link.gbps)


class ScaleUpSpec(Strict):
    """A server's scale-up domain (NVLink/NVSwitch-class): modelled inside the server, no packets."""

    gbps: float = Field(default=3600, gt=0, le=100_000,
                        description="modelled bandwidth per GPU and direction in Gb/s (NVLink 4: 3600)")
    latency: Seconds = Field(default=1e-6, ge=0, le=0.01, description="modelled start-up latency of one transfer")


class ServersSpec(Strict):
    """Multi-GPU servers: each GPU has its own NIC (a host: h1.., or srv<s>n<r> on rail-optimized
    fabrics) and a server's GPUs share a scale-up domain. Servers are srv1.. in host order."""

    gpus: Optional[int] = Field(default=None, ge=1, le=64,
                                description="GPUs (NICs) per server; consecutive hosts under one leaf "
                                            "(rail-optimized: nics_per_server, the default)")
    scale_up: ScaleUpSpec = Field(default=ScaleUpSpec(), description="the GPUs' scale-up domain")


def _gpus_fit(model: str, servers: Optional[ServersSpec], per_leaf: int, what: str) -> None:
    """A server sits under one leaf: its GPUs must divide the leaf's hosts."""
    if servers is None:
        return
    if servers.gpus is None:
        raise problem_at(model, ("servers", "gpus"), f"required: GPUs per server (a divisor of {what}, {per_leaf})",
                         None)
    if per_leaf % servers.gpus:
        raise problem_at(model, ("servers", "gpus"),
                         f"{servers.gpus} does not divide {what} ({per_leaf}); a server's GPUs sit under one leaf",
                         servers.gpus)


SERVERS_HELP = "multi-GPU servers with a scale-up domain (default: none, every host a server of its own)"


TOPOLOGY_KINDS = ("leaf-spine", "fat-tree", "rail-optimized", "custom")
UNKNOWN_KIND = f"allowed: {', '.join(TOPOLOGY_KINDS)}"
KIND_HELP = f"the fabric's kind: {', '.join(TOPOLOGY_KINDS)}"


class LeafSpineSpec(TopologyBase):
    """Two tiers: every leaf connects to every spine (the default kind)."""

    kind: Literal["leaf-spine"] = Field(description=KIND_HELP)
    spines: int = Field(ge=1, le=64, description="spine switches (spine1..spineS); every leaf connects to each")
    leaves: int = Field(ge=1, le=200, description="leaf switches (leaf1..leafL)")
    hosts_per_leaf: int = Field(ge=1, le=200, description="hosts under each leaf (h1..hN, numbered leaf by leaf)")
    servers: Optional[ServersSpec] = Field(default=None, description=SERVERS_HELP)

    @field_validator("kind", mode="before")
    @classmethod
    def _known_kind(cls, v: Any) -> Any:
        # Unknown kinds are validated as leaf-spine (so every other problem is reported too);
        # say which kinds exist rather than only this one.
        if v not in TOPOLOGY_KINDS:
            raise ValueError(f"got {v!r} ({UNKNOWN_KIND})")
        return v

    @property
    def host_count(self) -> int:
        return self.leaves * self.hosts_per_leaf

    @model_validator(mode="after")
    def _servers_fit(self):
        _gpus_fit("LeafSpineSpec", self.servers, self.hosts_per_leaf, "hosts_per_leaf")
        return self


class FatTreeSpec(TopologyBase):
    """A k-ary three-tier fat-tree (Al-Fares et al. 2008): (k/2)^2 core switches; k pods of k/2
    aggregation and k/2 edge switches; k/2 hosts per edge switch, k^3/4 hosts."""

    kind: Literal["fat-tree"] = Field(description=KIND_HELP)
    # At most 12: the port datapath maps up to 4095 link ends (k=12 has 2,592, k=14 4,116).
    k: int = Field(ge=4, le=12, description="switch radix: an even number from 4 to 12")
    servers: Optional[ServersSpec] = Field(default=None, description=SERVERS_HELP)

    @field_validator("k")
    @classmethod
    def _even(cls, v: int) -> int:
        if v % 2:
            raise ValueError(f"got {v}; k must be even (4, 6, 8, 10, 12)")
        return v

    @property
    def host_count(self) -> int:
        return self.k ** 3 // 4

    @model_validator(mode="after")
    def _servers_fit(self):
        _gpus_fit("FatTreeSpec", self.servers, self.k // 2, "an edge switch's hosts, k/2")
        return self


class RailOptimizedSpec(TopologyBase):
    """Servers with several NICs, in groups: NIC n of every server of a group connects to the
    group's rail leaf n; every rail leaf connects to every spine."""

    kind: Literal["rail-optimized"] = Field(description=KIND_HELP)
    groups: int = Field(ge=1, le=16, description="server groups (each with its own rail leaves)")
    servers_per_group: int = Field(ge=1, le=64, description="servers in each group")
    nics_per_server: int = Field(ge=1, le=8, description="NICs per server = rail leaves per group")
    spines: int = Field(ge=1, le=64, description="spine switches; every rail leaf connects to each")
    servers: Optional[ServersSpec] = Field(
        default=None, description="the servers' scale-up domain (GPU r of every server is NIC r, on rail r; "
                                  "default: none, NICs only reach each other through the fabric)")

    @property
    def host_count(self) -> int:
        return self.groups * self.servers_per_group * self.nics_per_server

    @model_validator(mode="after")
    def _servers_fit(self):
        srv = self.servers
        if srv is not None and srv.gpus is not None and srv.gpus != self.nics_per_server:
            raise problem_at("RailOptimizedSpec", ("servers", "gpus"),
                             f"{srv.gpus} is not nics_per_server ({self.nics_per_server}); on a rail-optimized "
                             "fabric every GPU has its own NIC on its own rail (leave gpus out)", srv.gpus)
        return self


# Names of a custom fabric's switches and hosts: short enough that <name>-eth<port> fits Linux's
# 15 characters (a switch with many ports may need a shorter name: CustomSpec checks), and no
# '-', which joins the two ends of a link in events (r1-r2).
CUSTOM_NAME_RE = r"^[a-z][a-z0-9]{0,9}$"
CUSTOM_NAME_HELP = "1-10 lower-case letters and digits, starting with a letter"
MAX_IFNAME = 15  # Linux's limit on interface names (IFNAMSIZ - 1)
MAX_CUSTOM_LEAVES = 200  # host-attached switches: leaf n's hosts are 10.0.<n>.0/24
MAX_CUSTOM_PORTS = 250  # per switch: a host's address ends in its switch port
MAX_LINK_ENDS = 4095  # the port datapath's map (fabric_emu.ports.layout.MAX_PORTS - 1)


def _custom_name(v: Any) -> Any:
    if not isinstance(v, str) or not re.fullmatch(CUSTOM_NAME_RE, v):
        raise ValueError(f"got {v!r} ({CUSTOM_NAME_HELP})")
    return v


CustomName = Annotated[str, BeforeValidator(_custom_name),
                       WithJsonSchema({"type": "string", "pattern": CUSTOM_NAME_RE})]


class CustomHostSpec(Strict):
    """A host of a custom fabric: one NIC, on one switch."""

    name: CustomName = Field(description=f"the host's name: {CUSTOM_NAME_HELP}")
    switch: str = Field(description="the switch its NIC connects to (one of switches)")
    gbps: Optional[float] = Field(default=None, gt=0, le=1600,
                                  description="its link's modelled rate in Gb/s (default: host_link.gbps)")


class CustomLinkSpec(Strict):
    """A link between two switches of a custom fabric."""

    a: str = Field(description="one end: a switch (one of switches)")
    b: str = Field(description="the other end: another switch")
    gbps: Optional[float] = Field(default=None, gt=0, le=1600,
                                  description="its modelled rate in Gb/s (default: fabric_link.gbps)")


def _few(names: list[str], n: int = 6) -> str:
    return ", ".join(names[:n]) + (f", ... ({len(names)} in all)" if len(names) > n else "")


class CustomSpec(TopologyBase):
    """Any fabric: switches, hosts (each on one switch) and links between switches, each link
    at its own rate if given. Routed like the other kinds, by equal-cost shortest paths;
    switches with hosts are its leaves (numbered in the listed order), the others its spines."""

    kind: Literal["custom"] = Field(description=KIND_HELP)
    host_link: LinkSpec = Field(default=LinkSpec(gbps=100), description="host links without a gbps of their own")
    fabric_link: LinkSpec = Field(default=LinkSpec(gbps=100), description="links without a gbps of their own")
    switches: list[CustomName] = Field(min_length=1, max_length=1000,
                                       description=f"the switches' names ({CUSTOM_NAME_HELP})")
    hosts: list[CustomHostSpec] = Field(min_length=2, max_length=MAX_LINK_ENDS // 2,
                                        description="the hosts, each with one NIC on one switch")
    links: list[CustomLinkSpec] = Field(default=[], max_length=MAX_LINK_ENDS // 2,
                                        description="links between two switches (at most one per pair)")
    servers: Optional[ServersSpec] = Field(default=None, description="not on custom fabrics (single-NIC hosts)")

    @field_validator("servers")
    @classmethod
    def _no_servers(cls, v):
        if v is not None:
            raise ValueError("custom fabrics have single-NIC hosts (servers: on leaf-spine, fat-tree, rail-optimized)")
        return v

    @property
    def host_count(self) -> int:
        return len(self.hosts)

    @property
    def fastest_link_gbps(self) -> float:
        return max([h.gbps or self.host_link.gbps for h in self.hosts]
                   + [ln.gbps or self.fabric_link.gbps for ln in self.links])

    @model_validator(mode="after")
    def _a_fabric(self):
        """Unique names, known switches, no loops or parallel links, sizes that fit the addresses
        and Linux, and every host able to reach every other."""
        def problem(loc: tuple, msg: str, value: Any):
            return problem_at("CustomSpec", loc, msg, value)

        first: dict[str, tuple] = {}  # name -> where it was first given
        for i, name in enumerate(self.switches):
            if name in first:
                raise problem(("switches", i), f"{name!r} is listed twice (switches.{first[name][1]})", name)
            first[name] = ("switches", i)
        for i, h in enumerate(self.hosts):
            if h.name in first:
                where = ".".join(map(str, first[h.name]))
                what = "a switch" if first[h.name][0] == "switches" else "another host"
                raise problem(("hosts", i, "name"), f"{h.name!r} is already the name of {what} ({where})", h.name)
            first[h.name] = ("hosts", i, "name")
        known = set(self.switches)
        listed = f"switches are {_few(self.switches)}"
        for i, h in enumerate(self.hosts):
            if h.switch not in known:
                raise problem(("hosts", i, "switch"), f"unknown switch {h.switch!r} ({listed})", h.switch)
        pairs: dict[frozenset, int] = {}
        for i, ln in enumerate(self.links):
            for end in ("a", "b"):
                if getattr(ln, end) not in known:
                    raise problem(("links", i, end), f"unknown switch {getattr(ln, end)!r} ({listed})",
                                  getattr(ln, end))
            if ln.a == ln.b:
                raise problem(("links", i, "b"), f"a link from {ln.a} to itself", ln.b)
            pair = frozenset((ln.a, ln.b))
            if pair in pairs:
                raise problem(("links", i), f"{ln.a}-{ln.b} is already links.{pairs[pair]} (a custom fabric"
                              " has at most one link between two switches)", f"{ln.a}-{ln.b}")
            pairs[pair] = i
        self._check_sizes(problem)
        self._check_connected(problem)
        return self

    def _check_sizes(self, problem) -> None:
        ports = {s: 0 for s in self.switches}
        for h in self.hosts:
            ports[h.switch] += 1
        leaves = [s for s in self.switches if ports[s]]
        if len(leaves) > MAX_CUSTOM_LEAVES:
            raise problem(("hosts",), f"hosts are on {len(leaves)} switches; at most {MAX_CUSTOM_LEAVES}"
                          " (each holds its hosts' 10.0.<n>.0/24)", len(leaves))
        for ln in self.links:
            ports[ln.a] += 1
            ports[ln.b] += 1
        for i, s in enumerate(self.switches):
            if ports[s] > MAX_CUSTOM_PORTS:
                raise problem(("switches", i), f"{s} has {ports[s]} ports (hosts and links); at most "
                              f"{MAX_CUSTOM_PORTS}", s)
            intf = f"{s}-eth{ports[s]}"
            if len(intf) > MAX_IFNAME:
                raise problem(("switches", i), f"{s} has {ports[s]} ports: interface names like {intf} are"
                              f" longer than Linux's {MAX_IFNAME} characters; give it a name of at most"
                              f" {MAX_IFNAME - len(intf) + len(s)} characters", s)
        ends = 2 * (len(self.hosts) + len(self.links))
        if ends > MAX_LINK_ENDS:
            raise problem(("links",), f"{len(self.hosts)} hosts and {len(self.links)} links have {ends} link"
                          f" ends; the port datapath holds {MAX_LINK_ENDS}", len(self.links))

    def _check_connected(self, problem) -> None:
        """Every switch in one piece with the first host's: a host elsewhere cannot reach it."""
        peers: dict[str, set[str]] = {s: set() for s in self.switches}
        for ln in self.links:
            peers[ln.a].add(ln.b)
            peers[ln.b].add(ln.a)
        start = self.hosts[0]
        seen, todo = {start.switch}, [start.switch]
        while todo:
            for p in peers[todo.pop()] - seen:
                seen.add(p)
                todo.append(p)
        cut_off = [(i, h) for i, h in enumerate(self.hosts) if h.switch not in seen]
        if cut_off:
            i, h = cut_off[0]
            others = f" (nor can {_few([x.name for _, x in cut_off[1:]])})" if len(cut_off) > 1 else ""
            raise problem(("hosts", i, "switch"), f"{h.name} cannot reach {start.name}: no links join"
                          f" {h.switch} to {start.switch}{others}", h.switch)
        alone = [(i, s) for i, s in enumerate(self.switches) if s not in seen]
        if alone:
            i, s = alone[0]
            more = f" (nor are {_few([x for _, x in alone[1:]])})" if len(alone) > 1 else ""
            raise problem(("switches", i), f"{s} is not linked to the hosts' switches{more}", s)


TopologySpec = LeafSpineSpec  # the default kind's model, under its first name


def servers_of(topo: TopologyBase) -> Optional[ServersSpec]:
    """A topology's multi-GPU servers, if it has them (custom fabrics do not)."""
    return getattr(topo, "servers", None)


def _topology_kind(v: Any) -> str:
    """The model to validate a topology with; unknown or missing kinds go to leaf-spine, whose
    kind check names the allowed kinds."""
    kind = v.get("kind") if isinstance(v, dict) else getattr(v, "kind", None)
    return kind if kind in TOPOLOGY_KINDS else "leaf-spine"


Topology = Annotated[
    Union[Annotated[LeafSpineSpec, Tag("leaf-spine")], Annotated[FatTreeSpec, Tag("fat-tree")],
          Annotated[RailOptimizedSpec, Tag("rail-optimized")], Annotated[CustomSpec, Tag("custom")]],
    Discriminator(_topology_kind)]


# Switch names of every kind (fabric_emu.topo.plan): spineN, leafN; fat-tree coreN, aggN, edgeN;
# rail-optimized gGrailR (group G's leaf of rail R); custom: any CUSTOM_NAME_RE. The pattern
# takes every one of them (the plan decides which exist: fabric_emu.run.prepare).
SWITCH_NAME = r"[a-z][a-z0-9]{0,9}"
SWITCH_PORT_RE = rf"^{SWITCH_NAME}-eth[0-9]{{1,3}}$"
