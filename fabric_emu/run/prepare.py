"""Prepare a run: load an experiment and check it against its plan (names of hosts, ports and
links that only the plan knows), resolve `datapath: auto` and `dilation: auto` and derive the
default timeout."""

from __future__ import annotations

from pathlib import Path

from fabric_emu.kernel import ovs_datapath
from fabric_emu.kernel.ovs_datapath import DatapathUnavailable
from fabric_emu.cc.pfc import MAX_QUANTA, REFRESH_FRACTION, pause_seconds
from fabric_emu.run.deadline import default_timeout_s, losses_possible
from fabric_emu.spec.errors import SpecError
from fabric_emu.spec.experiment import ExperimentSpec
from fabric_emu.spec.load import load_experiment
from fabric_emu.spec.machines import underlay_mtu_needed
from fabric_emu.topo.placement import PlacementError, place
from fabric_emu.topo.plan import build_plan, resolve_ranks
from fabric_emu.workloads import jobs
from fabric_emu.workloads.flows import agent_hosts, unknown_hosts, workload_flows, workload_line_rate_s


def load_checked(path: Path, sets: list[str], measure: bool = False,
                 probe: ovs_datapath.Probe = ovs_datapath.probe_module, plan_only: bool = False):
    """Load an experiment and check names that need the plan (hosts, links, capture ports).

    `datapath` is resolved here (probe: whether openvswitch.ko is usable), and `dilation: auto`,
    from this machine's cached capacity on that datapath; `measure` allows measuring it when
    there is no cache (root, about 10 s; see fabric_emu.measure.capacity). `plan_only`: for
    `fabric-emu show`, which plans what a run cannot do yet (machines:)."""
    return check_spec(load_experiment(path, sets), str(path), measure, probe, plan_only)


def resolve_datapath(spec: ExperimentSpec, path: str,
                     probe: ovs_datapath.Probe = ovs_datapath.probe_module) -> ovs_datapath.DatapathChoice:
    """The datapath this run's switches get; `datapath: kernel` that cannot be had is bad input
    (one line, nothing created)."""
    try:
        return ovs_datapath.choose(spec.datapath, probe)
    except DatapathUnavailable as e:
        raise SpecError([(path, "datapath", f"kernel: the openvswitch module cannot load on this machine ({e});"
                                            " allowed here: auto, userspace")]) from None


