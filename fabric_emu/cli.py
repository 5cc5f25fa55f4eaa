"""The `fabric-emu` command: run, lab, show, sweep, compare, report, lb, top, schema, clean."""

from __future__ import annotations

import os
import signal
import sys
import time
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Callable, Iterator, Optional

import typer
from rich.console import Console

from fabric_emu.api.experiment import Experiment
from fabric_emu.spec.errors import SpecError
from fabric_emu.spec.load import load_topology, read_yaml
from fabric_emu.run.prepare import load_checked
from fabric_emu.topo.plan import build_plan
from fabric_emu.results.sweep import Point, RunResult, check_overrides, check_size, grid, parse_over, parse_seeds

app = typer.Typer(add_completion=False, no_args_is_help=True,
                  help="Emulate RoCEv2 AI-cluster fabrics on Mininet and Open vSwitch.")
out = Console()
err = Console(stderr=True, soft_wrap=True)

EXIT_OK, EXIT_RUNTIME, EXIT_INPUT = 0, 1, 2
_debug = False


@app.callback()
def _main(debug: Annotated[bool, typer.Option("--debug", help="show tracebacks")] = False) -> None:
    global _debug
    _debug = debug


def _input_error(e: SpecError) -> None:
    for line in e.lines():
        err.print(f"error: {line}", markup=False, highlight=False)
    raise typer.Exit(EXIT_INPUT)


def _is_topology_file(path: Path) -> bool:
    data = read_yaml(path)
    return isinstance(data, dict) and "kind" in data and "workload" not in data


@app.command()
def show(spec: Annotated[Path, typer.Argument(help="an experiment or topology YAML file")],
         set_: Annotated[Optional[list[str]], typer.Option("--set", help="override dotted.key=value")] = None) -> None:
    """Validate a spec and print its plan (needs no root)."""
    from fabric_emu.run.show import print_plan

    from fabric_emu.measure.capacity import PROVISIONAL_DILATION, ProbeError

    try:
        if _is_topology_file(spec):
            topo = load_topology(spec, set_ or [])
            plan, ranks, exp = build_plan(topo, PROVISIONAL_DILATION if topo.dilation == "auto" else None), None, None
            if topo.dilation == "auto":
                plan.extra["dilation_auto"] = {
                    "dilation": None, "provisional_dilation": PROVISIONAL_DILATION,
                    "reason": "auto is chosen per experiment, from the packet rates its workload asks for"}
        else:
            try:  # as root, measure this machine if it was never measured (about 10 s)
                exp, plan, ranks = load_checked(spec, set_ or [], measure=os.geteuid() == 0, plan_only=True)
            except ProbeError as e:
                err.print(f"warning: cannot measure this machine for dilation: auto ({e})",
                          markup=False, highlight=False)
                exp, plan, ranks = load_checked(spec, set_ or [], measure=False, plan_only=True)
    except SpecError as e:
        _input_error(e)
    print_plan(out, plan, exp, ranks)


def _need_root(command: str) -> None:
    if os.geteuid() != 0:
        err.print(f"error: fabric-emu {command} needs root (Mininet and Open vSwitch); try sudo")
        raise typer.Exit(EXIT_RUNTIME)


def _run_experiment(exp: Experiment, out_dir: Path, command: list[str], metrics_port: int | None = 0,
                    metrics_linger_s: float = 0.0) -> int:
    """Run a validated experiment through the API (fabric_emu.api) and return the exit code."""
    from fabric_emu.api.experiment import RunError

    try:
        exp.run(out_dir, console=out, command=command, metrics_port=metrics_port,
                metrics_linger_s=metrics_linger_s, debug=_debug)
    except RunError as e:
        if not e.reported:  # the runner says why a run failed; this is why none started
            err.print(f"error: {e}", markup=False)
        return EXIT_RUNTIME
    return EXIT_OK


