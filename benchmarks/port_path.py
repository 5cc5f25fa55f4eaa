"""CPU cost per forwarded packet of the lossless port path, as a ratio to the foundation's
plain FIFO, measured alternately in the same run. Needs root.

Two hosts (namespaces) joined through one Open vSwitch bridge (userspace datapath):

  fifo   the foundation's ports: HTB + one byte FIFO per link end (fabric_emu.kernel.shaping), one
         OpenFlow table (in_port -> output);
  ports  this issue's ports: the class tree with the PFC gate (fabric_emu.ports.queues), the BPF
         programs on every link end (classes, admission, ECN, accounting), and the controller's
         tag table (in_port -> set eth_src, goto table 1 -> output).

A paced UDP sender in one host sends RoCE-class frames (DSCP 26, ECT(0), 4 KB) well below the
link rate, so no queue builds and every packet takes the same path in both modes; CPU is read
from /proc/stat (whole machine) and from ovs-vswitchd's own counters over the same window.

  .venv/bin/python benchmarks/port_path.py [--rounds 3] [--seconds 4] [--pps 3000] [--smoke]
"""

from __future__ import annotations

import argparse
import errno
import os
import socket
import statistics
import subprocess
import sys
import threading
import time
from contextlib import ExitStack
from pathlib import Path

from pyroute2 import IPRoute, netns
from pyroute2.netlink.exceptions import NetlinkError

from fabric_emu.kernel import shaping
from fabric_emu.ports import datapath, queues
from fabric_emu.ports.layout import PORT_ECN, PORT_PFC, PORT_SWITCH
from fabric_emu.ports.model import PortEnd
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the tests' namespace helpers
from tests.integration.netns_pair import bring_up, recorded_pins, run_in_netns  # noqa: E402

from smoke import parse_args  # noqa: E402  (benchmarks/smoke.py: scripts, not a package)

TAG = f"fepb{os.getpid() % 10000}"
BRIDGE = f"{TAG}br"
RATE, MTU, BUFFER = 400e6, 4200, 1_000_000
IPS = ("10.95.0.1", "10.95.0.2")
PAYLOAD = 4000
TOS = 26 << 2 | 2


def sh(*cmd: str) -> str:
    return subprocess.run(cmd, check=True, capture_output=True, text=True).stdout


