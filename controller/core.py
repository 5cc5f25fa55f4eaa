"""Framework-free controller core: from the plan to the OpenFlow messages each switch needs.

faucet's split: this module decides, controller/app.py only translates the plain messages below
to os-ken objects. Nothing here imports os-ken, so it is tested in milliseconds with no switch.

Two tables on every switch (higher priority wins). Table 0 tags, table 1 routes:

  table 0  prio 1000  eth_type=0x8808 (MAC control, e.g. PFC) -> drop: it ends at the MAC
           prio 900   in_port=<p>, ip, nw_ttl=0 or 1 -> drop (a router's TTL expiry; the flows'
                      packet counts are each port's ttl_expired, cookie TTL_COOKIE)
           prio 100   in_port=<p> -> eth_src=0e:fe:<port id of p>:00:00, goto table 1
  (the port id lets the egress port's BPF program charge the frame's bytes to the ingress port
  it came by, for PFC; see fabric_emu/ports/bpf/port.c. A router rewrites eth_src anyway.)

  table 1 (every IPv4 route decrements the TTL first, as a router does):
  prio 300  leaf:  ipv4_dst=<own host>/32        -> output:<host port>
  prio 280  pinned paths (`paths:`): ipv4_src=<src>, ipv4_dst=<dst> -> output:<next switch on the path>
  prio 250  leaf (spray): ipv4_dst=<other leaf's /24>, udp, udp_src=<b>/<entropies-1>
                                                 -> output:<uplink b mod n> (fabric_emu.lb.spray)
            leaf (dlb):   ipv4_dst=<other leaf's /24>, udp, nw_ttl=192+i
                                                 -> output:<uplink i> (the flowlet stage's choice,
                                                    fabric_emu/ports/bpf/port.c)
  prio 200  leaf:  ipv4_dst=<other leaf's /24>   -> the leaf's uplink spreading (ECMP: group 1)
            spine: ipv4_dst=<leaf j's /24>       -> output:<port to leaf j>
  prio 100  ARP request                          -> controller (proxy ARP from the plan)
  prio 0    anything else                        -> drop (no flooding, ever)

Fabrics of other kinds (fat-tree, rail-optimized) route every switch from the plan's graph
(graph_routes): at prio 200 each switch sends a leaf's /24 to its one next hop on a shortest
path, or to a select group over its equal-cost next hops (DEST_GROUP_BASE + the leaf's number,
ECMP-hashed with the switch's own seed); leaves add the prio 300 routes to their own hosts. A
link going down or up recomputes every switch's routes over the links that are up. Spraying and
DLB exist on leaf-spine fabrics only.

failover: local (the spec's `failover`) routes every kind by the graph, and wraps each route in a
fast-failover group (LOCAL_GROUP_BASE + the leaf's number): its first bucket is the route (one
port, or the select group over the equal-cost ports, whose buckets watch their ports so a dead
one is skipped), then one bucket per other switch neighbour that still reaches the leaf (the
local detour, a "bounce" in a Clos). Open vSwitch takes the first live bucket the moment a port
goes down; the controller recomputes the routes only after the convergence delay (or never).

Hosts ARP for each other directly (one /16) and get the true MAC from the controller, so frames
already carry the right eth_dst; switches rewrite only eth_src.
"""

from __future__ import annotations

import dataclasses
import ipaddress
import struct
from dataclasses import dataclass
from typing import Callable, Union

import networkx as nx

from fabric_emu.lb import spray
from fabric_emu.ports.dlb import TTL_BASE as DLB_TTL_BASE
from fabric_emu.topo.plan import FabricPlan, Host, Port, Switch
from fabric_emu.ports.model import port_ends

TAG_TABLE = 0
ROUTE_TABLE = 1
PRIO_MAC_CONTROL = 1000
PRIO_TTL_EXPIRED = 900
PRIO_PINNED = 280
PRIO_TAG = 100
PRIO_LOCAL_HOST = 300
PRIO_SPRAY = 250
PRIO_PREFIX = 200
PRIO_ARP = 100
PRIO_MISS = 0

ETH_TYPE_IPV4 = 0x0800
ETH_TYPE_ARP = 0x0806
ETH_TYPE_MAC_CONTROL = 0x8808
IP_PROTO_UDP = 17
ARP_REQUEST = 1
ARP_REPLY = 2

