"""AgentConfig: what the orchestrator writes for each host's NIC; EngineConfig groups them per engine.

Example (one per host; every host of a run gets the same ranks, workload and seed):

    {"host": "h1", "ip": "10.0.0.1", "rate_bps": 50000000.0, "roce_mtu": 4096,
     "ranks": [{"name": "h1", "ip": "10.0.0.1", "index": 0},
               {"name": "h2", "ip": "10.0.0.2", "index": 1}],
     "rank": 0,
     "workload": {"type": "allreduce", "size": 8000000, "iterations": 2, "qps_per_peer": 1},
     "seed": 1, "stats_path": "/tmp/run/agent-h1.json", "timeout_s": 120.0}

rate_bps is the emulated NIC line rate counted in Ethernet-frame bits (UDP payload + UDP, IPv4
and Ethernet headers, no FCS); roce_mtu is the data bytes per packet (the IB path MTU).

The workload is the ring all-reduce (type allreduce, the default when type is absent) or a set
of independent flows (type flows; an incast is flows from every sender to one receiver):

     "workload": {"type": "flows", "flows": [
        {"src": "h2", "dst": "h1", "size": 1000000, "qps": 1, "iterations": 1, "start_s": 0.0}]}

where start_s is emulated seconds after GO (the spec's modelled start times dilation). ranks
lists the hosts that run an agent: for flows, every host that sends or receives.
"""

from __future__ import annotations

from ipaddress import IPv4Address
from typing import Annotated, Literal, Optional, Self, Union

from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Discriminator,
    Field,
    Tag,
    ValidationError,
    model_validator,
)

IPv4 = Annotated[str, AfterValidator(lambda v: str(IPv4Address(v)))]  # sockets take strings


class ConfigError(ValueError):
    """A problem with one field of an agent config: 'field: what is wrong'."""


class _Frozen(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)


class _JsonFile(_Frozen):
    """A config written as a JSON file by the orchestrator and read by an engine."""

    def to_json(self) -> str:
        return self.model_dump_json(indent=1)

    @classmethod
    def from_json(cls, text: str) -> Self:
        """Parse and validate; the first problem becomes a one-line ConfigError."""
        try:
            return cls.model_validate_json(text, strict=False)
        except ValidationError as e:
            raise ConfigError(_first_error(e)) from None


class RankInfo(_Frozen):
    name: str
    ip: IPv4
    index: int = Field(ge=0)


class RingConfig(_Frozen):
    """The ring all-reduce: every rank runs the same schedule (fabric_emu.workloads.collectives)."""

    type: Literal["allreduce"] = "allreduce"
    size: int = Field(ge=0, description="bytes of the all-reduce buffer (S)")
    iterations: int = Field(ge=1)
    qps_per_peer: int = Field(ge=1)


WorkloadConfig = RingConfig  # the ring's config had this name before other workloads existed


class FlowConfig(_Frozen):
    """One flow: size bytes per iteration from src to dst, split evenly over qps queue pairs."""

    src: str
    dst: str
    size: int = Field(ge=1, description="bytes per iteration")
    qps: int = Field(default=1, ge=1)
    iterations: int = Field(default=1, ge=1)
    start_s: float = Field(default=0.0, ge=0, description="emulated seconds after GO")
    gap_s: float = Field(default=0.0, ge=0, description="emulated idle time after each acknowledged iteration")


class FlowsConfig(_Frozen):
    """Independent RDMA WRITE flows, the same list for every agent (incast is one of them)."""

    type: Literal["flows"]
    flows: tuple[FlowConfig, ...] = Field(min_length=1)


class ProgramChannel(_Frozen):
    src: str
    dst: str
    qps: int = Field(default=1, ge=1)
    via: Literal["fabric", "scale-up"] = "fabric"  # scale-up: modelled in the server, no packets


class ProgramOp(_Frozen):
    """One operation of this host (fabric_emu.workloads.program): send or recv a message on a channel, or
    compute for `seconds` (emulated); deps are indices into this host's ops."""

    kind: Literal["send", "recv", "compute"]
    channel: int = Field(default=-1, ge=-1)
    nbytes: int = Field(default=0, ge=0)
    seconds: float = Field(default=0.0, ge=0)
    deps: tuple[int, ...] = ()


class ProgramConfig(_Frozen):
    """A per-rank program: every channel of the run (each agent rebuilds the same QP table from
    them) and this host's operations."""

    type: Literal["program"]
    channels: tuple[ProgramChannel, ...] = Field(min_length=1)
    ops: tuple[ProgramOp, ...]

    @model_validator(mode="after")
    def _refs(self) -> "ProgramConfig":
        for i, o in enumerate(self.ops):
            if any(not 0 <= d < len(self.ops) or d == i for d in o.deps):
                raise ValueError(f"ops.{i}.deps: an index out of range (0..{len(self.ops) - 1}, not itself)")
            if o.kind != "compute" and not 0 <= o.channel < len(self.channels):
                raise ValueError(f"ops.{i}.channel: {o.channel} is not a channel")
        return self


def _workload_type(v: object) -> str:
    if isinstance(v, dict):
        return v.get("type", "allreduce")
    return getattr(v, "type", "allreduce")


AgentWorkload = Annotated[Union[Annotated[RingConfig, Tag("allreduce")],
                                Annotated[FlowsConfig, Tag("flows")],
                                Annotated[ProgramConfig, Tag("program")]],
                          Discriminator(_workload_type)]