def check_spec(spec: ExperimentSpec, path: str, measure: bool = False,
               probe: ovs_datapath.Probe = ovs_datapath.probe_module, plan_only: bool = False):
    """load_checked's checks of a spec already validated (from a file or a dict, named `path` in
    errors): (spec with dilation and timeout resolved, plan, ranks); the plan's
    extra["datapath"] says which datapath and why."""
    choice = resolve_datapath(spec, path, probe)
    auto = spec.topology.dilation == "auto"
    plan = build_plan(spec.topology, dilation=1.0 if auto else None)
    links = {frozenset((ln.a, ln.b)) for ln in plan.links if ln.kind == "fabric"}
    for i, e in enumerate(spec.events):
        if e.link is not None and frozenset(e.link.split("-")) not in links:
            raise SpecError([(str(path), f"events.{i}.link",
                              f"{e.link} is not a link between two switches of this fabric "
                              f"(see fabric-emu show; as {plan.links[-1].a}-{plan.links[-1].b})")])
    w = spec.workload
    names = [h.name for h in plan.hosts]
    program = None
    if jobs.uses_program(spec):
        try:
            program = jobs.build_program(jobs.resolve_jobs(spec, plan))
        except jobs.JobError as e:
            raise SpecError([(str(path), e.field, str(e))]) from None
        ranks = [h for h in names if h in set(program.hosts)]
    elif w.type == "allreduce":
        try:
            ranks = resolve_ranks(plan, w.ranks)
        except KeyError as e:
            raise SpecError([(str(path), "workload.ranks",
                              f"unknown host {e.args[0]!r} (hosts are {names[0]}..{names[-1]})")]) from None
    else:
        unknown = unknown_hosts(w, names)
        if unknown:
            raise SpecError([(str(path), field, msg) for field, msg in unknown])
        flows = workload_flows(w, names)
        if not flows:  # an incast from 'all' in a fabric of one host
            raise SpecError([(str(path), "workload.senders", f"'all' is nobody: {w.receiver} is the only host")])
        ranks = agent_hosts(flows, names)
    for i, e in enumerate(spec.events):
        if e.nic is not None and e.nic not in plan.host_by_name:
            raise SpecError([(str(path), f"events.{i}.nic",
                              f"unknown host {e.nic!r} (hosts are {names[0]}..{names[-1]})")])
    check_watchdog_poll(spec, plan, path)
    check_paths(spec, plan, path)
    check_machines(spec, plan, path, plan_only)
    for i, b in enumerate(spec.background):
        for end in ("src", "dst"):
            if getattr(b, end) not in plan.host_by_name:
                raise SpecError([(str(path), f"background.{i}.{end}",
                                  f"unknown host {getattr(b, end)!r} (hosts are {names[0]}..{names[-1]})")])
    if auto:
        from fabric_emu.measure.capacity import resolve_auto

        spec, plan = resolve_auto(spec, plan, ranks, measure, choice.datapath)
    plan.extra["datapath"] = choice.to_dict()
    plan.extra["routing"] = routing_of(spec, plan)
    if spec.timeout is None:
        if program is not None:
            line_rate_s = jobs.line_rate_s(program, plan.host_rate_bps(ranks[0]), plan.dilation)
        else:
            line_rate_s = workload_line_rate_s(w, ranks, names, plan.host_rate_bps(ranks[0]), plan.dilation)
        spec = spec.model_copy(update={"timeout": default_timeout(spec, plan, line_rate_s, plan.host_rate_bps(ranks[0]))})
    if spec.capture is not None:
        ports = {p.intf for sw in plan.switches for p in plan.ports(sw.name)}
        for i, name in enumerate(spec.capture.ports):
            if name not in ports:
                raise SpecError([(str(path), f"capture.ports.{i}",
                                  f"no switch port {name!r} in this fabric (see fabric-emu show)")])
    return spec, plan, ranks


def default_timeout(spec: ExperimentSpec, plan, line_rate_s: float, rate_bps: float) -> float:
    """The default deadline (fabric_emu.run.deadline): 30 s + 10x the line-rate time (wall
    seconds), and when packets can be lost, time for retransmission timeouts; the bottleneck's
    bytes are those of the line-rate time (the busiest host link's) at the host rate."""
    t = spec.transport
    return default_timeout_s(line_rate_s, plan.dilation,
                             lossy=losses_possible(spec.pfc.enabled, spec.pfcwd.enabled, spec.pfcwd.action),
                             bottleneck_bytes=round(line_rate_s * rate_bps / 8), port_buffer=plan.port_buffer,
                             retransmit_timeout_s=t.retransmit_timeout, retry_limit=t.retry_limit)


