"""Open vSwitch's kernel datapath against its userspace datapath, in one run on one machine.

For each datapath, on the same machine, one after the other:
* CPU per switch packet in the quickstart: ovs-vswitchd's CPU time and the machine's kernel
  time (softirq, irq, system) from GO to the end of the traffic, per packet the switches sent
  (the kernel time includes work both datapaths share: veths, the NIC engines' system calls);
  and, flooded, what the capacity probe of `dilation: auto` measures (one bridge between two
  namespaces: frame-hops per second of one core, inverted).
* the quickstart's lowest trusted dilation: the quickstart at falling dilations until it is
  no longer trusted by its own fidelity check or stops reaching 0.93 of the link rate;
* start-up and teardown against raw Mininet on the same datapath (benchmarks/startup.py's
  rounds, on a smaller fabric);
* the shipped scenarios at dilation auto, each with its verdict: the PFC incast (lossless,
  pauses spread upstream), the ECMP collision (spray and DLB beat ECMP), a link failure in the
  middle of a ring (rerouted, completes).

Needs both datapaths, so a kernel with Open vSwitch's module: run it in the lab VM,
  sudo scripts/vm/run.sh --timeout 5400 -- .venv/bin/python benchmarks/datapaths.py
(under software emulation the figures are the VM's, and only their ratios mean anything), or
on any Linux box whose kernel has the module. Where the kernel datapath is missing it says so
and measures the userspace one alone. --smoke: one dilation, a small workload.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
from pathlib import Path

from smoke import parse_args  # benchmarks/smoke.py (benchmarks are scripts, not a package)

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
DATAPATHS = ("userspace", "kernel")
CLK_TCK = os.sysconf("SC_CLK_TCK")
BUSBW_MIN = 0.93


def ovs_cpu_s() -> float:
    pid = int(Path("/var/run/openvswitch/ovs-vswitchd.pid").read_text())
    fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
    return (int(fields[11]) + int(fields[12])) / CLK_TCK  # utime + stime, all threads


def quickstart(datapath: str, dilation: float | str, size: str | None, experiment: str = "quickstart",
               **more: str) -> tuple[dict, dict]:
    """One run of an experiment (the quickstart) on this datapath at this dilation, through
    fabric_emu.api, with more --set overrides: its summary,
    and the CPU the switching cost from GO to the end of the traffic: ovs-vswitchd's process
    time and the machine's kernel time (softirq, irq, system; the kernel datapath's, and on
    both datapaths the veths' and the NIC engines' system calls)."""
    from fabric_emu.api import Experiment, RunError
    from fabric_emu.measure import softirq

    marks: dict[str, tuple] = {}

    def on(event) -> None:
        if event.phase == "traffic" and event.fraction is not None and "go" not in marks:
            marks["go"] = (softirq.read_proc_stat(), ovs_cpu_s())
        elif event.phase == "tear_down" and "end" not in marks:
            marks["end"] = (softirq.read_proc_stat(), ovs_cpu_s())

    sets = {"datapath": datapath, "topology.dilation": dilation if isinstance(dilation, str) else f"{dilation:g}",
            **({"workload.size": size} if size else {}), **more}
    exp = Experiment.from_file(REPO / f"experiments/{experiment}.yaml").override(sets)
    with tempfile.TemporaryDirectory(prefix="fabric-emu-dp-") as out:
        try:
            s = exp.run(out, progress=on, quiet=True).summary
        except RunError as e:
            s = e.results.summary if e.results is not None else {"status": f"failed: {e}"}
    cost = {}
    if "go" in marks and "end" in marks:
        kernel = softirq.cpu_seconds(marks["go"][0], marks["end"][0])
        cost = {"ovs_s": marks["end"][1] - marks["go"][1], "kernel_s": kernel["softirq"] + kernel["system"]}
    return s, cost


def good(s: dict) -> bool:
    return (s.get("status") == "ok" and not s.get("fidelity", {}).get("warnings")
            and (s.get("busbw_fraction") or 0) >= BUSBW_MIN)


def lowest_trusted(datapath: str, ladder: list[float], size: str | None) -> tuple[float | None, dict]:
    """Walk down the ladder: the last dilation whose run was good (None: not even the first),
    and the switching cost per switch packet (us) of the first run."""
    best, per_packet = None, {}
    for d in ladder:
        s, cost = quickstart(datapath, d, size)
        fid = s.get("fidelity", {})
        packets = (s.get("switch") or {}).get("tx_packets") or 0
        if cost and packets and not per_packet:
            per_packet = {k: v / packets * 1e6 for k, v in cost.items()}
        print(f"  {datapath:9} dilation {d:>7g}: {s.get('status')}, busbw {s.get('busbw_fraction') or 0:.3f},"
              f" CPU busy max {fid.get('cpu_busy_max', 0):.0%}, "
              f"{'trusted' if not fid.get('warnings') else 'NOT trusted: ' + fid['warnings'][0][:80]}", flush=True)
        if not good(s):
            break
        best = d
    return best, per_packet


def trusted(s: dict) -> bool:
    return s.get("status") == "ok" and not s.get("fidelity", {}).get("warnings")


def scenarios(datapath: str) -> list[tuple[str, bool, str]]:
    """The shipped scenarios at dilation auto, each with its verdict: (what, held, figures)."""
    out = []
    s, _ = quickstart(datapath, "auto", None, "incast")
    sw = s.get("switch", {})
    out.append(("PFC incast: lossless, pauses spread upstream",
                trusted(s) and sw.get("lossless_drops") == 0 and sw.get("pause_rx", 0) > 0,
                f"{s.get('status')}, dilation {s.get('dilation')}, lossless drops {sw.get('lossless_drops')},"
                f" pauses sent/received by switches {sw.get('pause_tx')}/{sw.get('pause_rx')}"))
    jct = {}
    for mode in ("ecmp", "spray", "dlb"):
        s, _ = quickstart(datapath, "auto", None, "ecmp-collision", load_balancing=mode)
        jct[mode] = s.get("jct_fabric_s") if trusted(s) else None
    beat = all(jct[m] and jct["ecmp"] and jct[m] < jct["ecmp"] for m in ("spray", "dlb"))
    out.append(("ECMP collision: spray and DLB beat ECMP", beat,
                ", ".join(f"{m} {jct[m] * 1e6:,.0f} us" if jct[m] else f"{m} not trusted" for m in jct)))
    s, _ = quickstart(datapath, "auto", None, "link-failure")
    moved = (s.get("failover") or [{}])[0]
    out.append(("link failure mid-ring: rerouted, completes", trusted(s) and bool(moved.get("rerouted")),
                f"{s.get('status')}, busbw {s.get('busbw_fraction') or 0:.3f}, failover {moved.get('failover_s')} s"))
    for what, held, figures in out:
        print(f"  {datapath:9} {what}: {'yes' if held else 'NO'} ({figures})", flush=True)
    return out


def startup(datapath: str, rounds: int, shape: tuple[int, int, int]) -> str:
    r = subprocess.run([sys.executable, str(REPO / "benchmarks/startup.py"), "--rounds", str(rounds),
                        "--datapath", datapath, "--spines", str(shape[0]), "--leaves", str(shape[1]),
                        "--hosts", str(shape[2])], cwd=REPO, capture_output=True, text=True)
    return r.stdout.strip() or r.stderr.strip()[-500:]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ladder", default="32000,16000,8000,4000,2000",
                    help="dilations to try, highest first")
    ap.add_argument("--size", default=None, help="the quickstart's workload.size (default: its own)")
    ap.add_argument("--startup-rounds", type=int, default=3)
    ap.add_argument("--scenarios", action=argparse.BooleanOptionalAction, default=True,
                    help="also the incast, ECMP collision and link failure at dilation auto on each")
    ap.add_argument("--startup-fabric", default="2x4x2", help="spines x leaves x hosts of the start-up rounds")
    args = parse_args(ap, ladder="8000", size="1MB", startup_rounds=1, startup_fabric="1x2x1", scenarios=False)
    if os.geteuid() != 0:
        print("needs root", file=sys.stderr)
        return 1
    from fabric_emu.kernel.ovs_datapath import probe_module
    from fabric_emu.measure.capacity import measure

    usable, why = probe_module()
    datapaths = DATAPATHS if usable else ("userspace",)
    if not usable:
        print(f"kernel datapath: not on this machine ({why}); the userspace datapath alone", flush=True)
    mtu = 4200  # the quickstart's
    ladder = [float(x) for x in args.ladder.split(",")]
    shape = tuple(int(x) for x in args.startup_fabric.split("x"))
    probe, lowest, run_cost, starts, checks = {}, {}, {}, {}, {}
    for dp in datapaths:
        cap = measure(mtu, dp)
        probe[dp] = 1e6 / cap.ovs_pps
        print(f"{dp}: flooded, {probe[dp]:.1f} us of CPU per switch packet ({cap.ovs_pps:,.0f} frame-hops/s per core)",
              flush=True)
        lowest[dp], run_cost[dp] = lowest_trusted(dp, ladder, args.size)
        starts[dp] = startup(dp, args.startup_rounds, shape)
        checks[dp] = scenarios(dp) if args.scenarios else []

    def row(label: str, cells: list[str]) -> None:
        print(f"{label:50}" + "".join(f"{c:>12}" for c in cells))

    print()
    row("", list(datapaths))
    row("quickstart: OVS process CPU per switch pkt (us)", [f"{run_cost[dp].get('ovs_s', 0):.1f}" for dp in datapaths])
    row("quickstart: kernel CPU per switch pkt (us)", [f"{run_cost[dp].get('kernel_s', 0):.1f}" for dp in datapaths])
    total = {dp: run_cost[dp].get("ovs_s", 0) + run_cost[dp].get("kernel_s", 0) for dp in datapaths}
    row("quickstart: both, per switch packet (us)", [f"{total[dp]:.1f}" for dp in datapaths])
    row("flooded probe: CPU per switch packet (us)", [f"{probe[dp]:.1f}" for dp in datapaths])
    row("lowest trusted quickstart dilation", [f"{lowest[dp]:g}" if lowest[dp] else "none" for dp in datapaths])
    if "kernel" in total and total["kernel"] > 0:
        print(f"ratio userspace/kernel: CPU per switch packet {total['userspace'] / total['kernel']:.2f}"
              f" (quickstart), {probe['userspace'] / probe['kernel']:.2f} (flooded)")
    for dp in datapaths:
        for what, held, figures in checks[dp]:
            print(f"{dp} datapath, {what}: {'yes' if held else 'NO'} ({figures})")
    for dp in datapaths:
        print(f"\nstart-up and teardown, {dp} datapath:\n{starts[dp]}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
