"""Micro-benchmark: microseconds to build one RoCEv2 data packet (UDP payload) in Python.

Compares the old PacketWriter.write (a CRC32 over BTH + payload per packet; the prefix CRC is
precomputed, as the NIC caches it) with QpPackets.packet (prebuilt template, incremental ICRC
by table lookups). No sockets; the best of several repeats is printed, since this machine is
shared and noisy.

Run:  .venv/bin/python benchmarks/packet_build.py [--packets 200000] [--repeats 5] [--smoke]
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable

from fabric_emu.wire import roce

from smoke import parse_args  # benchmarks/smoke.py (benchmarks are scripts, not a package)

SRC, DST, SPORT, QPN = "10.99.0.1", "10.99.0.2", 0xC123, 0x123456
MTU = 4096


def best_us_per_packet(run: Callable[[int], None], packets: int, repeats: int) -> float:
    """run(n) builds n packets; the fastest of `repeats` runs, per packet."""
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        run(packets)
        best = min(best, time.perf_counter() - start)
    return best / packets * 1e6


def writer_loop(writer: roce.PacketWriter, prefix: int, opcode: int, data_len: int,
                reth: tuple[int, int, int] | None) -> Callable[[int], None]:
    def run(n: int) -> None:
        write = writer.write
        for psn in range(n):
            write(prefix, opcode, QPN, psn, data_len, reth_fields=reth)
    return run


def template_loop(qp: roce.QpPackets, opcode: int, data_len: int,
                  message_len: int) -> Callable[[int], None]:
    def run(n: int) -> None:
        packet = qp.packet
        for psn in range(n):
            packet(opcode, psn, data_len, False, message_len)
    return run


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--packets", type=int, default=200_000)
    ap.add_argument("--repeats", type=int, default=5)
    args = parse_args(ap, packets=2000, repeats=1)

    cases = [("MIDDLE", roce.RC_RDMA_WRITE_MIDDLE, MTU),
             ("FIRST+RETH", roce.RC_RDMA_WRITE_FIRST, MTU),
             ("LAST", roce.RC_RDMA_WRITE_LAST, 333)]
    print(f"{'packet':<12} {'bytes':>5} {'PacketWriter us':>16} {'QpPackets us':>13} {'ratio':>6}")
    for name, opcode, data_len in cases:
        writer = roce.PacketWriter(MTU)
        prefix = roce.icrc_prefix(SRC, DST, SPORT, roce.udp_payload_len(opcode, data_len))
        reth = (0, QPN, 1 << 20) if roce.has_reth(opcode) else None
        qp = roce.QpPackets(SRC, DST, SPORT, QPN, MTU, rkey=QPN)
        if (bytes(writer.write(prefix, opcode, QPN, 5, data_len, reth_fields=reth))
                != bytes(qp.packet(opcode, 5, data_len, False, 1 << 20))):
            raise SystemExit(f"{name}: the two paths build different packets")

        old = best_us_per_packet(writer_loop(writer, prefix, opcode, data_len, reth),
                                 args.packets, args.repeats)
        new = best_us_per_packet(template_loop(qp, opcode, data_len, 1 << 20),
                                 args.packets, args.repeats)
        print(f"{name:<12} {data_len:>5} {old:>16.3f} {new:>13.3f} {old / new:>5.1f}x")


if __name__ == "__main__":
    main()
