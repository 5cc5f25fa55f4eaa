"""The machines a fabric is partitioned over (`machines:`, issue 19): names and underlay
addresses, checked before they reach ssh, a shell or the kernel."""

from __future__ import annotations

import ipaddress
import re

from pydantic import Field, field_validator

from fabric_emu.spec.fields import Strict

MACHINE_RE = r"^[a-z][a-z0-9-]{0,15}$"
# A DNS name: dot-separated labels of letters, digits and inner hyphens (RFC 1123).
_LABEL = r"[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?"
HOSTNAME_RE = re.compile(rf"^{_LABEL}(?:\.{_LABEL})*$")
# VXLAN over IPv4 adds an outer IPv4 (20), UDP (8) and VXLAN (8) header to the inner Ethernet
# frame (14 + the fabric's MTU): the underlay's IP MTU must hold all of it.
VXLAN_OVERHEAD = 14 + 20 + 8 + 8


def underlay_mtu_needed(fabric_mtu: int) -> int:
    """The smallest underlay MTU that carries a full fabric frame inside VXLAN unfragmented."""
    return fabric_mtu + VXLAN_OVERHEAD


def fits_underlay(fabric_mtu: int, underlay_mtu: int) -> bool:
    """Whether an underlay of this MTU carries the fabric's full frames: the tunnels never
    fragment (fabric_emu.kernel.vxlan), so a smaller one loses every full frame."""
    return underlay_mtu >= underlay_mtu_needed(fabric_mtu)


class MachineSpec(Strict):
    """One machine of a partitioned fabric: it runs its share of switches and hosts, their NIC
    engines, PFC daemon and counters. The first listed is the head (controller, orchestrator)."""

    name: str = Field(pattern=MACHINE_RE, description="the machine's name in placements and results: "
                                                      "1-16 of a-z, 0-9, '-', starting with a letter")
    address: str = Field(description="its underlay address (IPv4, IPv6 or a DNS name): ssh reaches it there "
                                     "and the cross-machine links' VXLAN tunnels end there")
    ssh_address: str | None = Field(default=None, description="where ssh reaches it, when that is not its "
                                                               "underlay address (a management network)")
    ssh_user: str = Field(default="root", pattern=r"^[a-z_][a-z0-9_-]{0,31}$",
                          description="the user ssh logs in as (it needs root's rights there)")

    @field_validator("address", "ssh_address")
    @classmethod
    def _address(cls, v: str | None) -> str | None:
        if v is None:
            return v
        try:
            return str(ipaddress.ip_address(v))
        except ValueError:
            pass
        if len(v) > 253 or not HOSTNAME_RE.match(v):
            raise ValueError(f"{v!r} is not an IPv4 or IPv6 address or a DNS name")
        return v
