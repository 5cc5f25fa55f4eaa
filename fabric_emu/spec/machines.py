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


SIGNAL_SPEED_M_S = 2e8  # in fibre or copper: 5 ns a metre


def underlay_delay_problem(one_way_s: float, dilation: float, cable_m: float) -> str | None:
    """A cut link's frames (data and pauses) also cross the underlay, whose delay the fabric
    does not model: divided by the dilation it must stay within the modelled cable's own
    propagation delay, which the PFC headroom is sized for (docs/lossless-ports.md)."""
    cable_s = max(cable_m, 1.0) / SIGNAL_SPEED_M_S  # a cable of 0 m still has its transceivers
    modelled_s = one_way_s / dilation
    if modelled_s <= cable_s:
        return None
    need = one_way_s / cable_s
    return (f"its one-way delay, {one_way_s * 1e6:.0f} us, is {modelled_s * 1e9:.0f} ns of modelled time at "
            f"dilation {dilation:g}, more than the modelled {cable_m:g} m cable's {cable_s * 1e9:.0f} ns: "
            f"use a dilation of at least {need:.0f}")


def clock_problem(offset_s: float, uncertainty_s: float, start_delay_s: float) -> str | None:
    """Every machine's NIC engines start at one wall-clock epoch: a clock that is off by more
    than a quarter of the delay before it (beyond what the measurement cannot tell) would start
    its engines late, or miss the start."""
    if abs(offset_s) - uncertainty_s <= start_delay_s / 4:
        return None
    return (f"its clock is {offset_s * 1e3:+.1f} ms off the head's (+-{uncertainty_s * 1e3:.1f} ms): "
            f"synchronise the clocks (chrony, NTP) to within {start_delay_s / 4 * 1e3:.0f} ms")


UNDERLAY_SHARE = 0.5  # of the measured underlay bandwidth the cut links may need at most


def underlay_bandwidth_problem(needed_bps: float, measured_bps: float, dilation: float) -> str | None:
    """The cut links between two machines carry up to their emulated rates (modelled / dilation)
    each way, which must fit in a share of what the underlay carried when measured (the rest is
    for bursts, VXLAN's headers and the control traffic)."""
    if needed_bps <= UNDERLAY_SHARE * measured_bps:
        return None
    need = dilation * needed_bps / (UNDERLAY_SHARE * measured_bps)
    return (f"its cut links carry up to {needed_bps / 1e6:.0f} Mb/s at dilation {dilation:g}, more than "
            f"{UNDERLAY_SHARE:.0%} of the {measured_bps / 1e6:.0f} Mb/s it carried when measured: "
            f"use a dilation of at least {need:.0f}")