ECMP_GROUP_ID = 1
# While a link is down, a leaf reaches some leaves through fewer uplinks than the others: their
# routes use a group of their own, DEST_GROUP_BASE + the destination leaf's index.
DEST_GROUP_BASE = 100
# OXM names (os-ken's OFPMatch keywords); ovs-ofctl shows them as ip_src, ip_dst, udp_src, udp_dst.
# The UDP source port is a RoCEv2 queue pair's entropy: OVS's default select hash ignores it.
ECMP_HASH_FIELDS = ("ipv4_src", "ipv4_dst", "udp_src", "udp_dst")

LB_MODES = ("ecmp", "dlb", "spray")
# The flows a load-balancing mode adds on top of the routes carry this cookie, so a live mode
# change deletes exactly them and adds the new mode's (the routes and the ECMP group stay).
LB_COOKIE = 0x1B
TTL_COOKIE = 0x77  # the TTL-expiry drops of table 0 (their packet counts are ttl_expired)
PINNED_COOKIE = 0x9A
# failover: local: one fast-failover group per destination leaf, LOCAL_GROUP_BASE + its number
LOCAL_GROUP_BASE = 1000
PINNED_GROUP_BASE = 2000  # failover: local: a pinned path's hop, + its index in paths
FAILOVER_MODES = ("global", "local")


class Conflict(Exception):
    """A change that is valid but not possible in this run (e.g. spraying without NIC entropy)."""


# --------------------------------------------------------------------------- messages
@dataclass(frozen=True)
class Output:
    port: int


@dataclass(frozen=True)
class ToGroup:
    group_id: int


@dataclass(frozen=True)
class ToController:
    """Send the whole packet to the controller (no buffering)."""


@dataclass(frozen=True)
class SetEthSrc:
    mac: str


@dataclass(frozen=True)
class DecTtl:
    """Decrement the IPv4 TTL (a router's hop); table 0 has dropped TTL 0 and 1 already."""


@dataclass(frozen=True)
class Hairpin:
    """Let the output go back out the port the packet came in by (Open vSwitch skips an output to
    the in_port otherwise): clears the in_port. A detour may bounce a packet back where it came
    from, as a real switch would, and loops end by their TTL, not silently."""


Action = Union[Output, ToGroup, ToController, SetEthSrc, DecTtl, Hairpin]


@dataclass(frozen=True)
class ResetSwitch:
    """Delete every flow and group, so a reconnecting switch starts from a known state."""


@dataclass(frozen=True)
class Flow:
    table: int
    priority: int
    match: dict  # OXM field -> value, as os-ken's OFPMatch keywords; a prefix is (addr, mask)
    actions: tuple[Action, ...]  # empty (and no goto) = drop
    goto_table: int | None = None
    cookie: int = 0


@dataclass(frozen=True)
class DeleteFlows:
    """Delete every flow of a table that carries this cookie."""

    table: int
    cookie: int


@dataclass(frozen=True)
class Bucket:
    bucket_id: int
    actions: tuple[Action, ...]
    watch_port: int | None = None  # the bucket is live while this port is up (ff, select)
    watch_group: int | None = None  # ... or while this group has a live bucket


@dataclass(frozen=True)
class Group:
    group_id: int
    type: str  # "select" | "all" | "indirect" | "ff"
    buckets: tuple[Bucket, ...]
    hash_fields: tuple[str, ...] = ()  # select groups: OVS selection_method=hash over these
    hash_masks: tuple[tuple[str, int], ...] = ()  # fields hashed through a mask, not whole
    hash_basis: int = 0  # the hash's seed: each switch its own, so ECMP tiers do not polarise
    modify: bool = False  # replace an existing group's buckets (OFPGC_MODIFY), not add one


@dataclass(frozen=True)
class PacketOut:
    out_port: int
    data: bytes


Message = Union[ResetSwitch, Flow, DeleteFlows, Group, PacketOut]


# --------------------------------------------------------------------------- load balancing seam
@dataclass(frozen=True)
class UplinkSpread:
    """How a leaf spreads traffic over its uplinks: the groups, the action that enters them, and
    finer matches that win over it for the traffic they match (extra match fields, action)."""

    groups: tuple[Group, ...]
    action: Action
    refinements: tuple[tuple[dict, Action], ...] = ()


