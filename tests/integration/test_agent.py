"""Real host agents in network namespaces run a ring all-reduce over a Linux bridge.

    feag-h1      feag-h2      feag-h3        one namespace per host, 10.99.0.x/24
      feagh1       feagh2       feagh3
        |            |            |          veth pairs
      feags1       feags2       feags3
        +------- feagbr ---------+           Linux bridge in namespace feag-sw
"""

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
from scapy.contrib.roce import BTH
from scapy.layers.inet import IP, UDP
from scapy.utils import rdpcap

from fabric_emu import roce
from fabric_emu.agent.config import AgentConfig, RankInfo, WorkloadConfig
from fabric_emu.collectives import RingAllReduce, algbw, allreduce_busbw

pytestmark = [
    pytest.mark.root,
    pytest.mark.skipif(os.geteuid() != 0, reason="needs root for network namespaces"),
]

REPO = Path(__file__).resolve().parents[2]
SWITCH_NS = "feag-sw"
BRIDGE = "feagbr"


def sh(*args: str) -> None:
    subprocess.run(args, check=True, capture_output=True, text=True)


class BridgeLab:
    """n host namespaces on one bridge; removes everything it created."""

    def __init__(self, n: int):
        self.hosts = [f"h{i}" for i in range(1, n + 1)]
        self.namespaces: list[str] = []

    def ns(self, host: str) -> str:
        return f"feag-{host}"

    def ip(self, host: str) -> str:
        return f"10.99.0.{self.hosts.index(host) + 1}"

    def intf(self, host: str) -> str:
        return f"feag{host}"

    def __enter__(self) -> "BridgeLab":
        try:
            self._add_ns(SWITCH_NS)
            sh("ip", "-n", SWITCH_NS, "link", "add", BRIDGE, "type", "bridge")
            sh("ip", "-n", SWITCH_NS, "link", "set", BRIDGE, "up")
            for i, host in enumerate(self.hosts, 1):
                ns, port = self.ns(host), f"feags{i}"
                self._add_ns(ns)
                sh("ip", "link", "add", self.intf(host), "netns", ns, "type", "veth",
                   "peer", "name", port, "netns", SWITCH_NS)
                sh("ip", "-n", SWITCH_NS, "link", "set", port, "master", BRIDGE, "up")
                sh("ip", "-n", ns, "addr", "add", f"{self.ip(host)}/24", "dev", self.intf(host))
                sh("ip", "-n", ns, "link", "set", self.intf(host), "up")
        except BaseException:
            self.__exit__()
            raise
        return self

    def _add_ns(self, ns: str) -> None:
        sh("ip", "netns", "add", ns)
        self.namespaces.append(ns)
        sh("ip", "-n", ns, "link", "set", "lo", "up")

    def __exit__(self, *exc: object) -> None:
        for ns in reversed(self.namespaces):  # deleting a namespace deletes its veth ends
            subprocess.run(["ip", "netns", "del", ns], capture_output=True)
        self.namespaces.clear()


def agent_configs(lab: BridgeLab, tmp: Path, timeout_s: float = 30.0,
                  **workload: int) -> list[AgentConfig]:
    ranks = tuple(RankInfo(name=h, ip=lab.ip(h), index=i) for i, h in enumerate(lab.hosts))
    return [AgentConfig(host=h, ip=lab.ip(h), rate_bps=50e6, roce_mtu=1024, ranks=ranks,
                        rank=i, workload=WorkloadConfig(**workload), seed=3,
                        stats_path=str(tmp / f"{h}.json"), timeout_s=timeout_s)
            for i, h in enumerate(lab.hosts)]


@contextmanager
def running_agents(lab: BridgeLab, cfgs: list[AgentConfig],
                   tmp: Path) -> Iterator[list[subprocess.Popen]]:
    """Agents started in their namespaces and READY; killed on the way out if still running."""
    procs = []
    try:
        for cfg in cfgs:
            path = tmp / f"{cfg.host}.config.json"
            path.write_text(cfg.to_json())
            procs.append(subprocess.Popen(
                ["ip", "netns", "exec", lab.ns(cfg.host), sys.executable, "-m",
                 "fabric_emu.agent", str(path)],
                cwd=REPO, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True))
        for p in procs:
            assert p.stdout.readline().strip() == "READY"
        yield procs
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()


def send_go(procs: list[subprocess.Popen], delay_s: float = 0.3) -> None:
    go = time.time() + delay_s
    for p in procs:
        p.stdin.write(f"GO {go}\n")
        p.stdin.flush()


def start_capture(lab: BridgeLab, host: str, pcap: Path) -> subprocess.Popen:
    cap = subprocess.Popen(
        ["ip", "netns", "exec", lab.ns(host), "tcpdump", "-i", lab.intf(host), "-Q", "in",
         "-n", "-U", "-c", "40", "-w", str(pcap), "udp", "dst", "port", str(roce.ROCE_UDP_PORT)],
        stderr=subprocess.PIPE, text=True)
    assert "listening on" in cap.stderr.readline()
    return cap


