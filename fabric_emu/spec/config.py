"""Spec files: load YAML, apply --set overrides, validate into typed models.

Every problem becomes a SpecError that names the file, the dotted field and what is allowed,
so the CLI can print one line per problem and exit 2 before anything is created.
"""

from __future__ import annotations

import copy
import re
from pathlib import Path
from typing import Annotated, Any, Literal, Optional, Union

from pydantic import (
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Discriminator,
    Field,
    Tag,
    TypeAdapter,
    ValidationError,
    ValidationInfo,
    field_validator,
    model_validator,
)
from pydantic_core import InitErrorDetails, PydanticCustomError
from ruamel.yaml import YAML
from ruamel.yaml.error import YAMLError

from fabric_emu.spec import units

NAME_RE = r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$"
NAME_HELP = "1-64 characters: letters, digits, '_', '.', '-', starting with a letter or digit"


class SpecError(Exception):
    """One or more problems with a spec, each 'FILE: field: message'."""

    def __init__(self, problems: list[tuple[str, str, str]]):
        self.problems = problems
        super().__init__("\n".join(self.lines()))

    def lines(self) -> list[str]:
        return [f"{f}: {field}: {msg}" if field else f"{f}: {msg}" for f, field, msg in self.problems]


def _unit(parser, help_text):
    def convert(v: Any) -> Any:
        try:
            return parser(v)
        except ValueError:
            raise ValueError(f"got {v!r} ({help_text})") from None

    return BeforeValidator(convert)


Bytes = Annotated[int, _unit(units.parse_size, units.SIZE_HELP)]
Rate = Annotated[float, _unit(units.parse_rate_bps, units.RATE_HELP)]
Seconds = Annotated[float, _unit(units.parse_time_s, units.TIME_HELP)]


IMPLEMENTED_LB = ("ecmp", "spray", "dlb")


class Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=False, frozen=True)


class LinkSpec(Strict):
    gbps: float = Field(gt=0, le=1600, description="modelled link rate in Gb/s")


MAX_DILATION = 1_000_000


def _dilation(v: Any) -> Any:
    """A number from 1 to MAX_DILATION, or 'auto' (left for fabric_emu.measure.dilation to resolve)."""
    if v == "auto":
        return v
    allowed = f"a number from 1 to {MAX_DILATION:,}, or auto"
    if isinstance(v, bool):
        raise ValueError(f"got {v!r} ({allowed})")
    try:
        d = float(v)
    except (TypeError, ValueError):
        raise ValueError(f"got {v!r} ({allowed})") from None
    if not 1 <= d <= MAX_DILATION:  # also rejects nan
        raise ValueError(f"{v!r} is out of range ({allowed})")
    return d


Dilation = Annotated[Union[float, Literal["auto"]], BeforeValidator(_dilation)]


class TopologyBase(Strict):
    """What every kind of fabric has: links, dilation, MTU and port buffers."""

    name: str = Field(pattern=NAME_RE)
    host_link: LinkSpec = LinkSpec(gbps=100)
    fabric_link: LinkSpec = LinkSpec(gbps=100)
    dilation: Dilation = Field(
        default=2000.0, description="emulated = modelled / dilation; 'auto': the lowest that this "
        "machine's measured capacity carries with a margin (fabric_emu.measure.dilation)")
    mtu: int = Field(default=4200, ge=1280, le=9000, description="Ethernet MTU of every link")
    port_buffer: Bytes = Field(default=1_000_000, ge=10_000, le=1_000_000_000,
                               description="egress buffer per switch port, bytes")


TOPOLOGY_KINDS = ("leaf-spine", "fat-tree", "rail-optimized")
UNKNOWN_KIND = f"allowed: {', '.join(TOPOLOGY_KINDS)}"


class LeafSpineSpec(TopologyBase):
    """Two tiers: every leaf connects to every spine (the default kind)."""

    kind: Literal["leaf-spine"]
    spines: int = Field(ge=1, le=64)
    leaves: int = Field(ge=1, le=200)
    hosts_per_leaf: int = Field(ge=1, le=200)

    @field_validator("kind", mode="before")
    @classmethod
    def _known_kind(cls, v: Any) -> Any:
        # Unknown kinds are validated as leaf-spine (so every other problem is reported too);
        # say which kinds exist rather than only this one.
        if v not in TOPOLOGY_KINDS:
            raise ValueError(f"got {v!r} ({UNKNOWN_KIND})")
        return v

    @property
    def host_count(self) -> int:
        return self.leaves * self.hosts_per_leaf


class FatTreeSpec(TopologyBase):
    """A k-ary three-tier fat-tree (Al-Fares et al. 2008): (k/2)^2 core switches; k pods of k/2
    aggregation and k/2 edge switches; k/2 hosts per edge switch, k^3/4 hosts."""

    kind: Literal["fat-tree"]
    # At most 12: the port datapath maps up to 4095 link ends (k=12 has 2,592, k=14 4,116).
    k: int = Field(ge=4, le=12, description="switch radix: an even number from 4 to 12")

    @field_validator("k")
    @classmethod
    def _even(cls, v: int) -> int:
        if v % 2:
            raise ValueError(f"got {v}; k must be even (4, 6, 8, 10, 12)")
        return v

    @property
    def host_count(self) -> int:
        return self.k ** 3 // 4