class Bench:
    """h1 -- <TAG>s1 [bridge] <TAG>s2 -- h2; every name is this process's own."""

    def __init__(self) -> None:
        self.hosts = [f"{TAG}h1", f"{TAG}h2"]
        self.host_if = [f"{TAG}e1", f"{TAG}e2"]
        self.switch_if = [f"{TAG}s1", f"{TAG}s2"]
        self.pins: Path | None = None
        self._pinned = ExitStack()  # the recorded pin folder (netns_pair.recorded_pins)
        self.maps: datapath.PortMaps | None = None

    def up(self) -> None:
        sh("ovs-vsctl", "add-br", BRIDGE, "--", "set", "bridge", BRIDGE, "datapath_type=netdev",
           "protocols=OpenFlow15", "fail_mode=secure")
        with IPRoute() as ipr:
            for ns, hif, sif, ip in zip(self.hosts, self.host_if, self.switch_if, IPS):
                netns.create(ns)
                ipr.link("add", ifname=sif, kind="veth", peer={"ifname": hif, "net_ns_fd": ns})
                index = ipr.link_lookup(ifname=sif)[0]
                ipr.link("set", index=index, mtu=MTU, state="up")
                with shaping.open_iproute(ns) as hipr:
                    hipr.link("set", index=hipr.link_lookup(ifname=hif)[0], mtu=MTU)
                bring_up(ns, hif, ip)
                sh("ovs-vsctl", "add-port", BRIDGE, sif, "--", "set", "interface", sif,
                   f"ofport_request={self.switch_if.index(sif) + 1}")
        for ns, hif, peer_ip in zip(self.hosts, self.host_if, reversed(IPS)):
            subprocess.run(["ip", "netns", "exec", ns, "ethtool", "-K", hif, "tx", "off"], capture_output=True)
            mac = sh("ip", "netns", "exec", self.hosts[IPS.index(peer_ip)], "cat",
                     f"/sys/class/net/{self.host_if[IPS.index(peer_ip)]}/address").strip()
            sh("ip", "netns", "exec", ns, "ip", "neigh", "add", peer_ip, "lladdr", mac, "dev", hif)

    def down(self) -> None:
        subprocess.run(["ovs-vsctl", "--if-exists", "del-br", BRIDGE], capture_output=True)
        # The switch ends go first: removing a namespace deletes their peers, and with them
        # the switch ends, asynchronously (a lookup then a delete raced it in CI: ENODEV).
        with IPRoute() as ipr:
            for sif in self.switch_if:
                try:
                    ipr.link("del", ifname=sif)
                except NetlinkError as err:
                    if err.code != errno.ENODEV:
                        raise
        for ns in self.hosts:
            if ns in netns.listnetns():
                netns.remove(ns)
        self._unload()

    def _unload(self) -> None:
        if self.maps is not None:
            self.maps.close()
            self.maps = None
        self._pinned.close()
        self.pins = None

    def ends(self) -> list[tuple[str, str | None]]:
        return [(s, None) for s in self.switch_if] + [(h, f"/var/run/netns/{ns}")
                                                       for h, ns in zip(self.host_if, self.hosts)]

    def configure(self, mode: str) -> None:
        """Install one mode's queues, programs and flows on the same links."""
        self._unload()
        sh("ovs-ofctl", "-O", "OpenFlow15", "del-flows", BRIDGE)
        with shaping.IPRoutePool() as pool:
            for ifname, ns in self.ends():
                ipr = pool.get(ns)
                index = shaping.link_index(ipr, ifname)
                shaping.delete_root_qdisc(ipr, index)
                try:
                    ipr.tc("del", "clsact", index)
                except Exception:  # noqa: BLE001 - there was none
                    pass
                if mode == "fifo":
                    shaping.shape_egress(ifname, RATE, BUFFER, MTU, ns, pool=pool)
                else:
                    queues.shape_classes(queues.PortQueues(ifname, RATE, MTU, {0: BUFFER, 3: BUFFER, 6: BUFFER}, ns))
        if mode == "fifo":
            for a, b in ((1, 2), (2, 1)):
                sh("ovs-ofctl", "-O", "OpenFlow15", "add-flow", BRIDGE, f"in_port={a},actions=output:{b}")
            return
        self.pins = self._pinned.enter_context(recorded_pins("bench-port"))
        self.maps = datapath.PortMaps(self.pins)
        ids = {name: i for i, (name, _) in enumerate(self.ends())}
        peer = {self.switch_if[0]: self.host_if[0], self.switch_if[1]: self.host_if[1]}
        peer.update({v: k for k, v in peer.items()})
        ends = [PortEnd(ids[n], "sw" if ns is None else n, 0, n, ids[peer[n]],
                        "switch" if ns is None else "host", 100, RATE) for n, ns in self.ends()]
        for e in ends:
            if e.role == "switch":
                datapath.configure(self.maps, e.id, {"flags": PORT_SWITCH | PORT_ECN | PORT_PFC,
                                                     "limit": [BUFFER] * 8, "kmin": 100_000, "kmax": 400_000,
                                                     "pmax32": 1 << 30, "xoff": 100_000, "xon": 80_000,
                                                     "headroom": 47_104})
        netns_of = {e.node: dict(self.ends())[e.intf] for e in ends}
        datapath.attach(self.pins, ends, netns_of, self.maps)
        for a, b in ((1, 2), (2, 1)):
            tag = f"0e:fe:00:{ids[self.switch_if[a - 1]]:02x}:00:00"
            sh("ovs-ofctl", "-O", "OpenFlow15", "add-flow", BRIDGE,
               f"table=0,in_port={a},actions=set_field:{tag}->eth_src,goto_table:1")
            sh("ovs-ofctl", "-O", "OpenFlow15", "add-flow", BRIDGE, f"table=1,in_port={a},actions=output:{b}")


