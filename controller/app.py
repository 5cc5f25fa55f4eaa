"""Thin os-ken app: OpenFlow 1.5 events in, FabricCore calls, os-ken messages out.

OpenFlow 1.5 because only there can a group carry OVS's Netronome selection-method property,
the one way to make a select group hash the UDP source port (the RoCEv2 entropy); bridges must
list OpenFlow15 in their protocols.

Configuration arrives as os_ken.cfg options in group [fabric] (controller/__main__.py sets them):
  plan        path of the plan JSON (FabricPlan.to_json())
  ready_file  written atomically, as {"dpids": [...], "time": ...}, once every planned switch
              has answered the barrier that follows its initial messages without an error
  lb_mode     ecmp | spray (dlb later)
  spray_entropies  UDP source ports per QP the NICs rotate through (0: one, no spraying)
  rest_port   the REST API's TCP port (controller/rest.py; 0: none), on rest_host (loopback)
  bpf_pins    the run's pinned BPF maps: the DLB stage's table is configured through them
  dlb_inactivity_ns, dlb_window_ns   the DLB stage's flowlet gap and quality window (wall ns)

A switch that connects is synchronised warm (controller/sync.py): the app reads its ports, flows
and groups, and sends only the difference from what the core wants, so a restarted controller
(or a switch that reconnects) never wipes tables the switch kept forwarding on. What a restart
loses, and why that is acceptable:
  - link state: rebuilt from the port descriptions of every switch that connects holding flows
    (a link is down when either end is; a switch with empty tables is new, as planned); routes are computed over the links up then, at once: with failover: local a
    pending convergence delay ends at the restart (the detours were only ever a stopgap);
  - the load-balancing mode set live: read back from a leaf's LB_COOKIE flows (observed_lb_mode);
    DLB's live timing parameters go back to the run's (the spec's), its flowlet state lives in
    the BPF table and is kept;
  - the history of live changes (REST `changes`, `link_changes`): the new process starts its own;
    the run records the outage itself (fabric_emu.fabric.keeper).
"""

from __future__ import annotations

import json
import logging
import os
import struct
import time
from collections.abc import Iterable
from pathlib import Path

from os_ken import cfg
from os_ken.base import app_manager
from os_ken.controller import ofp_event
from os_ken.controller.controller import Datapath
from os_ken.controller.handler import (CONFIG_DISPATCHER, DEAD_DISPATCHER, MAIN_DISPATCHER,
                                       set_ev_cls)
from os_ken.lib import hub
from os_ken.ofproto import ofproto_v1_5 as ofp
from os_ken.ofproto import ofproto_v1_5_parser as parser

from controller.core import (TTL_COOKIE, UPLINK_BUILDERS, Action, Bucket, Conflict, DecTtl, DeleteFlows, FabricCore,
                             Hairpin, Flow, Group, LbOptions, Message, Output, PacketOut, ResetSwitch, SetEthSrc,
                             ToController, ToGroup)
from controller.rest import make_app
from controller.sync import DeleteFlow, DeleteGroup, SyncCounts, Unknown, observed_lb_mode, plan_sync
from fabric_emu.spec import units
from fabric_emu.topo.plan import FabricPlan
from fabric_emu.ports.dlb import DlbTable

LOG = logging.getLogger("fabric_emu.controller")
LOAD_POLL_S = 1.0  # how often the REST API's uplink loads are refreshed (OpenFlow port stats)
BARRIER_TIMEOUT_S = 5.0
READ_TABLES_TIMEOUT_S = 5.0  # a warm start's wait for a switch's ports, flows and groups

cfg.CONF.register_opts([
    cfg.StrOpt("plan", help="plan JSON file"),
    cfg.StrOpt("ready_file", help="written once every planned switch is programmed"),
    cfg.StrOpt("lb_mode", default="ecmp", help="ecmp | dlb | spray"),
    cfg.IntOpt("spray_entropies", default=0, help="spray: UDP source ports per QP (0: default)"),
    cfg.IntOpt("rest_port", default=0, help="REST API port (0: no REST API)"),
    cfg.StrOpt("rest_host", default="127.0.0.1", help="REST API address"),
    cfg.StrOpt("bpf_pins", default="", help="the run's pinned BPF objects (DLB's table)"),
    cfg.IntOpt("dlb_inactivity_ns", default=100_000_000, help="DLB flowlet gap, wall ns"),
    cfg.IntOpt("dlb_window_ns", default=40_000_000, help="DLB quality window, wall ns"),
], group="fabric")

# Open vSwitch's select-group extension (include/openflow/netronome-ext.h).
NTR_VENDOR_ID = 0x0000154D
NTRT_SELECTION_METHOD = 1

GROUP_TYPES = {"select": ofp.OFPGT_SELECT, "all": ofp.OFPGT_ALL,
               "indirect": ofp.OFPGT_INDIRECT, "ff": ofp.OFPGT_FF}


