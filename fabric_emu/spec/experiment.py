"""ExperimentSpec: a topology, its workload(s) and every setting of the run, checked together."""

from __future__ import annotations

from typing import Literal, Optional, Union

from pydantic import Field, field_validator, model_validator

from fabric_emu.spec.errors import problem_at
from fabric_emu.spec.events import BackgroundSpec, CaptureSpec, EventSpec
from fabric_emu.spec.fields import NAME_HELP, NAME_RE, Seconds, Strict
from fabric_emu.spec.lb import IMPLEMENTED_LB, DlbSpec, SpraySpec
from fabric_emu.spec.lossless import EcnSpec, PfcSpec, resolve_thresholds
from fabric_emu.spec.machines import MachineSpec
from fabric_emu.spec.pfcwd import PfcwdSpec
from fabric_emu.spec.routing import FailoverSpec, PathSpec
from fabric_emu.spec.topology import Topology, servers_of
from fabric_emu.spec.transport import DcqcnSpec, TransportSpec
from fabric_emu.spec.workloads import JobWorkload, Workload


class ExperimentSpec(Strict):
    """An experiment: a fabric, the workload(s) run on it, and how its switches and NICs behave."""

    name: str = Field(pattern=NAME_RE, description=f"the experiment's name, its results folder's: {NAME_HELP}")
    topology: Topology = Field(description="the fabric: a topology file's path (relative to this file) "
                                           "or a topology mapping")
    load_balancing: Literal["ecmp", "dlb", "spray"] = Field(
        default="ecmp", description="how leaves spread traffic over their uplinks: ecmp (per flow hash), "
                                    "spray (per packet) or dlb (flowlets); other kinds than leaf-spine: ecmp")
    workload: Optional[Workload] = Field(default=None, description="the one job (or give workloads)")
    workloads: list[JobWorkload] = Field(default_factory=list, max_length=16,
                                         description="several jobs at once (instead of workload)")
    background: list[BackgroundSpec] = Field(default_factory=list, max_length=32,
                                             description="lossy iperf3 traffic during the jobs")
    jobs_alone: bool = Field(default=True, description="with several jobs: first run each by itself, "
                             "so the summary shows how much they slowed each other")
    seed: int = Field(default=1, ge=0, le=2**32 - 1,
                      description="queue pair numbers, hence UDP source ports, hence ECMP paths")
    timeout: Optional[Seconds] = Field(
        default=None, gt=0, le=86400,
        description="wall-clock limit of the traffic phase (default: 30 s + 10x its time at line rate, "
                    "+ retransmission timeouts when packets can be lost: docs/experiments.md)")
    capture: Optional[CaptureSpec] = Field(default=None, description="pcap of switch ports into the results")
    ecn: EcnSpec = Field(default=EcnSpec(), description="RED/ECN marking of RoCE at switch egress")
    pfc: PfcSpec = Field(default=PfcSpec(), description="PFC on the lossless priority")
    pfcwd: PfcwdSpec = Field(default=PfcwdSpec(), description="the switches' PFC watchdog (SONiC pfcwd)")
    congestion_control: Literal["dcqcn", "none"] = Field(
        default="dcqcn", description="dcqcn, or none (CE marks are then only counted)")
    dcqcn: DcqcnSpec = Field(default=DcqcnSpec(), description="DCQCN's preset and parameter overrides")
    transport: TransportSpec = Field(default=TransportSpec(), description="RC acknowledgements and retransmission")
    spray: SpraySpec = Field(default=SpraySpec(), description="packet spraying (load_balancing: spray)")
    dlb: DlbSpec = Field(default=DlbSpec(), description="flowlet switching (load_balancing: dlb)")
    paths: list[PathSpec] = Field(default_factory=list, max_length=256,
                                  description="routes pinned for host pairs (their RoCE traffic takes exactly these switches)")
    failover: Union[FailoverSpec, Literal["global", "local"]] = Field(
        default=FailoverSpec(), description="global | local, or {mode, convergence}: how switches route around a failed link")
    events: list[EventSpec] = Field(default_factory=list, max_length=1000,
                                    description="changes during the run, at modelled times from the start of traffic")
    pxn: bool = Field(default=True, description="rail-optimized fabrics with servers: a transfer to a GPU on "
                                                "another rail of another server first crosses the sender's "
                                                "server to its GPU on that rail (NCCL's PXN); false: it "
                                                "crosses between rails in the fabric")
    machines: list[MachineSpec] = Field(
        default_factory=list, max_length=64,
        description="partition the fabric over these machines (the first is the head): none, or at least 2; "
                    "`fabric-emu show` prints the placement and the links that cross machines")
    datapath: Literal["auto", "kernel", "userspace"] = Field(
        default="auto", description="Open vSwitch's datapath for the switches: kernel (openvswitch.ko, "
                                    "forwarding in softirq), userspace (ovs-vswitchd's thread) or auto (the "
                                    "kernel's when the openvswitch module is loaded or loads, else userspace)")

    @field_validator("failover", mode="after")
    @classmethod
    def _failover_mapping(cls, v: FailoverSpec | str) -> FailoverSpec:
        return FailoverSpec(mode=v) if isinstance(v, str) else v  # `failover: local` is {mode: local}

    @field_validator("load_balancing")
    @classmethod
    def _lb_implemented(cls, v: str) -> str:
        # dlb and spray have their place in controller/core.py; until they exist, say so.
        if v not in IMPLEMENTED_LB:
            raise ValueError(f"'{v}' is not implemented yet (allowed: {', '.join(IMPLEMENTED_LB)})")
        return v

    @model_validator(mode="after")
    def _thresholds_fit(self):
        """Fill the buffer-dependent defaults; thresholds beyond the buffer, or a headroom that
        cannot keep PFC lossless, are errors (when the mechanism is on)."""
        from fabric_emu.cc.headroom import headroom_bytes

        t, buf = self.topology, self.topology.port_buffer
        e, p = self.ecn, self.pfc
        frame = t.mtu + 14
        gbps = t.fastest_link_gbps
        need = headroom_bytes(frame, gbps, p.cable_length)
        kmin, kmax, headroom, xoff, xon = resolve_thresholds(e, p, buf, need)
        if e.enabled:
            if kmin >= kmax:
                raise problem_at("ExperimentSpec", ("ecn", "kmin"), f"{kmin} B is not below kmax ({kmax} B)", kmin)
            if kmax > buf:
                raise problem_at("ExperimentSpec", ("ecn", "kmax"),
                                 f"{kmax} B is beyond topology.port_buffer ({buf} B)", kmax)
        if p.enabled:
            if headroom < need:
                raise problem_at("ExperimentSpec", ("pfc", "headroom"),
                                 f"{headroom} B cannot keep {gbps:g} Gb/s lossless: in flight after a pause"
                                 f" are up to {need} B (2 frames of {frame} B, {p.cable_length:g} m of"
                                 " cable both ways, the 802.3 response time); raise it or set pfc.enabled: false",
                                 headroom)
            if xoff <= 0:
                raise problem_at("ExperimentSpec", ("topology", "port_buffer"),
                                 f"{buf} B cannot hold PFC's headroom ({headroom} B) and an xoff above it;"
                                 " raise it or set pfc.enabled: false", buf)
            if xon >= xoff:
                raise problem_at("ExperimentSpec", ("pfc", "xon"), f"{xon} B is not below xoff ({xoff} B)", xon)
            if xoff + headroom > buf:
                raise problem_at("ExperimentSpec", ("pfc", "xoff"),
                                 f"xoff + headroom ({xoff} + {headroom} B) is beyond"
                                 f" topology.port_buffer ({buf} B)", xoff)
        return self.model_copy(update={
            "ecn": e.model_copy(update={"kmin": kmin, "kmax": kmax}),
            "pfc": p.model_copy(update={"headroom": headroom, "xoff": max(1, xoff), "xon": xon})})

    @model_validator(mode="after")
    def _machines_distinct(self):
        if len(self.machines) == 1:
            raise problem_at("ExperimentSpec", ("machines",),
                             "one machine is no partition: list at least 2, or none to run on this one", None)
        for field in ("name", "address"):
            seen = [getattr(m, field) for m in self.machines]
            for i, v in enumerate(seen):
                if seen.index(v) != i:
                    raise problem_at("ExperimentSpec", ("machines", i, field),
                                     f"{v!r} is also machine {seen.index(v)}'s {field}", v)
        return self

    @model_validator(mode="after")
    def _watchdog_needs_pfc(self):
        if self.pfcwd.enabled and not self.pfc.enabled:
            raise problem_at("ExperimentSpec", ("pfcwd", "enabled"),
                             "the watchdog watches lossless queues: it needs pfc.enabled: true", True)
        return self

    @model_validator(mode="after")
    def _lb_modes_fit_the_kind(self):
        """Spraying and DLB act on a leaf's uplinks to one spine tier (controller/core.py); other
        kinds route by ECMP at every tier."""
        if self.topology.kind == "leaf-spine":
            return self
        if self.load_balancing != "ecmp":
            raise problem_at("ExperimentSpec", ("load_balancing",),
                             f"{self.load_balancing} runs on leaf-spine fabrics only; this one is "
                             f"{self.topology.kind} (allowed: ecmp)", self.load_balancing)
        for i, e in enumerate(self.events):
            if e.load_balancing not in (None, "ecmp"):
                raise problem_at("ExperimentSpec", ("events", i, "load_balancing"),
                                 f"{e.load_balancing} runs on leaf-spine fabrics only; this one is "
                                 f"{self.topology.kind} (allowed: ecmp)", e.load_balancing)
        return self

    @model_validator(mode="after")
    def _links_exist(self):
        """Link events of a leaf-spine name one of its links (leafI-spineJ or spineJ-leafI); in
        other kinds the plan decides which switches are linked (fabric_emu.run.prepare checks)."""
        t = self.topology
        if t.kind != "leaf-spine":
            return self
        for i, e in enumerate(self.events):
            if e.link is None:
                continue
            a, b = sorted(e.link.split("-"))  # "leafI" sorts before "spineJ"
            ok = (a.startswith("leaf") and b.startswith("spine")
                  and int(a[4:]) <= t.leaves and int(b[5:]) <= t.spines)
            if not ok:
                raise problem_at("ExperimentSpec", ("events", i, "link"),
                                 f"{e.link} is not a link of this fabric (leaf1..leaf{t.leaves}"
                                 f" to spine1..spine{t.spines}, as leaf1-spine2)", e.link)
        return self

    @model_validator(mode="after")
    def _dlb_fits(self):
        """The flowlet stage tracks up to 16 uplinks per leaf (bpf/port.c DLB_MAX_UPLINKS)."""
        uses_dlb = self.load_balancing == "dlb" or any(e.load_balancing == "dlb" for e in self.events)
        if uses_dlb and self.topology.spines > 16:
            raise problem_at("ExperimentSpec", ("load_balancing",),
                             f"dlb handles up to 16 uplinks per leaf; this fabric has "
                             f"{self.topology.spines} spines (use ecmp or spray)", self.load_balancing)
        return self

    @model_validator(mode="after")
    def _allreduce_algorithm(self):
        """An all-reduce without an algorithm is hierarchical on a fabric of multi-GPU servers (as
        NCCL picks), else a ring; hierarchical needs servers."""
        servers = servers_of(self.topology) is not None
        fixed = []
        for i, w in enumerate(self.jobs):
            if w.type == "allreduce" and w.algorithm is None:
                w = w.model_copy(update={"algorithm": "hierarchical" if servers else "ring"})
            elif w.type == "allreduce" and w.algorithm == "hierarchical" and not servers:
                loc = ("workload",) if self.workload is not None else ("workloads", i)
                raise problem_at("ExperimentSpec", (*loc, "algorithm"),
                                 "hierarchical needs multi-GPU servers (topology.servers); allowed here: "
                                 "ring, halving-doubling", w.algorithm)
            fixed.append(w)
        if self.workload is not None:
            return self.model_copy(update={"workload": fixed[0]})
        return self.model_copy(update={"workloads": fixed})

    @property
    def jobs(self) -> list[Workload]:
        """The experiment's workloads: its one `workload`, or its `workloads`."""
        return [self.workload] if self.workload is not None else list(self.workloads)

    @model_validator(mode="after")
    def _one_kind_of_workload(self):
        if (self.workload is None) == (not self.workloads):
            raise problem_at("ExperimentSpec", ("workload",),
                             "give either workload (one job) or workloads (a list of jobs)", None)
        names = [w.name or f"job{i + 1}" for i, w in enumerate(self.workloads)]
        for i, n in enumerate(names):
            if names.index(n) != i:
                raise problem_at("ExperimentSpec", ("workloads", i, "name"),
                                 f"{n!r} names two jobs (each job needs its own name)", n)
        return self

    @model_validator(mode="after")
    def _chunks_not_empty(self):
        w = self.workload
        if w is None or w.type != "allreduce":
            return self
        n = self.topology.host_count if w.ranks == "all" else len(w.ranks)
        if w.size < n * w.qps_per_peer:
            raise ValueError(
                f"workload.size {w.size} B is smaller than ranks x qps_per_peer ({n * w.qps_per_peer});"
                " every queue pair needs at least one byte per step")
        return self