class RailOptimizedSpec(TopologyBase):
    """Servers with several NICs, in groups: NIC n of every server of a group connects to the
    group's rail leaf n; every rail leaf connects to every spine."""

    kind: Literal["rail-optimized"]
    groups: int = Field(ge=1, le=16, description="server groups (each with its own rail leaves)")
    servers_per_group: int = Field(ge=1, le=64)
    nics_per_server: int = Field(ge=1, le=8, description="NICs per server = rail leaves per group")
    spines: int = Field(ge=1, le=64)

    @property
    def host_count(self) -> int:
        return self.groups * self.servers_per_group * self.nics_per_server


TopologySpec = LeafSpineSpec  # the default kind's model, under its first name


def _topology_kind(v: Any) -> str:
    """The model to validate a topology with; unknown or missing kinds go to leaf-spine, whose
    kind check names the allowed kinds."""
    kind = v.get("kind") if isinstance(v, dict) else getattr(v, "kind", None)
    return kind if kind in TOPOLOGY_KINDS else "leaf-spine"


Topology = Annotated[
    Union[Annotated[LeafSpineSpec, Tag("leaf-spine")], Annotated[FatTreeSpec, Tag("fat-tree")],
          Annotated[RailOptimizedSpec, Tag("rail-optimized")]],
    Discriminator(_topology_kind)]
_topology_adapter: TypeAdapter = TypeAdapter(Topology)


HostName = Annotated[str, Field(pattern=NAME_RE)]
JobName = Annotated[str, Field(pattern=NAME_RE)]


def _distinct_hosts(v: list[str], least: int = 2) -> list[str]:
    if len(v) < least:
        raise ValueError(f"needs at least {least} hosts ('all' or a list of host names)")
    twice = sorted({h for h in v if v.count(h) > 1})
    if twice:
        raise ValueError(f"lists {', '.join(twice)} more than once (each rank is a distinct host)")
    return v


class _Collective(Strict):
    """What every collective has: S bytes (nccl-tests' size), ranks, iterations, QPs per peer."""

    name: Optional[JobName] = Field(default=None, description="the job's name in results (workloads lists)")
    size: Bytes = Field(gt=0, le=100 * 10**9)
    iterations: int = Field(default=1, ge=1, le=1000)
    ranks: Union[Literal["all"], list[HostName]] = "all"
    qps_per_peer: int = Field(default=1, ge=1, le=64)

    @field_validator("ranks")
    @classmethod
    def _ranks_distinct(cls, v):
        return _distinct_hosts(v) if isinstance(v, list) else v


class AllReduceWorkload(_Collective):
    type: Literal["allreduce"]
    algorithm: Literal["ring", "halving-doubling"] = "ring"


class CollectiveWorkload(_Collective):
    """reducescatter, allgather (ring), alltoall (every pair at once), sendrecv (to the next rank)."""

    type: Literal["reducescatter", "allgather", "alltoall", "sendrecv"]

    @property
    def algorithm(self) -> str:
        return {"alltoall": "pairwise"}.get(self.type, "ring")


class _Passes(Strict):
    """Microbatched forward and backward passes (modelled compute times, run x dilation)."""

    name: Optional[JobName] = Field(default=None, description="the job's name in results (workloads lists)")
    microbatches: int = Field(default=8, ge=1, le=256)
    schedule: Literal["gpipe", "1f1b"] = "1f1b"
    forward: Seconds = Field(gt=0, le=10, description="compute per microbatch per stage, forward")
    backward: Optional[Seconds] = Field(default=None, gt=0, le=10, description="default: 2 x forward")
    activation_size: Bytes = Field(ge=0, le=10 * 10**9, description="bytes a stage sends the next, per microbatch")
    iterations: int = Field(default=1, ge=1, le=100, description="training steps")

    @property
    def backward_s(self) -> float:
        return self.backward if self.backward is not None else 2 * self.forward


class PipelineWorkload(_Passes):
    """Pipeline parallelism: stages of hosts in order; host j of a stage talks to host j of the next."""

    type: Literal["pipeline"]
    stages: list[Union[HostName, list[HostName]]] = Field(min_length=2, max_length=64)
    gradient_size: Optional[Bytes] = Field(default=None, ge=0, le=10 * 10**9,
                                           description="bytes sent back per microbatch (default: activation_size)")

    @field_validator("stages")
    @classmethod
    def _stages_even(cls, v):
        stages = [[s] if isinstance(s, str) else s for s in v]
        if any(len(s) != len(stages[0]) for s in stages):
            raise ValueError("every stage needs the same number of hosts")
        _distinct_hosts([h for s in stages for h in s])
        return stages