@app.command()
def run(experiment: Annotated[Path, typer.Argument(help="experiment YAML file")],
        out_dir: Annotated[Path, typer.Option("--out", help="results base folder")] = Path("results"),
        set_: Annotated[Optional[list[str]], typer.Option("--set", help="override dotted.key=value")] = None,
        metrics_port: Annotated[int, typer.Option(
            "--metrics-port", help="Prometheus exporter port on 127.0.0.1 (0: a free one, -1: none)")] = 0,
        metrics_linger: Annotated[float, typer.Option(
            "--metrics-linger", help="seconds to keep serving the final metrics after the run")] = 0.0) -> None:
    """Build the fabric, run the workload, collect counters, tear down, write results."""
    try:
        exp = Experiment.from_file(experiment, set_ or [])
    except SpecError as e:
        _input_error(e)
    if not -1 <= metrics_port <= 65535 or metrics_linger < 0:
        err.print("error: --metrics-port: 0..65535 or -1 (none); --metrics-linger: seconds >= 0", markup=False)
        raise typer.Exit(EXIT_INPUT)
    _need_root("run")
    raise typer.Exit(_run_experiment(exp, out_dir, sys.argv, None if metrics_port < 0 else metrics_port,
                                     metrics_linger))


@app.command()
def lab(experiment: Annotated[Path, typer.Argument(help="experiment YAML file: the fabric and the first settings")],
        out_dir: Annotated[Path, typer.Option("--out", help="results base folder")] = Path("results"),
        set_: Annotated[Optional[list[str]], typer.Option("--set", help="override dotted.key=value")] = None,
        script: Annotated[Optional[str], typer.Option(
            "--script", help="run the lab commands of this file (- : standard input), then leave")] = None,
        metrics_port: Annotated[int, typer.Option(
            "--metrics-port", help="Prometheus exporter port on 127.0.0.1 (0: a free one, -1: none)")] = 0) -> None:
    """Build the fabric and keep it up: Mininet's CLI plus run, lb, ecn, pfc, cc, link, ports, flows..."""
    from fabric_emu.lab.shell import script_lines

    try:
        load_checked(experiment, set_ or [])
    except SpecError as e:
        _input_error(e)
    if not -1 <= metrics_port <= 65535:
        err.print("error: --metrics-port: 0..65535 or -1 (none)", markup=False)
        raise typer.Exit(EXIT_INPUT)
    lines = None
    if script is not None:
        try:
            lines = script_lines(script, sys.stdin)
        except OSError as e:
            err.print(f"error: {script}: cannot read ({e.strerror})", markup=False)
            raise typer.Exit(EXIT_INPUT)
    _need_root("lab")
    raise typer.Exit(_lab(experiment, set_ or [], out_dir, lines, None if metrics_port < 0 else metrics_port))


def _lab(experiment: Path, sets: list[str], out_dir: Path, script: list[str] | None, metrics_port: int | None) -> int:
    """The lab's life: up, the prompt (or script), down, whatever ends it."""
    from fabric_emu.measure.capacity import ProbeError
    from fabric_emu.lab.session import LabExit, LabSession, install_exit_handlers
    from fabric_emu.lab.shell import LabCLI

    console = out if out.is_terminal else Console(width=140)  # a script's tables, not cut at 80
    try:
        session = LabSession(experiment, sets, out_dir, console, metrics_port)
    except ProbeError as e:
        err.print(f"error: dilation: auto: cannot measure this machine ({e})", markup=False)
        return EXIT_RUNTIME
    old = install_exit_handlers()
    failed: str | None = None
    left = "quit"
    try:
        session.up()
        r = session.record
        console.print(f"lab up: {len(session.plan.hosts)} hosts, run {r.run_id}; metrics {r.metrics_url or 'off'}; "
                  "type help for the commands, quit to leave", highlight=False, soft_wrap=True)
        shell = LabCLI(session, console, script=script, debug=_debug)
        failed, left = shell.failed, shell.left_by
    except LabExit as e:
        left, failed = f"{e}", (f"terminated ({e})" if script is not None else None)
    except KeyboardInterrupt:
        left, failed = "Ctrl-C", "interrupted (SIGINT)" if script is not None else None
    except Exception as e:  # noqa: BLE001 - the fabric still goes; one line unless --debug
        if _debug:
            import traceback
            traceback.print_exc()
        left, failed = "error", f"{type(e).__name__}: {e}"
    finally:
        problems = session.down()
        for sig, handler in old.items():
            signal.signal(sig, handler)
    try:
        for p in problems:
            err.print(f"warning: {p}; cleaned from the run record", markup=False)
        console.print(f"lab over ({left}): the fabric is torn down; {len(session.runs)} run(s) in {out_dir}",
                  highlight=False, soft_wrap=True)
        if failed:
            err.print(f"error: {failed}", markup=False, highlight=False)
    except OSError:  # the terminal is gone (SIGHUP)
        pass
    return EXIT_RUNTIME if failed else EXIT_OK


