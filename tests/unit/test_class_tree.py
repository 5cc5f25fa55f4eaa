"""The class tree of a link end as raw rtnetlink requests (queues.tree_batch): each request
decodes, with pyroute2's own parser, as the qdisc or class the module docstring draws.
tests/integration/test_ports.py and test_qp_limiter.py check what the kernel makes of them."""

from __future__ import annotations

import errno

import pytest

from fabric_emu.kernel import rtnl
from fabric_emu.ports import qp_limiter, queues
from tests.unit.test_qp_limiter import FakeNetlink, decoded

LIMITS = {0: 1_000_000, 3: 600_000, 6: 50_000}


def tree(qp_classes: bool) -> list:
    nl = FakeNetlink()
    queues.tree_batch(queues.PortQueues("leaf1-eth1", 25e6, 4200, LIMITS, qp_classes=qp_classes), 7).send(nl)
    return [decoded(raw) for raw in nl.sent]


def test_a_switch_port_gets_htb_three_classes_a_gate_and_two_fifos():
    msgs = tree(qp_classes=False)
    assert all(m["index"] == 7 for m in msgs)
    shape = [(m["header"]["type"], m.get_attr("TCA_KIND"), m["handle"], m["parent"]) for m in msgs]
    assert shape == [
        (rtnl.RTM_DELQDISC, None, 0, rtnl.TC_H_ROOT),
        (rtnl.RTM_NEWQDISC, "htb", 0x10000, rtnl.TC_H_ROOT),
        (rtnl.RTM_NEWTCLASS, "htb", 0x10001, 0x10000),
        (rtnl.RTM_NEWTCLASS, "htb", 0x10016, 0x10001), (rtnl.RTM_NEWQDISC, "bfifo", 0x160000, 0x10016),
        (rtnl.RTM_NEWTCLASS, "htb", 0x10013, 0x10001), (rtnl.RTM_NEWQDISC, "tbf", 0x130000, 0x10013),
        (rtnl.RTM_NEWTCLASS, "htb", 0x10010, 0x10001), (rtnl.RTM_NEWQDISC, "bfifo", 0x100000, 0x10010),
    ]
    assert msgs[1].get_attr("TCA_OPTIONS").get_attr("TCA_HTB_INIT")["defcls"] == 0x10
    link = 25e6 / 8
    rates = {m["handle"]: m.get_attr("TCA_OPTIONS").get_attr("TCA_HTB_RATE64") for m in msgs
             if m["header"]["type"] == rtnl.RTM_NEWTCLASS}
    assert rates[0x10001] == link and rates[0x10016] == link * queues.CNP_SHARE
    assert rates[0x10013] + rates[0x10010] + rates[0x10016] == link  # the shares fill the link
    parms = {m["handle"]: m.get_attr("TCA_OPTIONS").get_attr("TCA_HTB_PARMS") for m in msgs
             if m["header"]["type"] == rtnl.RTM_NEWTCLASS}
    assert parms[0x10016]["prio"] == 0 and parms[0x10013]["prio"] == parms[0x10010]["prio"] == 1
    assert all(p["ceil"] == link for h, p in parms.items())
    gate = msgs[6].get_attr("TCA_OPTIONS")
    assert gate.get_attr("TCA_TBF_PARMS")["rate"] == queues.GATE_OPEN_FACTOR * link  # open
    assert gate.get_attr("TCA_TBF_PARMS")["limit"] == LIMITS[3]
    assert gate.get_attr("TCA_TBF_BURST") >= 16 * (4200 + 14)
    assert [msgs[i].get_attr("TCA_OPTIONS")["limit"] for i in (4, 8)] == [LIMITS[6], LIMITS[0]]


def test_a_host_nic_gets_the_qp_htb_inside_its_gate():
    msgs = tree(qp_classes=True)
    qp = msgs[7]
    assert (qp.get_attr("TCA_KIND"), qp["handle"], qp["parent"]) == ("htb", qp_limiter.QP_MAJOR, queues.GATE_CLASS)
    assert len(msgs) == 10


def test_only_a_missing_root_qdisc_is_forgiven():
    b = queues.tree_batch(queues.PortQueues("x", 1e9, 1500, LIMITS), 3)
    assert [r[4] for r in b.requests] == [frozenset({errno.ENOENT})] + [frozenset()] * (len(b.requests) - 1)
    with pytest.raises(OSError, match="x: root qdisc not deleted: Invalid argument"):
        b.send(FakeNetlink(errno.EINVAL))


def test_a_bpf_filter_request_is_direct_action_for_every_protocol():
    msg = decoded(rtnl.message(rtnl.RTM_NEWTFILTER, rtnl.CREATE,
                               rtnl.bpf_filter(5, 0xFFFFFFF3, 42, "switch_egress", 1), seq=1))
    opts = msg.get_attr("TCA_OPTIONS")
    assert (msg["index"], msg["handle"], msg["parent"]) == (5, 1, 0xFFFFFFF3)
    assert msg["info"] >> 16 == 0  # the kernel picks the priority
    assert (opts.get_attr("TCA_BPF_FD"), opts.get_attr("TCA_BPF_NAME"), opts.get_attr("TCA_BPF_CLASSID")) == (
        42, "switch_egress", 1)
    assert opts.get_attr("TCA_BPF_FLAGS") == rtnl.TCA_BPF_FLAG_ACT_DIRECT
