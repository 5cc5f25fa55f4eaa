"""AgentConfig: the JSON file the orchestrator writes for each host agent.

Example (one file per host, every agent of a run gets the same ranks, workload and seed):

    {"host": "h1", "ip": "10.0.0.1", "rate_bps": 50000000.0, "roce_mtu": 4096,
     "ranks": [{"name": "h1", "ip": "10.0.0.1", "index": 0},
               {"name": "h2", "ip": "10.0.0.2", "index": 1}],
     "rank": 0,
     "workload": {"size": 8000000, "iterations": 2, "qps_per_peer": 1},
     "seed": 1, "stats_path": "/tmp/run/agent-h1.json", "timeout_s": 120.0}

rate_bps is the emulated NIC line rate counted in Ethernet-frame bits (UDP payload + UDP, IPv4
and Ethernet headers, no FCS); roce_mtu is the data bytes per packet (the IB path MTU).
"""

from __future__ import annotations

from ipaddress import IPv4Address
from typing import Annotated, Literal

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, ValidationError, model_validator

IPv4 = Annotated[str, AfterValidator(lambda v: str(IPv4Address(v)))]  # sockets take strings


class ConfigError(ValueError):
    """A problem with one field of an agent config: 'field: what is wrong'."""


class _Frozen(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)


class RankInfo(_Frozen):
    name: str
    ip: IPv4
    index: int = Field(ge=0)


class WorkloadConfig(_Frozen):
    size: int = Field(ge=0, description="bytes of the all-reduce buffer (S)")
    iterations: int = Field(ge=1)
    qps_per_peer: int = Field(ge=1)


class AgentConfig(_Frozen):
    host: str
    ip: IPv4
    rate_bps: float = Field(gt=0)
    roce_mtu: Literal[256, 512, 1024, 2048, 4096]
    ranks: tuple[RankInfo, ...] = Field(min_length=2)
    rank: int = Field(ge=0)
    workload: WorkloadConfig
    seed: int
    stats_path: str
    timeout_s: float = Field(gt=0)

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
        return self

    def to_json(self) -> str:
        return self.model_dump_json(indent=1)

    @classmethod
    def from_json(cls, text: str) -> "AgentConfig":
        """Parse and validate; the first problem becomes a one-line ConfigError."""
        try:
            return cls.model_validate_json(text, strict=False)
        except ValidationError as e:
            err = e.errors(include_url=False)[0]
            where = ".".join(str(p) for p in err["loc"])
            msg = err["msg"].removeprefix("Value error, ")
            raise ConfigError(f"{where}: {msg}" if where else msg) from None
