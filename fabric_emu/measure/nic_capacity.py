"""How many packets per second one core of a NIC engine can send: the NIC half of this
machine's capacity (fabric_emu.measure.capacity caches it; `dilation: auto` divides by it).

What is measured is the COST FLOOR of the Python send path: a tight loop of sendto() of
`payload` bytes on one UDP socket to a sink that never reads, in a throwaway network namespace;
it follows this machine's speed. The engine's own rate is that floor divided by
ENGINE_COST_FACTOR: an engine also builds packets, keeps per-QP transport and DCQCN state,
receives, acknowledges and sleeps between batches. The factor is the engine's cost per packet
operation (a send or a receive) over the floor's, measured on the development machine (2 cores,
floor 320-400k sendto/s): a 128-host ring (benchmarks/scale.py, 4x16x8) at dilation 50,000
handled 16.3k operations/s on two engines at 22% of a core each, 37k per core; busier hosts
amortise the per-host work of a wake-up better (a quickstart engine reaches ~110k/s), so the
large fabric, where the estimate matters, sets the factor. benchmarks/nic_cpu.py measures the
engine directly. Measuring a real engine here would need a shaped host pair and the port
programs: a probe of its own, not done yet.
"""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import time

PROBE_VERSION = 3  # bump when nic_capacity_pps measures something else
ENGINE_COST_FACTOR = 9.0  # engine cost per packet operation / the sendto floor's (docstring)
DEFAULT_PAYLOAD = 4096  # a full RoCE packet at the plan's 4096-byte path MTU
PROBE_SECONDS = 1.0


def send_floor_pps(payload: int = DEFAULT_PAYLOAD, seconds: float = PROBE_SECONDS) -> float:
    """sendto() calls per second of one Python thread to a local sink that never reads.

    The sink's receive queue fills at once, after which the kernel drops at the socket: what
    is timed is the Python call, the system call and the UDP/IP send path, not a receiver."""
    sink = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    sink.bind(("127.0.0.1", 0))
    dest = sink.getsockname()
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    s.setsockopt(socket.IPPROTO_IP, socket.IP_TOS, 0x68 | 0b10)  # DSCP 26, ECT(0), as RoCE packets
    data = bytes(payload)
    sendto = s.sendto
    n = 0
    t0 = time.perf_counter()
    end = t0 + seconds
    while True:
        for _ in range(256):  # check the clock every 256 sends, not every send
            sendto(data, dest)
        n += 256
        t = time.perf_counter()
        if t >= end:
            break
    s.close()
    sink.close()
    return n / (t - t0)


def nic_capacity_pps(payload: int = DEFAULT_PAYLOAD, seconds: float = PROBE_SECONDS) -> dict:
    """Packet operations/s one core of a NIC engine handles, estimated from the send floor
    measured now (needs root: it runs in a throwaway network namespace so nothing on this
    machine is touched).

    Returns {"pps", "floor_pps", "what", "payload"}; "what" says how pps was obtained."""
    code = ("import json, subprocess, sys\n"
            "subprocess.run(['ip', 'link', 'set', 'lo', 'up'], check=True)\n"
            "from fabric_emu.measure.nic_capacity import send_floor_pps\n"
            f"print(json.dumps(send_floor_pps({int(payload)}, {float(seconds)})))\n")
    r = subprocess.run(["unshare", "--net", "--", sys.executable, "-c", code],
                       capture_output=True, text=True, timeout=30 + seconds)
    if r.returncode != 0:
        raise RuntimeError(f"NIC probe failed: {(r.stderr.strip().splitlines() or ['?'])[-1]}")
    floor = float(json.loads(r.stdout))
    return {"pps": floor / ENGINE_COST_FACTOR, "floor_pps": floor, "payload": payload,
            "what": f"engine estimate: the Python sendto floor / {ENGINE_COST_FACTOR} "
                    "(fabric_emu.measure.nic_capacity)"}
