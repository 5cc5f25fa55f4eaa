"""Load-balancing modes and the parameters of spraying and DLB."""

from __future__ import annotations

from typing import Optional

from pydantic import Field, field_validator

from fabric_emu.spec.fields import Seconds, Strict

IMPLEMENTED_LB = ("ecmp", "spray", "dlb")


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