class NtrSelectionMethod(parser.OFPGroupPropExperimenter):
    """struct ntr_group_prop_selection_method, then its field array, padded to 8 bytes.

    os-ken's experimenter property packs its data as 32-bit words, but OVS takes every byte up
    to `length` (which excludes the pad) as OXM TLVs, so the body is packed here byte-exact.
    """

    def __init__(self, method: str, fields: tuple[str, ...], param: int = 0,
                 masks: tuple[tuple[str, int], ...] = ()):
        super().__init__(type_=ofp.OFPGPT_EXPERIMENTER, experimenter=NTR_VENDOR_ID,
                         exp_type=NTRT_SELECTION_METHOD)
        self.body = (struct.pack("!4x16sQ", method.encode(), param)
                     + b"".join(_field_mask_tlv(f) for f in fields)
                     + b"".join(_field_mask_tlv(f, m) for f, m in masks))

    def serialize(self) -> bytearray:
        self.length = 12 + len(self.body)
        buf = bytearray(struct.pack("!HHII", self.type, self.length, self.experimenter,
                                    self.exp_type) + self.body)
        return buf + bytes(-len(buf) % 8)


def _field_mask_tlv(name: str, mask: int | None = None) -> bytes:
    """An OXM TLV whose value is the mask to hash the field through (oxm_pull_field_array):
    all ones (the whole field) unless a mask is given."""
    header = bytearray()
    ofp.oxm_serialize_header(ofp.oxm_from_user_header(name), header, 0)
    width = header[3]  # the header's last byte is the value length
    return bytes(header) + (b"\xff" * width if mask is None else mask.to_bytes(width, "big"))


# Nicira extension fields (class 0x0001) that os-ken would put first: Open vSwitch checks each
# field's prerequisites as it parses them, so nw_ttl must come after eth_type.
_NXM_LAST = frozenset({"nw_ttl"})


def _match(fields: dict) -> parser.OFPMatch:
    m = parser.OFPMatch(**fields)
    if _NXM_LAST.isdisjoint(fields):
        return m
    return parser.OFPMatch(_ordered_fields=sorted(m._fields2, key=lambda kv: kv[0] in _NXM_LAST))


def _actions(actions: Iterable[Action]) -> list[parser.OFPAction]:
    out = []
    for a in actions:
        match a:
            case Output(port):
                out.append(parser.OFPActionOutput(port))
            case ToGroup(group_id):
                out.append(parser.OFPActionGroup(group_id))
            case ToController():
                out.append(parser.OFPActionOutput(ofp.OFPP_CONTROLLER, ofp.OFPCML_NO_BUFFER))
            case SetEthSrc(mac):
                out.append(parser.OFPActionSetField(eth_src=mac))
            case DecTtl():
                out.append(parser.OFPActionDecNwTtl())
            case Hairpin():  # Open vSwitch's idiom, in_port = 0 through its 16-bit NXM field (the
                out.append(parser.OFPActionSetField(in_port_nxm=0))  # OXM one refuses port 0)
    return out


def _watch(port: int | None, group: int | None) -> list:
    """OpenFlow 1.5 bucket properties that make a bucket live only while a port (or a group) is."""
    props = []
    if port is not None:
        props.append(parser.OFPGroupBucketPropWatch(type_=ofp.OFPGBPT_WATCH_PORT, watch=port))
    if group is not None:
        props.append(parser.OFPGroupBucketPropWatch(type_=ofp.OFPGBPT_WATCH_GROUP, watch=group))
    return props


def to_ofp(dp: Datapath, msg: Message | DeleteFlow | DeleteGroup) -> list[parser.MsgBase]:
    """The os-ken messages that carry one core message."""
    match msg:
        case ResetSwitch():
            return [parser.OFPFlowMod(dp, table_id=ofp.OFPTT_ALL, command=ofp.OFPFC_DELETE,
                                      out_port=ofp.OFPP_ANY, out_group=ofp.OFPG_ANY,
                                      match=parser.OFPMatch()),
                    parser.OFPGroupMod(dp, command=ofp.OFPGC_DELETE, group_id=ofp.OFPG_ALL)]
        case Group():
            buckets = [parser.OFPBucket(bucket_id=b.bucket_id, actions=_actions(b.actions),
                                        properties=_watch(b.watch_port, b.watch_group))
                       for b in msg.buckets]
            props = ([NtrSelectionMethod("hash", msg.hash_fields, msg.hash_basis, masks=msg.hash_masks)]
                     if msg.hash_fields or msg.hash_masks else [])
            command = ofp.OFPGC_MODIFY if msg.modify else ofp.OFPGC_ADD
            return [parser.OFPGroupMod(dp, command=command, type_=GROUP_TYPES[msg.type],
                                       group_id=msg.group_id, buckets=buckets, properties=props)]
        case Flow():
            inst = [parser.OFPInstructionActions(ofp.OFPIT_APPLY_ACTIONS, _actions(msg.actions))]
            if msg.goto_table is not None:
                inst.append(parser.OFPInstructionGotoTable(msg.goto_table))
            return [parser.OFPFlowMod(dp, table_id=msg.table, priority=msg.priority, cookie=msg.cookie,
                                      match=_match(msg.match), instructions=inst)]
        case DeleteFlows(table, cookie):
            return [parser.OFPFlowMod(dp, table_id=table, command=ofp.OFPFC_DELETE, cookie=cookie,
                                      cookie_mask=0xFFFFFFFFFFFFFFFF, out_port=ofp.OFPP_ANY,
                                      out_group=ofp.OFPG_ANY, match=parser.OFPMatch())]
        case DeleteFlow(table, priority, match):
            return [parser.OFPFlowMod(dp, table_id=table, command=ofp.OFPFC_DELETE_STRICT, priority=priority,
                                      out_port=ofp.OFPP_ANY, out_group=ofp.OFPG_ANY, match=_match(match))]
        case DeleteGroup(group_id):
            return [parser.OFPGroupMod(dp, command=ofp.OFPGC_DELETE, group_id=group_id)]
        case PacketOut():
            return [parser.OFPPacketOut(dp, buffer_id=ofp.OFP_NO_BUFFER,
                                        match=parser.OFPMatch(in_port=ofp.OFPP_CONTROLLER),
                                        actions=_actions([Output(msg.out_port)]), data=msg.data)]
    raise TypeError(f"no OpenFlow translation for {msg!r}")