def test_ring_allreduce_three_agents(tmp_path):
    size, iterations, qps = 2_000_000, 2, 2
    pcap = tmp_path / "h2.pcap"
    with BridgeLab(3) as lab:
        cfgs = agent_configs(lab, tmp_path, size=size, iterations=iterations, qps_per_peer=qps)
        with running_agents(lab, cfgs, tmp_path) as procs:
            cap = start_capture(lab, "h2", pcap)
            try:
                send_go(procs)
                outs = [p.communicate(timeout=60)[0] for p in procs]
                cap.wait(timeout=10)
            finally:
                if cap.poll() is None:
                    cap.kill()
    assert [p.returncode for p in procs] == [0, 0, 0]
    assert all(o.strip() == "DONE" for o in outs)
    stats = [json.loads(Path(c.stats_path).read_text()) for c in cfgs]
    check_stats(cfgs, stats, size, iterations, qps)
    check_capture(pcap, lab, stats)


def test_sigterm_and_timeout_write_incomplete_stats(tmp_path):
    with BridgeLab(2) as lab:
        cfgs = agent_configs(lab, tmp_path, timeout_s=2.0, size=20_000_000, iterations=1,
                             qps_per_peer=1)
        with running_agents(lab, cfgs, tmp_path) as procs:
            send_go(procs, delay_s=0.1)
            time.sleep(0.6)
            procs[0].send_signal(signal.SIGTERM)  # `ip netns exec` has exec'd the agent
            outs = [p.communicate(timeout=10)[0] for p in procs]
    assert [p.returncode for p in procs] == [1, 1] and outs == ["", ""]
    stats = [json.loads(Path(c.stats_path).read_text()) for c in cfgs]
    assert [s["status"] for s in stats] == ["incomplete", "incomplete"]
    assert stats[0]["error"] == f"stopped by signal {signal.SIGTERM}"
    assert stats[1]["error"] == "timeout"
    assert stats[1]["recv_qps"][0]["bytes"] == stats[0]["send_qps"][0]["bytes"] > 0
    assert stats[1]["iterations"][0]["end"] is None


def test_local_queue_drops_are_retried_not_lost(tmp_path):
    """A qdisc slower than the agent drops packets: the agent sees ENOBUFS and resends them."""
    with BridgeLab(2) as lab:
        sh("ip", "netns", "exec", lab.ns("h1"), "tc", "qdisc", "add", "dev", lab.intf("h1"),
           "root", "tbf", "rate", "20mbit", "burst", "10kb", "limit", "20kb")
        cfgs = agent_configs(lab, tmp_path, size=1_000_000, iterations=1, qps_per_peer=2)
        with running_agents(lab, cfgs, tmp_path) as procs:
            send_go(procs)
            for p in procs:
                p.communicate(timeout=30)
    assert [p.returncode for p in procs] == [0, 0]
    h1, h2 = (json.loads(Path(c.stats_path).read_text()) for c in cfgs)
    assert h1["pacing"]["eagain_retries"] > 0
    assert h1["pacing"]["achieved_bps"] < 25e6  # what the qdisc let through
    # n=2: two steps of a 500 KB chunk, split over two QPs
    assert [rq["bytes"] for rq in h2["recv_qps"]] == [500_000, 500_000]
    assert all(rq["missing"] == 0 and rq["damaged_messages"] == 0 for rq in h2["recv_qps"])


CE_PROBE = """
import json, socket, time
from fabric_emu import roce
from fabric_emu.agent.loop import now
from fabric_emu.agent.nic import Nic
from fabric_emu.agent.qps import QueuePair
qp = QueuePair("a", "b", 0, src_qpn=100, dst_qpn=200, start_psn=7, udp_sport=0xC000)
nic = Nic("127.0.0.1", 1e9, 1024, [], [qp], {}, now())
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
for psn, tos in ((7, roce.TOS_ROCE), (8, roce.TOS_ROCE | roce.ECN_CE)):
    s.setsockopt(socket.IPPROTO_IP, socket.IP_TOS, tos)
    s.sendto(roce.build_packet("127.0.0.1", "127.0.0.1", 0xC000, roce.RC_RDMA_WRITE_ONLY, 200,
                               psn, 64, reth_fields=(0, 0, 64)), ("127.0.0.1", 4791))
deadline = time.monotonic() + 2
while nic.recv_qps[0].packets < 2 and time.monotonic() < deadline:
    nic.wait(0.1)
    nic.receive(now())
print(json.dumps(nic.recv_qps[0].stats()))
"""


