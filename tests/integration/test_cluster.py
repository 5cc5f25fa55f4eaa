"""A fabric split over two machines through Mininet's Cluster Edition (issue 19), on one
kernel: two "servers" of their own network, mount and PID namespaces, each with its own Open
vSwitch and sshd (tests/integration/servers.py), driven over real ssh. 2 spines x 2 leaves x 2
hosts: leaf1, h1, h2 and spine1 on s1; leaf2, h3, h4 and spine2 on s2 (fabric_emu.topo.
placement), so leaf1-spine2 and leaf2-spine1 cross the underlay in VXLAN (fabric_emu.fabric.
stitch_link.StitchLink). The os-ken controller runs here, on loopback, reached through ssh -R.
Each server runs its own share of the port model (classes, port programs, PFC daemon and the
programs' stitch of the cut links: fabric_emu.run.machine), started over ssh.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from pathlib import Path

import pytest

from fabric_emu.fabric.cluster import ClusterFabric
from fabric_emu.fabric.machines import Machine
from fabric_emu.fabric.stitch_link import stitch_names
from fabric_emu.fabric.controller import start_controller
from fabric_emu.ports.model import EcnSettings, default_settings
from fabric_emu.spec.topology import TopologySpec
from fabric_emu.topo.placement import Placement, place
from fabric_emu.topo.plan import FabricPlan, build_plan
from tests.conftest import REPO
from tests.integration.servers import Server, two_servers

pytestmark = [pytest.mark.root, pytest.mark.skipif(os.geteuid() != 0, reason="needs root")]

TAG = f"fecl{os.getpid() % 100000}"
# A RoCEv2 burst (UDP 4791, DSCP 26, ECT(0)) from a host, retried while its NIC queue is full
# (ENOBUFS: paused or busy), as the NIC engines do: python's own, no fabric_emu on the host.
BURST = """
import errno, socket, sys, time
dst, frames, flows = sys.argv[1], int(sys.argv[2]), 8
socks = []
for i in range(flows):
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    s.setsockopt(socket.IPPROTO_IP, socket.IP_TOS, 26 << 2 | 2)
    s.bind(("", 50000 + i))
    socks.append(s)
bth = bytes([0x04, 0x40, 0xff, 0xff, 0, 0, 0, 0x11, 0x80, 0, 0, 0])
sent = 0
while sent < frames:
    try:
        socks[sent % flows].sendto(bth + bytes(3988), (dst, 4791))
        sent += 1
    except OSError as e:
        if e.errno != errno.ENOBUFS:
            raise
        time.sleep(0.0005)
