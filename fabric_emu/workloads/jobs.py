"""An experiment's jobs as one per-rank Program, and each job's results from its ops' times, pure.

What every job run as a Program has in common; each kind builds and measures its own:

    spec --resolve_jobs--> [Job: ranks placed] --build_program--> Program --> NIC engines
        collectives:          collective_program, collective_results (fabric_emu.workloads.collectives)
        pipeline, training:   training_program, step_results         (fabric_emu.workloads.training)
        parameter-server:     job_program, ps_results                (fabric_emu.workloads.parameter_server)
    engines' [start, end] per op --op_times--> Times --job_results--> summary.json's `jobs`

Jobs: the collectives (allreduce by halving-doubling, reducescatter, allgather, alltoall,
sendrecv), pipelines, 3D-parallel training steps and parameter-server training, alone
(`workload`) or several at once (`workloads`; a ring all-reduce there too). A single ring all-reduce, incast or flows workload
keeps its own driver (fabric_emu.nic.drivers.ring, flows).

A job's results: its planned bytes, completion time and step bounds here, then its kind's
metrics (nccl-tests' algbw and busbw for a collective; a step's split and the pipeline bubble).
"""

from __future__ import annotations

from dataclasses import dataclass

from fabric_emu.spec.experiment import ExperimentSpec
from fabric_emu.spec.topology import servers_of
from fabric_emu.spec.workloads import (AllReduceWorkload, CollectiveWorkload, ParameterServerWorkload,
                                       PipelineWorkload, TrainingWorkload)
from fabric_emu.topo.plan import FabricPlan, resolve_ranks
from fabric_emu.workloads import collectives, parameter_server, training
from fabric_emu.workloads.program import COMPUTE, FABRIC, RECV, SCALE_UP, Domains, Program, Times

PROGRAM_TYPES = ("reducescatter", "allgather", "alltoall", "sendrecv", "pipeline", "training", "parameter-server")


class JobError(ValueError):
    """A job that does not fit the fabric: (field under the spec, message)."""

    def __init__(self, field: str, message: str):
        self.field = field
        super().__init__(message)


@dataclass
class Job:
    name: str
    workload: AllReduceWorkload | CollectiveWorkload | PipelineWorkload | TrainingWorkload | ParameterServerWorkload
    field: str  # where the spec gives it: workload, or workloads.<i>
    hosts: list[str]  # in rank order (for a grid: d, s, t with t fastest; workers, then servers)
    grid: training.Grid | None = None  # pipelines and training
    roles: tuple[list[str], list[str]] | None = None  # parameter-server: (workers, servers)
    domains: Domains | None = None  # multi-GPU servers: which transfers go across a scale-up domain

    @property
    def type(self) -> str:
        return self.workload.type


def uses_program(spec: ExperimentSpec) -> bool:
    """Whether the run's NICs run a Program (else the ring or flows driver of one workload)."""
    if spec.workloads:
        return True
    w = spec.workload
    # a ring over multi-GPU servers runs as a Program: its hops inside a server are scale-up
    return w.type in PROGRAM_TYPES or (w.type == "allreduce" and (
        w.algorithm != "ring" or servers_of(spec.topology) is not None))


def domains(spec: ExperimentSpec, plan: FabricPlan) -> Domains | None:
    """The plan's multi-GPU servers as a Program takes them; PXN on rail-optimized fabrics only
    (elsewhere a server's GPUs share one leaf: every rail is one switch away)."""
    if not plan.servers:
        return None
    return Domains({srv.name: srv.hosts for srv in plan.servers},
                   pxn=spec.pxn and plan.kind == "rail-optimized")


def servers_in_order(plan: FabricPlan) -> list[list[str]]:
    """Each server's hosts in GPU order, in host order (empty for single-NIC hosts)."""
    return [list(srv.hosts) for srv in plan.servers]


def hosts_by_leaf(plan: FabricPlan) -> list[list[str]]:
    out: dict[str, list[str]] = {}
    for h in plan.hosts:
        out.setdefault(h.leaf, []).append(h.name)
    return list(out.values())


