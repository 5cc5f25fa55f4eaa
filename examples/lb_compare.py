"""ECMP, packet spraying and DLB on the same four flows, over several seeds: slowest flow per run.

    sudo .venv/bin/python examples/lb_compare.py [--out DIR] [--small]

experiments/ecmp-collision.yaml sends four flows from leaf1 to leaf2 over four spines. ECMP
hashes each queue pair onto one uplink, so with some seeds two share one and the last flow
finishes about twice as late; spraying and DLB spread them. Writes DIR/lb_compare.png.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import matplotlib

matplotlib.use("Agg")  # files only, no display
import matplotlib.pyplot as plt  # noqa: E402
import pandas as pd  # noqa: E402

from fabric_emu.api import Experiment, Sweep  # noqa: E402

EXPERIMENT = Path(__file__).resolve().parents[1] / "experiments" / "ecmp-collision.yaml"
MODES = ("ecmp", "spray", "dlb")


def main(argv: list[str] | None = None) -> pd.DataFrame:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", type=Path, default=Path("results"), help="results base folder")
    p.add_argument("--small", action="store_true", help="one seed, 2 MB flows (CI)")
    args = p.parse_args(argv)
    seeds = [1] if args.small else [1, 2, 3, 4]
    base = Experiment.from_file(EXPERIMENT)
    if args.small:
        # --set replaces a list whole: the same four flows, smaller (any JSON-able value works)
        base = base.override({"workload.flows": [{"src": f"h{i}", "dst": f"h{i + 4}", "size": "2MB"}
                                                 for i in range(1, 5)]})

    runs = []
    for mode in MODES:
        for seed in seeds:
            print(f"load_balancing={mode} seed={seed}", flush=True)
            runs.append(base.override({"load_balancing": mode, "seed": seed}).run(args.out, quiet=True))
    flows = Sweep(runs, ["load_balancing"]).frame("flows")  # one row per queue pair of every run

    # A run is as slow as its slowest flow; then each mode's spread over the seeds.
    slowest = flows.groupby(["load_balancing", "seed"])["completion_fabric_us"].max().reset_index()
    print(slowest.pivot(index="seed", columns="load_balancing", values="completion_fabric_us").round(0).to_string())

    fig, ax = plt.subplots(figsize=(6, 4))
    for i, mode in enumerate(MODES):
        ys = slowest.loc[slowest["load_balancing"] == mode, "completion_fabric_us"]
        ax.scatter([i] * len(ys), ys, s=40, alpha=0.7)
        ax.hlines(ys.mean(), i - 0.25, i + 0.25)
    ax.set_xticks(range(len(MODES)), MODES)
    ax.set(ylabel="slowest flow's completion (us, modelled)", ylim=(0, None),
           title=f"ecmp-collision: {len(seeds)} seed(s) per mode (line: mean)")
    ax.grid(axis="y", alpha=0.3)
    args.out.mkdir(parents=True, exist_ok=True)
    fig.savefig(args.out / "lb_compare.png", dpi=100, bbox_inches="tight")
    print(f"plot: {args.out / 'lb_compare.png'}")
    return flows


if __name__ == "__main__":
    main()
