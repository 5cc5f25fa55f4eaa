"""Sweep DCQCN's additive-increase step (rate_ai) on an incast, plot completion time against it.

    sudo .venv/bin/python examples/dcqcn_sweep.py [--out DIR] [--small]

Seven senders write to h1 (experiments/dcqcn-incast.yaml, DCQCN with the paper's parameters).
After each cut a queue pair's target rate grows by rate_ai per timer period: a small step
recovers slowly and the incast takes longer; a large one refills the queue and is cut again.
Writes DIR/dcqcn_sweep.png and the runs' folders under DIR/dcqcn-incast/.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import matplotlib

matplotlib.use("Agg")  # files only, no display
import matplotlib.pyplot as plt  # noqa: E402
import pandas as pd  # noqa: E402

from fabric_emu.api import Experiment, ProgressEvent, Sweep  # noqa: E402

EXPERIMENT = Path(__file__).resolve().parents[1] / "experiments" / "dcqcn-incast.yaml"


def say(event: ProgressEvent) -> None:
    if event.phase != "traffic" or event.fraction is None:
        print(f"  {event.elapsed_s:5.1f}s {event.phase} {event.text}", flush=True)


def main(argv: list[str] | None = None) -> pd.DataFrame:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", type=Path, default=Path("results"), help="results base folder")
    p.add_argument("--small", action="store_true", help="two values, one seed, 1 MB each (CI)")
    args = p.parse_args(argv)
    values = ["40Mbps", "4Gbps"] if args.small else ["10Mbps", "40Mbps", "400Mbps", "4Gbps"]
    seeds = [1] if args.small else [1, 2, 3]
    base = Experiment.from_file(EXPERIMENT).override({"workload.size": "1MB"} if args.small else {})

    runs = []
    for rate_ai in values:
        for seed in seeds:
            print(f"rate_ai={rate_ai} seed={seed}", flush=True)
            runs.append(base.override({"dcqcn.rate_ai": rate_ai, "seed": seed}).run(args.out, progress=say, quiet=True))
    summary = Sweep(runs, ["dcqcn.rate_ai"]).summary()  # one row per run; rate_ai in bit/s

    summary["rate_ai_mbps"] = summary["dcqcn.rate_ai"] / 1e6
    summary["jct_us"] = summary["jct_fabric_s"] * 1e6
    by_rate = summary.groupby("rate_ai_mbps")["jct_us"].agg(["mean", "min", "max"])
    print(by_rate.round(1).to_string())

    fig, ax = plt.subplots(figsize=(6, 4))
    ax.errorbar(by_rate.index, by_rate["mean"], yerr=[by_rate["mean"] - by_rate["min"], by_rate["max"] - by_rate["mean"]],
                marker="o", capsize=4)
    ax.set(xscale="log", xlabel="DCQCN rate_ai (Mb/s, modelled)", ylabel="incast completion time (us, modelled)",
           title=f"dcqcn-incast: {len(seeds)} seed(s) per point")
    ax.grid(alpha=0.3)
    args.out.mkdir(parents=True, exist_ok=True)
    fig.savefig(args.out / "dcqcn_sweep.png", dpi=100, bbox_inches="tight")
    print(f"plot: {args.out / 'dcqcn_sweep.png'}")
    return summary


if __name__ == "__main__":
    main()