def resolve_jobs(spec: ExperimentSpec, plan: FabricPlan) -> list[Job]:
    """Each job with its ranks placed; raises JobError naming the field that does not fit."""
    single = spec.workload is not None
    doms = domains(spec, plan)
    jobs = []
    for i, w in enumerate(spec.jobs):
        field = "workload" if single else f"workloads.{i}"
        name = w.name or (w.type if single else f"job{i + 1}")
        job = _resolve(name, w, field, plan)
        job.domains = doms
        jobs.append(job)
    return jobs


def _known(plan: FabricPlan, field: str, hosts: list[str]) -> None:
    names = [h.name for h in plan.hosts]
    for h in hosts:
        if h not in plan.host_by_name:
            raise JobError(field, f"unknown host {h!r} (hosts are {names[0]}..{names[-1]})")


def _resolve(name: str, w, field: str, plan: FabricPlan) -> Job:
    if isinstance(w, (AllReduceWorkload, CollectiveWorkload)):
        try:
            hosts = resolve_ranks(plan, w.ranks)
        except KeyError as e:
            names = [h.name for h in plan.hosts]
            raise JobError(f"{field}.ranks", f"unknown host {e.args[0]!r} (hosts are {names[0]}..{names[-1]})") from None
        n = len(hosts)
        if n < 2:
            raise JobError(f"{field}.ranks", "needs at least 2 hosts")
        if w.algorithm == "halving-doubling" and n & (n - 1):
            raise JobError(f"{field}.algorithm", f"halving-doubling needs a power-of-two number of ranks, got {n}")
        if w.size < n * w.qps_per_peer:
            raise JobError(f"{field}.size", f"{w.size} B is smaller than ranks x qps_per_peer "
                                            f"({n * w.qps_per_peer}); every queue pair needs a byte per step")
        return Job(name, w, field, hosts)
    if isinstance(w, ParameterServerWorkload):
        for role in ("servers", "workers"):
            if isinstance(getattr(w, role), list):
                _known(plan, f"{field}.{role}", getattr(w, role))
        try:
            workers, servers = parameter_server.roles(w, [h.name for h in plan.hosts])
        except ValueError as e:
            raise JobError(f"{field}.servers", str(e)) from None
        if w.size < len(servers) * w.qps_per_peer:
            raise JobError(f"{field}.size", f"{w.size} B is smaller than servers x qps_per_peer "
                                            f"({len(servers) * w.qps_per_peer}); every queue pair needs a byte")
        return Job(name, w, field, workers + servers, roles=(workers, servers))
    if isinstance(w, PipelineWorkload):
        hosts = [h for stage in w.stages for h in stage]
        _known(plan, f"{field}.stages", hosts)
        return Job(name, w, field, hosts, [list(w.stages)])
    try:
        grid = training.place(w.tp, w.pp, w.dp, w.placement, hosts_by_leaf(plan), servers_in_order(plan))
    except ValueError as e:
        raise JobError(f"{field}.placement", str(e)) from None
    hosts = [h for rep in grid for stage in rep for h in stage]
    _known(plan, f"{field}.placement", hosts)
    return Job(name, w, field, hosts, grid)


def build_program(jobs: list[Job]) -> Program:
    """Every job's operations in one Program (compute times modelled)."""
    p = Program()
    for job in jobs:
        p.domains = job.domains  # Program.transfer picks scale-up, PXN or fabric by them
        w = job.workload
        if isinstance(w, (AllReduceWorkload, CollectiveWorkload)):
            collectives.collective_program(job.name, w.type, w.algorithm, job.hosts, w.size, w.iterations,
                                           w.qps_per_peer, p)
        elif isinstance(w, ParameterServerWorkload):
            parameter_server.job_program(job.name, w, *job.roles, p)
        else:
            training.training_program(job.name, w, job.grid, p)
    p.domains = None
    p.check()
    return p


def line_rate_s(p: Program, rate_bps: float, dilation: float) -> float:
    """Emulated time of the busiest host at line rate: its bytes each way plus its compute."""
    sent: dict[str, int] = {}
    received: dict[str, int] = {}
    compute: dict[str, float] = {}
    for o in p.ops:
        if o.kind == COMPUTE:
            compute[o.host] = compute.get(o.host, 0.0) + o.seconds
        else:
            side = sent if o.kind == "send" else received
            side[o.host] = side.get(o.host, 0) + o.nbytes
    return max(max(sent.get(h, 0), received.get(h, 0)) * 8 / rate_bps + compute.get(h, 0.0) * dilation
               for h in p.hosts)


