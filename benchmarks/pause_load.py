"""A/B: how fast pauses take effect under CPU load, an earlier revision against this tree.

Each side runs `fabric-emu run experiments/incast.yaml` (PFC alone, ~1,200 pauses a run) from
its own source tree (the earlier one extracted with `git archive`, as benchmarks/versus.py does)
with `--busy` busy loops (`sh -c 'while :; do :; done'`, started here and ended by pid) beside
it, the two sides alternating run by run, `--runs` runs each. Per side it prints the slowest
pause of each run (summary.json pfc_reaction.max_s: the kernel's xoff crossing to the upstream
gate closed) as max and median over the runs, how many runs had their slowest pause within
1 ms, the runs whose slowest pause exceeded the time the headroom buys (headroom bytes at the
link rate, times the dilation) and the frames that came in past the headroom (switch
headroom_overruns, measured by the port programs); the stage that held the slowest pause
of all (pfc_reaction.slowest_ms); and how often the machine let the PFC daemon wake more than
1 ms late for its own timers (pfc_reaction.late_wake, where the revision records it), which
tells a slow pause that the machine held back from one the daemon made slow. Then, without the busy loops, versus.py's quickstart CPU per
packet for both sides (`--quickstart-rounds`, 0 to skip).

`--probe` also runs benchmarks/wakeup_probe.c beside every run (both sides): one real-time
thread per CPU, above the PFC daemon's priority, waking every 250 us and recording when each
CPU could not run it. For each pause of this tree's runs that took more than 1 ms
(summary.json pfc_reaction.late, which keeps the slowest ten of a run) it prints how long each CPU was
held during the pause and what the daemon was doing, then how many such pauses had every CPU
held (a stall no design on this machine escapes), one CPU held and another free (a responder
able to run on any CPU could have served it), or none.

Run as root:  .venv/bin/python benchmarks/pause_load.py [--rev HEAD~1] [--runs 20] [--busy 2]
              [--quickstart-rounds 1] [--probe] [--smoke]
(--smoke: HEAD against HEAD, one run each, no quickstart.)
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

import yaml

import versus  # benchmarks/versus.py (benchmarks are scripts, not a package)
from fabric_emu.ports.pfcd import REALTIME_PRIORITY
from smoke import parse_args

REPO = Path(__file__).resolve().parents[1]
WITHIN_S = 1e-3
PROBE_PERIOD_NS = 250_000
HELD_SHARE = 0.5  # a CPU held for at least this share of a pause counts as held during it


def incast(src: Path, out: Path, probe: Path | None = None) -> dict:
    """One incast run from the tree at src: its slowest pause, headroom time and overruns;
    with `probe`, the probe's per-CPU stalls beside it."""
    stalls_file = out.with_name(out.name + ".stalls")
    beside = None
    if probe is not None:
        cpus = ",".join(str(c) for c in sorted(os.sched_getaffinity(0)))
        beside = subprocess.Popen([str(probe), "3600", str(PROBE_PERIOD_NS), str(REALTIME_PRIORITY + 1), cpus,
                                   str(stalls_file)], stdout=subprocess.DEVNULL)
    try:
        done = subprocess.run([sys.executable, "-m", "fabric_emu", "run", str(src / "experiments/incast.yaml"),
                           "--out", str(out)], cwd=src, env={**os.environ, "PYTHONPATH": str(src)},
                              capture_output=True, text=True)
    finally:
        if beside is not None:
            beside.send_signal(signal.SIGTERM)
            beside.wait()
    runs = list((out / "incast").iterdir()) if (out / "incast").is_dir() else []
    if not runs or not (runs[0] / "summary.json").exists():
        return {"failed": (done.stderr or done.stdout).strip().splitlines()[-1:]}
    s = json.loads((runs[0] / "summary.json").read_text())
    spec = yaml.safe_load((runs[0] / "experiment.yaml").read_text())
    gbps = min(spec["topology"]["host_link"]["gbps"], spec["topology"]["fabric_link"]["gbps"])
    reaction = s.get("pfc_reaction") or {}
    return {"slowest_s": reaction.get("max_s"), "split_ms": reaction.get("slowest_ms"),
            "stage_max_ms": reaction.get("stage_max_ms"), "gc_full": reaction.get("gc_full"),
            "longest_call_ms": reaction.get("longest_call_ms"), "late_wake": reaction.get("late_wake"),
            "pauses": reaction.get("pauses_measured", 0),
            "headroom_s": spec["pfc"]["headroom"] * 8 / (gbps * 1e9) * s["dilation"],
            "overruns": s["switch"].get("headroom_overruns", 0), "status": s.get("status"),
            "late": reaction.get("late"), "stalls": read_stalls(stalls_file) if probe is not None else None}