@dataclass
class _SweepRun:
    """One run of a sweep: a grid point with one seed, validated."""
    point: Point
    seed: int
    sets: list[str]  # what `fabric-emu run --set` would be given
    exp: Experiment

    @property
    def name(self) -> str:
        return self.exp.name


def _plan_sweep(experiment: Path, sets: list[str], points: list[Point],
                seeds: list[int] | None) -> list[_SweepRun]:
    """Validate every run of the grid before any starts; every distinct problem is reported."""
    runs: list[_SweepRun] = []
    problems: list[tuple[str, str, str]] = []
    for point in points:
        for seed in seeds or [None]:
            run_sets = [*sets, *point.sets(), *([f"seed={seed}"] if seed is not None else [])]
            try:
                exp = Experiment.from_file(experiment, run_sets)
            except SpecError as e:
                problems += [p for p in e.problems if p not in problems]
                continue
            runs.append(_SweepRun(point, exp.spec.seed, run_sets, exp))
    if problems:
        raise SpecError(problems)
    return runs


def _folders(parent: Path) -> set[Path]:
    return {p for p in parent.iterdir() if p.is_dir()} if parent.is_dir() else set()


def _sweep_one(experiment: Path, run: _SweepRun, out_dir: Path) -> tuple[RunResult, bool]:
    """One run of a sweep, as `fabric-emu run` does it; (its result, whether Ctrl-C stopped it)."""
    from fabric_emu.results.compare import read_summary

    command = [sys.argv[0], *(["--debug"] if _debug else []), "run", str(experiment), "--out", str(out_dir),
               *[a for s in run.sets for a in ("--set", s)]]  # the run's own, to rerun it alone
    before = _folders(out_dir / run.name)
    error, stopped = "", False
    try:
        _run_experiment(run.exp, out_dir, command)
    except KeyboardInterrupt:  # Ctrl-C outside the traffic phase (the runner catches it there)
        error, stopped = "interrupted (SIGINT)", True
    except Exception as e:  # noqa: BLE001 - a failed point is recorded, the others still run
        error = f"{type(e).__name__}: {e}"
        if _debug:
            import traceback
            traceback.print_exc()
    new = sorted(_folders(out_dir / run.name) - before)
    run_dir = new[0] if len(new) == 1 else None  # runs are one at a time (the run lock)
    try:
        summary = read_summary(run_dir) if run_dir else {}
    except SpecError as e:
        summary, error = {}, error or str(e)
    result = RunResult.of_summary(run.point.index, run.seed, str(run_dir or ""), summary, error)
    return result, stopped or result.interrupted


@contextmanager
def _no_interrupts() -> Iterator[None]:
    """Ctrl-C waits while a few small files are written, as the runner's teardown does."""
    old = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, old)


