"""Framework-free controller core: from the plan to the OpenFlow messages each switch needs.

faucet's split: this module decides, controller/app.py only translates the plain messages below
to os-ken objects. Nothing here imports os-ken, so it is tested in milliseconds with no switch.

Two tables on every switch (higher priority wins). Table 0 tags, table 1 routes:

  table 0  prio 1000  eth_type=0x8808 (MAC control, e.g. PFC) -> drop: it ends at the MAC
           prio 100   in_port=<p> -> eth_src=0e:fe:<port id of p>:00:00, goto table 1
  (the port id lets the egress port's BPF program charge the frame's bytes to the ingress port
  it came by, for PFC; see fabric_emu/ports/bpf/port.c. A router rewrites eth_src anyway.)

  table 1:
  prio 300  leaf:  ipv4_dst=<own host>/32        -> output:<host port>
  prio 250  leaf (spray): ipv4_dst=<other leaf's /24>, udp, udp_src=<b>/<entropies-1>
                                                 -> output:<uplink b mod n> (fabric_emu.spray)
  prio 200  leaf:  ipv4_dst=<other leaf's /24>   -> the leaf's uplink spreading (ECMP: group 1)
            spine: ipv4_dst=<leaf j's /24>       -> output:<port to leaf j>
  prio 100  ARP request                          -> controller (proxy ARP from the plan)
  prio 0    anything else                        -> drop (no flooding, ever)

Hosts ARP for each other directly (one /16) and get the true MAC from the controller, so frames
already carry the right eth_dst; switches rewrite only eth_src.
"""

from __future__ import annotations

import ipaddress
import struct
from dataclasses import dataclass
from typing import Callable, Union

from fabric_emu import spray
from fabric_emu.plan import FabricPlan, Host, Switch
from fabric_emu.ports.model import port_ends

TAG_TABLE = 0
ROUTE_TABLE = 1
PRIO_MAC_CONTROL = 1000
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
# OXM names (os-ken's OFPMatch keywords); ovs-ofctl shows them as ip_src, ip_dst, udp_src, udp_dst.
# The UDP source port is a RoCEv2 queue pair's entropy: OVS's default select hash ignores it.
ECMP_HASH_FIELDS = ("ipv4_src", "ipv4_dst", "udp_src", "udp_dst")

LB_MODES = ("ecmp", "dlb", "spray")


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


Action = Union[Output, ToGroup, ToController, SetEthSrc]


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


@dataclass(frozen=True)
class Bucket:
    bucket_id: int
    actions: tuple[Action, ...]


@dataclass(frozen=True)
class Group:
    group_id: int
    type: str  # "select" | "all" | "indirect" | "ff"
    buckets: tuple[Bucket, ...]
    hash_fields: tuple[str, ...] = ()  # select groups: OVS selection_method=hash over these


@dataclass(frozen=True)
class PacketOut:
    out_port: int
    data: bytes


Message = Union[ResetSwitch, Flow, Group, PacketOut]


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

    spray_entropies: int | None = None  # None: fabric_emu.spray.default_entropies


def ecmp_uplinks(plan: FabricPlan, leaf: Switch, options: LbOptions) -> UplinkSpread:
    """One select group, one bucket per uplink, hashed on the IP/UDP 4-tuple."""
    buckets = tuple(Bucket(i, (Output(p.port),)) for i, p in enumerate(plan.uplinks(leaf.name)))
    group = Group(ECMP_GROUP_ID, "select", buckets, ECMP_HASH_FIELDS)
    return UplinkSpread((group,), ToGroup(ECMP_GROUP_ID))


def spray_uplinks(plan: FabricPlan, leaf: Switch, options: LbOptions) -> UplinkSpread:
    """UDP packets go up the uplink their source port's low bits name (the NIC rotates those
    bits per packet, fabric_emu.spray); anything else is spread as ECMP spreads it."""
    uplinks = plan.uplinks(leaf.name)
    n = options.spray_entropies or spray.default_entropies(len(uplinks))
    mask = n - 1
    refinements = tuple(({"ip_proto": IP_PROTO_UDP, "udp_src": (b, mask)}, Output(uplinks[u].port))
                        for b, u in enumerate(spray.bucket_uplinks(n, len(uplinks))))
    ecmp = ecmp_uplinks(plan, leaf, options)
    return UplinkSpread(ecmp.groups, ecmp.action, refinements)