def write_ready(path: str, dpids: list[int], syncs: dict | None = None) -> None:
    """Atomically, so a poller never reads half a file. syncs: per dpid (hex), what its warm
    start sent (SyncCounts.as_dict) and when."""
    tmp = Path(f"{path}.tmp")
    tmp.write_text(json.dumps({"dpids": dpids, "time": time.time(), "syncs": syncs or {}}))
    os.replace(tmp, path)


# ---------------------------------------------------------------------- reading tables back
def _bucket(buf: bytes, offset: int) -> parser.OFPBucket:
    """OFPBucket.parser, mended the same way: a bucket's properties end where the bucket does."""
    b = parser.OFPBucket()
    start = offset
    b.len, b.action_array_len, b.bucket_id = struct.unpack_from(ofp.OFP_BUCKET_PACK_STR, buf, offset)
    offset += ofp.OFP_BUCKET_SIZE
    action_buf = buf[offset:offset + b.action_array_len]
    b.actions = []
    while action_buf:
        action = parser.OFPAction.parser(action_buf, 0)
        b.actions.append(action)
        action_buf = action_buf[action.len:]
    rest = buf[offset + b.action_array_len:start + b.len]
    b.properties = []
    while rest:
        prop, rest = parser.OFPGroupBucketProp.parse(rest)
        b.properties.append(prop)
    return b


def _group_desc_parser(cls, buf, offset):
    """OFPGroupDescStats.parser, mended: os-ken 4 parses an entry's properties (and each
    bucket's) from its offset to offset + length (the whole entry's length), so with several
    groups (buckets) it reads the next ones as properties, and fails. Here the properties end
    where the entry does, and their raw bytes are kept (raw_properties) for the
    selection-method property, which os-ken cannot read."""
    stats = cls()
    start = offset
    (stats.length, stats.type, stats.group_id,
     stats.bucket_array_len) = struct.unpack_from(ofp.OFP_GROUP_DESC_STATS_PACK_STR, buf, offset)
    offset += ofp.OFP_GROUP_DESC_STATS_SIZE
    bucket_buf = buf[offset:offset + stats.bucket_array_len]
    stats.buckets = []
    while bucket_buf:
        bucket = _bucket(bucket_buf, 0)
        stats.buckets.append(bucket)
        bucket_buf = bucket_buf[bucket.len:]
    offset += stats.bucket_array_len
    stats.raw_properties = bytes(buf[offset:start + stats.length])
    stats.properties = []
    return stats


parser.OFPGroupDescStats.parser = classmethod(_group_desc_parser)


def _selection_method(raw: bytes) -> tuple[tuple[str, ...], tuple[tuple[str, int], ...], int] | None:
    """(fields hashed whole, (field, mask) hashed through a mask, basis) from a group's raw
    properties (Open vSwitch's ntr_group_prop_selection_method); None if it has none."""
    off = 0
    while off + 4 <= len(raw):
        ptype, length = struct.unpack_from("!HH", raw, off)
        if length < 4:
            return None
        if ptype == ofp.OFPGPT_EXPERIMENTER and length >= 12:
            exp, exp_type = struct.unpack_from("!II", raw, off + 4)
            if exp == NTR_VENDOR_ID and exp_type == NTRT_SELECTION_METHOD:
                body = raw[off + 12:off + length]
                basis = struct.unpack_from("!Q", body, 20)[0]
                whole, masked, pos = [], [], 28
                while pos + 4 <= len(body):
                    (header,) = struct.unpack_from("!I", body, pos)
                    num, hdr_len = ofp.oxm_parse_header(body, pos)
                    value = body[pos + hdr_len:pos + 4 + (header & 0xFF)]
                    name = ofp.oxm_to_user_header(num)
                    if value == b"\xff" * len(value):
                        whole.append(name)
                    else:
                        masked.append((name, int.from_bytes(value, "big")))
                    pos += 4 + (header & 0xFF)
                return tuple(whole), tuple(masked), basis
        off += (length + 7) // 8 * 8
    return None


