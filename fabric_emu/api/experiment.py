"""An experiment from Python: built from a YAML file or a dict, overridden as `--set` does,
validated as `fabric-emu run` validates it, and run the way `fabric-emu run` runs it (the
command is a thin layer over Experiment.run)."""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from rich.console import Console

from fabric_emu.api.results import Results
from fabric_emu.run.prepare import check_spec, load_checked
from fabric_emu.run.progress import OnProgress, ProgressEvent
from fabric_emu.spec.experiment import ExperimentSpec
from fabric_emu.spec.load import experiment_from_data
from fabric_emu.topo.plan import FabricPlan


class RunError(RuntimeError):
    """A run that did not finish ok, or could not start. `results` is its folder when one was
    written (its summary says how far it got); `reported` says the runner already printed why
    on its console (the command line uses it not to say it twice)."""

    def __init__(self, message: str, results: Results | None = None, reported: bool = False) -> None:
        super().__init__(message)
        self.results = results
        self.reported = reported


def _set_text(key: str, value: Any) -> str:
    """One override as `--set` takes it: a string as written (parsed as YAML, so '40Mbps' and
    '4' work), anything else as JSON, which YAML reads back as the same value."""
    return f"{key}={value if isinstance(value, str) else json.dumps(value)}"


class Experiment:
    """A validated experiment. Every constructor and override checks the whole spec, raising
    SpecError (one 'file: field: message' line per problem, as the command line prints them)."""

    def __init__(self, *, path: Path | None = None, data: dict | None = None, source: str = "<dict>",
                 base_dir: Path | None = None, sets: list[str] | None = None) -> None:
        self._path = path
        self._data = data
        self.source = str(path) if path is not None else source
        self._base_dir = base_dir or Path.cwd()
        self.sets = list(sets or [])  # the overrides, as `--set` would be given them
        self.spec, self.plan, self.ranks = self._check(measure=False)

    @classmethod
    def from_file(cls, path: str | Path, sets: list[str] | None = None) -> Experiment:
        """An experiment YAML file, with `--set`-style overrides ('dotted.key=value')."""
        return cls(path=Path(path), sets=sets)

    @classmethod
    def from_dict(cls, data: dict, name_for_errors: str = "<dict>", base_dir: str | Path | None = None,
                  sets: list[str] | None = None) -> Experiment:
        """An experiment as a dict of the YAML's fields; its topology a mapping, or a path read
        relative to `base_dir` (default: the current folder)."""
        return cls(data=data, source=name_for_errors, base_dir=Path(base_dir) if base_dir else None, sets=sets)

    def override(self, *changes: str | Mapping[str, Any]) -> Experiment:
        """A new Experiment with more overrides: 'dotted.key=value' strings or mappings of
        dotted keys to values (override({'dcqcn.rate_ai': '40Mbps', 'seed': 2})); later ones win."""
        sets = list(self.sets)
        for c in changes:
            sets += [c] if isinstance(c, str) else [_set_text(k, v) for k, v in c.items()]
        return Experiment(path=self._path, data=self._data, source=self.source, base_dir=self._base_dir, sets=sets)

    def _check(self, measure: bool) -> tuple[ExperimentSpec, FabricPlan, list[str]]:
        if self._path is not None:  # exactly what `fabric-emu run FILE --set ...` does
            return load_checked(self._path, self.sets, measure)
        spec = experiment_from_data(self._data, self.source, self._base_dir, self.sets)
        return check_spec(spec, self.source, measure)

    @property
    def name(self) -> str:
        return self.spec.name

    @property
    def dilation(self) -> float:
        """Emulated / modelled time (for `dilation: auto`, the cached or provisional choice)."""
        return self.plan.dilation

    def __repr__(self) -> str:
        return f"Experiment({self.source!r}, sets={self.sets!r})"

    def command(self, out: str | Path) -> list[str]:
        """The command line that reruns this experiment (metadata.json keeps it)."""
        sets = [a for s in self.sets for a in ("--set", s)]
        if self._path is not None:
            return ["fabric-emu", "run", str(self._path), "--out", str(out), *sets]
        return ["python: fabric_emu.api.Experiment.from_dict", self.source, *sets, "--out", str(out)]

    def run(self, out: str | Path = "results", progress: OnProgress | None = None, quiet: bool = False, *,
            metrics_port: int | None = None, metrics_linger_s: float = 0.0, console: Console | None = None,
            command: list[str] | None = None, debug: bool = False) -> Results:
        """Build the fabric, run the workload, tear down, write results/<name>/<UTC time>/ under
        `out`, and return it. Needs root and the main thread (Ctrl-C is caught for teardown).

        `progress` is called with a ProgressEvent at each phase and twice a second while traffic
        flows; `quiet` silences the console (the summary table). A run that does not finish ok
        raises RunError, whose `results` is the folder it wrote, if any. `metrics_port`: a
        Prometheus exporter on 127.0.0.1 (0: a free port; None: none)."""
        from fabric_emu.measure.capacity import ProbeError
        from fabric_emu.run.runner import Runner

        if os.geteuid() != 0:
            raise PermissionError("running an experiment needs root (Mininet and Open vSwitch); try sudo")
        spec, plan, ranks = self.spec, self.plan, self.ranks
        if plan.extra.get("dilation_auto", {}).get("provisional_dilation"):
            if progress is not None:
                progress(ProgressEvent("measure", None, 0.0, "measuring this machine for dilation: auto"))
            try:  # dilation: auto, and this machine's capacity was not cached: measure it now
                spec, plan, ranks = self._check(measure=True)
            except ProbeError as e:
                raise RunError(f"dilation: auto: cannot measure this machine ({e})") from None
        if spec.machines:  # over several machines (issue 19)
            from fabric_emu.run.partitioned import PartitionedRunner
            runner_class = PartitionedRunner
        else:
            runner_class = Runner
        runner = runner_class(spec, plan, ranks, Path(out), command=command or self.command(out),
                        console=console or Console(quiet=quiet), metrics_port=metrics_port,
                        metrics_linger_s=metrics_linger_s, on_progress=progress)
        code = runner.run(debug=debug)
        results = Results(runner.run_dir) if runner.run_dir is not None else None
        if code != 0 or results is None:
            raise RunError(runner.error or "the run did not finish ok", results, reported=True)
        return results
