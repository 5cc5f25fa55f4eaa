"""Is OVS's forwarding thread behind? Its own datapath statistics say, where its CPU use cannot.

ovs-vswitchd's main thread forwards every `system` port of the userspace datapath, and its CPU
time is no measure of how far behind it is: each wakeup polls every port, and the kernel work of
delivering what it sends (the egress qdisc and BPF program, the peer namespace's receive path)
is charged to it while arrivals are sparse, and to ksoftirqd once they are not. Measured on the
quickstart fabric (2 cores): at dilation 4000 it was >= 95% busy forwarding 12.7k frames/s one
by one (output batches of 1.0, no loss, bus bandwidth 97% of the link), at dilation 1000 60%
busy forwarding 38k frames/s in batches of 7. A thread that is behind finds packets waiting at
every poll: its batches fill towards NETDEV_MAX_BURST (32), as they did (31.9) when iperf3
flooded one bridge at its limit. So OVS's thread counts as saturated in a sample only when it is
busy AND its output batches average at least BEHIND_BATCH packets.

The statistics come from `dpif-netdev/pmd-stats-show` over ovs-vswitchd's unixctl socket
(JSON-RPC, no process forked), cleared after each read so each sample covers its own interval.
"""

from __future__ import annotations

import json
import re
import socket
from pathlib import Path

NETDEV_MAX_BURST = 32
BEHIND_BATCH = NETDEV_MAX_BURST / 2
RUNDIRS = ("/var/run/openvswitch", "/run/openvswitch")


def parse_main_thread(text: str) -> dict | None:
    """{"packets": received, "output_batch": avg packets per output batch, "upcalls": misses
    of the flow cache that went up to the OpenFlow tables} of the main thread's section of
    pmd-stats-show; None when it has none (no netdev bridge)."""
    m = re.search(r"^main thread:\n((?:[ \t].*\n?)*)", text, re.M)
    if not m:
        return None
    body = m.group(1)

    def count(label: str) -> int:
        found = re.search(label + r":\s*(\d+)", body)
        return int(found.group(1)) if found else 0

    batch = re.search(r"avg\. packets per output batch:\s*([\d.]+)", body)
    return {"packets": count("packets received"), "output_batch": float(batch.group(1)) if batch else 0.0,
            "upcalls": count("miss with success upcall") + count("miss with failed upcall")}


class Unixctl:
    """ovs-appctl without the fork: one JSON-RPC request per connection to the control socket."""

    def __init__(self, pid: int, rundirs: tuple[str, ...] = RUNDIRS, timeout_s: float = 1.0) -> None:
        self.path = next((str(p) for d in rundirs if (p := Path(d) / f"ovs-vswitchd.{pid}.ctl").exists()), None)
        self.timeout_s = timeout_s

    def call(self, method: str, *params: str) -> str | None:
        """The command's output, or None if it failed (or OVS is gone)."""
        if self.path is None:
            return None
        try:
            with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
                s.settimeout(self.timeout_s)
                s.connect(self.path)
                s.sendall(json.dumps({"method": method, "params": list(params), "id": 0}).encode())
                buf, dec = "", json.JSONDecoder()
                while True:
                    chunk = s.recv(65536)
                    if not chunk:
                        return None
                    buf += chunk.decode(errors="replace")
                    try:
                        reply, _ = dec.raw_decode(buf)
                        break
                    except ValueError:
                        continue
        except OSError:
            return None
        return reply.get("result") if reply.get("error") is None else None


class BatchSampler:
    """Per sample: the main thread's average output batch over the sample's interval."""

    def __init__(self, pid: int) -> None:
        self.ctl = Unixctl(pid)
        self.ctl.call("dpif-netdev/pmd-stats-clear")

    def sample(self) -> dict | None:
        text = self.ctl.call("dpif-netdev/pmd-stats-show")
        self.ctl.call("dpif-netdev/pmd-stats-clear")
        return parse_main_thread(text) if text else None
