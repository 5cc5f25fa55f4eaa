"""The NICs' transport: DCQCN rate control and RC reliability."""

from __future__ import annotations

from typing import Literal, Optional

from pydantic import Field

from fabric_emu.spec.fields import Bytes, Rate, Seconds, Strict


class DcqcnSpec(Strict):
    """DCQCN at every NIC: a preset (fabric_emu/cc/dcqcn.py: `mlx5`, NVIDIA ConnectX firmware
    defaults; `paper`, Zhu et al. 2015) and any of its parameters overridden. Times and rates are
    modelled (times run x dilation); rates in bits/s."""

    preset: Literal["mlx5", "paper"] = Field(
        default="mlx5", description="mlx5 (NVIDIA ConnectX firmware defaults) or paper (Zhu et al. 2015)")
    g: Optional[float] = Field(default=None, gt=0, le=1, description="alpha's gain (default: the preset's)")
    alpha_timer: Optional[Seconds] = Field(default=None, gt=0,
                                           description="K: alpha decays once per K without a CNP")
    rate_timer: Optional[Seconds] = Field(default=None, gt=0,
                                          description="T: one rate-increase stage per T without a CNP")
    byte_counter: Optional[Bytes] = Field(default=None, ge=0,
                                          description="B: one rate-increase stage per B bytes sent (0: off)")
    fast_recovery_stages: Optional[int] = Field(default=None, ge=0, le=100,
                                                description="F: fast-recovery stages before additive increase")
    rate_ai: Optional[Rate] = Field(default=None, gt=0, description="additive-increase step of the target rate")
    rate_hai: Optional[Rate] = Field(default=None, gt=0, description="hyper-increase step of the target rate")
    rate_min: Optional[Rate] = Field(default=None, gt=0, description="the lowest rate a cut leaves")
    min_dec_factor: Optional[float] = Field(default=None, gt=0, le=1,
                                            description="the largest cut of one event (0.5: halve at most)")
    rate_reduce_period: Optional[Seconds] = Field(default=None, ge=0,
                                                  description="the least time between two cuts (0: every CNP cuts)")
    initial_alpha: Optional[float] = Field(default=None, gt=0, le=1, description="alpha at the first CNP")
    min_time_between_cnps: Optional[Seconds] = Field(
        default=None, ge=0, description="the notification point's CNP pacing: the least time between two CNPs")
    cnp_pacing_per_port: Optional[bool] = Field(
        default=None, description="one CNP pacer for the whole NIC (true, mlx5) or one per QP (false, paper)")

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
    retransmit_timeout: Seconds = Field(default=4.194304e-3, gt=0, le=60,
                                        description="time without an acknowledgement before the QP "
                                                    "retransmits (default 4.096 us x 2^10)")
    retry_limit: int = Field(default=7, ge=1, le=7, description="timeouts in a row before the QP fails")