# "dlb" (flowlets on observed port load) adds its builder here.
UplinkBuilder = Callable[[FabricPlan, Switch, LbOptions], UplinkSpread]
UPLINK_BUILDERS: dict[str, UplinkBuilder] = {"ecmp": ecmp_uplinks, "spray": spray_uplinks}


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


def _ipv4_dst(net: ipaddress.IPv4Network) -> dict:
    return {"eth_type": ETH_TYPE_IPV4, "ipv4_dst": (str(net.network_address), str(net.netmask))}


class FabricCore:
    """Everything the controller decides, as plain messages, for one plan and LB mode."""

    def __init__(self, plan: FabricPlan, lb_mode: str = "ecmp", options: LbOptions = LbOptions()):
        self.plan = plan
        self.lb_mode = lb_mode
        self.options = options
        self._spread_uplinks = uplink_builder(lb_mode)
        self._switch_by_dpid = {s.dpid: s for s in plan.switches}
        self._host_by_ip = {h.ip: h for h in plan.hosts}
        self._prefix = leaf_prefixes(plan)
        self._port_ids: dict[str, dict[int, int]] = {}
        for end in port_ends(plan):
            if end.role == "switch":
                self._port_ids.setdefault(end.node, {})[end.port] = end.id

    def expected_dpids(self) -> list[int]:
        return sorted(self._switch_by_dpid)

    def switch_up(self, dpid: int) -> list[Message]:
        """Everything a switch needs, proactively: groups before the flows that use them."""
        switch = self._switch_by_dpid.get(dpid)
        if switch is None:
            raise KeyError(f"dpid {dpid:#x} is not in plan {self.plan.name}")
        if switch.role == "leaf":
            groups, flows = self._leaf_rules(switch)
        else:
            groups, flows = (), self._spine_flows(switch)
        arp_request = {"eth_type": ETH_TYPE_ARP, "arp_op": ARP_REQUEST}
        arp = Flow(ROUTE_TABLE, PRIO_ARP, arp_request, (ToController(),))
        miss = Flow(ROUTE_TABLE, PRIO_MISS, {}, ())
        return [ResetSwitch(), *groups, *flows, arp, miss, *self._tag_flows(switch)]

    def _tag_flows(self, switch: Switch) -> list[Flow]:
        """Table 0: MAC control frames end here; everything else is tagged with its in_port's id."""
        mac_control = Flow(TAG_TABLE, PRIO_MAC_CONTROL, {"eth_type": ETH_TYPE_MAC_CONTROL}, ())
        return [mac_control] + [
            Flow(TAG_TABLE, PRIO_TAG, {"in_port": port}, (SetEthSrc(ingress_tag(port_id)),), ROUTE_TABLE)
            for port, port_id in sorted(self._port_ids[switch.name].items())]

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

    def _leaf_rules(self, leaf: Switch) -> tuple[tuple[Group, ...], list[Flow]]:
        local = [Flow(ROUTE_TABLE, PRIO_LOCAL_HOST, {"eth_type": ETH_TYPE_IPV4, "ipv4_dst": h.ip},
                      (Output(h.leaf_port),))
                 for h in self.plan.hosts if h.leaf == leaf.name]
        spread = self._spread_uplinks(self.plan, leaf, self.options)
        remote = []
        for name, net in self._prefix.items():
            if name == leaf.name:
                continue
            remote.append(Flow(ROUTE_TABLE, PRIO_PREFIX, _ipv4_dst(net), (spread.action,)))
            remote += [Flow(ROUTE_TABLE, PRIO_SPRAY, {**_ipv4_dst(net), **extra}, (action,))
                       for extra, action in spread.refinements]
        return spread.groups, local + remote

    def _spine_flows(self, spine: Switch) -> list[Flow]:
        port_to = {p.peer: p.port for p in self.plan.ports(spine.name)}
        return [Flow(ROUTE_TABLE, PRIO_PREFIX, _ipv4_dst(net), (Output(port_to[name]),))
                for name, net in self._prefix.items()]
