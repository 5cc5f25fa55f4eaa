"""The switches' side of the lossless class: ECN marking and PFC, and their buffer-dependent
default thresholds."""

from __future__ import annotations

from typing import Optional

from pydantic import Field, model_validator

from fabric_emu.spec.errors import problem_at
from fabric_emu.spec.fields import Bytes, Rate, Seconds, Strict


class EcnSpec(Strict):
    """RED/ECN marking of the RoCE class at switch egress (DCQCN's congestion point).

    Defaults: the profile of HPCC's simulator config, "from Alibaba's production" for 25G links
    (docs/reference/deployed_parameters.md §4.3): kmin 100 KB, kmax 400 KB, pmax 20%; NVIDIA's
    Cumulus default is 150 KB/1.5 MB/100%. In a port buffer under 1 MB the defaults shrink with
    it (kmax 40% of the buffer, kmin a quarter of kmax); given values are taken as they are."""

    enabled: bool = Field(default=True, description="mark CE at switch egress (false: no marking)")
    kmin: Optional[Bytes] = Field(default=None, ge=0, description="no marks at or below this depth")
    kmax: Optional[Bytes] = Field(default=None, gt=0, description="every ECT packet marked above it")
    pmax: float = Field(default=0.2, gt=0, le=1, description="mark probability at kmax")


class NicReceiveSpec(Strict):
    """A slow receiver: every host NIC holds the lossless bytes that reach it until its host takes
    them at `drain` (PCIe, memory: a modelled rate below the link's); above xoff it pauses its
    leaf's port (PFC, refreshed), below xon it resumes it; what does not fit the buffer is lost."""

    drain: Rate = Field(gt=0, description="how fast the host takes received bytes from the NIC (modelled)")
    buffer: Bytes = Field(default=512_000, gt=0, description="the NIC's receive buffer")
    xoff: Bytes = Field(default=128_000, gt=0, description="bytes held above which the NIC pauses its leaf")
    xon: Bytes = Field(default=64_000, ge=0, description="bytes held below which it resumes it")

    @model_validator(mode="after")
    def _order(self):
        if not self.xon < self.xoff:
            raise problem_at("NicReceiveSpec", ("xon",), f"{self.xon} B is not below xoff ({self.xoff} B)", self.xon)
        if not self.xoff < self.buffer:
            raise problem_at("NicReceiveSpec", ("xoff",), f"{self.xoff} B is not below buffer ({self.buffer} B)",
                             self.xoff)
        return self


class PfcSpec(Strict):
    """PFC on the lossless priority (3), thresholds per switch ingress port.

    xoff/xon: bytes of priority 3 held in a switch that came in through one port; above xoff it
    pauses its upstream, below xon it resumes it. Defaults: xoff 100 KB (less in a buffer too
    small for it and the headroom), xon 20 KB below it, like the ~19 KB xon of SONiC's Mellanox
    profiles (deployed_parameters.md §4.4). headroom: bytes absorbed above xoff while the pause
    takes effect (default: the SONiC formula, fabric_emu/cc/headroom.py)."""

    enabled: bool = Field(default=True, description="pause the lossless priority (false: it drops, like any class)")
    xoff: Optional[Bytes] = Field(default=None, gt=0,
                                  description="bytes from one ingress port above which it pauses its upstream "
                                              "(default: 100 KB, less in a buffer too small for it and the headroom)")
    xon: Optional[Bytes] = Field(default=None, ge=0,
                                 description="bytes below which it resumes it (default: 20 KB below xoff)")
    headroom: Optional[Bytes] = Field(default=None, gt=0, description="default: the SONiC formula")
    cable_length: float = Field(default=100, ge=0, le=100_000,
                                description="metres, for the headroom formula (Cumulus' default)")
    quanta: int = Field(default=0xFFFF, ge=1, le=0xFFFF, description="pause time, 512-bit-time quanta")
    nic_stall_guard: Optional[Seconds] = Field(
        default=None, gt=0, le=60,
        description="the NICs' PFC stall prevention (mlx5 pfc-prevention-tout: 8 s by default, 100 ms in auto): "
                    "a NIC that has paused its leaf this long without draining stops pausing (modelled time; "
                    "default: off)")
    nic_receive: Optional[NicReceiveSpec] = Field(
        default=None, description="the NICs' receive buffers, drained at a rate below the link's: NICs that "
                                  "pause their leaf (default: none, a NIC takes whatever arrives)")


def resolve_thresholds(e: EcnSpec, p: PfcSpec, buf: int, need_headroom: int) -> tuple[int, int, int, int, int]:
    """(kmin, kmax, headroom, xoff, xon): the given values, or the defaults for this buffer."""
    kmax = e.kmax if e.kmax is not None else min(400_000, buf * 2 // 5)
    kmin = e.kmin if e.kmin is not None else min(100_000, kmax // 4)
    headroom = p.headroom if p.headroom is not None else need_headroom
    xoff = p.xoff if p.xoff is not None else min(100_000, (buf - headroom) // 2)
    xon = p.xon if p.xon is not None else max(0, xoff - min(20_000, xoff // 5))
    return kmin, kmax, headroom, xoff, xon