class TrainingWorkload(_Passes):
    """A 3D-parallel training step: tp x pp x dp ranks placed on the fabric."""

    type: Literal["training"]
    tp: int = Field(default=1, ge=1, le=64)
    pp: int = Field(default=1, ge=1, le=64)
    dp: int = Field(default=1, ge=1, le=256)
    placement: Union[Literal["topology-aware", "naive"], list[HostName]] = "topology-aware"
    tp_allreduce_size: Bytes = Field(default=0, ge=0, le=10 * 10**9,
                                     description="bytes of the TP all-reduce after each pass")
    dp_allreduce_size: Bytes = Field(default=0, ge=0, le=100 * 10**9,
                                     description="gradient bytes per rank all-reduced across replicas")

    @model_validator(mode="after")
    def _placement_fits(self):
        n = self.tp * self.pp * self.dp
        if n < 2:
            raise _problem_at("TrainingWorkload", ("dp",), "tp x pp x dp must be at least 2 ranks", self.dp)
        if isinstance(self.placement, list):
            if len(self.placement) != n:
                raise _problem_at("TrainingWorkload", ("placement",),
                                  f"lists {len(self.placement)} hosts; tp x pp x dp is {n}", self.placement)
            _distinct_hosts(self.placement)
        return self


def _problem_at(model: str, loc: tuple, msg: str, value: Any) -> ValidationError:
    """A validation error at a field below the model (senders.2), not at the model itself."""
    return ValidationError.from_exception_data(model, [InitErrorDetails(
        type=PydanticCustomError("value_error", msg),
        loc=loc, input=value)])


class IncastWorkload(Strict):
    """Every sender writes `size` bytes to one receiver, `iterations` times.

    Iterations run back to back per sender, with no barrier: a sender posts iteration i+1 as
    soon as its own iteration-i message has left its NIC.
    """

    type: Literal["incast"]
    receiver: HostName
    senders: Union[Literal["all"], list[HostName]] = Field(
        default="all", description="'all' (every host but the receiver) or a list of host names")
    size: Bytes = Field(gt=0, le=100 * 10**9, description="bytes per sender per iteration")
    iterations: int = Field(default=1, ge=1, le=1000)
    qps_per_sender: int = Field(default=1, ge=1, le=64)

    @field_validator("senders")
    @classmethod
    def _senders_distinct(cls, v):
        if isinstance(v, list):
            if not v:
                raise ValueError("is empty ('all' or a list of host names)")
            twice = sorted({h for h in v if v.count(h) > 1})
            if twice:
                raise ValueError(f"lists {', '.join(twice)} more than once (each sender is a distinct host)")
        return v

    @model_validator(mode="after")
    def _receiver_is_not_a_sender(self):
        if isinstance(self.senders, list) and self.receiver in self.senders:
            i = self.senders.index(self.receiver)
            raise _problem_at("IncastWorkload", ("senders", i),
                              f"{self.receiver} is the receiver; a host cannot send to itself", self.receiver)
        if self.size < self.qps_per_sender:
            raise _problem_at("IncastWorkload", ("size",),
                              f"{self.size} B is smaller than qps_per_sender ({self.qps_per_sender});"
                              " every queue pair needs at least one byte", self.size)
        return self


class FlowSpec(Strict):
    """One RDMA WRITE flow: `size` bytes from src to dst over `qps` queue pairs."""

    src: HostName
    dst: HostName
    size: Optional[Bytes] = Field(default=None, gt=0, le=100 * 10**9,
                                  description="bytes (default: the workload's size)")
    qps: int = Field(default=1, ge=1, le=64)
    start: Seconds = Field(default=0.0, ge=0, le=60,
                           description="modelled fabric time after the common start")
    iterations: int = Field(default=1, ge=1, le=10_000, description="times the flow sends `size`")
    gap: Seconds = Field(default=0.0, ge=0, le=60,
                         description="idle time between an iteration's acknowledgement and the next "
                                     "(0: the next is posted as soon as the last has left)")

    @field_validator("dst")
    @classmethod
    def _not_to_itself(cls, v, info: ValidationInfo):
        if v == info.data.get("src"):
            raise ValueError(f"is the same host as src ({v}); a flow goes between two hosts")
        return v


class FlowsWorkload(Strict):
    """Independent RDMA WRITE flows, each starting at its own time."""

    type: Literal["flows"]
    flows: list[FlowSpec] = Field(max_length=1024)
    size: Optional[Bytes] = Field(default=None, gt=0, le=100 * 10**9,
                                  description="bytes of every flow that does not give its own size")

    @field_validator("flows")
    @classmethod
    def _flows_not_empty(cls, v):
        if not v:
            raise ValueError("is empty (list at least one flow with src, dst and size)")
        return v

    @model_validator(mode="after")
    def _every_flow_has_a_size(self):
        for i, f in enumerate(self.flows):
            size = f.size if f.size is not None else self.size
            if size is None:
                raise _problem_at("FlowsWorkload", ("flows", i, "size"),
                                  "required field is missing (or set workload.size for every flow"
                                  " without its own)", None)
            if size < f.qps:
                raise _problem_at("FlowsWorkload", ("flows", i, "size"),
                                  f"{size} B is smaller than qps ({f.qps}); every queue pair needs"
                                  " at least one byte", size)
        return self


