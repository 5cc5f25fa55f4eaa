"""What orphan() costs per frame (bpf/port.c: on the kernel datapath, the switch port a host's
frame enters by sends a clone on and consumes the frame, so its socket no longer owns it), as a
ratio to the same path without it, measured alternately in the same run. Needs root.

The path is tests/integration/orphan_path.py's: a host, its switch port with the port programs,
then a kernel forwarding path (macvlan, tc mirred) into a sink, as Open vSwitch's kernel
datapath forwards. A Python sender in the host sends `--frames` lossless 4 KB frames as fast as
it can; the receive side's work (the switch port's programs and, with orphan(), the clone and
its second pass) runs in softirq, read from /proc/stat over the same window. Prints softirq and
all CPU time per frame for both sides and their ratios.

  .venv/bin/python benchmarks/orphan_cost.py [--rounds 5] [--frames 100000] [--smoke]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the tests' namespace helpers
from tests.integration.orphan_path import FAR_IP, OrphanPath, orphan_path  # noqa: E402

from smoke import parse_args  # noqa: E402  (benchmarks/smoke.py: scripts, not a package)

PAYLOAD = 4000
CLK_TCK = os.sysconf("SC_CLK_TCK")


def cpu_ticks() -> tuple[int, int]:
    """(softirq, busy) ticks of the whole machine, from /proc/stat's cpu line."""
    with open("/proc/stat") as f:
        v = [int(x) for x in f.readline().split()[1:]]
    user, nice, system, idle, iowait, irq, softirq = v[:7]
    steal = v[7] if len(v) > 7 else 0
    return softirq, user + nice + system + irq + softirq + steal


def one_side(path: OrphanPath, orphan: bool, frames: int) -> tuple[float, float]:
    """(softirq us, busy us) per frame with orphan() on or off."""
    path.set_orphan(orphan)
    sock = path.host_socket()
    data = b"r" * PAYLOAD
    try:
        s0, b0 = cpu_ticks()
        for _ in range(frames):
            sock.sendto(data, (FAR_IP, 4791))
        time.sleep(0.1)  # the last frames through softirq
        s1, b1 = cpu_ticks()
    finally:
        sock.close()
    per = 1e6 / CLK_TCK / frames
    return (s1 - s0) * per, (b1 - b0) * per


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--frames", type=int, default=100_000)
    args = parse_args(ap, rounds=1, frames=5_000)
    if os.geteuid() != 0:
        sys.exit("run as root: it builds namespaces")
    rows: dict[bool, list[tuple[float, float]]] = {False: [], True: []}
    with orphan_path(f"feoc{os.getpid() % 10000}", hold=False) as path:
        one_side(path, True, min(args.frames, 2_000))  # warm: the programs loaded, caches filled
        for _ in range(args.rounds):
            for orphan in (False, True):
                rows[orphan].append(one_side(path, orphan, args.frames))
    med = {k: (statistics.median(r[0] for r in v), statistics.median(r[1] for r in v)) for k, v in rows.items()}
    print(f"{args.frames} frames of {PAYLOAD} B per side, {args.rounds} round(s), medians per frame:")
    for orphan, name in ((False, "without orphan()"), (True, "with orphan()")):
        print(f"  {name:17s} softirq {med[orphan][0]:6.2f} us  all CPU {med[orphan][1]:6.2f} us")
    print(f"ratio with/without: softirq {med[True][0] / max(med[False][0], 1e-9):.2f}, "
          f"all CPU {med[True][1] / max(med[False][1], 1e-9):.2f}")


if __name__ == "__main__":
    main()