def _cpu() -> tuple[int, int]:
    parts = [int(x) for x in open("/proc/stat").readline().split()[1:]]
    return sum(parts[:8]) - parts[3] - parts[4], sum(parts[:8])


def _ovs_cpu() -> int:
    pid = int(Path("/var/run/openvswitch/ovs-vswitchd.pid").read_text())
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return int(fields[11]) + int(fields[12])  # utime + stime, clock ticks


def paced_udp(tx_ns: str, rx_ns: str, rx_ip: str, seconds: float, pps: int, tos: int = 0) -> dict:
    """Send PAYLOAD-byte UDP datagrams from namespace tx_ns to rx_ip (bound in rx_ns) for
    `seconds` at `pps`; what was sent and received, and the CPU clock ticks the machine and
    ovs-vswitchd spent meanwhile (also used by benchmarks/wire_cost.py)."""
    rx = run_in_netns(rx_ns, lambda: socket.socket(socket.AF_INET, socket.SOCK_DGRAM))
    rx.bind((rx_ip, 4791))
    rx.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 8 << 20)
    rx.settimeout(0.5)
    tx = run_in_netns(tx_ns, lambda: socket.socket(socket.AF_INET, socket.SOCK_DGRAM))
    tx.setsockopt(socket.IPPROTO_IP, socket.IP_TOS, tos)
    got = [0]

    def receive() -> None:
        try:
            while True:
                rx.recv(65536)
                got[0] += 1
        except TimeoutError:
            pass

    t = threading.Thread(target=receive)
    t.start()
    payload = b"r" * PAYLOAD
    busy0, total0 = _cpu()
    ovs0 = _ovs_cpu()
    start = time.monotonic()
    n = 0
    while (now := time.monotonic()) < start + seconds:
        due = int((now - start) * pps)
        while n < due:
            tx.sendto(payload, (rx_ip, 4791))
            n += 1
        time.sleep(0.0005)
    busy1, total1 = _cpu()
    ovs1 = _ovs_cpu()
    t.join()
    tx.close()
    rx.close()
    return {"sent": n, "received": got[0], "busy_ticks": busy1 - busy0, "ovs_ticks": ovs1 - ovs0}


def measure(bench: Bench, seconds: float, pps: int) -> dict:
    """Send for `seconds` at `pps`; CPU per received packet (machine, and OVS alone), in us."""
    m = paced_udp(bench.hosts[0], bench.hosts[1], IPS[1], seconds, pps, TOS)
    tick = 1e6 / os.sysconf("SC_CLK_TCK")
    return {"sent": m["sent"], "received": m["received"],
            "machine_us_per_pkt": m["busy_ticks"] * tick / max(1, m["received"]),
            "ovs_us_per_pkt": m["ovs_ticks"] * tick / max(1, m["received"])}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--seconds", type=float, default=4.0)
    ap.add_argument("--pps", type=int, default=3000)
    args = parse_args(ap, rounds=1, seconds=1.0)
    bench = Bench()
    results: dict[str, list[dict]] = {"fifo": [], "ports": []}
    try:
        bench.up()
        for r in range(args.rounds):
            for mode in ("fifo", "ports"):
                bench.configure(mode)
                m = measure(bench, args.seconds, args.pps)
                results[mode].append(m)
                print(f"round {r + 1} {mode:5s}: {m['received']}/{m['sent']} packets, "
                      f"machine {m['machine_us_per_pkt']:.1f} us/pkt, OVS {m['ovs_us_per_pkt']:.1f} us/pkt")
    finally:
        bench.down()
    for key in ("machine_us_per_pkt", "ovs_us_per_pkt"):
        fifo = statistics.median(m[key] for m in results["fifo"])
        ports = statistics.median(m[key] for m in results["ports"])
        print(f"{key}: fifo {fifo:.1f}, ports {ports:.1f}, ratio ports/fifo = {ports / fifo:.2f}")


if __name__ == "__main__":
    main()