@app.command()
def sweep(experiment: Annotated[Path, typer.Argument(help="experiment YAML file")],
          over: Annotated[Optional[list[str]], typer.Option(
              "--over", help="a key and the values to run it with: dotted.key=V1,V2,...")] = None,
          seeds: Annotated[Optional[str], typer.Option(
              "--seeds", help="seeds for every point: 1-5, 1,3,7 or 4 (default: the spec's)")] = None,
          out_dir: Annotated[Path, typer.Option("--out", help="results base folder")] = Path("results"),
          set_: Annotated[Optional[list[str]], typer.Option("--set", help="override dotted.key=value")] = None) -> None:
    """Run every combination of the --over values with every seed, then compare them."""
    from fabric_emu.results import folder as results
    from fabric_emu.results.compare import Comparison, print_comparison, sweep_title, write_sweep

    sets = set_ or []
    try:
        axes = parse_over(over or [])
        seed_list = parse_seeds(seeds) if seeds is not None else None
        check_overrides(axes, sets, seed_list is not None)
        points = grid(axes)
        check_size(points, seed_list)
        runs = _plan_sweep(experiment, sets, points, seed_list)
    except SpecError as e:
        _input_error(e)
    _need_root("sweep")
    started = time.time()
    done: list[RunResult] = []
    stopped = False
    try:
        for i, run in enumerate(runs, 1):
            out.rule(f"sweep run {i} of {len(runs)}: point {run.point.index} ({run.point.label}), seed {run.seed}",
                     style="dim")
            result, stopped = _sweep_one(experiment, run, out_dir)
            done.append(result)
            if stopped:
                break
    except KeyboardInterrupt:  # between two runs: the runs so far still get their sweep folder
        stopped = True
    used_seeds = seed_list or sorted({r.seed for r in runs})
    comp = Comparison(sweep_title(runs[0].name, len(points), len(used_seeds)), [a.key for a in axes], points, done)
    with _no_interrupts():
        sweep_dir = results.make_run_dir(out_dir, runs[0].name, started, prefix="sweep-")
        files = write_sweep(sweep_dir, {
            "name": runs[0].name, "experiment": str(experiment), "command": sys.argv,
            "over": {a.key: list(a.values) for a in axes}, "seeds": used_seeds, "sets": sets,
            "start": results.iso(started), "end": results.iso(time.time()),
            "runs_planned": len(runs), "runs_done": len(done), "interrupted": stopped}, comp)
    print_comparison(out, comp)
    out.print(f"sweep: {sweep_dir} ({', '.join(files)})", soft_wrap=True, highlight=False)
    failed = sum(1 for r in done if r.status != "ok")
    if stopped:
        err.print(f"error: sweep interrupted after {len(done)} of {len(runs)} runs", markup=False)
    elif failed:
        err.print(f"error: {failed} of {len(runs)} runs did not finish ok", markup=False)
    raise typer.Exit(EXIT_RUNTIME if stopped or failed else EXIT_OK)


@app.command()
def compare(paths: Annotated[list[Path], typer.Argument(
        help="results folders of runs, sweep folders, or an experiment's folder of runs")]) -> None:
    """Compare finished runs: group them by the spec keys that differ, seeds aggregated."""
    from fabric_emu.results.compare import load_comparison, print_comparison

    try:
        comp = load_comparison(paths)
    except SpecError as e:
        _input_error(e)
    print_comparison(out, comp)


@app.command()
def report(results_dir: Annotated[Path, typer.Argument(
               help="a run's results folder, a sweep folder, or an experiment's folder of runs")],
           out_path: Annotated[Optional[Path], typer.Option(
               "--out", help="where to write the page (default: RESULTS_DIR/report.html)")] = None) -> None:
    """Write one self-contained HTML page of a results folder and print its path (needs no root)."""
    from fabric_emu.results.report import write_report

    try:
        page = write_report(results_dir, out_path)
    except SpecError as e:
        _input_error(e)
    out.print(str(page), soft_wrap=True, highlight=False, markup=False)


@app.command()
def lb(mode: Annotated[Optional[str], typer.Argument(help="ecmp, spray or dlb; leave out to show the state")] = None,
       set_: Annotated[Optional[list[str]], typer.Option(
           "--set", help="a parameter of the mode, key=value (dlb: inactivity=30us, quality_window=20us)")] = None,
       run_id: Annotated[Optional[str], typer.Option("--run", help="the run's id, when several are running")] = None
       ) -> None:
    """Show or change the load-balancing mode of the running fabric, live (its controller)."""
    from fabric_emu.fabric.events import RestError, rest_call
    from fabric_emu.lb.view import print_lb_state

    record = _live_run("lb", run_id, lambda r: bool(r.controller_url))
    url = record.controller_url
    params = {}
    for item in set_ or []:
        key, sep, value = item.partition("=")
        if not sep or not key:
            err.print(f"error: lb: --set {item}: expected key=value", markup=False, highlight=False)
            raise typer.Exit(EXIT_INPUT)
        params[key] = value
    try:
        if mode is None:
            print_lb_state(out, record.run_id, rest_call(url))
            return
        change = rest_call(url, {"mode": mode, "params": params})
    except RestError as e:
        err.print(f"error: lb: {e}", markup=False, highlight=False)
        raise typer.Exit(EXIT_INPUT if str(e)[:3] in ("400", "409") else EXIT_RUNTIME)
    out.print(f"load balancing of {record.run_id} is now {change['mode']}: every leaf applied it in "
              f"{change['applied_s'] * 1e3:.1f} ms" + ("" if change.get("answered") else " (some did not answer)"),
              highlight=False)


