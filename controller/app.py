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

from controller.core import (TTL_COOKIE, UPLINK_BUILDERS, Action, Conflict, DecTtl, DeleteFlows, FabricCore, Hairpin,
                             Flow, Group, LbOptions, Message, Output, PacketOut, ResetSwitch, SetEthSrc,
                             ToController, ToGroup)
from controller.rest import make_app
from fabric_emu.spec import units
from fabric_emu.topo.plan import FabricPlan
from fabric_emu.ports.dlb import DlbTable

LOG = logging.getLogger("fabric_emu.controller")
LOAD_POLL_S = 1.0  # how often the REST API's uplink loads are refreshed (OpenFlow port stats)
BARRIER_TIMEOUT_S = 5.0

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


def to_ofp(dp: Datapath, msg: Message) -> list[parser.MsgBase]:
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
        case PacketOut():
            return [parser.OFPPacketOut(dp, buffer_id=ofp.OFP_NO_BUFFER,
                                        match=parser.OFPMatch(in_port=ofp.OFPP_CONTROLLER),
                                        actions=_actions([Output(msg.out_port)]), data=msg.data)]
    raise TypeError(f"no OpenFlow translation for {msg!r}")


def write_ready(path: str, dpids: list[int]) -> None:
    """Atomically, so a poller never reads half a file."""
    tmp = Path(f"{path}.tmp")
    tmp.write_text(json.dumps({"dpids": dpids, "time": time.time()}))
    os.replace(tmp, path)


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
        t0 = time.time()
        desc = ev.msg.desc
        link = self.core.link_of(ev.msg.datapath.id, desc.port_no)
        if link is None:
            return
        self._port_up[(ev.msg.datapath.id, desc.port_no)] = not (
            desc.state & ofp.OFPPS_LINK_DOWN or desc.config & ofp.OFPPC_PORT_DOWN)
        # A link is up when both its ends are (each end reports on its own, in any order).
        up = all(self._port_up.get(end, True) for end in self.core.link_ends(*link))
        if (frozenset(link) not in self.core.down) == up:
            return  # no change (its other end reported it already, or a mere counter update)
        msgs = self.core.link_changed(*link, up)  # now, so the other end's report is no change
        if self.core.failover == "local":
            self._local_failover(link, up, t0)
            return
        if self.dlb is not None:  # the flowlet stage stops choosing uplinks that cannot reach
            for leaf in self.core.plan.leaves:
                self.dlb.set_allowed(self.core.leaf_number(leaf), self.core.dlb_allowed(leaf))
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

    @set_ev_cls(ofp_event.EventOFPFlowDescStatsReply, MAIN_DISPATCHER)
    def flow_stats(self, ev) -> None:
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
        msgs = self.core.switch_up(dp.id)
        for msg in msgs:
            for ofmsg in to_ofp(dp, msg):
                dp.send_msg(ofmsg)
        # OpenFlow answers a barrier only after every earlier message, errors included.
        dp.send_msg(parser.OFPBarrierRequest(dp))
        LOG.info("dpid %#x connected: sent %d messages and a barrier", dp.id, len(msgs))

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
            write_ready(self.ready_file, self.core.expected_dpids())
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
