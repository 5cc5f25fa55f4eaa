"""The `fabric-emu` command: run, show, clean."""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Annotated, Optional

import typer
from rich.console import Console

from fabric_emu import traffic
from fabric_emu.config import SpecError, load_experiment, load_topology, read_yaml
from fabric_emu.plan import build_plan, resolve_ranks

app = typer.Typer(add_completion=False, no_args_is_help=True,
                  help="Emulate RoCEv2 AI-cluster fabrics on Mininet and Open vSwitch.")
out = Console()
err = Console(stderr=True, soft_wrap=True)

EXIT_OK, EXIT_RUNTIME, EXIT_INPUT = 0, 1, 2
# Without retransmission (not built yet) a lost last packet stalls a rank until the timeout,
# so the default scales with the workload instead of being minutes long.
DEFAULT_TIMEOUT_BASE_S = 30.0
_debug = False


@app.callback()
def _main(debug: Annotated[bool, typer.Option("--debug", help="show tracebacks")] = False) -> None:
    global _debug
    _debug = debug


def _input_error(e: SpecError) -> None:
    for line in e.lines():
        err.print(f"error: {line}", markup=False, highlight=False)
    raise typer.Exit(EXIT_INPUT)


def load_checked(path: Path, sets: list[str], measure: bool = False):
    """Load an experiment and check names that need the plan (the workload's host names).

    `dilation: auto` is resolved here, from this machine's cached capacity; `measure` allows
    measuring it when there is no cache (root, about 10 s; see fabric_emu.capacity)."""
    spec = load_experiment(path, sets)
    auto = spec.topology.dilation == "auto"
    plan = build_plan(spec.topology, dilation=1.0 if auto else None)
    w = spec.workload
    names = [h.name for h in plan.hosts]
    if w.type == "allreduce":
        try:
            ranks = resolve_ranks(plan, w.ranks)
        except KeyError as e:
            raise SpecError([(str(path), "workload.ranks",
                              f"unknown host {e.args[0]!r} (hosts are {names[0]}..{names[-1]})")]) from None
    else:
        unknown = traffic.unknown_hosts(w, names)
        if unknown:
            raise SpecError([(str(path), field, msg) for field, msg in unknown])
        flows = traffic.workload_flows(w, names)
        if not flows:  # an incast from 'all' in a fabric of one host
            raise SpecError([(str(path), "workload.senders", f"'all' is nobody: {w.receiver} is the only host")])
        ranks = traffic.agent_hosts(flows, names)
    if auto:
        from fabric_emu.capacity import resolve_auto

        spec, plan = resolve_auto(spec, plan, ranks, measure)
    if spec.timeout is None:
        line_rate_s = traffic.line_rate_s(w, ranks, names, plan.host_rate_bps(ranks[0]), plan.dilation)
        spec = spec.model_copy(update={"timeout": DEFAULT_TIMEOUT_BASE_S + 10 * line_rate_s})
    if spec.capture is not None:
        ports = {p.intf for sw in plan.switches for p in plan.ports(sw.name)}
        for i, name in enumerate(spec.capture.ports):
            if name not in ports:
                raise SpecError([(str(path), f"capture.ports.{i}",
                                  f"no switch port {name!r} in this fabric (see fabric-emu show)")])
    return spec, plan, ranks


def _is_topology_file(path: Path) -> bool:
    data = read_yaml(path)
    return isinstance(data, dict) and "kind" in data and "workload" not in data


@app.command()
def show(spec: Annotated[Path, typer.Argument(help="an experiment or topology YAML file")],
         set_: Annotated[Optional[list[str]], typer.Option("--set", help="override dotted.key=value")] = None) -> None:
    """Validate a spec and print its plan (needs no root)."""
    from fabric_emu.show import print_plan

    from fabric_emu.capacity import PROVISIONAL_DILATION, ProbeError

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
                exp, plan, ranks = load_checked(spec, set_ or [], measure=os.geteuid() == 0)
            except ProbeError as e:
                err.print(f"warning: cannot measure this machine for dilation: auto ({e})",
                          markup=False, highlight=False)
                exp, plan, ranks = load_checked(spec, set_ or [], measure=False)
    except SpecError as e:
        _input_error(e)
    print_plan(out, plan, exp, ranks)


@app.command()
def run(experiment: Annotated[Path, typer.Argument(help="experiment YAML file")],
        out_dir: Annotated[Path, typer.Option("--out", help="results base folder")] = Path("results"),
        set_: Annotated[Optional[list[str]], typer.Option("--set", help="override dotted.key=value")] = None) -> None:
    """Build the fabric, run the workload, collect counters, tear down, write results."""
    from fabric_emu.capacity import ProbeError

    try:
        spec, plan, ranks = load_checked(experiment, set_ or [])
    except SpecError as e:
        _input_error(e)
    if os.geteuid() != 0:
        err.print("error: fabric-emu run needs root (Mininet and Open vSwitch); try sudo")
        raise typer.Exit(EXIT_RUNTIME)
    if plan.extra.get("dilation_auto", {}).get("provisional_dilation"):
        try:  # dilation: auto, and this machine's capacity was not cached: measure it now
            spec, plan, ranks = load_checked(experiment, set_ or [], measure=True)
        except ProbeError as e:
            err.print(f"error: dilation: auto: cannot measure this machine ({e})", markup=False)
            raise typer.Exit(EXIT_RUNTIME)
    from fabric_emu.runner import Runner

    runner = Runner(spec, plan, ranks, out_dir, command=sys.argv, console=out)
    code = runner.run(debug=_debug)
    raise typer.Exit(code)


@app.command()
def clean() -> None:
    """Remove everything earlier fabric-emu runs left behind on this machine, and nothing else."""
    if os.geteuid() != 0:
        err.print("error: fabric-emu clean needs root")
        raise typer.Exit(EXIT_RUNTIME)
    from fabric_emu.cleanup import clean_stale

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