@dataclass(frozen=True)
class LbOptions:
    """Parameters of the load-balancing modes (from the experiment spec)."""

    # UDP source ports per QP the NICs rotate through (fabric_emu.lb.spray); None: one, the NICs do
    # not rotate (then only a spraying start may pick the default, and nothing can switch to it)
    spray_entropies: int | None = None


def ecmp_group(group_id: int, leaf: Switch, uplinks: list, options: LbOptions) -> Group:
    """A select group, one bucket per uplink, hashed on the IP/UDP 4-tuple with the leaf's own
    seed. When the NICs rotate entropy bits (a run that may spray), the hash leaves those bits
    out, so each QP still keeps one path."""
    buckets = tuple(Bucket(i, (Output(p.port),)) for i, p in enumerate(uplinks))
    n = options.spray_entropies or 1
    if n > 1:
        fields = tuple(f for f in ECMP_HASH_FIELDS if f != "udp_src")
        return Group(group_id, "select", buckets, fields, (("udp_src", 0xFFFF & ~(n - 1)),),
                     hash_basis=leaf.dpid)
    return Group(group_id, "select", buckets, ECMP_HASH_FIELDS, hash_basis=leaf.dpid)


def ecmp_uplinks(plan: FabricPlan, leaf: Switch, options: LbOptions, uplinks: list | None = None) -> UplinkSpread:
    """ECMP over the leaf's uplinks (or the given ones, while links are down): its group."""
    group = ecmp_group(ECMP_GROUP_ID, leaf, plan.uplinks(leaf.name) if uplinks is None else uplinks, options)
    return UplinkSpread((group,), ToGroup(ECMP_GROUP_ID))


def spray_uplinks(plan: FabricPlan, leaf: Switch, options: LbOptions, uplinks: list | None = None) -> UplinkSpread:
    """UDP packets go up the uplink their source port's low bits name (the NIC rotates those
    bits per packet, fabric_emu.lb.spray); anything else is spread as ECMP spreads it."""
    uplinks = plan.uplinks(leaf.name) if uplinks is None else uplinks
    if not uplinks:
        return UplinkSpread((), ToGroup(ECMP_GROUP_ID))
    n = options.spray_entropies or spray.default_entropies(len(plan.uplinks(leaf.name)))
    mask = n - 1
    refinements = tuple(({"ip_proto": IP_PROTO_UDP, "udp_src": (b, mask)}, Output(uplinks[u].port))
                        for b, u in enumerate(spray.bucket_uplinks(n, len(uplinks))))
    return UplinkSpread((), ToGroup(ECMP_GROUP_ID), refinements)


def dlb_uplinks(plan: FabricPlan, leaf: Switch, options: LbOptions, uplinks: list | None = None) -> UplinkSpread:
    """The flowlet stage (bpf/port.c, on the leaf's host links) writes its choice of uplink i
    into the IP TTL as DLB_TTL_BASE + i: one rule per uplink sends it there. Uplinks that
    cannot reach a destination are left out by the stage itself (its allowed masks), so the
    rules cover every uplink."""
    return UplinkSpread((), ToGroup(ECMP_GROUP_ID), tuple(
        ({"ip_proto": IP_PROTO_UDP, "nw_ttl": DLB_TTL_BASE + i}, Output(p.port))
        for i, p in enumerate(plan.uplinks(leaf.name))))


UplinkBuilder = Callable[..., UplinkSpread]  # (plan, leaf, options, uplinks=None)
UPLINK_BUILDERS: dict[str, UplinkBuilder] = {"ecmp": ecmp_uplinks, "spray": spray_uplinks,
                                             "dlb": dlb_uplinks}


def uplink_builder(lb_mode: str) -> UplinkBuilder:
    if lb_mode in UPLINK_BUILDERS:
        return UPLINK_BUILDERS[lb_mode]
    if lb_mode in LB_MODES:
        raise ValueError(f"load balancing '{lb_mode}' is not implemented yet "
                         f"(implemented: {', '.join(UPLINK_BUILDERS)})")
    raise ValueError(f"unknown load balancing '{lb_mode}' (allowed: {', '.join(LB_MODES)})")


# --------------------------------------------------------------------------- proxy ARP codec
_ETH = struct.Struct("!6s6sH")
_ARP = struct.Struct("!HHBBH6s4s6s4s")  # htype ptype hlen plen op sha spa tha tpa


@dataclass(frozen=True)
class ArpRequest:
    sender_mac: bytes
    sender_ip: str
    target_ip: str