WORKLOAD_TYPES = ("allreduce", "incast", "flows", "reducescatter", "allgather", "alltoall", "sendrecv",
                  "pipeline", "training")
Workload = Annotated[Union[AllReduceWorkload, CollectiveWorkload, IncastWorkload, FlowsWorkload,
                           PipelineWorkload, TrainingWorkload], Field(discriminator="type")]
# Workloads that run as per-rank programs (fabric_emu.workloads.program); only these go in `workloads`.
JobWorkload = Annotated[Union[AllReduceWorkload, CollectiveWorkload, PipelineWorkload, TrainingWorkload],
                        Field(discriminator="type")]

# Switch names of every kind (fabric_emu.topo.plan): spineN, leafN; fat-tree coreN, aggN, edgeN;
# rail-optimized gGrailR (group G's leaf of rail R).
SWITCH_NAME = r"(?:(?:spine|leaf|core|agg|edge)[1-9][0-9]{0,3}|g[1-9][0-9]?rail[1-9])"
SWITCH_PORT_RE = rf"^{SWITCH_NAME}-eth[0-9]{{1,3}}$"


class CaptureSpec(Strict):
    """Record RoCEv2 packets seen on switch ports into the results folder (pcap files)."""

    ports: list[Annotated[str, Field(pattern=SWITCH_PORT_RE)]] = Field(min_length=1, max_length=16)
    packets: int = Field(default=200, ge=1, le=100_000, description="per port")
    snaplen: int = Field(default=0, ge=0, le=65535, description="bytes kept per packet; 0 = all")


class EcnSpec(Strict):
    """RED/ECN marking of the RoCE class at switch egress (DCQCN's congestion point).

    Defaults: the profile of HPCC's simulator config, "from Alibaba's production" for 25G links
    (docs/reference/deployed_parameters.md §4.3): kmin 100 KB, kmax 400 KB, pmax 20%; NVIDIA's
    Cumulus default is 150 KB/1.5 MB/100%. In a port buffer under 1 MB the defaults shrink with
    it (kmax 40% of the buffer, kmin a quarter of kmax); given values are taken as they are."""

    enabled: bool = True
    kmin: Optional[Bytes] = Field(default=None, ge=0, description="no marks at or below this depth")
    kmax: Optional[Bytes] = Field(default=None, gt=0, description="every ECT packet marked above it")
    pmax: float = Field(default=0.2, gt=0, le=1, description="mark probability at kmax")


class PfcSpec(Strict):
    """PFC on the lossless priority (3), thresholds per switch ingress port.

    xoff/xon: bytes of priority 3 held in a switch that came in through one port; above xoff it
    pauses its upstream, below xon it resumes it. Defaults: xoff 100 KB (less in a buffer too
    small for it and the headroom), xon 20 KB below it, like the ~19 KB xon of SONiC's Mellanox
    profiles (deployed_parameters.md §4.4). headroom: bytes absorbed above xoff while the pause
    takes effect (default: the SONiC formula, fabric_emu/cc/headroom.py)."""

    enabled: bool = True
    xoff: Optional[Bytes] = Field(default=None, gt=0)
    xon: Optional[Bytes] = Field(default=None, ge=0)
    headroom: Optional[Bytes] = Field(default=None, gt=0, description="default: the SONiC formula")
    cable_length: float = Field(default=100, ge=0, le=100_000,
                                description="metres, for the headroom formula (Cumulus' default)")
    quanta: int = Field(default=0xFFFF, ge=1, le=0xFFFF, description="pause time, 512-bit-time quanta")


