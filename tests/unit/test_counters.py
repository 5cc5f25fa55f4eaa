import pytest

from fabric_emu.measure.counters import PortCounters, delta, parse_dump_ports, parse_socket_drops, totals


def test_delta_subtracts_counters_and_keeps_identity():
    before = [PortCounters("leaf1", 3, "leaf1-eth3", "spine1", "fabric", tx_bytes=100, tx_packets=1,
                           queue_drops_p0=2, bpf_drops_p3=1, ecn_marked_p3=7, pause_tx_p3=1,
                           paused_ns_p3=10, max_backlog_p3=5000, max_held_p3=900)]
    after = [PortCounters("leaf1", 3, "leaf1-eth3", "spine1", "fabric", tx_bytes=4200, tx_packets=2,
                          queue_drops_p0=5, rx_dropped=1, bpf_drops_p3=4, ecn_marked_p3=9, pause_tx_p3=4,
                          paused_ns_p3=4_000_010, lossless_drops=3, max_backlog_p3=8000, max_held_p3=1000)]
    (d,) = delta(after, before)
    assert (d.switch, d.port, d.intf, d.peer) == ("leaf1", 3, "leaf1-eth3", "spine1")
    assert (d.tx_bytes, d.tx_packets, d.queue_drops_p0, d.bpf_drops_p3) == (4100, 1, 3, 3)
    assert d.drops == 1 + 3 + 3  # OVS + kernel FIFO + the port program's admission
    assert (d.ecn_marked, d.pause_tx_p3, d.paused_ns_p3, d.lossless_drops) == (2, 3, 4_000_000, 3)
    assert (d.max_backlog_p3, d.max_held_p3) == (8000, 1000)  # high-water marks are not differenced
    row = d.row(dilation=2000)
    assert row["drops_p3"] == 3 and row["paused_fabric_us_p3"] == 2.0  # 4 ms emulated / 2000
    t = totals([d], dilation=2000)
    assert (t["tx_packets"], t["tx_bytes"], t["drops"], t["lossless_drops"]) == (1, 4100, 7, 3)
    assert (t["ecn_marked"], t["pause_tx"], t["paused_fabric_us"], t["ports_paused"]) == (2, 3, 2.0, 1)
    assert t["drops_by_class"] == {"p0": 3, "p3": 3, "p6": 0}


DUMP_PORTS = """OFPST_PORT reply (OF1.5) (xid=0x2): 2 ports
  port LOCAL: rx pkts=0, bytes=0, drop=0, errs=0, frame=0, over=0, crc=0
           tx pkts=0, bytes=0, drop=0, errs=0, coll=0
           duration=0.099s
  port  3: rx pkts=2, bytes=200, drop=1, errs=0, frame=0, over=0, crc=0
           tx pkts=6113, bytes=25305266, drop=4, errs=0, coll=0
           duration=0.099s
"""

SS = """Netid State  Recv-Q Send-Q Local Address:Port Peer Address:PortProcess
p_raw UNCONN 0 0 [0]:* * users:(("ovs-vswitchd",pid=2866,fd=55)) skmem:(r0,rb212992,t0,tb212992,f0,w0,o0,bl0,d0)
p_raw UNCONN 0 0 *:leaf1-eth3 * users:(("ovs-vswitchd",pid=2866,fd=40)) skmem:(r0,rb8388608,t0,tb212992,f0,w0,o176,bl0,d17)
p_raw UNCONN 0 0 *:eth0 * users:(("tcpdump",pid=1,fd=3)) skmem:(r0,rb212992,t0,tb212992,f0,w0,o0,bl0,d9)
"""


def test_parse_openflow_port_stats():
    assert parse_dump_ports(DUMP_PORTS) == {3: {
        "rx_packets": 2, "rx_bytes": 200, "rx_dropped": 1,
        "tx_packets": 6113, "tx_bytes": 25305266, "tx_dropped": 4}}


def test_parse_ovs_socket_drops_ignores_other_processes():
    assert parse_socket_drops(SS) == {"leaf1-eth3": 17}


def test_delta_refuses_a_port_without_a_baseline():
    # Without a "before" row the "after" row holds totals since the port was created: they must
    # never be reported as what happened during the traffic phase.
    before = [PortCounters("leaf1", 3, "leaf1-eth3", "spine1", "fabric", tx_packets=1)]
    after = [PortCounters("leaf1", 3, "leaf1-eth3", "spine1", "fabric", tx_packets=2),
             PortCounters("leaf1", 4, "leaf1-eth4", "spine2", "fabric", tx_packets=10**6)]
    with pytest.raises(ValueError, match="leaf1-eth4 missing from the snapshot before traffic"):
        delta(after, before)
