"""Routing an experiment controls: paths pinned for host pairs, and how switches fail over when a
link goes down (controller/core.py carries them out)."""

from __future__ import annotations

from typing import Literal, Union

from pydantic import Field, field_validator

from fabric_emu.spec.fields import HostName, Seconds, Strict

SwitchName = str


class PathSpec(Strict):
    """Exactly this route for the RoCE traffic from one host to another (the other direction,
    ACKs included, keeps the fabric's routing)."""

    src: HostName = Field(description="the sending host")
    dst: HostName = Field(description="the receiving host")
    via: list[SwitchName] = Field(min_length=1, max_length=64,
                                  description="the switches in order, from src's switch to dst's; each next to the one before")

    @field_validator("via")
    @classmethod
    def _no_repeats(cls, v: list[str]) -> list[str]:
        seen = [s for i, s in enumerate(v) if s in v[:i]]
        if seen:
            raise ValueError(f"{seen[0]} appears twice (a pinned path visits a switch once)")
        return v


class FailoverSpec(Strict):
    """What switches do when one of their links goes down."""

    mode: Literal["global", "local"] = Field(
        default="global", description="global: the controller recomputes every switch's routes at once; "
        "local: each switch detours around its own failed link at once (OpenFlow fast-failover "
        "groups), the controller repairs the others after `convergence`")
    convergence: Union[Seconds, Literal["never"]] = Field(
        default=0.001, description="local: the modelled time after a link change at which the "
        "controller recomputes every switch (never: switches keep their detours)")