def read_stalls(path: Path) -> dict[int, list[tuple[int, int]]]:
    """The probe's file: per CPU, the (deadline, woke) ns of its wake-ups more than 0.3 ms late."""
    out: dict[int, list[tuple[int, int]]] = {}
    for line in path.read_text().splitlines() if path.exists() else []:
        cpu, deadline, woke = map(int, line.split())
        out.setdefault(cpu, []).append((deadline, woke))
    return out


def held_ms(stalls: list[tuple[int, int]], start_ns: int, end_ns: int) -> float:
    """How long one CPU could not run the probe between start and end."""
    return sum(max(0, min(woke, end_ns) - max(deadline, start_ns)) for deadline, woke in stalls) / 1e6


def attribute(rows: list[dict], cpus: list[int]) -> None:
    """Per late pause of these runs: each CPU's time held during it, the daemon's long calls;
    then the tally by what the CPUs were doing."""
    tally = {"every CPU held": 0, "one CPU held, another free": 0, "no CPU held": 0}
    for r in rows:
        for p in (r.get("late") or {}).get("slowest", []):
            start, end = p["at_monotonic_ns"], p["at_monotonic_ns"] + int(p["ms"] * 1e6)
            held = {c: held_ms(r["stalls"].get(c, []), start, end) for c in cpus}
            n_held = sum(h >= HELD_SHARE * p["ms"] for h in held.values())
            kind = ("no CPU held" if n_held == 0 else "every CPU held" if n_held == len(cpus)
                    else "one CPU held, another free")
            tally[kind] += 1
            calls = ", ".join(f"{k} {a:+.2f}..{b:+.2f}" for k, a, b in p["daemon_ms"]) or "none over 0.3 ms"
            print(f"  {'':10s} {p['ms']:6.2f} ms {p['stages_ms']}  held: "
                  f"{', '.join(f'cpu{c} {h:.2f} ms' for c, h in held.items())}  daemon: {calls}")
    print(f"  {'':10s} late pauses by CPU: " + "; ".join(f"{k} {n}" for k, n in tally.items()))


def busy_loops(n: int) -> list[subprocess.Popen]:
    return [subprocess.Popen(["sh", "-c", "while :; do :; done"]) for _ in range(n)]


def longest_streak(rows: list[dict]) -> int:
    """Issue 20's bar: the most consecutive runs whose slowest pause was within 1 ms with no
    frame past the headroom (a run that failed to measure breaks the streak)."""
    best = current = 0
    for r in rows:
        met = r.get("slowest_s") is not None and r["slowest_s"] <= WITHIN_S and not r["overruns"]
        current = current + 1 if met else 0
        best = max(best, current)
    return best


