"""Thin os-ken app: OpenFlow 1.5 events in, FabricCore calls, os-ken messages out.

OpenFlow 1.5 because only there can a group carry OVS's Netronome selection-method property,
the one way to make a select group hash the UDP source port (the RoCEv2 entropy); bridges must
list OpenFlow15 in their protocols.

Configuration arrives as os_ken.cfg options in group [fabric] (controller/__main__.py sets them):
  plan        path of the plan JSON (FabricPlan.to_json())
  ready_file  written atomically, as {"dpids": [...], "time": ...}, once every planned switch
              has answered the barrier that follows its initial messages without an error
  lb_mode     ecmp | spray (dlb later)
  spray_entropies  spray: UDP source ports per QP (0: one per uplink)
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
from os_ken.ofproto import ofproto_v1_5 as ofp
from os_ken.ofproto import ofproto_v1_5_parser as parser

from controller.core import (Action, FabricCore, Flow, Group, LbOptions, Message, Output, PacketOut,
                             ResetSwitch, SetEthSrc, ToController, ToGroup)
from fabric_emu.plan import FabricPlan

LOG = logging.getLogger("fabric_emu.controller")

cfg.CONF.register_opts([
    cfg.StrOpt("plan", help="plan JSON file"),
    cfg.StrOpt("ready_file", help="written once every planned switch is programmed"),
    cfg.StrOpt("lb_mode", default="ecmp", help="ecmp | dlb | spray"),
    cfg.IntOpt("spray_entropies", default=0, help="spray: UDP source ports per QP (0: default)"),
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

    def __init__(self, method: str, fields: tuple[str, ...], param: int = 0):
        super().__init__(type_=ofp.OFPGPT_EXPERIMENTER, experimenter=NTR_VENDOR_ID,
                         exp_type=NTRT_SELECTION_METHOD)
        self.body = (struct.pack("!4x16sQ", method.encode(), param)
                     + b"".join(_field_mask_tlv(f) for f in fields))

    def serialize(self) -> bytearray:
        self.length = 12 + len(self.body)
        buf = bytearray(struct.pack("!HHII", self.type, self.length, self.experimenter,
                                    self.exp_type) + self.body)
        return buf + bytes(-len(buf) % 8)


def _field_mask_tlv(name: str) -> bytes:
    """An OXM TLV whose value is an all-ones mask: hash the whole field (oxm_pull_field_array)."""
    header = bytearray()
    ofp.oxm_serialize_header(ofp.oxm_from_user_header(name), header, 0)
    return bytes(header) + b"\xff" * header[3]  # the header's last byte is the value length


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
    return out


def to_ofp(dp: Datapath, msg: Message) -> list[parser.MsgBase]:
    """The os-ken messages that carry one core message."""
    match msg:
        case ResetSwitch():
            return [parser.OFPFlowMod(dp, table_id=ofp.OFPTT_ALL, command=ofp.OFPFC_DELETE,
                                      out_port=ofp.OFPP_ANY, out_group=ofp.OFPG_ANY,
                                      match=parser.OFPMatch()),
                    parser.OFPGroupMod(dp, command=ofp.OFPGC_DELETE, group_id=ofp.OFPG_ALL)]
        case Group():
            buckets = [parser.OFPBucket(bucket_id=b.bucket_id, actions=_actions(b.actions))
                       for b in msg.buckets]
            props = [NtrSelectionMethod("hash", msg.hash_fields)] if msg.hash_fields else []
            return [parser.OFPGroupMod(dp, command=ofp.OFPGC_ADD, type_=GROUP_TYPES[msg.type],
                                       group_id=msg.group_id, buckets=buckets, properties=props)]
        case Flow():
            inst = [parser.OFPInstructionActions(ofp.OFPIT_APPLY_ACTIONS, _actions(msg.actions))]
            if msg.goto_table is not None:
                inst.append(parser.OFPInstructionGotoTable(msg.goto_table))
            return [parser.OFPFlowMod(dp, table_id=msg.table, priority=msg.priority,
                                      match=parser.OFPMatch(**msg.match), instructions=inst)]
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
        LOG.info("plan %s, lb_mode %s, expecting dpids %s", self.core.plan.name, conf.lb_mode,
                 [hex(d) for d in self.core.expected_dpids()])

    @set_ev_cls(ofp_event.EventOFPSwitchFeatures, CONFIG_DISPATCHER)
    def switch_features(self, ev) -> None:
        dp = ev.msg.datapath
        if dp.id not in self.core.expected_dpids():
            LOG.warning("dpid %#x is not in the plan; leaving it alone", dp.id)
            return
        self.programmed.discard(dp.id)
        self.failed.discard(dp.id)
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
