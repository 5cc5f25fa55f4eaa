"""Comparisons on disk: read runs and sweep folders, write a sweep's files, print the table.

A sweep folder (`<out>/<experiment>/sweep-<UTC time>/`) holds `sweep.json` (the command, the
swept keys and values, the seeds), `runs.csv` (one row per run), `comparison.csv` (one row per
grid point, statistics over seeds) and `comparison.png`. The grouping and the statistics are
fabric_emu.results.sweep's; this module only reads, writes and prints.
"""

from __future__ import annotations

import csv
import json
import logging
from dataclasses import dataclass
from pathlib import Path

from rich.console import Console
from rich.table import Table

from fabric_emu.results import folder as results
from fabric_emu.spec.errors import SpecError
from fabric_emu.spec.load import read_yaml
from fabric_emu.results.sweep import (
    STATS, Axis, Point, RunResult, comparison_rows, grid, group_by_differences, run_rows,
)

log = logging.getLogger(__name__)

FOLDER_HELP = ("allowed: a run's folder with summary.json, a sweep folder with sweep.json and runs.csv, "
               "or an experiment's folder of runs")


@dataclass
class Comparison:
    """Runs grouped into points by the keys that tell them apart."""
    title: str
    keys: list[str]
    points: list[Point]
    runs: list[RunResult]

    def rows(self) -> list[dict]:
        return comparison_rows(self.keys, self.points, self.runs)

    def run_rows(self) -> list[dict]:
        return run_rows(self.keys, self.points, self.runs)


def sweep_title(name: str, points: int, seeds: int) -> str:
    return f"{name}: {points} point(s) x {seeds} seed(s)"


# ---------------------------------------------------------------------------- reading
def read_summary(run_dir: Path) -> dict:
    path = run_dir / "summary.json"
    try:
        data = json.loads(path.read_text())
    except OSError as e:
        raise SpecError([(str(path), "", f"cannot read ({e.strerror})")]) from None
    except ValueError as e:
        raise SpecError([(str(path), "", f"invalid JSON ({e})")]) from None
    if not isinstance(data, dict):
        raise SpecError([(str(path), "", "expected a JSON object")])
    return data


def _is_sweep(path: Path) -> bool:
    return (path / "sweep.json").is_file() and (path / "runs.csv").is_file()


def _child_runs(path: Path) -> list[Path]:
    return sorted(p for p in path.iterdir() if p.is_dir() and (p / "summary.json").is_file())


def _read_csv(path: Path) -> list[dict]:
    try:
        with open(path, newline="") as f:
            return list(csv.DictReader(f))
    except (OSError, csv.Error, UnicodeDecodeError) as e:
        raise SpecError([(str(path), "", f"cannot read ({e})")]) from None


def read_sweep(sweep_dir: Path) -> Comparison:
    """A sweep as it was: its points from sweep.json, its runs from runs.csv."""
    try:
        manifest = json.loads((sweep_dir / "sweep.json").read_text())
        axes = [Axis(k, tuple(v)) for k, v in manifest["over"].items()]
        seeds = manifest.get("seeds") or []
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as e:
        raise SpecError([(str(sweep_dir / "sweep.json"), "", f"not a sweep's manifest ({e})")]) from None
    try:
        runs = [RunResult.of_row(r) for r in _read_csv(sweep_dir / "runs.csv")]
    except (KeyError, ValueError) as e:
        raise SpecError([(str(sweep_dir / "runs.csv"), "", f"not a sweep's runs ({e})")]) from None
    points = grid(axes)
    title = sweep_title(manifest.get("name", sweep_dir.parent.name), len(points), len(seeds))
    return Comparison(title, [a.key for a in axes], points, runs)


def sweep_run_dirs(sweep_dir: Path) -> tuple[list[Path], list[tuple[str, str, str]]]:
    """The run folders a sweep lists, as written or, if the tree was moved, beside the sweep."""
    found, problems = [], []
    for row in _read_csv(sweep_dir / "runs.csv"):
        if not row.get("run_dir"):
            continue  # the run failed before it had a folder
        written = Path(row["run_dir"])
        for candidate in (written, sweep_dir.parent / written.name):
            if (candidate / "summary.json").is_file():
                found.append(candidate)
                break
        else:
            problems.append((str(sweep_dir / "runs.csv"), "run_dir", f"{written}: not found"))
    return found, problems


