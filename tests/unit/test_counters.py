from fabric_emu.counters import PortCounters, delta, parse_dump_ports, parse_socket_drops, totals


def test_delta_subtracts_counters_and_keeps_identity():
    before = [PortCounters("leaf1", 3, "leaf1-eth3", "spine1", "fabric", tx_bytes=100, tx_packets=1,
                           queue_drops=2)]
    after = [PortCounters("leaf1", 3, "leaf1-eth3", "spine1", "fabric", tx_bytes=4200, tx_packets=2,
                          queue_drops=5, rx_dropped=1)]
    (d,) = delta(after, before)
    assert (d.switch, d.port, d.intf, d.peer) == ("leaf1", 3, "leaf1-eth3", "spine1")
    assert (d.tx_bytes, d.tx_packets, d.queue_drops, d.drops) == (4100, 1, 3, 4)
    assert totals([d]) == {"tx_packets": 1, "tx_bytes": 4100, "drops": 4}


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