def check_paths(spec: ExperimentSpec, plan, path: str) -> None:
    """A pinned path starts at its source's switch, ends at its destination's, and steps from
    switch to switch over links of this fabric; one pair is pinned once."""
    names = [h.name for h in plan.hosts]
    links = {frozenset((ln.a, ln.b)) for ln in plan.links if ln.kind == "fabric"}
    pairs: set[tuple[str, str]] = set()
    for i, p in enumerate(spec.paths):
        for end in ("src", "dst"):
            if getattr(p, end) not in plan.host_by_name:
                raise SpecError([(str(path), f"paths.{i}.{end}",
                                  f"unknown host {getattr(p, end)!r} (hosts are {names[0]}..{names[-1]})")])
        if (p.src, p.dst) in pairs:
            raise SpecError([(str(path), f"paths.{i}", f"{p.src} -> {p.dst} is pinned twice")])
        pairs.add((p.src, p.dst))
        src_leaf, dst_leaf = plan.host_by_name[p.src].leaf, plan.host_by_name[p.dst].leaf
        for j, s in enumerate(p.via):
            if s not in plan.switch_by_name:
                raise SpecError([(str(path), f"paths.{i}.via.{j}", f"unknown switch {s!r} (see fabric-emu show)")])
        if p.via[0] != src_leaf or p.via[-1] != dst_leaf:
            raise SpecError([(str(path), f"paths.{i}.via",
                              f"must start at {p.src}'s switch {src_leaf} and end at {p.dst}'s switch {dst_leaf}")])
        for j, (a, b) in enumerate(zip(p.via, p.via[1:])):
            if frozenset((a, b)) not in links:
                raise SpecError([(str(path), f"paths.{i}.via.{j + 1}", f"no link between {a} and {b}")])


# What a run over several machines does not do yet (issue 19): field -> why, when set
NOT_ACROSS_MACHINES = {
    "background": "background traffic",
    "workloads": "several jobs", "pfcwd": "the PFC watchdog", "load_balancing": "dlb (its flowlet stage "
    "runs beside the controller)",
}


def unsupported_across_machines(spec: ExperimentSpec) -> list[str]:
    """The fields of a spec with machines: that a run over several machines cannot do yet."""
    used = {"background": bool(spec.background),
            "workloads": len(spec.workloads) > 1, "pfcwd": spec.pfcwd.enabled,
            "load_balancing": spec.load_balancing == "dlb"}
    return [field for field, on in used.items() if on]


def check_machines(spec: ExperimentSpec, plan, path: str, plan_only: bool) -> None:
    """Place a partitioned fabric (plan.extra["placement"]), and refuse, before anything is
    created, what a run over several machines does not do yet."""
    if not spec.machines:
        return
    try:
        placement = place(plan, [m.name for m in spec.machines])
    except PlacementError as e:
        raise SpecError([(str(path), "machines", str(e))]) from None
    plan.extra["placement"] = {**placement.to_dict(), "addresses": {m.name: m.address for m in spec.machines},
                               "underlay_mtu": underlay_mtu_needed(plan.mtu)}
    if plan_only:
        return
    problems = [(str(path), field, f"{NOT_ACROSS_MACHINES[field]} cannot run over several machines yet "
                                   "(allowed with machines: none of it)") for field in unsupported_across_machines(spec)]
    if len({m.ssh_user for m in spec.machines}) > 1:
        problems.append((str(path), "machines", "every machine must take the same ssh_user (Cluster Edition "
                                                "logs in as one user)"))
    if problems:
        raise SpecError(problems)


def routing_of(spec: ExperimentSpec, plan) -> dict:
    """What the controller needs of the spec's routing (the plan's extra["routing"]): pinned
    paths, the failover mode and the wall-clock convergence delay (None: never)."""
    conv = spec.failover.convergence
    return {"paths": [p.model_dump() for p in spec.paths], "failover": spec.failover.mode,
            "convergence_wall_s": None if conv == "never" else conv * plan.dilation}


def check_watchdog_poll(spec: ExperimentSpec, plan, path: str) -> None:
    """A storm's pause frames must reach every poll, or its polls would look clean: the poll
    must outlast the refresh period of a full pause at the slowest switch port."""
    wd = spec.pfcwd
    if not wd.enabled:
        return
    slowest = min(ln.gbps for ln in plan.links)
    refresh = REFRESH_FRACTION * pause_seconds(MAX_QUANTA, slowest)
    if wd.poll_interval <= refresh:
        raise SpecError([(str(path), "pfcwd.poll_interval",
                          f"{wd.poll_interval * 1e6:g} us is not longer than a storm's pause refresh period "
                          f"({refresh * 1e6:.0f} us at {slowest:g} Gb/s): a poll could see no pause frame")])