def parse_arp_request(data: bytes) -> ArpRequest | None:
    """The Ethernet/IPv4 ARP request in a frame, or None for anything else."""
    if len(data) < _ETH.size + _ARP.size:
        return None
    _, _, eth_type = _ETH.unpack_from(data)
    if eth_type != ETH_TYPE_ARP:
        return None
    htype, ptype, hlen, plen, op, sha, spa, _, tpa = _ARP.unpack_from(data, _ETH.size)
    if (htype, ptype, hlen, plen, op) != (1, ETH_TYPE_IPV4, 6, 4, ARP_REQUEST):
        return None
    return ArpRequest(sha, str(ipaddress.IPv4Address(spa)), str(ipaddress.IPv4Address(tpa)))


def arp_reply(req: ArpRequest, target_mac: str) -> bytes:
    """The reply the owner of req.target_ip would send, as if it had heard the request."""
    mac = bytes.fromhex(target_mac.replace(":", ""))
    eth = _ETH.pack(req.sender_mac, mac, ETH_TYPE_ARP)
    arp = _ARP.pack(1, ETH_TYPE_IPV4, 6, 4, ARP_REPLY, mac,
                    ipaddress.IPv4Address(req.target_ip).packed,
                    req.sender_mac, ipaddress.IPv4Address(req.sender_ip).packed)
    return eth + arp


# --------------------------------------------------------------------------- the core
def ingress_tag(port_id: int) -> str:
    """The source MAC table 0 writes: 0e:fe, then the ingress port id (the egress id follows)."""
    return f"0e:fe:{port_id >> 8:02x}:{port_id & 0xff:02x}:00:00"


def leaf_prefixes(plan: FabricPlan) -> dict[str, ipaddress.IPv4Network]:
    """The /24 that holds each leaf's hosts (10.0.<leaf>.0/24); checks that it is one and unique."""
    prefixes: dict[str, ipaddress.IPv4Network] = {}
    for leaf in plan.leaves:
        nets = {ipaddress.ip_network(f"{h.ip}/24", strict=False)
                for h in plan.hosts if h.leaf == leaf.name}
        if len(nets) > 1:
            raise ValueError(f"{leaf.name}: hosts span several /24s ({sorted(map(str, nets))})")
        if nets:
            prefixes[leaf.name] = nets.pop()
    if len(set(prefixes.values())) != len(prefixes):
        raise ValueError("two leaves share a /24; routing by leaf prefix needs one /24 per leaf")
    return prefixes


def leaf_distances(plan: FabricPlan, down: set[frozenset[str]] = frozenset()) -> dict[str, dict[str, int]]:
    """Per leaf: the hop count from every switch that reaches it over the links that are up."""
    g = nx.Graph()
    g.add_nodes_from(plan.switch_by_name)
    g.add_edges_from((ln.a, ln.b) for ln in plan.links
                     if ln.kind == "fabric" and frozenset((ln.a, ln.b)) not in down)
    return {leaf.name: nx.single_source_shortest_path_length(g, leaf.name) for leaf in plan.leaves}


def graph_routes(plan: FabricPlan, switch: str, down: set[frozenset[str]],
                 dists: dict[str, dict[str, int]]) -> dict[str, list[Port]]:
    """Per leaf the switch reaches (dists: leaf_distances over the links not `down`): its ports
    on links that are up and start a shortest path to it (several = equal-cost next hops)."""
    ports = [p for p in plan.ports(switch) if frozenset((switch, p.peer)) not in down]
    return {leaf: [p for p in ports if dist.get(p.peer, -1) == dist[switch] - 1]
            for leaf, dist in dists.items() if leaf != switch and switch in dist}


def _ipv4_dst(net: ipaddress.IPv4Network) -> dict:
    return {"eth_type": ETH_TYPE_IPV4, "ipv4_dst": (str(net.network_address), str(net.netmask))}


def forward(actions: tuple[Action, ...], hairpin: bool = False) -> tuple[Action, ...]:
    """A route's actions as a router carries them out: the TTL goes down by one, then out (back
    out the in_port too, with hairpin). A route with no action stays a drop."""
    if not actions:
        return ()
    return (DecTtl(), Hairpin(), *actions) if hairpin else (DecTtl(), *actions)


