"""The NICs' transport: DCQCN rate control and RC reliability."""

from __future__ import annotations

from typing import Literal, Optional

from pydantic import Field

from fabric_emu.spec.fields import Bytes, Rate, Seconds, Strict


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
