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

Run as root:  .venv/bin/python benchmarks/pause_load.py [--rev HEAD~1] [--runs 20] [--busy 2]
              [--quickstart-rounds 1] [--smoke]
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
from smoke import parse_args

REPO = Path(__file__).resolve().parents[1]
WITHIN_S = 1e-3


def incast(src: Path, out: Path) -> dict:
    """One incast run from the tree at src: its slowest pause, headroom time and overruns."""
    done = subprocess.run([sys.executable, "-m", "fabric_emu", "run", str(src / "experiments/incast.yaml"),
                           "--out", str(out)], cwd=src, env={**os.environ, "PYTHONPATH": str(src)},
                          capture_output=True, text=True)
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
            "overruns": s["switch"].get("headroom_overruns", 0), "status": s.get("status")}


def busy_loops(n: int) -> list[subprocess.Popen]:
    return [subprocess.Popen(["sh", "-c", "while :; do :; done"]) for _ in range(n)]


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
    args = parse_args(ap, rev="HEAD", runs=1, quickstart_rounds=0)
    if os.geteuid() != 0:
        sys.exit("run as root: it builds fabrics")
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(1))  # end the busy loops on the way out
    with tempfile.TemporaryDirectory() as tmp:
        old = versus.extract(args.rev, Path(tmp) / "old")
        results: dict[str, list[dict]] = {"earlier": [], "this tree": []}
        loops = busy_loops(args.busy)
        try:
            for i in range(args.runs):
                results["earlier"].append(incast(old, Path(tmp) / f"old-{i}"))
                results["this tree"].append(incast(REPO, Path(tmp) / f"new-{i}"))
        finally:
            for p in loops:
                p.send_signal(signal.SIGTERM)
                p.wait()
        print(f"incast with {args.busy} busy loop(s), {args.runs} run(s) each, alternating, earlier = {args.rev}")
        for name, rows in results.items():
            report(name, rows)
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
