"""How late this machine wakes a real-time thread: the floor under every pause fabric-emu serves.

One process per CPU, pinned there at the PFC daemon's real-time priority, sleeps 200 us over and
over for `--seconds` and counts how late each wake-up came: first on the machine as it is, then
with `--busy` busy loops beside them, in the same run. A wake-up milliseconds late is time the
PFC daemon would also have lost, whatever its code does: a kernel section this kernel does not
preempt, or a virtual CPU the hypervisor did not run. Per CPU it prints the wake-ups, how many
came more than 0.5 / 1 / 2 ms late, the latest, and the moments (monotonic seconds) of those
past 1 ms, so stalls that hit every CPU at once (the hypervisor's) show as the same moments on
each line; then the ratio of wake-ups past 1 ms, busy against as is.

Run as root:  .venv/bin/python benchmarks/wakeups.py [--seconds 20] [--busy 2] [--smoke]
"""

from __future__ import annotations

import argparse
import multiprocessing
import os
import sys
import time

from fabric_emu.ports.pfcd import REALTIME_PRIORITY
from pause_load import busy_loops
from smoke import parse_args

SLEEP_S = 200e-6


def probe(cpu: int, seconds: float, out: "multiprocessing.Queue[tuple]") -> None:
    os.sched_setaffinity(0, {cpu})
    os.sched_setscheduler(0, os.SCHED_FIFO, os.sched_param(REALTIME_PRIORITY))
    late_ns: list[int] = []
    stalls: list[float] = []
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        t = time.monotonic_ns()
        time.sleep(SLEEP_S)
        late = time.monotonic_ns() - t - int(SLEEP_S * 1e9)
        late_ns.append(late)
        if late > 1_000_000:
            stalls.append(round(time.monotonic(), 3))
    out.put((cpu, len(late_ns), *(sum(x > ms * 1_000_000 for x in late_ns) for ms in (0.5, 1, 2)),
             max(late_ns) / 1e6, stalls))


def measure(seconds: float, busy: int) -> list[tuple]:
    """One row per CPU: (cpu, wake-ups, late > 0.5 ms, > 1 ms, > 2 ms, latest ms, stall moments)."""
    loops = busy_loops(busy)
    try:
        results: multiprocessing.Queue = multiprocessing.Queue()
        procs = [multiprocessing.Process(target=probe, args=(cpu, seconds, results))
                 for cpu in sorted(os.sched_getaffinity(0))]
        for p in procs:
            p.start()
        rows = sorted(results.get() for _ in procs)
        for p in procs:
            p.join()
    finally:
        for p in loops:
            p.terminate()
            p.wait()
    return rows


def report(name: str, rows: list[tuple]) -> None:
    for cpu, n, half, one, two, worst, stalls in rows:
        print(f"  {name:7s} cpu{cpu}: {n} wake-ups, late > 0.5 ms {half}, > 1 ms {one}, > 2 ms {two}, "
              f"latest {worst:.2f} ms; past 1 ms at {' '.join(f'{t:.3f}' for t in stalls[:20]) or '-'}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seconds", type=float, default=20.0, help="each phase")
    ap.add_argument("--busy", type=int, default=2, help="busy loops beside the probes in the second phase")
    args = parse_args(ap, seconds=1.0)
    if os.geteuid() != 0:
        sys.exit("run as root: the probes take a real-time priority")
    print(f"real-time wake-ups after {SLEEP_S * 1e6:.0f} us sleeps, {args.seconds:g} s as is, "
          f"then {args.seconds:g} s beside {args.busy} busy loop(s)")
    idle, busy = measure(args.seconds, 0), measure(args.seconds, args.busy)
    report("as is", idle)
    report("busy", busy)
    past = [sum(r[3] for r in rows) / max(1, sum(r[1] for r in rows)) for rows in (idle, busy)]
    print(f"ratio busy/as is, share of wake-ups past 1 ms: {past[1] / past[0]:.2f}" if past[0]
          else f"ratio busy/as is, share of wake-ups past 1 ms: none as is, {past[1] * 1e3:.3f} per 1000 busy")


if __name__ == "__main__":
    main()
