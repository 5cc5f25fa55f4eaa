"""Benchmark the host agent's send path: paced rate accuracy and the unpaced packet rate.

    feagb-tx [feagbtx] ---- veth ---- [feagbrx] feagb-rx      (no shaping)

For each configured rate one sender process runs the agent's NIC and event loop (fabric_emu.agent
nic + loop) in feagb-tx for a few seconds, and a receiver process runs the agent's receive path
in feagb-rx and counts what arrived. An unpaced run gives the highest packet rate one agent
process reaches; a plain-socket sendto loop of the same datagrams in the same namespace is the
baseline it is compared with (this machine is shared and noisy: read ratios, not absolutes).

Run as root:  .venv/bin/python benchmarks/agent_send.py [--rates 50,200,800] [--roce-mtu 4096]
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import subprocess
import sys
import time
from dataclasses import dataclass

from fabric_emu import roce
from fabric_emu.agent.loop import now, run_loop
from fabric_emu.agent.nic import Nic
from fabric_emu.agent.qps import build_qp_table
from fabric_emu.plan import ROCE_IP_OVERHEAD

TX_NS, RX_NS = "feagb-tx", "feagb-rx"
TX_IF, RX_IF = "feagbtx", "feagbrx"
TX_IP, RX_IP = "10.99.1.1", "10.99.1.2"
UNPACED_BPS = 1e12
MESSAGE_BYTES = 1 << 20
RECEIVER_IDLE_S = 0.5
SEED = 1


# --------------------------------------------------------------------------- child processes
class TimedSender:
    """Driver that keeps every send QP busy until `until`, then lets the NIC drain."""

    wake_at = None  # never waits for a start time (run_loop's Driver protocol)

    def __init__(self, nic: Nic, until: float):
        self.nic, self.until = nic, until

    @property
    def finished(self) -> bool:
        return now() >= self.until and self.nic.idle

    def advance(self, t: float) -> None:
        if t >= self.until:
            return
        for q, sq in enumerate(self.nic.send_qps):
            if len(sq.messages) < 2:
                self.nic.post_write(q, MESSAGE_BYTES, t)


class IdleReceiver:
    """Driver that finishes once packets stop arriving."""

    wake_at = None

    def __init__(self, nic: Nic):
        self.nic = nic

    @property
    def finished(self) -> bool:
        last = max((rq.last_rx or 0.0 for rq in self.nic.recv_qps), default=0.0)
        return last > 0 and now() - last > RECEIVER_IDLE_S

    def advance(self, t: float) -> None:
        pass


def child_send(rate_bps: float, mtu: int, qps: int, seconds: float) -> dict:
    table = build_qp_table([("tx", "rx")], qps, SEED)
    nic = Nic(TX_IP, rate_bps, mtu, table, [], {"rx": RX_IP}, now())
    cpu0, t0 = time.process_time(), now()
    run_loop(TimedSender(nic, t0 + seconds), nic, False, t0 + seconds + 30)
    wall, cpu = now() - t0, time.process_time() - cpu0
    packets = sum(sq.packets for sq in nic.send_qps)
    nic.close()
    return {"pacing": nic.pacing_stats(), "packets": packets, "pps": packets / wall,
            "cpu": cpu / wall}


def child_recv(mtu: int, qps: int, timeout: float) -> dict:
    table = build_qp_table([("tx", "rx")], qps, SEED)
    nic = Nic(RX_IP, UNPACED_BPS, mtu, [], table, {"tx": TX_IP}, now())
    print("READY", flush=True)
    run_loop(IdleReceiver(nic), nic, False, now() + timeout)
    nic.close()
    return {"bytes": sum(rq.bytes for rq in nic.recv_qps),
            "packets": sum(rq.packets for rq in nic.recv_qps),
            "missing": sum(rq.missing for rq in nic.recv_qps)}


def child_raw(mtu: int, seconds: float) -> dict:
    """Baseline: the same datagrams from a bare sendto loop (no pacing, no RoCE work)."""
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    payload = bytes(roce.udp_payload_len(roce.RC_RDMA_WRITE_MIDDLE, mtu))
    addr, sent, t0 = (RX_IP, roce.ROCE_UDP_PORT), 0, time.monotonic()
    while (elapsed := time.monotonic() - t0) < seconds:
        for _ in range(100):
            s.sendto(payload, addr)
        sent += 100
    return {"pps": sent / elapsed}


# --------------------------------------------------------------------------- the lab
def sh(*args: str) -> None:
    subprocess.run(args, check=True, capture_output=True, text=True)


@dataclass
class VethLab:
    mtu: int

    def __enter__(self) -> "VethLab":
        try:
            for ns in (TX_NS, RX_NS):
                sh("ip", "netns", "add", ns)
            sh("ip", "link", "add", TX_IF, "netns", TX_NS, "type", "veth",
               "peer", "name", RX_IF, "netns", RX_NS)
            for ns, intf, ip in ((TX_NS, TX_IF, TX_IP), (RX_NS, RX_IF, RX_IP)):
                sh("ip", "-n", ns, "link", "set", intf, "mtu", str(self.mtu), "up")
                sh("ip", "-n", ns, "addr", "add", f"{ip}/24", "dev", intf)
        except BaseException:
            self.__exit__()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        for ns in (TX_NS, RX_NS):
            subprocess.run(["ip", "netns", "del", ns], capture_output=True)


def in_ns(ns: str, *args: str) -> list[str]:
    return ["ip", "netns", "exec", ns, sys.executable, __file__, "--child", *args]


def measure(sender: list[str], mtu: int, qps: int, seconds: float) -> dict:
    """Run a sender child against a receiver child; the sender's JSON plus what arrived."""
    recv = subprocess.Popen(in_ns(RX_NS, "recv", str(mtu), str(qps), str(seconds + 30)),
                            stdout=subprocess.PIPE, text=True)
    try:
        assert recv.stdout.readline().strip() == "READY"
        send = subprocess.run(sender, capture_output=True, text=True, check=True)
        received = json.loads(recv.communicate(timeout=60)[0])
    finally:
        if recv.poll() is None:
            recv.kill()
    return {**json.loads(send.stdout), "received": received}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rates", default="50,200,800", help="paced rates in Mb/s")
    ap.add_argument("--roce-mtu", type=int, default=4096)
    ap.add_argument("--qps", type=int, default=2)
    ap.add_argument("--seconds", type=float, default=2.0)
    args = ap.parse_args()
    if os.geteuid() != 0:
        print("error: needs root (network namespaces)", file=sys.stderr)
        return 2
    mtu = args.roce_mtu
    rows = []
    with VethLab(max(1500, mtu + ROCE_IP_OVERHEAD)):
        for mbps in [float(r) for r in args.rates.split(",")] + [None]:
            rate = UNPACED_BPS if mbps is None else mbps * 1e6
            sender = in_ns(TX_NS, "send", str(rate), str(mtu), str(args.qps), str(args.seconds))
            rows.append((mbps, measure(sender, mtu, args.qps, args.seconds)))
        raw = measure(in_ns(TX_NS, "raw", str(mtu), str(args.seconds)), mtu, args.qps,
                      args.seconds)
    print_table(rows, raw, mtu, args.qps)
    return 0