def report(name: str, rows: list[dict]) -> None:
    ok = [r for r in rows if r.get("slowest_s") is not None]
    failed = len(rows) - len(ok)
    if not ok:
        print(f"  {name:10s} no run measured a pause ({failed} failed: {rows[0].get('failed')})")
        return
    slowest = [r["slowest_s"] * 1e3 for r in ok]
    late = sum(r["slowest_s"] > r["headroom_s"] for r in ok)
    overruns = [r["overruns"] for r in ok]
    worst = max(ok, key=lambda r: r["slowest_s"])
    print(f"  {name:10s} slowest pause max {max(slowest):7.3f} ms  median {statistics.median(slowest):7.3f} ms  "
          f"runs <= 1 ms {sum(s <= WITHIN_S * 1e3 for s in slowest)}/{len(ok)}  "
          f"runs past the headroom's {ok[0]['headroom_s'] * 1e3:.2f} ms {late}  "
          f"overrun frames {sum(overruns)} (in {sum(o > 0 for o in overruns)} runs)"
          + (f"  failed runs {failed}" if failed else ""))
    print(f"  {'':10s} per run (ms): {' '.join(f'{s:.2f}' for s in slowest)}")
    print(f"  {'':10s} most consecutive runs within 1 ms with no frame past the headroom: "
          f"{longest_streak(rows)} of {len(rows)}")
    print(f"  {'':10s} the slowest of all, by stage (ms): {worst['split_ms']}")
    stages = [r["stage_max_ms"] for r in ok if r.get("stage_max_ms")]
    if stages:  # revisions that record it: each stage's longest over every pause of every run
        print(f"  {'':10s} each stage's longest over all runs (ms): "
              f"{ {k: max(s[k] for s in stages) for k in stages[0]} }")
    calls = [r["longest_call_ms"] for r in ok if r.get("longest_call_ms")]
    if calls:  # revisions that record it: the PFC daemon's longest frame send and tc change
        longest = {k: max(c[k] for c in calls) for k in calls[0]}
        sends = " ".join(f"{c['frame']:.2f}" for c in calls)
        print(f"  {'':10s} PFC daemon's longest call (ms): {longest}  per run, frame send: {sends}")
    wakes = [r["late_wake"] for r in ok if r.get("late_wake")]
    if wakes:  # revisions that record it: how late the machine let the daemon wake for its timers
        stalled = [i for i, r in enumerate(ok) if r.get("late_wake") and r["late_wake"]["over_1ms"]]
        print(f"  {'':10s} PFC daemon's timer wakes more than 1 ms late: {sum(w['over_1ms'] for w in wakes)} "
              f"of {sum(w['wakes'] for w in wakes)}, in {len(stalled)} run(s) (numbered from 1: "
              f"{' '.join(str(i + 1) for i in stalled) or '-'}), the latest {max(w['max_ms'] for w in wakes):.2f} ms")
    gcs = [r["gc_full"] for r in ok if r.get("gc_full")]
    if gcs:  # revisions that record it: the PFC daemon's full garbage collections while serving
        print(f"  {'':10s} PFC daemon full collections {sum(g['count'] for g in gcs)}, "
              f"longest {max(g['longest_ms'] for g in gcs):.3f} ms")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rev", default="HEAD~1", help="the earlier revision (git)")
    ap.add_argument("--runs", type=int, default=20, help="incast runs per side")
    ap.add_argument("--busy", type=int, default=2, help="busy loops beside the runs")
    ap.add_argument("--quickstart-rounds", type=int, default=1, help="versus.py rounds (0: skip)")
    ap.add_argument("--probe", action="store_true", help="each CPU's stalls beside the runs, per late pause")
    args = parse_args(ap, rev="HEAD", runs=1, quickstart_rounds=0)
    if os.geteuid() != 0:
        sys.exit("run as root: it builds fabrics")
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(1))  # end the busy loops on the way out
    with tempfile.TemporaryDirectory() as tmp:
        old = versus.extract(args.rev, Path(tmp) / "old")
        results: dict[str, list[dict]] = {"earlier": [], "this tree": []}
        probe = None
        if args.probe:
            from wakeups import build_probe  # wakeups imports this module: not at the top
            probe = build_probe()
        loops = busy_loops(args.busy)
        try:
            for i in range(args.runs):
                results["earlier"].append(incast(old, Path(tmp) / f"old-{i}", probe))
                results["this tree"].append(incast(REPO, Path(tmp) / f"new-{i}", probe))
        finally:
            for p in loops:
                p.send_signal(signal.SIGTERM)
                p.wait()
        print(f"incast with {args.busy} busy loop(s), {args.runs} run(s) each, alternating, earlier = {args.rev}")
        for name, rows in results.items():
            report(name, rows)
        if probe is not None:
            print(f"  this tree's pauses over 1 ms, beside a probe waking every CPU every {PROBE_PERIOD_NS / 1e3:.0f} us:")
            attribute([r for r in results["this tree"] if r.get("stalls") is not None], sorted(os.sched_getaffinity(0)))
        if args.quickstart_rounds:
            cpu = {"earlier": [], "this tree": []}
            for i in range(args.quickstart_rounds):
                cpu["earlier"].append(versus.run(old, Path(tmp) / f"qs-old-{i}", None))
                cpu["this tree"].append(versus.run(REPO, Path(tmp) / f"qs-new-{i}", None))
            mean = {name: {k: statistics.mean(r[k] for r in rows) for k in ("ovs_us", "nic_us")}
                    for name, rows in cpu.items()}
            e, t = mean["earlier"], mean["this tree"]
            print(f"quickstart, {args.quickstart_rounds} round(s) each, no busy loops: ratios this/earlier: "
                  f"OVS per packet {t['ovs_us'] / e['ovs_us']:.2f}, NIC per packet {t['nic_us'] / e['nic_us']:.2f}")


if __name__ == "__main__":
    main()