def run_dirs(paths: list[Path]) -> list[Path]:
    """Every run folder the paths name, each once; SpecError lists every bad path."""
    dirs: list[Path] = []
    problems: list[tuple[str, str, str]] = []
    for path in paths:
        if not path.exists():
            problems.append((str(path), "", "not found"))
        elif not path.is_dir():
            problems.append((str(path), "", f"not a folder ({FOLDER_HELP})"))
        elif (path / "summary.json").is_file():
            dirs.append(path)
        elif _is_sweep(path):
            found, missing = sweep_run_dirs(path)
            dirs += found
            problems += missing
        elif children := _child_runs(path):
            dirs += children
        else:
            problems.append((str(path), "", f"not a results folder ({FOLDER_HELP})"))
    if problems:
        raise SpecError(problems)
    unique: dict[Path, Path] = {}
    for d in dirs:
        unique.setdefault(d.resolve(), d)
    return list(unique.values())


def load_comparison(paths: list[Path]) -> Comparison:
    """One sweep folder as the sweep printed it; anything else grouped by its runs' specs."""
    if len(paths) == 1 and paths[0].is_dir() and _is_sweep(paths[0]):
        return read_sweep(paths[0])
    dirs = run_dirs(paths)
    specs, summaries = [], []
    for d in dirs:
        summaries.append(read_summary(d))
        spec = read_yaml(d / "experiment.yaml")
        specs.append(spec if isinstance(spec, dict) else {})
    keys, points, membership = group_by_differences(specs)
    runs = [RunResult.of_summary(p, spec.get("seed"), str(d), s)
            for d, s, spec, p in zip(dirs, summaries, specs, membership)]
    return Comparison(f"{len(runs)} run(s) in {len(points)} group(s)", keys, points, runs)


# ---------------------------------------------------------------------------- writing
def write_sweep(sweep_dir: Path, manifest: dict, comp: Comparison) -> list[str]:
    """sweep.json, runs.csv, comparison.csv and comparison.png, each written whole."""
    results.write_json(sweep_dir / "sweep.json", manifest)
    results.write_csv(sweep_dir / "runs.csv", comp.run_rows())
    rows = comp.rows()
    results.write_csv(sweep_dir / "comparison.csv", rows)
    written = ["sweep.json", "runs.csv", "comparison.csv"]
    try:  # a plot is a convenience, never a failure
        from fabric_emu.results.plots import plot_comparison

        labels = [", ".join(v for _, v in p.values) or p.label for p in comp.points
                  if any(r["point"] == p.index for r in rows)]
        if plot_comparison(rows, labels, ", ".join(comp.keys), sweep_dir / "comparison.png"):
            written.append("comparison.png")
    except Exception as e:  # noqa: BLE001
        log.warning("comparison.png skipped: %s: %s", type(e).__name__, e)
    return written


# ---------------------------------------------------------------------------- printing
def _cell(stats: dict, scale: float, fmt: str) -> str:
    """'mean ± sd' over 'min-max' (one line when there is one value); '-' when none."""
    mean, sd, lo, hi = (stats[s] for s in ("mean", "stdev", "min", "max"))
    if mean is None:
        return "-"
    if sd is None:
        return format(mean * scale, fmt)
    return f"{format(mean * scale, fmt)} ± {format(sd * scale, fmt)}\n{format(lo * scale, fmt)}-{format(hi * scale, fmt)}"


def print_comparison(console: Console, comp: Comparison) -> None:
    t = Table(title=comp.title, caption="JCT: completion time, fabric (modelled) microseconds; busbw/link: bus "
              "bandwidth over the host link rate; mean ± sample stdev, then min-max, over the runs that finished ok")
    t.add_column("#", justify="right")
    for key in comp.keys:
        t.add_column(key, overflow="fold")  # long keys and values wrap rather than hide
    t.add_column("ok/runs", justify="right")
    t.add_column("trusted", justify="right")
    t.add_column("JCT (us)", justify="right", no_wrap=True)
    t.add_column("busbw/link", justify="right", no_wrap=True)
    for row in comp.rows():
        t.add_row(str(row["point"]), *(row[k] for k in comp.keys), f"{row['ok']}/{row['runs']}",
                  str(row["trusted"]), _cell({s: row[f"jct_fabric_s_{s}"] for s in STATS}, 1e6, ",.0f"),
                  _cell({s: row[f"busbw_fraction_{s}"] for s in STATS}, 1.0, ".3f"))
    console.print(t)
    for r in comp.runs:
        if r.status != "ok":
            console.print(f"point {r.point}, seed {r.seed}: {r.status}: {r.error or '-'} "
                          f"({r.run_dir or 'no results folder'})", soft_wrap=True, highlight=False, markup=False)