def test_receiver_counts_ce_marks():
    """IP_RECVTOS on the receive socket reports CE (TOS & 3 == 3) per packet."""
    ns = "feag-ce"
    sh("ip", "netns", "add", ns)
    try:
        sh("ip", "-n", ns, "link", "set", "lo", "up")
        out = subprocess.run(["ip", "netns", "exec", ns, sys.executable, "-c", CE_PROBE],
                             cwd=REPO, check=True, capture_output=True, text=True).stdout
    finally:
        subprocess.run(["ip", "netns", "del", ns], capture_output=True)
    rq = json.loads(out)
    assert (rq["packets"], rq["bytes"], rq["messages"], rq["ecn_ce"]) == (2, 128, 2, 1)


def check_stats(cfgs, stats, size, iterations, qps):
    n = len(cfgs)
    names = tuple(c.host for c in cfgs)
    for cfg, st in zip(cfgs, stats):
        assert st["status"] == "ok" and st["error"] is None
        sched = RingAllReduce(names, cfg.rank, size, qps, iterations)
        per_qp = [sum(step.recv_parts[q] for step in sched.steps) * iterations for q in range(qps)]
        assert [rq["bytes"] for rq in st["recv_qps"]] == per_qp
        for rq in st["recv_qps"]:
            assert rq["src"] == sched.left
            assert rq["messages"] == sched.total_steps and rq["damaged_messages"] == 0
            assert (rq["missing"], rq["out_of_order"], rq["duplicates"]) == (0, 0, 0)
            assert rq["ecn_ce"] == 0
        sent = sum(sq["bytes"] for sq in st["send_qps"])
        assert sent == sum(s.send_bytes for s in sched.steps) * iterations
        assert len({sq["udp_src"] for sq in st["send_qps"]}) == qps
        assert st["pacing"]["eagain_retries"] == 0
        # Pacing works: never faster than the line rate, and not grossly slower. The bounds
        # catch a broken pacer (2x fast, 10x slow), not a busy machine: a short stall of this
        # shared 2-core VM must not fail the test; benchmarks/agent_send.py measures speed.
        assert 0.6 <= st["pacing"]["achieved_bps"] / cfg.rate_bps <= 1.05
        payload_rate = cfg.rate_bps * 1024 / roce.frame_len(
            roce.udp_payload_len(roce.RC_RDMA_WRITE_MIDDLE, 1024))
        assert [it["iteration"] for it in st["iterations"]] == list(range(iterations))
        for it in st["iterations"]:  # no iteration can beat the link
            assert allreduce_busbw(algbw(size, it["seconds"]), n) * 8 <= 1.05 * payload_rate, it
        whole = sum(it["seconds"] for it in st["iterations"])
        busbw_bits = allreduce_busbw(algbw(size * iterations, whole), n) * 8
        assert busbw_bits >= 0.6 * payload_rate  # the whole run, not a stall-prone slice
        assert all(s["start"] <= s["sent"] and s["received"] for s in st["steps"])
    # a sender's QP is its right neighbour's receive QP with the same numbers
    for i, st in enumerate(stats):
        right = stats[(i + 1) % n]
        for sq, rq in zip(st["send_qps"], right["recv_qps"]):
            assert (sq["qpn"], sq["remote_qpn"]) == (rq["remote_qpn"], rq["qpn"])
            assert sq["bytes"] == rq["bytes"] and sq["packets"] == rq["packets"]


def check_capture(pcap: Path, lab: BridgeLab, stats: list[dict]) -> None:
    """What crossed the bridge is RoCEv2 as the ICRC was computed for: id 0, DF, ECT(0), csum 0."""
    packets = rdpcap(str(pcap))
    assert len(packets) == 40
    h1_qpns = {sq["remote_qpn"] for sq in stats[0]["send_qps"]}
    for pkt in packets:
        ip, udp, bth = pkt[IP], pkt[UDP], pkt[BTH]
        assert (ip.src, ip.dst) == (lab.ip("h1"), lab.ip("h2"))
        assert ip.id == 0 and ip.flags == "DF" and ip.frag == 0
        assert ip.tos == roce.TOS_ROCE and ip.tos & 3 == roce.ECN_ECT0
        assert udp.chksum == 0 and udp.dport == roce.ROCE_UDP_PORT
        assert bth.dqpn in h1_qpns and bth.pkey == 0xFFFF
        assert bth.icrc == int.from_bytes(bth.compute_icrc(None), "big")
        assert roce.check_icrc(ip.src, ip.dst, udp.sport, bytes(udp.payload))
    # Wireshark's dissector recognises it as RoCEv2 (RRoCE), RETH included
    fields = subprocess.run(
        ["tshark", "-r", str(pcap), "-T", "fields", "-e", "frame.protocols",
         "-e", "infiniband.bth.opcode", "-e", "infiniband.reth.dmalen"],
        check=True, capture_output=True, text=True).stdout.splitlines()
    assert len(fields) == len(packets)
    for line in fields:
        protocols, opcode, dmalen = (line.split("\t") + [""])[:3]
        assert protocols.endswith(":udp:infiniband:data")
        assert (dmalen != "") == roce.has_reth(int(opcode))