def fabric_bytes(p: Program) -> int:
    """Bytes the program's receivers get over the fabric (what their NICs' QPs count): scale-up
    transfers, modelled inside servers, left out."""
    return sum(o.nbytes for o in p.ops if o.kind == "recv" and p.channels[o.channel].via == FABRIC)


def pairs(p: Program) -> list[tuple[str, str]]:
    """The (src, dst) of every channel the fabric carries (not scale-up), for load estimates."""
    return [(c.src, c.dst) for c in p.channels if c.via != SCALE_UP]


# --------------------------------------------------------------------------- results

def op_times(p: Program, by_host: dict[str, list]) -> Times:
    """Per op id, from each host's reported [start, end] list (in its ops' order)."""
    out: Times = [None] * len(p.ops)
    for h in p.hosts:
        reported = by_host.get(h) or []
        for o, t in zip(p.host_ops(h), reported):
            if t is not None and t[0] is not None and t[1] is not None:
                out[o.id] = (t[0], t[1])
    return out


def step_bounds(p: Program, times: Times, job: str) -> list[tuple[float, float]] | None:
    """(start, end) of each step of a job: its first send's or compute's start to its last op's
    end. A recv has no dependencies, so it "starts" when the host does, whatever its step: it
    would start every step at time 0."""
    steps: dict[int, list[float]] = {}
    for o in p.ops:
        if o.job != job:
            continue
        t = times[o.id]
        if t is None:
            return None  # the job did not finish
        start = t[1] if o.kind == RECV else t[0]  # a recv counts from its end: data arrived
        b = steps.setdefault(o.step, [start, t[1]])
        b[0], b[1] = min(b[0], start), max(b[1], t[1])
    return [(b[0], b[1]) for _, b in sorted(steps.items())]


def job_results(job: Job, p: Program, times: Times, dilation: float, host_gbps: float,
                leaf_of: dict[str, str]) -> dict:
    """summary.json's entry for one job (times in modelled and emulated seconds)."""
    w = job.workload
    out: dict = {"name": job.name, "type": w.type, "ranks": len(job.hosts), "hosts": job.hosts}
    sends = [(o, p.channels[o.channel]) for o in p.ops if o.job == job.name and o.kind == "send"]
    # a PXN relay's second hop carries a message already counted at its sender
    out["bytes_planned"] = sum(o.nbytes for o, c in sends if not c.relay)
    out["bytes_across_leaves_planned"] = sum(
        o.nbytes for o, c in sends if c.via != SCALE_UP and leaf_of[c.src] != leaf_of[c.dst])
    if job.domains is not None:
        via = p.sent_by_via(job.name)
        out["bytes_fabric_planned"], out["bytes_scale_up_planned"] = via["fabric"], via[SCALE_UP]
    bounds = step_bounds(p, times, job.name)
    if bounds is None:
        out["status"] = "incomplete"
        return out
    out["status"] = "ok"
    out["start"], out["end"] = bounds[0][0], bounds[-1][1]
    out["jct_s"] = bounds[-1][1] - bounds[0][0]
    out["jct_fabric_s"] = out["jct_s"] / dilation
    if isinstance(w, (AllReduceWorkload, CollectiveWorkload)):
        out.update(collectives.collective_results(w.type, w.algorithm, w.size, len(job.hosts), bounds,
                                                  dilation, host_gbps))
    elif isinstance(w, ParameterServerWorkload):
        out.update(parameter_server.ps_results(job.name, w, *job.roles, p, times, dilation))
    else:
        out.update(training.step_results(job.name, w, job.grid, p, times, bounds, dilation))
    return out


def placement_rows(job: Job, leaf_of: dict[str, str]) -> list[dict]:
    """One row per host of a grid job: its leaf and its (dp, pp, tp) coordinates."""
    rows = []
    for d, rep in enumerate(job.grid or []):
        for s, stage in enumerate(rep):
            for t, h in enumerate(stage):
                row = {"host": h, "leaf": leaf_of[h], "dp": d, "pp": s, "tp": t}
                if job.domains is not None:
                    row["server"] = job.domains.server(h) or ""
                rows.append(row)
    return sorted(rows, key=lambda r: (r["leaf"], r["host"]))