def detours(plan: FabricPlan, switch: str, dest: str, primary: set[str]) -> list[Port]:
    """A switch's local detours toward leaf `dest` (failover: local): its ports to other switches
    than its primary next hops that reach `dest` without coming back through it, nearest first;
    ties rotate with the switch's index, so neighbouring switches spread their detours."""
    g = nx.Graph((ln.a, ln.b) for ln in plan.links if ln.kind == "fabric" and switch not in (ln.a, ln.b))
    if dest not in g:
        return []
    dist = nx.single_source_shortest_path_length(g, dest)
    ports = [p for p in plan.ports(switch)
             if p.kind == "fabric" and p.peer not in primary and p.peer in dist]
    if not ports:
        return []
    shift = plan.switch_by_name[switch].index
    order = {p.port: i for i, p in enumerate(ports)}
    return sorted(ports, key=lambda p: (dist[p.peer], (order[p.port] - shift) % len(ports)))


class FabricCore:
    """Everything the controller decides, as plain messages, for one plan and LB mode."""

    def __init__(self, plan: FabricPlan, lb_mode: str = "ecmp", options: LbOptions = LbOptions()):
        self.plan = plan
        self.lb_mode = lb_mode
        self.options = options
        # Leaf-spine fabrics have their own routing (and spraying and DLB on the leaves' uplinks);
        # every other kind routes by ECMP over the plan's graph at every switch (graph_routes).
        routing = plan.extra.get("routing", {})
        self.failover: str = routing.get("failover", "global")
        if self.failover not in FAILOVER_MODES:
            raise ValueError(f"failover {self.failover!r} (allowed: {', '.join(FAILOVER_MODES)})")
        self.pinned: list[dict] = routing.get("paths", [])
        # failover: local needs a route per destination at every switch (its fast-failover group),
        # so it routes leaf-spine fabrics by the graph too.
        self.by_graph = plan.kind != "leaf-spine" or self.failover == "local"
        if self.by_graph and lb_mode != "ecmp":
            why = "with failover: local" if plan.kind == "leaf-spine" else f"on leaf-spine fabrics only (this one is {plan.kind})"
            raise ValueError(f"load balancing '{lb_mode}' runs {why}; allowed: ecmp")
        self._spread_uplinks = uplink_builder(lb_mode)
        self.down: set[frozenset[str]] = set()  # links that are down, as {node, node}
        self._dists: dict[str, dict[str, int]] | None = None  # leaf_distances while self.down holds
        self._groups: dict[int, set[int]] = {}  # dpid -> group ids it has (add vs modify)
        self._switch_by_dpid = {s.dpid: s for s in plan.switches}
        self._host_by_ip = {h.ip: h for h in plan.hosts}
        self._prefix = leaf_prefixes(plan)
        self._port_ids: dict[str, dict[int, int]] = {}
        for end in port_ends(plan):
            if end.role == "switch":
                self._port_ids.setdefault(end.node, {})[end.port] = end.id

    def _forward(self, actions: tuple[Action, ...]) -> tuple[Action, ...]:
        """forward(), with hairpins where detours may send a packet back (failover: local)."""
        return forward(actions, hairpin=self.failover == "local")

    def switch_of(self, dpid: int) -> Switch | None:
        return self._switch_by_dpid.get(dpid)

    def expected_dpids(self) -> list[int]:
        return sorted(self._switch_by_dpid)

    def set_mode(self, lb_mode: str) -> dict[int, list[Message]]:
        """Change the load-balancing mode live: per leaf dpid, the messages that replace the old
        mode's flows with the new one's (the routes and the ECMP group stay as they are)."""
        builder = uplink_builder(lb_mode)
        if self.by_graph and lb_mode != "ecmp":
            raise Conflict(f"{lb_mode} runs on leaf-spine fabrics with failover: global only; "
                           f"this one is {self.plan.kind}, failover {self.failover}")
        if lb_mode == "spray" and not self.options.spray_entropies:
            raise Conflict("this run's NICs send one UDP source port per queue pair, so there is "
                           "nothing to spray; start the run with spray.entropies set (or "
                           "load_balancing: spray) to switch to spraying during it")
        self.lb_mode, self._spread_uplinks = lb_mode, builder
        return {leaf.dpid: [DeleteFlows(ROUTE_TABLE, LB_COOKIE), *self._lb_flows(leaf)]
                for leaf in self.plan.leaves}

    def switch_up(self, dpid: int) -> list[Message]:
        """Everything a switch needs, proactively: groups before the flows that use them."""
        switch = self._switch_by_dpid.get(dpid)
        if switch is None:
            raise KeyError(f"dpid {dpid:#x} is not in plan {self.plan.name}")
        self._groups[dpid] = set()
        if self.by_graph:
            groups, flows = self._graph_rules(switch)
        elif switch.role == "leaf":
            groups, flows = self._leaf_rules(switch)
        else:
            groups, flows = (), self._spine_flows(switch)
        arp_request = {"eth_type": ETH_TYPE_ARP, "arp_op": ARP_REQUEST}
        arp = Flow(ROUTE_TABLE, PRIO_ARP, arp_request, (ToController(),))
        miss = Flow(ROUTE_TABLE, PRIO_MISS, {}, ())
        pin_groups, pinned = self._pinned_rules(switch)
        return [ResetSwitch(), *groups, *pin_groups, *flows, *pinned, arp, miss, *self._tag_flows(switch)]

    def _tag_flows(self, switch: Switch) -> list[Flow]:
        """Table 0: MAC control frames end here; IPv4 packets whose TTL cannot go down once more
        die here, counted per port; everything else is tagged with its in_port's id."""
        mac_control = Flow(TAG_TABLE, PRIO_MAC_CONTROL, {"eth_type": ETH_TYPE_MAC_CONTROL}, ())
        ports = sorted(self._port_ids[switch.name].items())
        expired = [Flow(TAG_TABLE, PRIO_TTL_EXPIRED, {"in_port": port, "eth_type": ETH_TYPE_IPV4, "nw_ttl": ttl},
                        (), cookie=TTL_COOKIE) for port, _ in ports for ttl in (0, 1)]
        return [mac_control, *expired] + [
            Flow(TAG_TABLE, PRIO_TAG, {"in_port": port}, (SetEthSrc(ingress_tag(port_id)),), ROUTE_TABLE)
            for port, port_id in ports]

    def _pinned_rules(self, switch: Switch) -> tuple[list[Group], list[Flow]]:
        """The pinned paths' hops at this switch: from the source host to the destination host,
        out the port toward the path's next switch (failover: local: through a fast-failover
        group that detours when that port is down)."""
        groups, flows = [], []
        for i, path in enumerate(self.pinned):
            via = path["via"]
            if switch.name not in via[:-1]:
                continue
            if self.failover == "global" and any(frozenset(hop) in self.down for hop in zip(via, via[1:])):
                continue  # a link of the path is down: the pair is routed like any other until it is back
            nxt = via[via.index(switch.name) + 1]
            port = next(p for p in self.plan.ports(switch.name) if p.peer == nxt)
            actions: tuple[Action, ...] = (Output(port.port),)
            if self.failover == "local":
                dest = self.plan.host_by_name[path["dst"]].leaf
                gid = PINNED_GROUP_BASE + i
                groups.append(self._failover_group(gid, switch, dest, actions, {nxt}, watch_port=port.port))
                actions = (ToGroup(gid),)
            src, dst = self.plan.host_by_name[path["src"]], self.plan.host_by_name[path["dst"]]
            flows.append(Flow(ROUTE_TABLE, PRIO_PINNED, {"eth_type": ETH_TYPE_IPV4, "ipv4_src": src.ip,
                                                         "ipv4_dst": dst.ip}, self._forward(actions), cookie=PINNED_COOKIE))
        return list(self._add_or_modify(switch, groups)), flows

    def _pinned_messages(self, switch: Switch) -> list[Message]:
        """The pinned paths' flows at a switch again, for the links up now."""
        groups, flows = self._pinned_rules(switch)
        return [DeleteFlows(ROUTE_TABLE, PINNED_COOKIE), *groups, *flows] if self.pinned else []

    def _failover_group(self, gid: int, switch: Switch, dest: str, primary: tuple[Action, ...],
                        primary_peers: set[str], watch_port: int | None = None,
                        watch_group: int | None = None) -> Group:
        """A fast-failover group: the primary route while it is live, then the local detours."""
        buckets = [Bucket(0, primary, watch_port=watch_port, watch_group=watch_group)]
        buckets += [Bucket(i, (Output(p.port),), watch_port=p.port)
                    for i, p in enumerate(detours(self.plan, switch.name, dest, primary_peers), 1)]
        return Group(gid, "ff", tuple(buckets))

    def packet_in(self, dpid: int, in_port: int, data: bytes) -> list[Message]:
        """Proxy ARP: answer a request for any planned host with its MAC; ignore everything else."""
        req = parse_arp_request(data)
        if req is None:
            return []
        target = self._host_by_ip.get(req.target_ip)
        if target is None or self._is_attached(target, dpid, in_port):
            return []  # unknown address, or a host probing its own address (DAD, gratuitous ARP)
        return [PacketOut(in_port, arp_reply(req, target.mac))]

    def _is_attached(self, host: Host, dpid: int, port: int) -> bool:
        switch = self._switch_by_dpid.get(dpid)
        return switch is not None and switch.name == host.leaf and port == host.leaf_port

    def link_changed(self, a: str, b: str, up: bool) -> dict[int, list[Message]]:
        """The link between nodes a and b went down (or came back): per leaf dpid, the messages
        that route around it. Every leaf may change: a spine that lost its link to leaf L can
        no longer carry anyone's traffic to L."""
        link = frozenset((a, b))
        if up:
            self.down.discard(link)
        else:
            self.down.add(link)
        if self.by_graph:  # any switch may route differently now
            return self.reroute_all()
        out = {}
        for leaf in self.plan.leaves:
            groups, routes = self._leaf_routing(leaf)
            out[leaf.dpid] = [*groups, *routes, DeleteFlows(ROUTE_TABLE, LB_COOKIE), *self._lb_flows(leaf),
                              *self._pinned_messages(leaf)]
        for spine in self.plan.spines if self.pinned else ():
            out[spine.dpid] = self._pinned_messages(spine)
        return out

    def reroute_all(self) -> dict[int, list[Message]]:
        """Every switch's routes over the links that are up now (graph routing)."""
        self._dists = None
        return {sw.dpid: [*groups, *routes, *self._pinned_messages(sw)] for sw in self.plan.switches
                for groups, routes in [self._graph_routing(sw)]}

    def link_of(self, dpid: int, port: int) -> tuple[str, str] | None:
        """The (node, peer) of a switch port between two switches; None for a host port."""
        switch = self._switch_by_dpid.get(dpid)
        if switch is None:
            return None
        for p in self.plan.ports(switch.name):
            if p.port == port and p.kind == "fabric":
                return switch.name, p.peer
        return None

    def leaf_number(self, leaf: Switch) -> int:
        """The number the flowlet stage knows a leaf by: its hosts' 10.0.<n>.0/24."""
        return int(self._prefix[leaf.name].network_address.packed[2])

    def dlb_allowed(self, leaf: Switch) -> dict[int, int]:
        """Destination leaf number -> bitmask of this leaf's uplink indexes that reach it."""
        index = {p.port: i for i, p in enumerate(self.plan.uplinks(leaf.name))}
        by_name = {s.name: s for s in self.plan.leaves}
        return {self.leaf_number(by_name[name]): sum(1 << index[p.port] for p in self._usable_uplinks(leaf, name))
                for name in self._prefix if name != leaf.name}

    def link_ends(self, a: str, b: str) -> list[tuple[int, int]]:
        """(dpid, port) of both ends of the link between switches a and b."""
        by_name = {s.name: s for s in self.plan.switches}
        return ([(by_name[a].dpid, p.port) for p in self.plan.ports(a) if p.peer == b]
                + [(by_name[b].dpid, p.port) for p in self.plan.ports(b) if p.peer == a])

    def _usable_uplinks(self, leaf: Switch, dest: str) -> list:
        """The leaf's uplinks whose spine still reaches leaf dest (both links up)."""
        return [p for p in self.plan.uplinks(leaf.name)
                if frozenset((leaf.name, p.peer)) not in self.down
                and frozenset((p.peer, dest)) not in self.down]

    def _local_hosts(self, leaf: Switch) -> list[Flow]:
        return [Flow(ROUTE_TABLE, PRIO_LOCAL_HOST, {"eth_type": ETH_TYPE_IPV4, "ipv4_dst": h.ip},
                     self._forward((Output(h.leaf_port),)))
                for h in self.plan.hosts if h.leaf == leaf.name]

    def _leaf_rules(self, leaf: Switch) -> tuple[tuple[Group, ...], list[Flow]]:
        groups, routes = self._leaf_routing(leaf)
        return groups, self._local_hosts(leaf) + routes + self._lb_flows(leaf)

    def _graph_rules(self, switch: Switch) -> tuple[tuple[Group, ...], list[Flow]]:
        groups, routes = self._graph_routing(switch)
        local = self._local_hosts(switch) if switch.role == "leaf" else []
        return groups, local + routes

    def _graph_routing(self, switch: Switch) -> tuple[tuple[Group, ...], list[Flow]]:
        """A route to every other leaf's /24: its one next hop, a select group over several
        (group DEST_GROUP_BASE + the leaf's number, hashed like the leaves' ECMP group with this
        switch's own seed), or a drop while no path is up."""
        if self._dists is None:
            self._dists = leaf_distances(self.plan, self.down)
        hops = graph_routes(self.plan, switch.name, self.down, self._dists)
        groups, routes = [], []
        for name, net in self._prefix.items():
            if name == switch.name:
                continue
            ports = hops.get(name, [])
            number = self.leaf_number(self.plan.switch_by_name[name])
            local = self.failover == "local" and ports
            watch: dict = {}
            if len(ports) > 1:
                gid = DEST_GROUP_BASE + number
                group = ecmp_group(gid, switch, ports, self.options)
                if local:  # a dead equal-cost port drops out of the spreading at once
                    group = dataclasses.replace(group, buckets=tuple(
                        dataclasses.replace(b, watch_port=p.port) for b, p in zip(group.buckets, ports)))
                    watch = {"watch_group": gid}
                groups.append(group)
                actions: tuple[Action, ...] = (ToGroup(gid),)
            else:
                actions = tuple(Output(p.port) for p in ports)
                watch = {"watch_port": ports[0].port} if ports else {}
            if local:
                gid = LOCAL_GROUP_BASE + number
                groups.append(self._failover_group(gid, switch, name, actions, {p.peer for p in ports}, **watch))
                actions = (ToGroup(gid),)
            routes.append(Flow(ROUTE_TABLE, PRIO_PREFIX, _ipv4_dst(net), self._forward(actions)))
        return self._add_or_modify(switch, groups), routes

    def _add_or_modify(self, switch: Switch, groups: list[Group]) -> tuple[Group, ...]:
        """Add a group the first time, modify it afterwards."""
        have = self._groups.setdefault(switch.dpid, set())
        out = []
        for g in groups:
            out.append(dataclasses.replace(g, modify=g.group_id in have))
            have.add(g.group_id)
        return tuple(out)

    def _leaf_routing(self, leaf: Switch) -> tuple[tuple[Group, ...], list[Flow]]:
        """The routes to other leaves and the groups they use. The routes and the ECMP group
        are the same in every mode (the mode adds its flows); while links are down, a leaf
        reached through fewer uplinks gets a group of its own."""
        full = self.plan.uplinks(leaf.name)
        groups = [ecmp_group(ECMP_GROUP_ID, leaf, full, self.options)]
        routes = []
        for i, (name, net) in enumerate(self._prefix.items()):
            if name == leaf.name:
                continue
            usable = self._usable_uplinks(leaf, name)
            if len(usable) == len(full):
                action: Action = ToGroup(ECMP_GROUP_ID)
            else:
                gid = DEST_GROUP_BASE + i
                groups.append(ecmp_group(gid, leaf, usable, self.options))
                action = ToGroup(gid)
            routes.append(Flow(ROUTE_TABLE, PRIO_PREFIX, _ipv4_dst(net), forward((action,)) if usable else ()))
        return self._add_or_modify(leaf, groups), routes

    def _lb_flows(self, leaf: Switch) -> list[Flow]:
        """The current mode's flows on a leaf, above the routes (cookie LB_COOKIE), over the
        uplinks that reach each destination."""
        flows = []
        for name, net in self._prefix.items():
            if name == leaf.name:
                continue
            spread = self._spread_uplinks(self.plan, leaf, self.options, self._usable_uplinks(leaf, name))
            flows += [Flow(ROUTE_TABLE, PRIO_SPRAY, {**_ipv4_dst(net), **extra}, forward((action,)), cookie=LB_COOKIE)
                      for extra, action in spread.refinements]
        return flows

    def _spine_flows(self, spine: Switch) -> list[Flow]:
        port_to = {p.peer: p.port for p in self.plan.ports(spine.name)}
        return [Flow(ROUTE_TABLE, PRIO_PREFIX, _ipv4_dst(net), forward((Output(port_to[name]),)))
                for name, net in self._prefix.items()]