class DcqcnSpec(Strict):
    """DCQCN at every NIC: a preset (fabric_emu/cc/dcqcn.py: `mlx5`, NVIDIA ConnectX firmware
    defaults; `paper`, Zhu et al. 2015) and any of its parameters overridden. Times and rates are
    modelled (times run x dilation); rates in bits/s."""

    preset: Literal["mlx5", "paper"] = "mlx5"
    g: Optional[float] = Field(default=None, gt=0, le=1)
    alpha_timer: Optional[Seconds] = Field(default=None, gt=0)
    rate_timer: Optional[Seconds] = Field(default=None, gt=0)
    byte_counter: Optional[Bytes] = Field(default=None, ge=0, description="0: off")
    fast_recovery_stages: Optional[int] = Field(default=None, ge=0, le=100)
    rate_ai: Optional[Rate] = Field(default=None, gt=0)
    rate_hai: Optional[Rate] = Field(default=None, gt=0)
    rate_min: Optional[Rate] = Field(default=None, gt=0)
    min_dec_factor: Optional[float] = Field(default=None, gt=0, le=1)
    rate_reduce_period: Optional[Seconds] = Field(default=None, ge=0)
    initial_alpha: Optional[float] = Field(default=None, gt=0, le=1)
    min_time_between_cnps: Optional[Seconds] = Field(default=None, ge=0)
    cnp_pacing_per_port: Optional[bool] = None

    def params(self) -> dict:
        """The preset's parameters with the overrides, as fabric_emu.cc.dcqcn.DcqcnParams fields."""
        from dataclasses import asdict

        from fabric_emu.cc.dcqcn import preset

        names = {"alpha_timer": "alpha_timer_s", "rate_timer": "rate_timer_s", "rate_ai": "rate_ai_bps",
                 "rate_hai": "rate_hai_bps", "rate_min": "rate_min_bps",
                 "rate_reduce_period": "rate_reduce_period_s",
                 "min_time_between_cnps": "min_time_between_cnps_s"}
        overrides = {names.get(k, k): v for k, v in self.model_dump(exclude={"preset"}).items() if v is not None}
        return asdict(preset(self.preset, **overrides))


class TransportSpec(Strict):
    """RC reliability at every NIC (modelled times; they run x dilation).

    ConnectX times out after 4.096 us x 2^timeout; applications often set timeout 14 (67 ms) and
    NCCL 20 (4.3 s). Dilated, those would stall a lossy run for minutes on every lost tail (a NAK
    is sent once per gap, so a retransmission lost again waits for the timer too). The default
    is 2^10 (4.2 ms): above a chain of PFC pauses (one pause at 100 Gb/s lasts 335 us), which can
    hold a packet in the fabric without losing it. Without PFC nothing holds a packet that long:
    lossy scenarios set 2^6 (262 us), still far above a round trip with full queues. The timer
    runs from when the NIC has sent everything it queued, as a NIC's runs from transmission.
    """

    ack_every: int = Field(default=16, ge=1, le=1024,
                           description="in-order packets per coalesced ACK (and every message's last)")
    retransmit_timeout: Seconds = Field(default=4.194304e-3, gt=0, le=60)
    retry_limit: int = Field(default=7, ge=1, le=7, description="timeouts in a row before the QP fails")


class DlbSpec(Strict):
    """Dynamic load balancing (load_balancing: dlb): flowlet switching on the leaves' uplinks
    (modelled times; they run x dilation)."""

    inactivity: Seconds = Field(default=50e-6, gt=0, le=1,
                                description="idle gap after which a flow may take another uplink")
    quality_window: Seconds = Field(default=20e-6, gt=0, le=1,
                                    description="how far back the uplinks' load is counted")


class SpraySpec(Strict):
    """Packet spraying (load_balancing: spray): how many UDP source ports each queue pair rotates
    through per packet (fabric_emu.lb.spray); the leaves send each one up its own uplink."""

    entropies: Optional[int] = Field(
        default=None, ge=1, le=64,
        description="a power of two (default: one per uplink, or 8 per uplink rounded up to a "
                    "power of two when the uplinks are not)")

    @field_validator("entropies")
    @classmethod
    def _power_of_two(cls, v: Optional[int]) -> Optional[int]:
        if v is not None and v & (v - 1):
            raise ValueError(f"must be a power of two (1, 2, 4 ... 64), got {v}")
        return v