print("sent", sent)
"""


@dataclass
class Split:
    plan: FabricPlan
    placement: Placement
    servers: dict[str, Server]
    fabric: ClusterFabric

    def server_of(self, node: str) -> Server:
        return self.servers[self.placement.machine_of[node]]

    def intf(self, node: str, peer: str) -> str:
        return next(p.intf for p in self.plan.ports(node) if p.peer == peer)

    def ping(self, src: str, dst: str, count: int = 1) -> bool:
        host = self.fabric.net.get(src)
        out = host.cmd(f"ping -c{count} -i0.02 -W2 -q {self.plan.host_by_name[dst].ip}")
        return f" {count} received" in out


def underlay_packets(server: Server) -> int:
    out = server.run(["cat", "/sys/class/net/ul0/statistics/tx_packets"]).stdout
    return int(out)


def plan_2x2() -> FabricPlan:
    return build_plan(TopologySpec(name="fecl", kind="leaf-spine", spines=2, leaves=2, hosts_per_leaf=2))


def machines_of(servers: tuple[Server, ...]) -> list[Machine]:
    return [Machine(s.name, s.ssh_address, s.address) for s in servers]


@pytest.fixture(scope="module")
def split(tmp_path_factory) -> Iterator[Split]:
    plan = plan_2x2()
    workdir = tmp_path_factory.mktemp("cluster")
    (workdir / "plan.json").write_text(plan.to_json())
    with two_servers(TAG) as servers:
        placement = place(plan, [s.name for s in servers])
        ctl = start_controller(workdir / "plan.json", workdir)
        ecn, pfc = default_settings(plan)
        ecn = EcnSettings(True, kmin=20_000, kmax=100_000, pmax=1.0)  # marks wherever a queue builds
        fabric = ClusterFabric(plan, placement, machines_of(servers), servers[0].ssh_config, ctl.port,
                               workdir, run_id=TAG, ports={"ecn": asdict(ecn), "pfc": asdict(pfc)})
        try:
            ctl.wait_listening()
            fabric.build()
            fabric.start()
            assert ctl.wait_ready(60), f"controller not ready:\n{ctl.log_file.read_text()[-2000:]}"
            yield Split(plan, placement, {s.name: s for s in servers}, fabric)
        finally:
            fabric.stop()
            ctl.stop()


def test_each_node_lives_on_its_machine(split: Split) -> None:
    placed = {name: [n for n, m in split.placement.machine_of.items() if m == name] for name in split.servers}
    assert placed["s1"] and placed["s2"]
    for name, server in split.servers.items():
        bridges = set(server.run(["ovs-vsctl", "--timeout=10", "list-br"]).stdout.split())
        assert bridges == {n for n in placed[name] if n in split.plan.switch_by_name}, name
    for h in split.plan.hosts:
        pid = split.fabric.net.get(h.name).pid  # as its machine sees it: Cluster Edition asks there
        home, other = split.server_of(h.name), next(s for s in split.servers.values() if s is not split.server_of(h.name))
        cmdline = home.run(["cat", f"/proc/{pid}/cmdline"]).stdout.replace("\0", " ")
        assert f"mininet:{h.name}" in cmdline, (h.name, home.name, cmdline)
        others = other.run(["pgrep", "-f", f"mininet:{h.name}$"]).stdout.split()
        assert others == [], f"{h.name} also runs on {other.name}"


def test_traffic_between_leaves_crosses_the_underlay(split: Split) -> None:
    assert split.ping("h1", "h3") and split.ping("h1", "h2")  # paths learnt, ARP resolved
    s1 = split.servers["s1"]
    before = underlay_packets(s1)
    assert split.ping("h1", "h2", count=20)
    within = underlay_packets(s1) - before
    before = underlay_packets(s1)
    assert split.ping("h1", "h3", count=20)
    across = underlay_packets(s1) - before
    assert across >= 20 and within < 5, (across, within)
    # the cut links' ends are the VXLAN devices of fabric_emu.fabric.stitch_link
    for ln in split.placement.cut:
        vni = next(i for i, x in enumerate(split.plan.links, start=1) if x == ln)
        for server in split.servers.values():
            shown = server.run(["ip", "-d", "link", "show", stitch_names(vni)[1]]).stdout
            assert re.search(rf"vxlan id {vni} remote 10\.210\.0\.\d", shown), shown


def capture(server: Server, intf: str, bpf: str, path: str) -> subprocess.Popen:
    """tcpdump on a server's interface (inside its namespaces), writing path."""
    p = subprocess.Popen(["nsenter", "-t", str(server.pid), "-n", "-m", "-p", "--", "tcpdump", "-i", intf, "-p",
                          "-n", "-U", "-w", path, bpf], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    while "listening on" not in (p.stderr.readline() or "listening on"):
        pass
    return p


def count(path: str, display_filter: str) -> int:
    out = subprocess.run(["tshark", "-r", path, "-Y", display_filter, "-T", "fields", "-e", "frame.number"],
                         capture_output=True, text=True, timeout=60).stdout
    return len(out.split())


def test_pfc_and_ecn_cross_between_machines(split: Split, tmp_path: Path) -> None:
    """h1 and h2 (s1) burst 2 x 600 RoCEv2 frames of 4 KB at h3 (s2): leaf2's port to h3 is the
    bottleneck, its ingress ports pause their upstreams, spine1 (s1) among them, over the
    underlay; spine1's paused queue to leaf2 builds and marks; the marks reach leaf2 on s2."""
    s2 = split.servers["s2"]
    assert split.ping("h1", "h3") and split.ping("h2", "h3")
    before = split.fabric.agents.counters()
    ul = capture(s2, "ul0", "udp port 4789", str(tmp_path / "underlay.pcap"))
    into_leaf2 = split.intf("leaf2", "spine1")
    ce = capture(s2, into_leaf2, "udp dst port 4791 and ip[1] & 3 == 3", str(tmp_path / "ce.pcap"))
    try:
        dst = split.plan.host_by_name["h3"].ip
        # the host's popen goes through ssh, which hands the words to a shell there: quoted
        senders = [split.fabric.net.get(h).popen(["python3", "-c", shlex.quote(BURST), dst, "600"])
                   for h in ("h1", "h2")]
        for p in senders:
            out, err = p.communicate(timeout=120)
            assert p.returncode == 0, err
        time.sleep(1.0)  # what is queued drains
    finally:
        for p in (ul, ce):
            p.terminate()
            p.wait(10)
    after = split.fabric.agents.counters()

    def delta(machine: str, intf: str, name: str) -> int:
        return after[machine][intf][name] - before[machine][intf][name]

    out_of_spine1 = split.intf("spine1", "leaf2")
    pauses_over_underlay = count(str(tmp_path / "underlay.pcap"), "vxlan && eth.type == 0x8808")
    marks_arrived = count(str(tmp_path / "ce.pcap"), "ip.dsfield.ecn == 3")
    print(f"\nPFC frames on the underlay {pauses_over_underlay}; leaf2 -> spine1 pauses sent "
          f"{delta('s2', into_leaf2, 'pause_tx_p3')}, received on s1 {delta('s1', out_of_spine1, 'pause_rx_p3')}; "
          f"spine1 -> leaf2 marked {delta('s1', out_of_spine1, 'marked_p3')} on s1, CE frames into leaf2 on s2 "
          f"{marks_arrived}")
    assert pauses_over_underlay > 0, "no PFC frame crossed the underlay"
    assert delta("s2", into_leaf2, "pause_tx_p3") > 0  # leaf2 paused spine1 ...
    assert delta("s1", out_of_spine1, "pause_rx_p3") > 0  # ... which got it on the other machine
    assert delta("s1", out_of_spine1, "marked_p3") > 0  # spine1 marked on s1 ...
    assert marks_arrived > 0  # ... and the marks reached s2
    for machine, ports in after.items():
        for intf, c in ports.items():
            assert c["lossless_drops"] == before[machine][intf]["lossless_drops"], (machine, intf)


def test_cutting_the_underlay_breaks_only_cross_machine_traffic(split: Split) -> None:
    s1 = split.servers["s1"]
    s1.run(["ip", "link", "set", "ul0", "down"], check=True)
    try:
        assert not split.ping("h1", "h3"), "h1 reached h3 with the underlay down"
        assert not split.ping("h4", "h2"), "h4 reached h2 with the underlay down"
        assert split.ping("h1", "h2") and split.ping("h3", "h4")
    finally:
        s1.run(["ip", "link", "set", "ul0", "up"], check=True)


def test_a_1500_byte_underlay_is_refused_before_anything_is_built(tmp_path: Path) -> None:
    plan = plan_2x2()
    with two_servers(TAG + "m", underlay_mtu=1500) as servers:
        placement = place(plan, [s.name for s in servers])
        fabric = ClusterFabric(plan, placement, machines_of(servers), servers[0].ssh_config, 6653, tmp_path,
                               run_id=TAG)
        with pytest.raises(ValueError, match=r"MTU 1500: .* need an underlay MTU of at least 4250"):
            fabric.build()
        for server in servers:
            assert server.run(["ovs-vsctl", "--timeout=10", "list-br"]).stdout.split() == []
            links = server.run(["ip", "-o", "link", "show"]).stdout
            assert "fevx" not in links and "leaf" not in links and "spine" not in links


def server_state(server: Server) -> dict[str, object]:
    """What fabric-emu may have left on a server: bridges, interfaces, its processes, pins, records."""
    procs = server.run(["ps", "-e", "-o", "args="]).stdout.splitlines()
    return {
        "bridges": server.run(["ovs-vsctl", "--timeout=10", "list-br"]).stdout.split(),
        "interfaces": sorted(re.findall(r"^\d+: ([^:@]+)", server.run(["ip", "-o", "link", "show"]).stdout, re.M)),
        "processes": sorted(p for p in procs if "fabric_emu" in p or "mininet:" in p),
        "pins": server.run(["find", "/sys/fs/bpf/fabric-emu", "-mindepth", "1"]).stdout.split(),
        "records": server.run(["find", "/var/lib/fabric-emu/runs", "-type", "f"]).stdout.split(),
    }


def test_a_killed_head_leaves_nothing_on_any_machine() -> None:
    """kill -9 of the head with the fabric up; then `fabric-emu clean` on the head (its record
    names the ssh clients): every machine's share goes with its ssh sessions, by its own record."""
    from fabric_emu.state.cleanup import clean_stale

    run_id = TAG + "k"
    with two_servers(TAG + "k") as servers:
        empty = {s.name: server_state(s) for s in servers}
        args = {"run_id": run_id, "ssh_config": str(servers[0].ssh_config),
                "machines": [[s.name, s.ssh_address, s.address] for s in servers]}
        head = subprocess.Popen([sys.executable, "-m", "tests.integration.cluster_head", json.dumps(args)],
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=REPO)
        try:
            line = head.stdout.readline().strip()
            assert line == "UP", head.stderr.read() if head.poll() is not None else line
            for s in servers:
                up = server_state(s)
                assert up["bridges"] and up["pins"] and up["records"], (s.name, up)
                assert any("fabric_emu.run.machine" in p for p in up["processes"]), up["processes"]
        finally:
            head.kill()
            head.wait()
        removed, _ = clean_stale()
        assert any(run_id in r for r in removed), removed
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and any(server_state(s) != empty[s.name] for s in servers):
            time.sleep(0.5)
        for s in servers:
            assert server_state(s) == empty[s.name], s.name
        assert not list(Path("/tmp").glob(f"fabric-emu-*{run_id}")), "a workdir was left"


def test_a_ring_allreduce_runs_across_machines(split: Split, tmp_path: Path) -> None:
    """The NIC engines of each machine's hosts run on that machine (started over ssh, their
    hosts' namespaces as that machine sees them), all on one start epoch; the ring crosses the
    underlay twice per round and completes at line rate, with no packet retransmitted."""
    from fabric_emu.nic.launch import run_agents
    from fabric_emu.results.jobs import ring_section
    from fabric_emu.spec.load import load_experiment
    from fabric_emu.state.records import RunRecord
    from fabric_emu.topo.plan import resolve_ranks

    (tmp_path / "topo.yaml").write_text("name: fecl\nkind: leaf-spine\nspines: 2\nleaves: 2\nhosts_per_leaf: 2\n")
    # No DCQCN: the fabric's ECN marks from 20 KB (for the test above) would cut the ring's rates
    # wherever this machine's scheduling bunches a few frames (busbw 0.57-0.74 in six runs today, 0.93-0.94 without)
    (tmp_path / "exp.yaml").write_text("name: ring\ntopology: topo.yaml\nload_balancing: ecmp\nseed: 1\ntimeout: 60\n"
                                       "congestion_control: none\n"
                                       "workload: {type: allreduce, algorithm: ring, size: 4MB, iterations: 2}\n")
    spec = load_experiment(tmp_path / "exp.yaml")
    ranks = resolve_ranks(split.plan, "all")
    record = RunRecord(TAG + "r", os.getpid(), 0, time.time())  # not saved: the engines end with the test
    agents = run_agents(spec, split.plan, ranks, split.fabric, record, tmp_path, say=print, site=split.fabric)
    assert {h: a["status"] for h, a in agents.items()} == {h: "ok" for h in ranks}, agents
    on_machines = {split.placement.machine_of[h] for h in ranks}
    assert on_machines == {"s1", "s2"}
    retransmitted = sum(qp.get("retransmitted", 0) for a in agents.values() for qp in a.get("qps", []))
    ring = ring_section(spec.workload, split.plan, len(ranks), agents, host_gbps=100.0)
    print(f"\nring all-reduce over 2 machines: busbw {ring['busbw_gbps']:.1f} Gb/s "
          f"({ring['busbw_fraction']:.3f} of the link), retransmitted {retransmitted}")
    assert ring["iterations_completed"] == 2
    assert retransmitted == 0
    assert 0.8 <= ring["busbw_fraction"] <= 1.02