def from_ofp_actions(actions: Iterable) -> tuple:
    """The core actions an os-ken action list carries (the inverse of _actions)."""
    out: list = []
    for a in actions:
        if isinstance(a, parser.OFPActionOutput):
            out.append(ToController() if a.port == ofp.OFPP_CONTROLLER else Output(a.port))
        elif isinstance(a, parser.OFPActionGroup):
            out.append(ToGroup(a.group_id))
        elif isinstance(a, parser.OFPActionDecNwTtl):
            out.append(DecTtl())
        elif isinstance(a, parser.OFPActionSetField) and a.key == "eth_src":
            out.append(SetEthSrc(str(a.value).lower()))
        elif isinstance(a, parser.OFPActionSetField) and a.key in ("in_port_nxm", "in_port") and a.value == 0:
            out.append(Hairpin())
        else:
            out.append(Unknown(repr(a)))
    return tuple(out)


def from_ofp_flow(st) -> Flow:
    """A flow description (OFPFlowDesc) as a core Flow."""
    actions: tuple = ()
    goto = None
    for inst in st.instructions:
        if isinstance(inst, parser.OFPInstructionActions) and inst.type == ofp.OFPIT_APPLY_ACTIONS:
            actions += from_ofp_actions(inst.actions)
        elif isinstance(inst, parser.OFPInstructionGotoTable):
            goto = inst.table_id
        else:
            actions += (Unknown(repr(inst)),)
    match = {k: tuple(v) if isinstance(v, list) else v for k, v in st.match._fields2}
    return Flow(st.table_id, st.priority, match, actions, goto, st.cookie)


_GROUP_TYPE_NAMES = {v: k for k, v in GROUP_TYPES.items()}


def from_ofp_group(st) -> Group:
    """A group description (OFPGroupDescStats, read with _group_desc_parser) as a core Group."""
    buckets = []
    for b in st.buckets:
        watch_port = watch_group = None
        for prop in b.properties:
            if prop.type == ofp.OFPGBPT_WATCH_PORT and prop.watch != ofp.OFPP_ANY:
                watch_port = prop.watch
            elif prop.type == ofp.OFPGBPT_WATCH_GROUP and prop.watch != ofp.OFPG_ANY:
                watch_group = prop.watch
        buckets.append(Bucket(b.bucket_id, from_ofp_actions(b.actions), watch_port, watch_group))
    hashed = _selection_method(getattr(st, "raw_properties", b""))
    whole, masked, basis = hashed if hashed else ((), (), 0)
    return Group(st.group_id, _GROUP_TYPE_NAMES.get(st.type, f"type{st.type}"), tuple(buckets),
                 whole, masked, basis)