def resolve_thresholds(e: EcnSpec, p: PfcSpec, buf: int, need_headroom: int) -> tuple[int, int, int, int, int]:
    """(kmin, kmax, headroom, xoff, xon): the given values, or the defaults for this buffer."""
    kmax = e.kmax if e.kmax is not None else min(400_000, buf * 2 // 5)
    kmin = e.kmin if e.kmin is not None else min(100_000, kmax // 4)
    headroom = p.headroom if p.headroom is not None else need_headroom
    xoff = p.xoff if p.xoff is not None else min(100_000, (buf - headroom) // 2)
    xon = p.xon if p.xon is not None else max(0, xoff - min(20_000, xoff // 5))
    return kmin, kmax, headroom, xoff, xon


class EventSpec(Strict):
    """Something that happens during the run, at a modelled time from the start of traffic
    (x dilation on the wall clock): a change of load-balancing mode, or a fabric link going
    down or coming back (`link: leaf1-spine2`, `state: down|up`), or changing its rate
    (`gbps: 25`)."""

    at: Seconds = Field(ge=0, le=3600, description="modelled time from the start of traffic")
    load_balancing: Optional[Literal["ecmp", "dlb", "spray"]] = None
    link: Optional[str] = Field(default=None, pattern=rf"^{SWITCH_NAME}-{SWITCH_NAME}$",
                                description="a link between two switches, as leaf1-spine2")
    state: Optional[Literal["up", "down"]] = None
    gbps: Optional[float] = Field(default=None, gt=0, le=1600, description="the link's new modelled rate")

    @field_validator("load_balancing")
    @classmethod
    def _lb_implemented(cls, v: Optional[str]) -> Optional[str]:
        if v is not None and v not in IMPLEMENTED_LB:
            raise ValueError(f"'{v}' is not implemented yet (allowed: {', '.join(IMPLEMENTED_LB)})")
        return v

    @model_validator(mode="after")
    def _one_thing(self):
        if (self.load_balancing is None) == (self.link is None):
            raise ValueError("an event takes either load_balancing or link (with state)")
        if self.link is not None and (self.state is None) == (self.gbps is None):
            raise ValueError("a link event takes link and either state (up or down) or gbps")
        if self.link is None and (self.state is not None or self.gbps is not None):
            raise ValueError("state and gbps go with link")
        return self

    @property
    def kind(self) -> str:
        return "load_balancing" if self.load_balancing is not None else "link"


class BackgroundSpec(Strict):
    """Lossy background traffic (iperf3, default class) from src to dst during the jobs."""

    src: HostName
    dst: HostName
    protocol: Literal["tcp", "udp"] = "tcp"
    gbps: Optional[float] = Field(default=None, gt=0, le=1600,
                                  description="modelled rate (udp: required; tcp: a cap, default none)")
    start: Seconds = Field(default=0.0, ge=0, le=60, description="modelled time after the jobs start")
    duration: Optional[Seconds] = Field(default=None, gt=0, le=60,
                                        description="modelled time (default: until the jobs end)")

    @model_validator(mode="after")
    def _sane(self):
        if self.src == self.dst:
            raise _problem_at("BackgroundSpec", ("dst",), f"is the same host as src ({self.src})", self.dst)
        if self.protocol == "udp" and self.gbps is None:
            raise _problem_at("BackgroundSpec", ("gbps",), "udp needs a rate (modelled Gb/s)", None)
        return self


class ExperimentSpec(Strict):
    name: str = Field(pattern=NAME_RE)
    topology: Topology
    load_balancing: Literal["ecmp", "dlb", "spray"] = "ecmp"
    workload: Optional[Workload] = None
    workloads: list[JobWorkload] = Field(default_factory=list, max_length=16,
                                         description="several jobs at once (instead of workload)")
    background: list[BackgroundSpec] = Field(default_factory=list, max_length=32)
    jobs_alone: bool = Field(default=True, description="with several jobs: first run each by itself, "
                             "so the summary shows how much they slowed each other")
    seed: int = Field(default=1, ge=0, le=2**32 - 1)
    timeout: Optional[Seconds] = Field(
        default=None, gt=0, le=86400,
        description="wall-clock limit of the traffic phase (default: 30 s + 10x its time at line rate)")
    capture: Optional[CaptureSpec] = None
    ecn: EcnSpec = EcnSpec()
    pfc: PfcSpec = PfcSpec()
    congestion_control: Literal["dcqcn", "none"] = "dcqcn"
    dcqcn: DcqcnSpec = DcqcnSpec()
    transport: TransportSpec = TransportSpec()
    spray: SpraySpec = SpraySpec()
    dlb: DlbSpec = DlbSpec()
    events: list[EventSpec] = Field(default_factory=list, max_length=1000)

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
        gbps = max(t.host_link.gbps, t.fabric_link.gbps)
        need = headroom_bytes(frame, gbps, p.cable_length)
        kmin, kmax, headroom, xoff, xon = resolve_thresholds(e, p, buf, need)
        if e.enabled:
            if kmin >= kmax:
                raise _problem_at("ExperimentSpec", ("ecn", "kmin"), f"{kmin} B is not below kmax ({kmax} B)", kmin)
            if kmax > buf:
                raise _problem_at("ExperimentSpec", ("ecn", "kmax"),
                                  f"{kmax} B is beyond topology.port_buffer ({buf} B)", kmax)
        if p.enabled:
            if headroom < need:
                raise _problem_at("ExperimentSpec", ("pfc", "headroom"),
                                  f"{headroom} B cannot keep {gbps:g} Gb/s lossless: in flight after a pause"
                                  f" are up to {need} B (2 frames of {frame} B, {p.cable_length:g} m of"
                                  " cable both ways, the 802.3 response time); raise it or set pfc.enabled: false",
                                  headroom)
            if xoff <= 0:
                raise _problem_at("ExperimentSpec", ("topology", "port_buffer"),
                                  f"{buf} B cannot hold PFC's headroom ({headroom} B) and an xoff above it;"
                                  " raise it or set pfc.enabled: false", buf)
            if xon >= xoff:
                raise _problem_at("ExperimentSpec", ("pfc", "xon"), f"{xon} B is not below xoff ({xoff} B)", xon)
            if xoff + headroom > buf:
                raise _problem_at("ExperimentSpec", ("pfc", "xoff"),
                                  f"xoff + headroom ({xoff} + {headroom} B) is beyond"
                                  f" topology.port_buffer ({buf} B)", xoff)
        return self.model_copy(update={
            "ecn": e.model_copy(update={"kmin": kmin, "kmax": kmax}),
            "pfc": p.model_copy(update={"headroom": headroom, "xoff": max(1, xoff), "xon": xon})})

    @model_validator(mode="after")
    def _lb_modes_fit_the_kind(self):
        """Spraying and DLB act on a leaf's uplinks to one spine tier (controller/core.py); other
        kinds route by ECMP at every tier."""
        if self.topology.kind == "leaf-spine":
            return self
        if self.load_balancing != "ecmp":
            raise _problem_at("ExperimentSpec", ("load_balancing",),
                              f"{self.load_balancing} runs on leaf-spine fabrics only; this one is "
                              f"{self.topology.kind} (allowed: ecmp)", self.load_balancing)
        for i, e in enumerate(self.events):
            if e.load_balancing not in (None, "ecmp"):
                raise _problem_at("ExperimentSpec", ("events", i, "load_balancing"),
                                  f"{e.load_balancing} runs on leaf-spine fabrics only; this one is "
                                  f"{self.topology.kind} (allowed: ecmp)", e.load_balancing)
        return self

    @model_validator(mode="after")
    def _links_exist(self):
        """Link events name a link of this topology (leafI-spineJ or spineJ-leafI)."""
        t = self.topology
        if t.kind != "leaf-spine":
            return self._links_exist_in_plan()
        for i, e in enumerate(self.events):
            if e.link is None:
                continue
            a, b = sorted(e.link.split("-"))  # "leafI" sorts before "spineJ"
            ok = (a.startswith("leaf") and b.startswith("spine")
                  and int(a[4:]) <= t.leaves and int(b[5:]) <= t.spines)
            if not ok:
                raise _problem_at("ExperimentSpec", ("events", i, "link"),
                                  f"{e.link} is not a link of this fabric (leaf1..leaf{t.leaves}"
                                  f" to spine1..spine{t.spines}, as leaf1-spine2)", e.link)
        return self

    def _links_exist_in_plan(self):
        """Link events name a link between two switches of the planned fabric."""
        from fabric_emu.topo.plan import build_plan  # the plan decides the names; it imports this module

        plan = build_plan(self.topology, dilation=1.0)
        links = {frozenset((ln.a, ln.b)) for ln in plan.links if ln.kind == "fabric"}
        for i, e in enumerate(self.events):
            if e.link is not None and frozenset(e.link.split("-")) not in links:
                raise _problem_at("ExperimentSpec", ("events", i, "link"),
                                  f"{e.link} is not a link between two switches of this fabric "
                                  f"(see fabric-emu show; as {plan.links[-1].a}-{plan.links[-1].b})", e.link)
        return self

    @model_validator(mode="after")
    def _dlb_fits(self):
        """The flowlet stage tracks up to 16 uplinks per leaf (bpf/port.c DLB_MAX_UPLINKS)."""
        uses_dlb = self.load_balancing == "dlb" or any(e.load_balancing == "dlb" for e in self.events)
        if uses_dlb and self.topology.spines > 16:
            raise _problem_at("ExperimentSpec", ("load_balancing",),
                              f"dlb handles up to 16 uplinks per leaf; this fabric has "
                              f"{self.topology.spines} spines (use ecmp or spray)", self.load_balancing)
        return self

    @property
    def jobs(self) -> list[Workload]:
        """The experiment's workloads: its one `workload`, or its `workloads`."""
        return [self.workload] if self.workload is not None else list(self.workloads)

    @model_validator(mode="after")
    def _one_kind_of_workload(self):
        if (self.workload is None) == (not self.workloads):
            raise _problem_at("ExperimentSpec", ("workload",),
                              "give either workload (one job) or workloads (a list of jobs)", None)
        names = [w.name or f"job{i + 1}" for i, w in enumerate(self.workloads)]
        for i, n in enumerate(names):
            if names.index(n) != i:
                raise _problem_at("ExperimentSpec", ("workloads", i, "name"),
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


# --------------------------------------------------------------------------- loading

_yaml = YAML(typ="safe", pure=True)
_yaml.allow_duplicate_keys = False


def read_yaml(path: Path) -> Any:
    try:
        text = path.read_text()
    except FileNotFoundError:
        raise SpecError([(str(path), "", "file not found")]) from None
    except OSError as e:
        raise SpecError([(str(path), "", f"cannot read ({e.strerror})")]) from None
    try:
        return _yaml.load(text)
    except YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f"line {mark.line + 1}" if mark is not None else ""
        problem = getattr(e, "problem", None) or str(e).splitlines()[0]
        raise SpecError([(str(path), where, f"invalid YAML: {problem}")]) from None


def _set_dotted(data: dict, dotted: str, raw: str, source: str) -> None:
    """Apply one --set override; the value is parsed as YAML (so 4 is an int, [a, b] a list)."""
    if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*", dotted):
        raise SpecError([(source, dotted, "not a dotted field path (like topology.spines)")])
    try:
        value = _yaml.load(raw) if raw.strip() else raw
    except YAMLError:
        value = raw
    node = data
    parts = dotted.split(".")
    for part in parts[:-1]:
        child = node.get(part)
        if child is None:
            child = node[part] = {}
        if not isinstance(child, dict):
            raise SpecError([(source, dotted, f"'{part}' is not a mapping, cannot set a field inside it")])
        node = child
    node[parts[-1]] = value


def _field_path(loc: tuple) -> str:
    # pydantic puts the discriminator tag in loc (workload.allreduce.size); users never wrote it.
    if len(loc) > 1 and loc[0] == "workload" and loc[1] in WORKLOAD_TYPES:
        loc = loc[:1] + loc[2:]
    if len(loc) > 1 and loc[0] == "topology" and loc[1] in TOPOLOGY_KINDS:
        loc = loc[:1] + loc[2:]
    elif loc and loc[0] in TOPOLOGY_KINDS:  # a topology file's own fields
        loc = loc[1:]
    parts = [str(p) for p in loc if not re.match(r"(list|literal|str|int)\[", str(p))]
    return ".".join(parts)


def _errors_to_problems(err: ValidationError, files: dict[str, str]) -> list[tuple[str, str, str]]:
    """Map pydantic errors to (file, field, message); 'files' maps a top-level key to its file."""
    problems = []
    errors = err.errors(include_url=False)
    # A topology of an unknown kind is checked as a leaf-spine: its missing fields are noise.
    def parent(path: str) -> str:  # "topology." of "topology.kind", "" of "kind"
        return path[:path.rfind(".") + 1]

    def bad_kind(e: dict) -> bool:
        return _field_path(e["loc"]).endswith("kind") and (UNKNOWN_KIND in e["msg"] or e["type"] == "missing")

    unknown_kind = {parent(_field_path(e["loc"])) for e in errors if bad_kind(e)}
    for e in errors:
        path = _field_path(e["loc"])
        if e["type"] == "missing" and parent(path) in unknown_kind and not bad_kind(e):
            continue
        top = path.split(".")[0] if path else ""
        file = files.get(top, files[""])
        if top in files and top != "" and path.startswith(top + "."):
            path = path[len(top) + 1:]
        msg = e["msg"]
        if e["type"] == "extra_forbidden":
            msg = "unknown key"
        elif e["type"] == "missing":
            msg = "required field is missing" + (f" ({UNKNOWN_KIND})" if bad_kind(e) else "")
        elif e["type"] == "literal_error":
            msg = f"got {e.get('input')!r}; {msg[0].lower()}{msg[1:]}"
        elif msg.startswith("Value error, "):
            msg = msg[len("Value error, "):]
        problems.append((file, path, msg))
    return problems


def load_topology(path: str | Path, overrides: list[str] | None = None) -> TopologyBase:
    path = Path(path)
    data = read_yaml(path)
    if not isinstance(data, dict):
        raise SpecError([(str(path), "", "expected a mapping of fields at the top level")])
    for item in overrides or []:
        key, _, raw = item.partition("=")
        _set_dotted(data, key, raw, "--set")
    try:
        return _topology_adapter.validate_python(data)
    except ValidationError as e:
        raise SpecError(_errors_to_problems(e, {"": str(path)})) from None


def load_experiment(path: str | Path, overrides: list[str] | None = None) -> ExperimentSpec:
    """Load an experiment; its topology may be a path (relative to the file) or a mapping."""
    path = Path(path)
    data = read_yaml(path)
    if not isinstance(data, dict):
        raise SpecError([(str(path), "", "expected a mapping of fields at the top level")])
    files = {"": str(path)}
    topo = data.get("topology")
    if isinstance(topo, str):
        topo_path = (path.parent / topo).resolve() if not Path(topo).is_absolute() else Path(topo)
        if not topo_path.is_file():
            raise SpecError([(str(path), "topology", f"file not found: {topo}")])
        topo_data = read_yaml(topo_path)
        if not isinstance(topo_data, dict):
            raise SpecError([(str(topo_path), "", "expected a mapping of fields at the top level")])
        data["topology"] = topo_data
        files["topology"] = str(topo_path)
    data = copy.deepcopy(data)
    for item in overrides or []:
        key, sep, raw = item.partition("=")
        if not sep:
            raise SpecError([("--set", item, "expected dotted.key=value")])
        _set_dotted(data, key, raw, "--set")
    try:
        spec = ExperimentSpec.model_validate(data)
    except ValidationError as e:
        raise SpecError(_errors_to_problems(e, files)) from None
    return spec


def resolved_dict(spec: BaseModel) -> dict:
    """The fully resolved spec (defaults filled in), as plain data for experiment.yaml."""
    return spec.model_dump(mode="json")
