"""What happens around the workload: timed events, lossy background traffic, packet capture."""

from __future__ import annotations

from typing import Annotated, Literal, Optional

from pydantic import BeforeValidator, Field, field_validator, model_validator

from fabric_emu.spec.errors import problem_at
from fabric_emu.spec.fields import HostName, Seconds, Strict
from fabric_emu.spec.lb import IMPLEMENTED_LB
from fabric_emu.spec.topology import SWITCH_NAME, SWITCH_PORT_RE


class CaptureSpec(Strict):
    """Record RoCEv2 packets seen on switch ports into the results folder (pcap files)."""

    ports: list[Annotated[str, Field(pattern=SWITCH_PORT_RE)]] = Field(
        min_length=1, max_length=16, description="switch ports to record, as spine1-eth2 (1 to 16)")
    packets: int = Field(default=200, ge=1, le=100_000, description="packets recorded per port")
    snaplen: int = Field(default=0, ge=0, le=65535, description="bytes kept per packet; 0 = all")


def _on_off(v: object) -> object:
    """YAML 1.1 reads a bare on/off as true/false: take either spelling."""
    return {True: "on", False: "off"}.get(v, v) if isinstance(v, bool) else v


class EventSpec(Strict):
    """Something that happens during the run, at a modelled time from the start of traffic
    (x dilation on the wall clock): a change of load-balancing mode, or a fabric link going
    down or coming back (`link: leaf1-spine2`, `state: down|up`), or changing its rate
    (`gbps: 25`), or a host NIC starting or ending a PFC storm (`nic: h3`, `pfc_storm: on|off`:
    it stops draining and pauses its leaf with full quanta, refreshed, never resuming it), or the
    controller crashing (`controller: restart`: killed, and a new one started at once, which
    resynchronises from the switches' tables; `stop` and `start` leave a gap between)."""

    at: Seconds = Field(ge=0, le=3600, description="modelled time from the start of traffic")
    load_balancing: Optional[Literal["ecmp", "dlb", "spray"]] = Field(
        default=None, description="the load-balancing mode to change to (instead of link)")
    link: Optional[str] = Field(default=None, pattern=rf"^{SWITCH_NAME}-{SWITCH_NAME}$",
                                description="a link between two switches, as leaf1-spine2")
    state: Optional[Literal["up", "down"]] = Field(
        default=None, description="the link goes down (both ends) or comes back up (with link)")
    gbps: Optional[float] = Field(default=None, gt=0, le=1600, description="the link's new modelled rate")
    nic: Optional[HostName] = Field(default=None, description="a host whose NIC starts or ends a PFC storm")
    pfc_storm: Annotated[Optional[Literal["on", "off"]], BeforeValidator(_on_off)] = Field(
        default=None, description="on: the NIC stops draining and pauses its leaf for ever; off: it recovers")
    controller: Optional[Literal["restart", "stop", "start"]] = Field(
        default=None, description="the controller process is killed (stop), started again (start), or both (restart)")

    @field_validator("load_balancing")
    @classmethod
    def _lb_implemented(cls, v: Optional[str]) -> Optional[str]:
        if v is not None and v not in IMPLEMENTED_LB:
            raise ValueError(f"'{v}' is not implemented yet (allowed: {', '.join(IMPLEMENTED_LB)})")
        return v

    @model_validator(mode="after")
    def _one_thing(self):
        if (self.nic is None) != (self.pfc_storm is None):
            raise ValueError("a storm event takes nic and pfc_storm (on or off)")
        if sum(x is not None for x in (self.load_balancing, self.link, self.nic, self.controller)) != 1:
            raise ValueError("an event takes one of load_balancing, link (with state or gbps), nic (with pfc_storm), "
                             "controller (restart, stop or start)")
        if self.link is not None and (self.state is None) == (self.gbps is None):
            raise ValueError("a link event takes link and either state (up or down) or gbps")
        if self.link is None and (self.state is not None or self.gbps is not None):
            raise ValueError("state and gbps go with link")
        return self

    @property
    def kind(self) -> str:
        if self.nic is not None:
            return "pfc_storm"
        if self.controller is not None:
            return "controller"
        return "load_balancing" if self.load_balancing is not None else "link"


class BackgroundSpec(Strict):
    """Lossy background traffic (iperf3, default class) from src to dst during the jobs."""

    src: HostName = Field(description="the sending host")
    dst: HostName = Field(description="the receiving host")
    protocol: Literal["tcp", "udp"] = Field(default="tcp", description="iperf3 over tcp or udp")
    gbps: Optional[float] = Field(default=None, gt=0, le=1600,
                                  description="modelled rate (udp: required; tcp: a cap, default none)")
    start: Seconds = Field(default=0.0, ge=0, le=60, description="modelled time after the jobs start")
    duration: Optional[Seconds] = Field(default=None, gt=0, le=60,
                                        description="modelled time (default: until the jobs end)")

    @model_validator(mode="after")
    def _sane(self):
        if self.src == self.dst:
            raise problem_at("BackgroundSpec", ("dst",), f"is the same host as src ({self.src})", self.dst)
        if self.protocol == "udp" and self.gbps is None:
            raise problem_at("BackgroundSpec", ("gbps",), "udp needs a rate (modelled Gb/s)", None)
        return self