def _live_run(command: str, run_id: str | None, has: Callable[[object], bool]):
    """The one running fabric whose record has what `command` needs (or --run ID); exit 2 if none."""
    from fabric_emu.state.records import live_records

    live = [r for r in live_records() if has(r) and (run_id is None or r.run_id == run_id)]
    if len(live) == 1:
        return live[0]
    which = f"run {run_id}" if run_id else "fabric"
    msg = (f"no running {which} to talk to (start one with `fabric-emu run` or `fabric-emu lab`)" if not live else
           "several are: pick one with --run " + " | ".join(r.run_id for r in live))
    err.print(f"error: {command}: {msg}", markup=False, highlight=False)
    raise typer.Exit(EXIT_INPUT)


@app.command()
def top(run_id: Annotated[Optional[str], typer.Option("--run", help="the run's id, when several are running")] = None,
        once: Annotated[bool, typer.Option("--once", help="print one view and exit")] = False,
        as_json: Annotated[bool, typer.Option("--json", help="print one view as JSON and exit")] = False,
        interval: Annotated[float, typer.Option("--interval", help="seconds between refreshes")] = 1.0) -> None:
    """Watch a running fabric live: port rates, queues, ECN, PFC, busiest QPs, LB, fidelity."""
    from fabric_emu.live.reader import LiveReader
    from fabric_emu.live.top import run_top

    _need_root("top")
    if interval <= 0:
        err.print("error: top: --interval must be > 0", markup=False)
        raise typer.Exit(EXIT_INPUT)
    record = _live_run("top", run_id, lambda r: bool(r.live_path))
    try:
        reader = LiveReader(record.live_path)
    except (OSError, ValueError) as e:
        err.print(f"error: top: run {record.run_id} has no live view yet ({e})", markup=False)
        raise typer.Exit(EXIT_RUNTIME)
    try:
        run_top(reader.snapshot, out, interval, once, as_json, alive=record.owner_alive)
    finally:
        reader.close()


@app.command()
def schema(topology: Annotated[bool, typer.Option(
               "--topology", help="the schema of topology files instead of experiment files")] = False,
           markdown: Annotated[bool, typer.Option(
               "--markdown", help="the spec reference of both instead (docs/spec-reference.md), as Markdown")] = False
           ) -> None:
    """Print the JSON Schema of experiment files (for editors), of topology files, or the spec reference."""
    if topology and markdown:
        err.print("error: schema: --markdown covers topology files too; leave out --topology", markup=False)
        raise typer.Exit(EXIT_INPUT)
    if markdown:
        from fabric_emu.spec.reference import render

        sys.stdout.write(render())
        return
    import json

    from fabric_emu.spec.schema import experiment_schema, topology_schema

    sys.stdout.write(json.dumps(topology_schema() if topology else experiment_schema(), indent=2,
                                ensure_ascii=False) + "\n")


@app.command()
def clean() -> None:
    """Remove everything earlier fabric-emu runs left behind on this machine, and nothing else."""
    if os.geteuid() != 0:
        err.print("error: fabric-emu clean needs root")
        raise typer.Exit(EXIT_RUNTIME)
    from fabric_emu.run.supervise import ovs_back_after_death
    from fabric_emu.state.cleanup import clean_stale

    ovs_back_after_death(lambda line: out.print(line, markup=False))  # else deleting bridges hangs
    removed, active = clean_stale()
    for line in removed:
        out.print(f"removed {line}", markup=False)
    for run_id in active:
        out.print(f"left alone: run {run_id} is still running", markup=False)
    if not removed and not active:
        out.print("nothing to clean")


def main() -> None:
    try:
        app()
    except SpecError as e:  # raised outside a command (defensive)
        for line in e.lines():
            err.print(f"error: {line}", markup=False)
        sys.exit(EXIT_INPUT)
    except Exception as e:  # noqa: BLE001 - one line unless --debug
        if _debug:
            raise
        err.print(f"error: {type(e).__name__}: {e}", markup=False)
        sys.exit(EXIT_RUNTIME)