class FabricApp(app_manager.OSKenApp):
    OFP_VERSIONS = [ofp.OFP_VERSION]

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        conf = self.CONF.fabric
        self.core = FabricCore(FabricPlan.from_dict(json.loads(Path(conf.plan).read_text())),
                               conf.lb_mode, LbOptions(conf.spray_entropies or None))
        self.ready_file: str = conf.ready_file
        self.programmed: set[int] = set()  # answered their barrier with no error before it
        self.failed: set[int] = set()  # sent an error since their last switch_up
        self.datapaths: dict[int, Datapath] = {}
        self._barriers: dict[int, hub.Event] = {}  # xid -> what a live change waits on
        self.changes: list[dict] = []  # live mode changes, as the REST API reports them
        self.link_changes: list[dict] = []  # links that went down or came back, and the reroute
        self._port_up: dict[tuple[int, int], bool] = {}  # (dpid, port) -> as last reported
        self._ports: dict[int, dict[int, tuple[float, int, float]]] = {}  # dpid -> port -> (t, tx_bytes, bps)
        self._ttl: dict[str, dict[int, int]] = {}  # the last ttl_expired() answers
        self._replies: dict[int, list] = {}  # xid -> the bodies of a multipart reply a warm start awaits
        self.syncs: dict[str, dict] = {}  # dpid (hex) -> what its last warm start sent, and when
        LOG.info("plan %s, lb_mode %s, expecting dpids %s", self.core.plan.name, conf.lb_mode,
                 [hex(d) for d in self.core.expected_dpids()])
        if conf.rest_port:
            hub.spawn(self._serve_rest, conf.rest_host, conf.rest_port)
            hub.spawn(self._poll_uplinks)
        self.dlb: DlbTable | None = None  # the flowlet stage's table, once the run loaded it
        if conf.bpf_pins:
            hub.spawn(self._open_dlb, Path(conf.bpf_pins), conf.dlb_inactivity_ns, conf.dlb_window_ns)

    # ------------------------------------------------------------------ DLB's flowlet stage
    def _open_dlb(self, pins: Path, inactivity_ns: int, window_ns: int) -> None:
        """The run loads the port programs while switches connect: wait for the table, then set
        every leaf's stage up (enabled if the run starts in dlb). Fabrics routed by graph
        (fat-tree, rail-optimized) have no DLB: their stage stays unconfigured, so it passes all."""
        if self.core.by_graph:
            LOG.info("%s fabric: no DLB stage", self.core.plan.kind)
            return
        deadline = time.time() + 300
        while not (pins / "maps" / "dlb").exists():
            if time.time() > deadline:
                LOG.error("no DLB table under %s: dlb is unavailable", pins)
                return
            hub.sleep(0.1)
        table = DlbTable.open(pins)
        for leaf in self.core.plan.leaves:
            n = self.core.leaf_number(leaf)
            table.configure(n, inactivity_ns=inactivity_ns, window_ns=window_ns,
                            n_uplinks=len(self.core.plan.uplinks(leaf.name)),
                            allowed=self.core.dlb_allowed(leaf))
            table.enable(n, self.core.lb_mode == "dlb")
        self.dlb = table
        LOG.info("DLB stage configured (inactivity %d ns, quality window %d ns), %s", inactivity_ns,
                 window_ns, "enabled" if self.core.lb_mode == "dlb" else "standing by")

    def _dlb_enable(self, on: bool) -> None:
        if self.dlb is not None:
            for leaf in self.core.plan.leaves:
                self.dlb.enable(self.core.leaf_number(leaf), on)

    def _dlb_state(self) -> dict:
        if self.dlb is None:
            return {"ready": False}
        per_leaf = {}
        for leaf in self.core.plan.leaves:
            ups = self.core.plan.uplinks(leaf.name)
            c = self.dlb.counters(self.core.leaf_number(leaf), len(ups))
            per_leaf[leaf.name] = {p.peer: {k: c[k][i] for k in c} for i, p in enumerate(ups)}
        return {"ready": True, "uplinks": per_leaf}

    # ------------------------------------------------------------------ REST (controller/rest.py)
    def _serve_rest(self, host: str, port: int) -> None:
        LOG.info("REST API on http://%s:%d/lb", host, port)
        hub.WSGIServer((host, port), make_app(self)).serve_forever()

    def state(self) -> dict:
        plan = self.core.plan
        uplinks = {}
        for leaf in plan.leaves:
            seen = self._ports.get(leaf.dpid, {})
            uplinks[leaf.name] = {p.peer: {"port": p.port, "tx_bytes": seen.get(p.port, (0, 0, 0.0))[1],
                                           "tx_bps": seen.get(p.port, (0, 0, 0.0))[2]}
                                  for p in plan.uplinks(leaf.name)}
        return {"mode": self.core.lb_mode, "modes": sorted(UPLINK_BUILDERS),
                "spray_entropies": self.core.options.spray_entropies or 0,
                "uplinks": uplinks, "load_interval_s": LOAD_POLL_S, "changes": self.changes,
                "links_down": sorted("-".join(sorted(link)) for link in self.core.down),
                "link_changes": self.link_changes, "dlb": self._dlb_state(),
                "failover": self.core.failover}

    def set_mode(self, mode: str, params: dict) -> dict:
        """Replace the mode's flows on every leaf; return once every leaf has answered a
        barrier after them (applied_s: from the first message to the last answer)."""
        timing = self._dlb_timing(mode, params)  # ValueError: nothing changes
        leaves = [leaf.dpid for leaf in self.core.plan.leaves]
        missing = [hex(d) for d in leaves if d not in self.datapaths]
        if missing:
            raise ValueError(f"switches not connected: {', '.join(missing)}")
        if mode == "dlb" and self.dlb is None:
            raise Conflict("the DLB stage is not loaded in this run (no BPF table)")
        t0 = time.time()
        per_leaf = self.core.set_mode(mode)  # ValueError / Conflict: nothing was sent
        if mode != "dlb":
            self._dlb_enable(False)  # stop marking before the rules that follow marks go
        change = {"time": t0, "mode": mode, **self._apply(per_leaf, t0)}
        if mode == "dlb":
            for leaf in self.core.plan.leaves:
                self.dlb.set_timing(self.core.leaf_number(leaf), **timing)
            self._dlb_enable(True)  # mark once every leaf follows the marks
        if params:
            change["params"] = params
        self.changes.append(change)
        LOG.info("load balancing now %s (applied in %.1f ms)", mode, change["applied_s"] * 1e3)
        return change

    def _dlb_timing(self, mode: str, params: dict) -> dict:
        """Live parameters: dlb takes inactivity and quality_window (modelled times, like the
        spec's); the wall-clock ns the stage uses."""
        allowed = ("inactivity", "quality_window") if mode == "dlb" else ()
        unknown = sorted(set(params) - set(allowed))
        if unknown:
            takes = ", ".join(allowed) or "no parameters"
            raise ValueError(f"{mode} takes {takes} during a run (got {', '.join(unknown)})")
        out = {}
        for key, field in (("inactivity", "inactivity_ns"), ("quality_window", "window_ns")):
            if key in params:
                seconds = units.parse_time_s(str(params[key]))  # ValueError names the problem
                if not 0 < seconds <= 1:
                    raise ValueError(f"{key}: {params[key]} is outside (0, 1 s]")
                out[field] = round(seconds * self.core.plan.dilation * 1e9)
        return out

    def _apply(self, per_switch: dict[int, list[Message]], t0: float) -> dict:
        """Send each switch its messages and a barrier; wait for the answers. How long it took
        from t0, and which switches refused something."""
        self.failed.difference_update(per_switch)
        waits = []
        for dpid, msgs in per_switch.items():
            dp = self.datapaths.get(dpid)
            if dp is None:
                continue
            for msg in msgs:
                for ofmsg in to_ofp(dp, msg):
                    dp.send_msg(ofmsg)
            barrier = parser.OFPBarrierRequest(dp)
            dp.set_xid(barrier)
            waits.append(self._barriers.setdefault(barrier.xid, hub.Event()))
            dp.send_msg(barrier)
        answered = all(w.wait(timeout=BARRIER_TIMEOUT_S) for w in waits)
        return {"applied_s": round(time.time() - t0, 6), "answered": answered,
                "switch_errors": sorted(hex(d) for d in self.failed & set(per_switch))}

    @set_ev_cls(ofp_event.EventOFPPortStatus, MAIN_DISPATCHER)
    def port_status(self, ev) -> None:
        """A fabric link went down or came back: route every leaf around it (or back)."""
        desc = ev.msg.desc
        self._port_seen(ev.msg.datapath.id, desc, time.time())

    def _port_seen(self, dpid: int, desc, t0: float, warm: bool = False) -> None:
        """A port's state, from a port status or (warm, at a switch's connection) its port
        description: if its link changed, reroute (warm: at once, on the switches already
        synchronised; the others are computed over the new state as they connect)."""
        link = self.core.link_of(dpid, desc.port_no)
        if link is None:
            return
        self._port_up[(dpid, desc.port_no)] = not (
            desc.state & ofp.OFPPS_LINK_DOWN or desc.config & ofp.OFPPC_PORT_DOWN)
        # A link is up when both its ends are (each end reports on its own, in any order).
        up = all(self._port_up.get(end, True) for end in self.core.link_ends(*link))
        if (frozenset(link) not in self.core.down) == up:
            return  # no change (its other end reported it already, or a mere counter update)
        msgs = self.core.link_changed(*link, up)  # now, so the other end's report is no change
        if self.core.failover == "local" and not warm:
            self._local_failover(link, up, t0)
            return
        if self.dlb is not None:  # the flowlet stage stops choosing uplinks that cannot reach
            for leaf in self.core.plan.leaves:
                self.dlb.set_allowed(self.core.leaf_number(leaf), self.core.dlb_allowed(leaf))
        if warm:
            msgs = {d: m for d, m in msgs.items() if d in self.programmed and d != dpid}
            LOG.info("link %s is %s at dpid %#x's connection", "-".join(sorted(link)), "up" if up else "down", dpid)
        hub.spawn(self._reroute, link, up, t0, msgs)  # waits on barriers: not in the event loop

    def _local_failover(self, link: tuple[str, str], up: bool, t0: float) -> None:
        """failover: local: the switches' fast-failover groups took their detours as the port
        went down (Open vSwitch reported it at t0); the controller recomputes every switch only
        after the convergence delay, or never."""
        name, state = "-".join(sorted(link)), "up" if up else "down"
        self.link_changes.append({"time": t0, "link": name, "state": state, "local": True, "applied_s": 0.0,
                                  "answered": True, "switch_errors": []})
        delay = self.core.plan.extra.get("routing", {}).get("convergence_wall_s")
        LOG.info("link %s %s: local detours at once; routes recomputed %s", name, state,
                 "never" if delay is None else f"after {delay:.3f} s")
        if delay is not None:
            hub.spawn_after(delay, self._converge, name, state, t0)

    def _converge(self, name: str, state: str, t0: float) -> None:
        """The convergence delay after a link change: every switch's routes over the links up now."""
        change = {"time": t0, "link": name, "state": state, "converged": True,
                  **self._apply(self.core.reroute_all(), t0)}
        self.link_changes.append(change)
        LOG.info("link %s %s: routes converged %.1f ms after", name, state, change["applied_s"] * 1e3)

    def ttl_expired(self, timeout_s: float = 1.0) -> dict[str, dict[int, int]]:
        """Per switch and ingress port: packets whose TTL expired there (table 0's TTL_COOKIE
        flows), asked of every switch now (OpenFlow 1.5's flow description: Open vSwitch has no
        OFPMP_FLOW_STATS)."""
        self._ttl = {}
        waits = []
        for dpid, dp in list(self.datapaths.items()):
            req = parser.OFPFlowDescStatsRequest(dp, table_id=0, cookie=TTL_COOKIE, cookie_mask=0xFFFFFFFFFFFFFFFF,
                                             match=parser.OFPMatch())
            dp.set_xid(req)
            waits.append(self._barriers.setdefault(req.xid, hub.Event()))
            dp.send_msg(req)
        deadline = time.time() + timeout_s
        for w in waits:
            w.wait(timeout=max(0.0, deadline - time.time()))
        return self._ttl

    @set_ev_cls(ofp_event.EventOFPFlowDescStatsReply, [CONFIG_DISPATCHER, MAIN_DISPATCHER])
    def flow_stats(self, ev) -> None:
        if self._collect(ev):  # a warm start's read of the whole table
            return
        switch = self.core.switch_of(ev.msg.datapath.id)
        if switch is not None:
            per_port = self._ttl.setdefault(switch.name, {})
            for st in ev.msg.body:
                port = st.match.get("in_port")
                count = st.stats.get("packet_count", 0)
                if port is not None and count:
                    per_port[port] = per_port.get(port, 0) + count
        if not ev.msg.flags & ofp.OFPMPF_REPLY_MORE:
            waiting = self._barriers.pop(ev.msg.xid, None)
            if waiting is not None:
                waiting.set()

    def _reroute(self, link: tuple[str, str], up: bool, t0: float, msgs: dict[int, list[Message]]) -> None:
        change = {"time": t0, "link": "-".join(sorted(link)), "state": "up" if up else "down",
                  **self._apply(msgs, t0)}
        self.link_changes.append(change)
        LOG.info("link %s %s: every leaf rerouted in %.1f ms", change["link"], change["state"],
                 change["applied_s"] * 1e3)

    def _poll_uplinks(self) -> None:
        while True:
            for leaf in self.core.plan.leaves:
                dp = self.datapaths.get(leaf.dpid)
                if dp is not None:
                    dp.send_msg(parser.OFPPortStatsRequest(dp, 0, ofp.OFPP_ANY))
            hub.sleep(LOAD_POLL_S)

    @set_ev_cls(ofp_event.EventOFPPortStatsReply, MAIN_DISPATCHER)
    def port_stats(self, ev) -> None:
        now, ports = time.time(), self._ports.setdefault(ev.msg.datapath.id, {})
        for st in ev.msg.body:
            prev = ports.get(st.port_no)
            bps = (st.tx_bytes - prev[1]) * 8 / (now - prev[0]) if prev and now > prev[0] else 0.0
            ports[st.port_no] = (now, st.tx_bytes, bps)

    @set_ev_cls(ofp_event.EventOFPSwitchFeatures, CONFIG_DISPATCHER)
    def switch_features(self, ev) -> None:
        dp = ev.msg.datapath
        if dp.id not in self.core.expected_dpids():
            LOG.warning("dpid %#x is not in the plan; leaving it alone", dp.id)
            return
        self.programmed.discard(dp.id)
        self.failed.discard(dp.id)
        self.datapaths[dp.id] = dp
        hub.spawn(self._warm_start, dp)  # waits for the switch's answers: not in the event loop

    def _read_tables(self, dp: Datapath) -> tuple[list, list[Flow], list[Group]] | None:
        """The switch's port descriptions, flows (every table) and groups; None on timeout."""
        reqs = [parser.OFPPortDescStatsRequest(dp, 0), parser.OFPFlowDescStatsRequest(dp),
                parser.OFPGroupDescStatsRequest(dp, 0, ofp.OFPG_ALL)]
        waits = []
        for req in reqs:
            dp.set_xid(req)
            self._replies[req.xid] = []
            waits.append(self._barriers.setdefault(req.xid, hub.Event()))
            dp.send_msg(req)
        deadline = time.time() + READ_TABLES_TIMEOUT_S
        answered = all(w.wait(timeout=max(0.0, deadline - time.time())) for w in waits)
        bodies = [self._replies.pop(req.xid, []) for req in reqs]
        for req in reqs:
            self._barriers.pop(req.xid, None)
        if not answered:
            return None
        ports, flows, groups = bodies
        return ports, [from_ofp_flow(st) for st in flows], [from_ofp_group(st) for st in groups]

    def _warm_start(self, dp: Datapath) -> None:
        """Bring a switch that connected to the wanted state without wiping it (controller/sync.py):
        its ports tell which links are down, a leaf's flows the live load-balancing mode, and
        only the difference is sent; then a barrier (its answer marks the switch programmed)."""
        t0 = time.time()
        tables = self._read_tables(dp)
        if self.datapaths.get(dp.id) is not dp:
            return  # it reconnected meanwhile: that connection's warm start does the work
        switch = self.core.switch_of(dp.id)
        if tables is None:
            LOG.warning("dpid %#x did not describe its tables within %.0f s: cold start (reset)",
                        dp.id, READ_TABLES_TIMEOUT_S)
            msgs: list = self.core.switch_up(dp.id)
            counts = None
        else:
            ports, flows, groups = tables
            # A switch with empty tables is new (the run's bring-up): its links are as planned,
            # and a port that changes later says so (port status). One that holds flows kept
            # forwarding without us: its ports say which links went down meanwhile.
            for desc in ports if flows else ():
                self._port_seen(dp.id, desc, t0, warm=True)
            if switch.role == "leaf" and not self.core.by_graph:
                self._adopt_mode(observed_lb_mode(flows), dp.id)
            sync = plan_sync(self.core.switch_up(dp.id), flows, groups)
            msgs, counts = sync.messages, sync.counts
        for msg in msgs:
            for ofmsg in to_ofp(dp, msg):
                dp.send_msg(ofmsg)
        # OpenFlow answers a barrier only after every earlier message, errors included.
        dp.send_msg(parser.OFPBarrierRequest(dp))
        record = {"time": t0, "read_s": round(time.time() - t0, 6), "cold": counts is None,
                  **(counts or SyncCounts(flows_added=len(msgs))).as_dict()}
        self.syncs[f"{dp.id:#x}"] = record
        LOG.info("dpid %#x connected: %s start, sent %d messages (%s) and a barrier", dp.id,
                 "cold" if counts is None else "warm", len(msgs),
                 "reset and everything" if counts is None else
                 ", ".join(f"{k} {v}" for k, v in counts.as_dict().items() if v and k != "messages"))

    def _adopt_mode(self, mode: str | None, dpid: int) -> None:
        """Keep the load-balancing mode a leaf's table shows (one changed live before a restart)."""
        if mode is None or mode == self.core.lb_mode:
            return
        try:
            self.core.set_mode(mode)  # its messages are not needed: the sync computes the difference
        except (ValueError, Conflict) as e:
            LOG.warning("dpid %#x shows load balancing %s, which this controller cannot take (%s)", dpid, mode, e)
            return
        LOG.info("dpid %#x shows load balancing %s: keeping it", dpid, mode)
        if mode == "dlb" and self.dlb is not None:
            self._dlb_enable(True)

    def _collect(self, ev) -> bool:
        """A multipart reply a warm start awaits: its bodies kept, its waiter woken at the end."""
        bodies = self._replies.get(ev.msg.xid)
        if bodies is None:
            return False
        bodies.extend(ev.msg.body)
        if not ev.msg.flags & ofp.OFPMPF_REPLY_MORE:
            waiting = self._barriers.pop(ev.msg.xid, None)
            if waiting is not None:
                waiting.set()
        return True

    @set_ev_cls(ofp_event.EventOFPPortDescStatsReply, [CONFIG_DISPATCHER, MAIN_DISPATCHER])
    def port_desc(self, ev) -> None:
        self._collect(ev)  # os-ken's own request at connection is not ours: ignored

    @set_ev_cls(ofp_event.EventOFPGroupDescStatsReply, [CONFIG_DISPATCHER, MAIN_DISPATCHER])
    def group_desc(self, ev) -> None:
        self._collect(ev)

    @set_ev_cls(ofp_event.EventOFPErrorMsg, [CONFIG_DISPATCHER, MAIN_DISPATCHER])
    def error(self, ev) -> None:
        msg = ev.msg
        self.failed.add(msg.datapath.id)
        LOG.error("dpid %#x error type %d code %d on %s", msg.datapath.id, msg.type, msg.code,
                  bytes(msg.data).hex())

    @set_ev_cls(ofp_event.EventOFPBarrierReply, MAIN_DISPATCHER)
    def barrier_reply(self, ev) -> None:
        waiting = self._barriers.pop(ev.msg.xid, None)
        if waiting is not None:  # a live change's, not switch-up's
            waiting.set()
            return
        dpid = ev.msg.datapath.id
        if dpid in self.failed:
            LOG.error("dpid %#x rejected some of its messages; not ready", dpid)
            return
        self.programmed.add(dpid)
        LOG.info("dpid %#x programmed (%d/%d)", dpid, len(self.programmed),
                 len(self.core.expected_dpids()))
        if self.programmed.issuperset(self.core.expected_dpids()):
            write_ready(self.ready_file, self.core.expected_dpids(), self.syncs)
            LOG.info("all switches programmed; wrote %s", self.ready_file)

    @set_ev_cls(ofp_event.EventOFPPacketIn, MAIN_DISPATCHER)
    def packet_in(self, ev) -> None:
        msg = ev.msg
        dp = msg.datapath
        for out in self.core.packet_in(dp.id, msg.match["in_port"], bytes(msg.data)):
            for ofmsg in to_ofp(dp, out):
                dp.send_msg(ofmsg)

    @set_ev_cls(ofp_event.EventOFPStateChange, DEAD_DISPATCHER)
    def disconnected(self, ev) -> None:
        if ev.datapath.id is not None:
            LOG.warning("dpid %#x disconnected", ev.datapath.id)
            self.datapaths.pop(ev.datapath.id, None)
