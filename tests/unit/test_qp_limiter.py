"""The hand-packed rtnetlink messages of fabric_emu.ports.qp_limiter, decoded by pyroute2's own
parser, and the decoding of the kernel's answers. No kernel involved."""

from __future__ import annotations

import errno
import struct

import pytest
from pyroute2.netlink.rtnl.tcmsg import tcmsg

from fabric_emu.kernel import rtnl
from fabric_emu.ports import qp_limiter as ql


class FakeNetlink:
    """Records what is sent; answers each request with an ack carrying `error`."""

    def __init__(self, error: int = 0, message: str = ""):
        self.sent: list[bytes] = []
        self.error = error
        self.message = message

    def setsockopt(self, *args: object) -> None:
        pass

    def send(self, data: bytes) -> int:
        self.sent.append(bytes(data))
        self._stale_first = True  # answer someone else's older request first
        return len(data)

    def recv(self, size: int) -> bytes:
        request = self.sent[-1]
        seq = struct.unpack_from("=I", request, 8)[0]
        body = struct.pack("=i", -self.error) + request[:16]  # capped: the request's header only
        flags = rtnl.NLM_F_CAPPED
        if self.message:
            text = self.message.encode() + b"\0"
            body += rtnl.attr(rtnl.NLMSGERR_ATTR_MSG, text)
            flags |= rtnl.NLM_F_ACK_TLVS
        if self._stale_first:
            self._stale_first = False
            return rtnl.HEADER.pack(36, rtnl.NLMSG_ERROR, 0, seq + 1000, 0) + struct.pack("=i", -errno.EIO) + bytes(16)
        return rtnl.HEADER.pack(16 + len(body), rtnl.NLMSG_ERROR, flags, seq, 0) + body


def decoded(raw: bytes) -> tcmsg:
    msg = tcmsg(raw)
    msg.decode()
    return msg


def test_marks_and_classes() -> None:
    assert ql.qp_mark(0) == 0x100 and ql.qp_class(0) == 0x300100
    assert ql.qp_class(ql.QP_MAX) == 0x30FFFF
    for bad in (-1, ql.QP_MAX + 1):
        with pytest.raises(ValueError):
            ql.qp_mark(bad)


def test_class_message_decodes_as_the_htb_class_we_mean() -> None:
    nl = FakeNetlink()
    limiter = ql.QpLimiter(nl, 7, 1500)
    limiter.add(3, 16e6)
    limiter.set_rate(3, 80e9)  # 10 GB/s: beyond the u32 byte rate
    for raw, flags, rate in ((nl.sent[0], rtnl.NLM_F_CREATE, 2_000_000), (nl.sent[-1], 0, 10**10)):
        msg = decoded(raw)
        assert msg["header"]["type"] == rtnl.RTM_NEWTCLASS
        assert msg["header"]["flags"] == rtnl.NLM_F_REQUEST | rtnl.NLM_F_ACK | flags
        assert (msg["index"], msg["handle"], msg["parent"]) == (7, 0x300103, ql.QP_MAJOR)
        assert msg.get_attr("TCA_KIND") == "htb"
        options = msg.get_attr("TCA_OPTIONS")
        parms = options.get_attr("TCA_HTB_PARMS")
        assert parms["rate"] == parms["ceil"] == min(rate, 2**32 - 1)
        assert options.get_attr("TCA_HTB_RATE64") == options.get_attr("TCA_HTB_CEIL64") == rate
        assert parms["quantum"] == 1514 and parms["prio"] == 0 and parms["level"] == 0
        assert parms["buffer"] == parms["cbuffer"] == rtnl.psched_ticks(2 * 1514 / rate)
        assert struct.unpack_from("=B", raw, 36 + 8 + 8 + 1)[0] == rtnl.TC_LINKLAYER_ETHERNET


def test_the_kernels_refusal_names_interface_class_and_reason() -> None:
    limiter = ql.QpLimiter(FakeNetlink(errno.EINVAL, "quantum of class is big"), 7, 1500, ifname="h1-eth0")
    with pytest.raises(OSError) as refused:
        limiter.set_rate(1, 1e6)
    assert refused.value.errno == errno.EINVAL
    assert "h1-eth0: class 30:101 rate not changed: Invalid argument (quantum of class is big)" in str(refused.value)


def test_qdisc_message_asks_for_a_direct_queue_and_no_default_class() -> None:
    nl = FakeNetlink()
    ql.install(nl, 9, 0x130001, direct_qlen=500)
    msg = decoded(nl.sent[-1])
    assert msg["header"]["type"] == rtnl.RTM_NEWQDISC
    assert (msg["index"], msg["handle"], msg["parent"]) == (9, ql.QP_MAJOR, 0x130001)
    options = msg.get_attr("TCA_OPTIONS")
    assert options.get_attr("TCA_HTB_INIT")["defcls"] == 0
    assert options.get_attr("TCA_HTB_DIRECT_QLEN") == 500
