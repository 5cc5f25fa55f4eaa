"""How late this machine wakes a real-time thread: the floor under every pause fabric-emu serves.

A compiled probe (benchmarks/wakeup_probe.c: no interpreter between the kernel's wake-up and the
measure) runs one thread per CPU, pinned there at the PFC daemon's real-time priority, each
sleeping to the same deadlines, 200 us apart, for `--seconds`: first on the machine as it is,
then with `--busy` busy loops beside them, in the same run. A wake-up milliseconds late is time
the PFC daemon would also have lost, whatever its code or language: a kernel section this kernel
does not preempt, or a virtual CPU the hypervisor did not run. Per CPU it prints the wake-ups,
how many came more than 0.5 / 1 / 2 ms late, the latest, and the moments (monotonic seconds) of
those past 1 ms, so stalls that hit every CPU at once (the hypervisor's) show as the same moments
on each line. Then, per deadline, the first wake-up on any CPU: the floor of a responder with a
thread on every CPU, which a stall of one CPU does not hold up but one of the whole machine does.
Last, the ratio of wake-ups past 1 ms, busy against as is.

Run as root:  .venv/bin/python benchmarks/wakeups.py [--seconds 20] [--busy 2] [--smoke]
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from fabric_emu.kernel.compiled import build_cached
from fabric_emu.ports.pfcd import REALTIME_PRIORITY
from pause_load import busy_loops
from smoke import parse_args

PERIOD_NS = 200_000
SOURCE = Path(__file__).with_name("wakeup_probe.c")
CACHE = Path("/var/lib/fabric-emu/benchmarks")


@dataclass(frozen=True)
class Lateness:
    """Wake-ups (or deadlines), how many came more than 0.5 / 1 / 2 ms late, the latest."""
    count: int
    late: tuple[int, int, int]
    worst_ms: float
    moments: tuple[float, ...] = ()


def parse_line(words: list[str]) -> Lateness:
    """`... wakes|deadlines N late_0.5 A late_1 B late_2 C worst_ms X [at T ...]` after its label."""
    at = words.index("at") if "at" in words else len(words)
    return Lateness(int(words[1]), (int(words[3]), int(words[5]), int(words[7])), float(words[9]),
                    tuple(float(t) for t in words[at + 1:]))


def parse(out: str) -> tuple[dict[int, Lateness], Lateness]:
    """The probe's output: per CPU, and the first wake-up on any CPU per deadline."""
    per_cpu, first = {}, None
    for line in out.splitlines():
        words = line.split()
        if words[:1] == ["cpu"]:
            per_cpu[int(words[1])] = parse_line(words[2:])
        elif words[:1] == ["first"]:
            first = parse_line(words[1:])
    if first is None or not per_cpu:
        raise RuntimeError(f"wakeup_probe printed no results: {out!r}")
    return per_cpu, first


def measure(probe: Path, seconds: float, busy: int) -> tuple[dict[int, Lateness], Lateness]:
    loops = busy_loops(busy)
    try:
        cpus = ",".join(str(c) for c in sorted(os.sched_getaffinity(0)))
        done = subprocess.run([str(probe), str(seconds), str(PERIOD_NS), str(REALTIME_PRIORITY), cpus],
                              capture_output=True, text=True, timeout=seconds + 60, check=True)
    finally:
        for p in loops:
            p.terminate()
            p.wait()
    if done.stderr.strip():
        raise RuntimeError(f"wakeup_probe: {done.stderr.strip().splitlines()[0]}")
    return parse(done.stdout)


def report(name: str, per_cpu: dict[int, Lateness], first: Lateness) -> None:
    for cpu, r in sorted(per_cpu.items()):
        print(f"  {name:7s} cpu{cpu}: {r.count} wake-ups, late > 0.5 ms {r.late[0]}, > 1 ms {r.late[1]}, "
              f"> 2 ms {r.late[2]}, latest {r.worst_ms:.2f} ms; past 1 ms at "
              f"{' '.join(f'{t:.3f}' for t in r.moments) or '-'}")
    print(f"  {name:7s} first CPU awake: {first.count} deadlines, late > 0.5 ms {first.late[0]}, "
          f"> 1 ms {first.late[1]}, > 2 ms {first.late[2]}, latest {first.worst_ms:.2f} ms")


def build_probe() -> Path:
    return build_cached(SOURCE, CACHE, "wakeup_probe", "", lambda out: [
        "clang", "-O2", "-Wall", "-Werror", "-pthread", str(SOURCE), "-o", str(out)])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seconds", type=float, default=20.0, help="each phase")
    ap.add_argument("--busy", type=int, default=2, help="busy loops beside the probes in the second phase")
    args = parse_args(ap, seconds=1.0)
    if os.geteuid() != 0:
        sys.exit("run as root: the probes take a real-time priority")
    probe = build_probe()
    print(f"real-time wake-ups at deadlines {PERIOD_NS / 1e3:.0f} us apart, {args.seconds:g} s as is, "
          f"then {args.seconds:g} s beside {args.busy} busy loop(s)")
    idle, busy = measure(probe, args.seconds, 0), measure(probe, args.seconds, args.busy)
    report("as is", *idle)
    report("busy", *busy)
    past = [sum(r.late[1] for r in rows.values()) / max(1, sum(r.count for r in rows.values()))
            for rows, _ in (idle, busy)]
    print(f"ratio busy/as is, share of wake-ups past 1 ms: {past[1] / past[0]:.2f}" if past[0]
          else f"ratio busy/as is, share of wake-ups past 1 ms: none as is, {past[1] * 1e3:.3f} per 1000 busy")


if __name__ == "__main__":
    main()
