"""The capacity probe behind `dilation: auto`: it measures OVS and the NIC send path, names the
thread that forwards, and leaves nothing behind."""

from __future__ import annotations

import subprocess

import pytest
from pyroute2 import IPRoute

from fabric_emu.measure import capacity
from fabric_emu.state.records import all_records

pytestmark = [pytest.mark.root, pytest.mark.slow]


def test_measure_this_machine_and_clean_up():
    cap = capacity.measure(4200)
    ovs = cap.details["ovs"]
    # The forwarding thread is ovs-vswitchd's main thread (no PMD threads without DPDK).
    assert ovs["thread"].startswith("ovs-vswitchd "), ovs
    assert ovs["frame_bytes"] == 4214 and ovs["forwarded_pps"] > 1000
    # iperf3 offered more than OVS forwarded: the generator was not the limit.
    assert not ovs["generator_limited"] and ovs["offered_pps"] > ovs["forwarded_pps"]
    assert cap.ovs_pps >= ovs["forwarded_pps"] and cap.nic_pps > 1000 and cap.cores >= 1
    assert 0 < cap.ovs_wakeup_s < 0.01  # CPU per frame arriving alone: a wakeup of the main loop
    assert cap.details["nic"]["what"]  # says what was measured (the send-path floor, or an engine)
    # Nothing left: no bridge, no root-namespace veth end, no run record, no process.
    bridges = subprocess.run(["ovs-vsctl", "list-br"], capture_output=True, text=True, check=True).stdout.split()
    assert capacity.BRIDGE not in bridges
    with IPRoute() as ipr:
        assert not {ln.get_attr("IFLA_IFNAME") for ln in ipr.get_links()} & set(capacity.ROOT_ENDS)
    assert not [r for r in all_records() if r.run_id.startswith("capacity-probe")]
