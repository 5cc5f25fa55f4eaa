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

import ipaddress
import json
from dataclasses import asdict, dataclass
from typing import Any

IB_MTUS = (256, 512, 1024, 2048, 4096)


class ConfigError(ValueError):
    """A problem with one field of an agent config: 'field: what is wrong'."""


@dataclass(frozen=True)
class RankInfo:
    name: str
    ip: str
    index: int


@dataclass(frozen=True)
class WorkloadConfig:
    size: int  # bytes of the all-reduce buffer (S)
    iterations: int
    qps_per_peer: int


@dataclass(frozen=True)
class AgentConfig:
    host: str
    ip: str
    rate_bps: float
    roce_mtu: int
    ranks: tuple[RankInfo, ...]
    rank: int
    workload: WorkloadConfig
    seed: int
    stats_path: str
    timeout_s: float

    def to_json(self) -> str:
        return json.dumps(asdict(self), indent=1)

    @classmethod
    def from_json(cls, text: str) -> "AgentConfig":
        try:
            data = json.loads(text)
        except json.JSONDecodeError as e:
            raise ConfigError(f"not JSON: {e}") from None
        return cls.from_dict(data)

    @classmethod
    def from_dict(cls, data: Any) -> "AgentConfig":
        d = _fields(data, "", cls.__dataclass_fields__)
        ranks = _list(d["ranks"], "ranks")
        cfg = cls(
            host=_typed(d["host"], str, "host"),
            ip=_ip(d["ip"], "ip"),
            rate_bps=_positive(_typed(d["rate_bps"], (int, float), "rate_bps"), "rate_bps"),
            roce_mtu=_typed(d["roce_mtu"], int, "roce_mtu"),
            ranks=tuple(_rank(r, f"ranks.{i}") for i, r in enumerate(ranks)),
            rank=_typed(d["rank"], int, "rank"),
            workload=_workload(d["workload"]),
            seed=_typed(d["seed"], int, "seed"),
            stats_path=_typed(d["stats_path"], str, "stats_path"),
            timeout_s=_positive(_typed(d["timeout_s"], (int, float), "timeout_s"), "timeout_s"),
        )
        cfg._check()
        return cfg

    def _check(self) -> None:
        if self.roce_mtu not in IB_MTUS:
            raise ConfigError(f"roce_mtu: got {self.roce_mtu} (one of {IB_MTUS})")
        if len(self.ranks) < 2:
            raise ConfigError("ranks: a ring needs at least 2 ranks")
        if [r.index for r in self.ranks] != list(range(len(self.ranks))):
            raise ConfigError("ranks: index must be 0, 1, ... in list order")
        if len({r.name for r in self.ranks}) != len(self.ranks):
            raise ConfigError("ranks: names must be unique")
        if not 0 <= self.rank < len(self.ranks):
            raise ConfigError(f"rank: got {self.rank} (0..{len(self.ranks) - 1})")
        me = self.ranks[self.rank]
        if (me.name, me.ip) != (self.host, self.ip):
            raise ConfigError(f"rank: ranks.{self.rank} is {me.name}/{me.ip}, "
                              f"not this host {self.host}/{self.ip}")


def _fields(data: Any, where: str, fields: dict) -> dict:
    if not isinstance(data, dict):
        raise ConfigError(f"{where or 'config'}: expected an object")
    prefix = f"{where}." if where else ""
    for key in data:
        if key not in fields:
            raise ConfigError(f"{prefix}{key}: unknown key (allowed: {', '.join(fields)})")
    for key in fields:
        if key not in data:
            raise ConfigError(f"{prefix}{key}: missing")
    return data


def _typed(value: Any, types: type | tuple[type, ...], where: str) -> Any:
    if isinstance(value, bool) or not isinstance(value, types):
        options = (types,) if isinstance(types, type) else types
        names = " or ".join(t.__name__ for t in options)
        raise ConfigError(f"{where}: got {value!r} (expected {names})")
    return value


def _positive(value: float, where: str) -> float:
    if value <= 0:
        raise ConfigError(f"{where}: got {value} (must be > 0)")
    return float(value)


def _ip(value: Any, where: str) -> str:
    try:
        return str(ipaddress.IPv4Address(_typed(value, str, where)))
    except ipaddress.AddressValueError:
        raise ConfigError(f"{where}: got {value!r} (an IPv4 address)") from None


def _list(value: Any, where: str) -> list:
    if not isinstance(value, list):
        raise ConfigError(f"{where}: expected a list")
    return value


def _rank(data: Any, where: str) -> RankInfo:
    d = _fields(data, where, RankInfo.__dataclass_fields__)
    return RankInfo(name=_typed(d["name"], str, f"{where}.name"), ip=_ip(d["ip"], f"{where}.ip"),
                    index=_typed(d["index"], int, f"{where}.index"))


def _workload(data: Any) -> WorkloadConfig:
    d = _fields(data, "workload", WorkloadConfig.__dataclass_fields__)
    w = WorkloadConfig(size=_typed(d["size"], int, "workload.size"),
                       iterations=_typed(d["iterations"], int, "workload.iterations"),
                       qps_per_peer=_typed(d["qps_per_peer"], int, "workload.qps_per_peer"))
    if w.size < 0 or w.iterations < 1 or w.qps_per_peer < 1:
        raise ConfigError("workload: size >= 0, iterations >= 1 and qps_per_peer >= 1 required")
    return w