def print_table(rows: list[tuple[float | None, dict]], raw: dict, mtu: int, qps: int) -> None:
    frame = roce.frame_len(roce.udp_payload_len(roce.RC_RDMA_WRITE_MIDDLE, mtu))
    print(f"agent send path: roce_mtu {mtu} B ({frame} B frames), {qps} QPs, veth, no shaping")
    print(f"{'configured':>11} {'achieved':>10} {'ratio':>6} {'pkt/s':>8} {'late max':>9} "
          f"{'cpu':>5} {'rx/tx pkts':>10} {'missing':>7}")
    for mbps, r in rows:
        p = r["pacing"]
        achieved = p["achieved_bps"] / 1e6
        conf = "unpaced" if mbps is None else f"{mbps:g} Mb/s"
        ratio = "" if mbps is None else f"{achieved / mbps:.3f}"
        rx = r["received"]
        print(f"{conf:>11} {achieved:>8.1f}Mb {ratio:>6} {r['pps']:>8.0f} "
              f"{p['max_lateness_s'] * 1e3:>7.2f}ms {r['cpu']:>5.0%} "
              f"{rx['packets'] / max(r['packets'], 1):>10.4f} {rx['missing']:>7}")
    unpaced = rows[-1][1]["pps"]
    print(f"baseline: bare sendto loop {raw['pps']:.0f} pkt/s; "
          f"unpaced agent / baseline = {unpaced / raw['pps']:.2f}")


def child_main(argv: list[str]) -> None:
    role, rest = argv[0], argv[1:]
    if role == "send":
        out = child_send(float(rest[0]), int(rest[1]), int(rest[2]), float(rest[3]))
    elif role == "recv":
        out = child_recv(int(rest[0]), int(rest[1]), float(rest[2]))
    else:
        out = child_raw(int(rest[0]), float(rest[1]))
    print(json.dumps(out), flush=True)


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "--child":
        child_main(sys.argv[2:])
    else:
        sys.exit(main())
