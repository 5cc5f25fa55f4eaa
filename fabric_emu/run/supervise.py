"""A run's supervisor (fabric_emu.state.supervise) filled with the run's parts, and what the
run does about Open vSwitch before it starts and after a fabric it served died.

The registry, one entry a part with its policy:

| part           | probe                                      | policy                          |
|----------------|--------------------------------------------|---------------------------------|
| NIC engines    | their Popen (fabric_emu.nic.launch adds them) | fail                         |
| the PFC daemon | its Popen                                  | restart (gates reopened first)  |
| ovs-vswitchd   | its pid and start time (pidfile at start)  | fail; restarted for teardown    |
| the exporter   | its serving thread                         | fail                            |

(The controller has its own keeper, fabric_emu.fabric.keeper, which also serves `controller:` events.)
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from fabric_emu.kernel import ovs_service
from fabric_emu.state.records import ProcessRef
from fabric_emu.state.supervise import Component, Supervisor, describe_exit

if TYPE_CHECKING:
    from fabric_emu.fabric.routed import RoutedFabric
    from fabric_emu.live.publish import RunPublisher


def run_supervisor(routed: RoutedFabric, live: RunPublisher | None) -> Supervisor:
    """The supervisor of a fabric that is up (the NIC engines join when they start)."""
    sup = Supervisor()
    ports = routed.ports
    if ports is not None and ports.daemon is not None:
        sup.add(Component("the PFC daemon", "pfc-daemon", "restart",
                          probe=lambda: describe_exit(ports.daemon_returncode()),
                          restart=ports.recover_daemon))
    pid = ovs_service.vswitchd_pid()
    ref = ProcessRef.of(pid, "ovs-vswitchd") if pid is not None else None
    if ref is not None:
        sup.add(Component(f"Open vSwitch (ovs-vswitchd, pid {pid})", "ovs", "fail",
                          probe=lambda: None if ref.alive() else "stopped"))
    if live is not None and live.server is not None:
        server = live.server
        sup.add(Component("the Prometheus exporter", "exporter", "fail",
                          probe=lambda: None if server.serving() else "stopped serving"))
    return sup


def ensure_ovs(say: Callable[[str], None]) -> None:
    """Before a run: OVS must answer; if it does not (it died with an earlier run, or crashed),
    start it as scripts/setup.sh does, or say what is wrong."""
    if ovs_service.responding():
        return
    say("Open vSwitch is not running: starting it (ovs-ctl start, as scripts/setup.sh does)")
    if not ovs_service.start():
        raise RuntimeError("Open vSwitch did not start; see /var/log/openvswitch/ (scripts/setup.sh sets it up)")


def ovs_back_after_death(say: Callable[[str], None]) -> None:
    """At teardown (and before `fabric-emu clean`), if ovs-vswitchd is gone: start it again. Every
    OVS command that changes a bridge waits for it, so the bridges could not be deleted without
    it; and the userspace datapath's bridge devices (persistent taps) are removed only by an
    ovs-vswitchd deleting its bridge. The restarted daemon takes the bridges up from its
    database, then the usual teardown deletes them; the next run finds OVS up."""
    if ovs_service.vswitchd_pid() is not None:
        return
    say("ovs-vswitchd is not running: starting it again (as scripts/setup.sh does) to tear the fabric down")
    if not ovs_service.start():
        say("warning: Open vSwitch did not start again; see /var/log/openvswitch/ and run scripts/setup.sh")
