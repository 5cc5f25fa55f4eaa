from fabric_emu.counters import PortCounters, delta, totals


def test_delta_subtracts_counters_and_keeps_identity():
    before = [PortCounters("leaf1", 3, "leaf1-eth3", "spine1", "fabric", tx_bytes=100, tx_packets=1,
                           queue_drops=2)]
    after = [PortCounters("leaf1", 3, "leaf1-eth3", "spine1", "fabric", tx_bytes=4200, tx_packets=2,
                          queue_drops=5, rx_dropped=1)]
    (d,) = delta(after, before)
    assert (d.switch, d.port, d.intf, d.peer) == ("leaf1", 3, "leaf1-eth3", "spine1")
    assert (d.tx_bytes, d.tx_packets, d.queue_drops, d.drops) == (4100, 1, 3, 4)
    assert totals([d]) == {"tx_packets": 1, "tx_bytes": 4100, "drops": 4}