class DcqcnConfig(_Frozen):
    """DCQCN at this NIC: the parameters of fabric_emu.cc.dcqcn.DcqcnParams (modelled units),
    the dilation its timers run at, and the NIC's modelled line rate."""

    params: dict[str, Union[float, int, bool]]
    dilation: float = Field(gt=0)
    line_rate_bps: float = Field(gt=0)


class TransportConfig(_Frozen):
    """RC reliability at this NIC, in EMULATED seconds (the spec's modelled times x dilation)."""

    ack_every: int = Field(default=16, ge=1, description="in-order packets per coalesced ACK")
    rto_s: float = Field(default=1.0, gt=0, description="retransmission timeout")
    retry_limit: int = Field(default=7, ge=1)


class ScaleUpConfig(_Frozen):
    """This host's server: its GPUs (hosts, in GPU order) and their scale-up domain, in EMULATED
    units (the plan's gbps per GPU and direction / dilation; latency x dilation)."""

    server: str
    hosts: tuple[str, ...] = Field(min_length=2)
    rate_bps: float = Field(gt=0, description="per GPU and direction, bits/s emulated")
    latency_s: float = Field(ge=0, description="a transfer's start-up latency, emulated")


class AgentConfig(_JsonFile):
    host: str
    ip: IPv4
    rate_bps: float = Field(gt=0)
    roce_mtu: Literal[256, 512, 1024, 2048, 4096]
    ranks: tuple[RankInfo, ...] = Field(min_length=2)
    rank: int = Field(ge=0)
    workload: AgentWorkload
    seed: int
    stats_path: str
    timeout_s: float = Field(gt=0)
    dcqcn: Optional[DcqcnConfig] = None  # None: no congestion control (CE marks are only counted)
    transport: TransportConfig = TransportConfig()
    netns: Optional[str] = None  # the host's namespace (/proc/<pid>/ns/net); None: this one
    ifname: str = "eth0"  # the host's NIC inside its namespace (its per-QP rate classes)
    link_mtu: int = Field(default=9000, ge=576, description="the link's IP MTU")
    # Packet spraying: UDP source ports each send QP rotates through per packet (a power of two;
    # 0: one port, no spraying); receivers then place packets by PSN (reordering is no loss).
    spray_entropies: int = Field(default=0, ge=0, le=64)
    scale_up: Optional[ScaleUpConfig] = None  # None: the host is no GPU of a multi-GPU server

    @model_validator(mode="after")
    def _ring_is_consistent(self) -> "AgentConfig":
        if [r.index for r in self.ranks] != list(range(len(self.ranks))):
            raise ValueError("ranks: index must be 0, 1, ... in list order")
        if len({r.name for r in self.ranks}) != len(self.ranks):
            raise ValueError("ranks: names must be unique")
        if self.rank >= len(self.ranks):
            raise ValueError(f"rank: got {self.rank} (0..{len(self.ranks) - 1})")
        me = self.ranks[self.rank]
        if (me.name, me.ip) != (self.host, self.ip):
            raise ValueError(f"rank: ranks.{self.rank} is {me.name}/{me.ip}, not this host {self.host}/{self.ip}")
        if isinstance(self.workload, ProgramConfig):
            names = {r.name for r in self.ranks}
            for i, c in enumerate(self.workload.channels):
                for end in ("src", "dst"):
                    if getattr(c, end) not in names:
                        raise ValueError(f"workload.channels.{i}.{end}: {getattr(c, end)} is not in ranks")
                if c.via != "fabric" and self.host in (c.src, c.dst):
                    server = self.scale_up.hosts if self.scale_up else ()
                    if c.src not in server or c.dst not in server:
                        raise ValueError(f"workload.channels.{i}.via: scale-up between {c.src} and {c.dst},"
                                         " which are not GPUs of one server")
        if isinstance(self.workload, FlowsConfig):
            names = {r.name for r in self.ranks}
            for i, f in enumerate(self.workload.flows):
                for end in ("src", "dst"):
                    if getattr(f, end) not in names:
                        raise ValueError(f"workload.flows.{i}.{end}: {getattr(f, end)} is not in ranks")
                if f.src == f.dst:
                    raise ValueError(f"workload.flows.{i}.dst: same host as src ({f.src})")
        return self



class EngineConfig(_JsonFile):
    """One NIC engine process: the hosts it serves (fabric_emu.nic.engine)."""

    engine: int = Field(ge=0)
    tick_s: float = Field(gt=0, description="longest sleep while packets wait for socket room")
    hosts: tuple[AgentConfig, ...] = Field(min_length=1)

    @model_validator(mode="after")
    def _servers_whole(self) -> "EngineConfig":
        """A scale-up domain is modelled in one process: both ends of every scale-up channel of
        a host here must be served here, with the same server."""
        here = {h.host: h.scale_up for h in self.hosts}
        for k, h in enumerate(self.hosts):
            if not isinstance(h.workload, ProgramConfig):
                continue
            for i, c in enumerate(h.workload.channels):
                if c.via == "fabric" or h.host not in (c.src, c.dst):
                    continue
                other = c.dst if c.src == h.host else c.src
                if other not in here:
                    raise ValueError(f"hosts.{k}.workload.channels.{i}: scale-up between {c.src} and {c.dst},"
                                     f" but {other} is served by another engine (a server's GPUs share one)")
                if here[other] != h.scale_up:
                    raise ValueError(f"hosts.{k}.scale_up: {h.host} and {other} disagree on their server")
        return self



def _first_error(e: ValidationError) -> str:
    err = e.errors(include_url=False)[0]
    where = ".".join(str(p) for p in err["loc"])
    msg = err["msg"].removeprefix("Value error, ")
    return f"{where}: {msg}" if where else msg
