"""The underlay between the machines of a fabric over several machines (issue 19), checked
before anything is built: its MTU, its round trip between the machines a cut link joins, and
each machine's clock against the head's."""

from __future__ import annotations

import ipaddress
import re
import shlex
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from fabric_emu.fabric.machines import Machine, ssh
from fabric_emu.spec.machines import fits_underlay, underlay_mtu_needed


def check_underlay(machines: list[Machine], fabric_mtu: int, run_on: Callable[[Machine, str], str]) -> None:
    """Refuse, before anything is built, an underlay that cannot carry a full fabric frame in
    VXLAN between some two machines. run_on(machine, command) runs a command there."""
    for m in machines:
        for peer in machines:
            if peer is m:
                continue
            ipaddress.ip_address(peer.underlay)  # nothing else reaches the shell
            out = run_on(m, f"d=$(ip route get {peer.underlay} | grep -o 'dev [^ ]*' | cut -d' ' -f2) && "
                            "echo $d $(cat /sys/class/net/$d/mtu)").split()
            if len(out) != 2 or not out[1].isdigit():
                raise RuntimeError(f"machines: {m.name} has no route to {peer.name}'s underlay address {peer.underlay}")
            device, mtu = out[0], int(out[1])
            if not fits_underlay(fabric_mtu, mtu):
                raise ValueError(f"machines: {m.name} reaches {peer.name} ({peer.underlay}) by {device}, MTU {mtu}: "
                                 f"the fabric's {fabric_mtu}-byte frames in VXLAN need an underlay MTU of at least "
                                 f"{underlay_mtu_needed(fabric_mtu)}")


RTT_RE = re.compile(r"rtt min/avg/max/mdev = [\d.]+/([\d.]+)/")


@dataclass(frozen=True)
class Underlay:
    """What the preflight measured: each machine's clock against the head's (offset,
    uncertainty, seconds) and each pair's underlay round trip (seconds)."""

    clocks: dict[str, tuple[float, float]]
    rtt: dict[tuple[str, str], float]
    bandwidth: dict[tuple[str, str], float]  # bits/s, from each machine to one of its cut peers

    def to_dict(self) -> dict:
        return {"clock_offset_ms": {m: round(o * 1e3, 3) for m, (o, _) in self.clocks.items()},
                "clock_uncertainty_ms": {m: round(u * 1e3, 3) for m, (_, u) in self.clocks.items()},
                "rtt_ms": {f"{a}->{b}": round(r * 1e3, 3) for (a, b), r in self.rtt.items()},
                "bandwidth_mbps": {f"{a}->{b}": round(r / 1e6) for (a, b), r in self.bandwidth.items()}}


def clock_offset(ssh_config: Path | None, m: Machine, samples: int = 5) -> tuple[float, float]:
    """A machine's wall clock minus the head's, and how far off that can be (half the best
    round trip), over one ssh session: a new connection per sample would cost far more."""
    p = subprocess.Popen([*ssh(ssh_config), m.dest, "while read _; do date +%s.%N; done"], stdin=subprocess.PIPE,
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, bufsize=1)
    try:
        best: tuple[float, float] | None = None
        for _ in range(samples + 1):  # the first answer also waits for the session: not kept
            t0 = time.time()
            p.stdin.write("\n")
            p.stdin.flush()
            line = p.stdout.readline()
            t1 = time.time()
            if not line:
                raise RuntimeError(f"{m.name}: cannot read its clock over ssh: {p.stderr.read().strip()}")
            offset, half = float(line) - (t0 + t1) / 2, (t1 - t0) / 2
            if best is None or half < best[1]:
                best = (offset, half)
        return best
    finally:
        p.stdin.close()
        p.wait(10)


def underlay_rtt(ssh_config: Path | None, m: Machine, peer: Machine) -> subprocess.Popen:
    """Ping the peer's underlay address from machine m (5 pings, 0.2 s apart): started, to be
    read with rtt_of."""
    return subprocess.Popen([*ssh(ssh_config), m.dest, f"ping -n -q -c 5 -i 0.2 -W 1 {peer.underlay}"],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def preflight(ssh_config: Path | None, machines: list[Machine], pairs: set[tuple[str, str]]) -> Underlay:
    """Each machine's clock, the underlay round trip of every pair of machines a cut link joins,
    and, one machine at a time (streams at once would share the underlay), what the underlay
    carries from each machine to one of those peers (its first)."""
    by_name = {m.name: m for m in machines}
    pings = {(a, b): underlay_rtt(ssh_config, by_name[a], by_name[b]) for a, b in sorted(pairs)}
    clocks = {m.name: clock_offset(ssh_config, m) for m in machines}
    rtt = {}
    for (a, b), p in pings.items():
        out, _ = p.communicate(timeout=30)
        match = RTT_RE.search(out)
        if not match:
            raise RuntimeError(f"machines: {a} cannot ping {b}'s underlay address {by_name[b].underlay}: "
                               f"{out.strip().splitlines()[-1] if out.strip() else 'no answer'}")
        rtt[(a, b)] = float(match.group(1)) / 1e3
    first_peer = {}
    for a, b in sorted(pairs):
        first_peer.setdefault(a, b)
    bandwidth = {(a, b): underlay_bandwidth(ssh_config, by_name[a], by_name[b]) for a, b in first_peer.items()}
    return Underlay(clocks, rtt, bandwidth)


SINK = """
import socket, sys, time
s = socket.socket()
s.bind((sys.argv[1], 0))
s.listen(1)
s.settimeout(20)
print(s.getsockname()[1], flush=True)
c, _ = s.accept()
n, t0 = 0, None
while True:
    d = c.recv(1 << 20)
    if not d:
        break
    t0 = t0 or time.monotonic()
    n += len(d)
print(n, time.monotonic() - t0, flush=True)
"""
SOURCE = """
import socket, sys, time
c = socket.create_connection((sys.argv[1], int(sys.argv[2])), timeout=10)
chunk, end = bytes(1 << 20), time.monotonic() + float(sys.argv[3])
while time.monotonic() < end:
    c.sendall(chunk)
c.close()
"""


def underlay_bandwidth(ssh_config: Path | None, m: Machine, peer: Machine, seconds: float = 0.5) -> float:
    """What the underlay carries from m to peer, bits/s: one TCP stream for `seconds`, into a
    one-connection listener on the peer's underlay address (gone once measured)."""
    sink = subprocess.Popen([*ssh(ssh_config), peer.dest,
                             f"{shlex.quote(sys.executable)} -c {shlex.quote(SINK)} {peer.underlay}"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        port = sink.stdout.readline().strip()
        if not port.isdigit():
            raise RuntimeError(f"machines: cannot measure the underlay into {peer.name}: {sink.stderr.read().strip()}")
        sent = subprocess.run([*ssh(ssh_config), m.dest, f"{shlex.quote(sys.executable)} -c {shlex.quote(SOURCE)} "
                               f"{peer.underlay} {port} {seconds}"], capture_output=True, text=True, timeout=60)
        if sent.returncode != 0:
            raise RuntimeError(f"machines: cannot measure the underlay from {m.name} to {peer.name}: "
                               f"{sent.stderr.strip().splitlines()[-1] if sent.stderr.strip() else sent.returncode}")
        received, elapsed = sink.stdout.readline().split()
        return int(received) * 8 / max(float(elapsed), 1e-6)
    finally:
        if sink.poll() is None:
            sink.terminate()
        sink.wait(10)
