"""Results of runs on disk, for Python: one run's folder (Results), a sweep's (Sweep), load().

Frames are read when first asked for and kept; pandas is imported only then (fabric_emu.api.frames),
so `fabric-emu run`, which returns a Results, does not pay for it.
"""

from __future__ import annotations

import json
from functools import cached_property
from pathlib import Path
from typing import TYPE_CHECKING, Any

from fabric_emu.results.compare import read_summary, read_sweep, sweep_run_dirs
from fabric_emu.results.sweep import flatten
from fabric_emu.spec.errors import SpecError
from fabric_emu.spec.load import read_yaml

if TYPE_CHECKING:
    import pandas as pd

LOAD_HELP = "allowed: a run's folder with summary.json, or a sweep folder with sweep.json and runs.csv"
FRAME_NAMES = ("ports", "flows", "rates", "queues", "pauses", "thresholds", "pfcwd", "jobs")


class Results:
    """One run's results folder: `summary` (summary.json as a dict), `spec` (the resolved
    experiment.yaml as a dict), `metadata`, and a DataFrame per table (docs/python-api.md)."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self._frames: dict[str, pd.DataFrame] = {}
        if not (self.path / "summary.json").is_file():
            raise SpecError([(str(self.path), "", "not a run's results folder (it has no summary.json)")])

    def __repr__(self) -> str:
        return f"Results({str(self.path)!r}, status={self.status!r})"

    @cached_property
    def summary(self) -> dict[str, Any]:
        return read_summary(self.path)

    @cached_property
    def spec(self) -> dict[str, Any]:
        """The fully resolved spec the run ran with ({} if the folder has none)."""
        path = self.path / "experiment.yaml"
        return read_yaml(path) if path.is_file() else {}

    @cached_property
    def metadata(self) -> dict[str, Any]:
        path = self.path / "metadata.json"
        return json.loads(path.read_text()) if path.is_file() else {}

    @property
    def status(self) -> str:
        return self.summary.get("status", "failed")

    @property
    def dilation(self) -> float:
        """Emulated time / modelled time of this run (summary, else metadata, else the spec)."""
        d = self.summary.get("dilation") or self.metadata.get("dilation") or \
            self.spec.get("topology", {}).get("dilation")
        return float(d) if isinstance(d, (int, float)) else 1.0

    @property
    def seed(self) -> int | None:
        return self.spec.get("seed", self.metadata.get("seed"))

    def frame(self, name: str) -> pd.DataFrame:
        """The frame called `name` (one of FRAME_NAMES), read once."""
        if name not in FRAME_NAMES:
            raise ValueError(f"no frame {name!r}; allowed: {', '.join(FRAME_NAMES)}")
        if name not in self._frames:
            from fabric_emu.api import frames

            self._frames[name] = frames.jobs_frame(self.summary) if name == "jobs" else \
                frames.read_frame(self.path, name, self.dilation)
        return self._frames[name].copy()  # a caller's edits do not leak into the next read

    ports = property(lambda self: self.frame("ports"), doc="ports.csv: one row per switch port")
    flows = property(lambda self: self.frame("flows"), doc="flows.csv: one row per queue pair")
    rates = property(lambda self: self.frame("rates"), doc="rates.csv: every DCQCN rate change")
    queues = property(lambda self: self.frame("queues"), doc="queues.csv: backlog samples per port")
    pauses = property(lambda self: self.frame("pauses"), doc="pauses.csv: one row per pause interval")
    thresholds = property(lambda self: self.frame("thresholds"), doc="thresholds.csv: limits per port")
    pfcwd = property(lambda self: self.frame("pfcwd"), doc="pfcwd.csv: the PFC watchdog's counters per queue")
    jobs = property(lambda self: self.frame("jobs"), doc="summary.json's jobs, one row each")

    def scalars(self) -> dict[str, Any]:
        """Every number, string and flag of summary.json under its dotted key (lists left out)."""
        return {k: v for k, v in flatten(self.summary).items() if not isinstance(v, (list, dict))}


class Sweep:
    """Runs that differ by some spec keys (a `fabric-emu sweep` folder, or runs made from Python):
    `runs`, the swept `keys`, and frames of all runs at once with a column per key and `seed`.
    A key's column holds the value each run ran with, from its resolved spec (sizes in bytes,
    rates in bit/s), so it sorts and plots as a number."""

    def __init__(self, runs: list[Results], keys: list[str], path: Path | None = None) -> None:
        self.runs = list(runs)
        self.keys = list(keys)
        self.path = path

    def __repr__(self) -> str:
        return f"Sweep({len(self.runs)} runs over {', '.join(self.keys) or 'nothing'})"

    def values(self, run: Results) -> dict[str, Any]:
        """The run's value of each swept key, and its seed."""
        flat = flatten(run.spec)
        return {**{k: flat.get(k) for k in self.keys}, "seed": run.seed}

    def frame(self, name: str) -> pd.DataFrame:
        """Every run's frame `name`, one under the other, each row keyed by the run's swept
        values, seed and folder (`run_dir`)."""
        import pandas as pd

        parts = [r.frame(name).assign(**self.values(r), run_dir=str(r.path)) for r in self.runs]
        if not parts:
            raise ValueError("the sweep has no runs with a results folder")
        df = pd.concat(parts, ignore_index=True)
        lead = [*self.keys, "seed", "run_dir"]
        return df[lead + [c for c in df.columns if c not in lead]]

    def summary(self) -> pd.DataFrame:
        """One row per run: its swept values, seed, folder, and every scalar of its summary.json
        under its dotted key (status, jct_fabric_s, transport.cnp_sent, ...)."""
        import pandas as pd

        return pd.DataFrame([{**self.values(r), "run_dir": str(r.path), **r.scalars()} for r in self.runs])


def _sweep(path: Path) -> Sweep:
    comparison = read_sweep(path)
    dirs, problems = sweep_run_dirs(path)
    if problems:
        raise SpecError(problems)
    return Sweep([Results(d) for d in dirs], comparison.keys, path)


def load(path: str | Path) -> Results | Sweep:
    """A run's results folder (it has summary.json) as Results, a sweep folder (sweep.json and
    runs.csv) as a Sweep; anything else raises SpecError saying what is allowed."""
    path = Path(path)
    if (path / "sweep.json").is_file() and (path / "runs.csv").is_file():
        return _sweep(path)
    if (path / "summary.json").is_file():
        return Results(path)
    why = "not found" if not path.exists() else f"not a results folder ({LOAD_HELP})"
    raise SpecError([(str(path), "", why)])
