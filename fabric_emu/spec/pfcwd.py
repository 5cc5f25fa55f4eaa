"""The PFC watchdog of the switches (SONiC's `pfcwd`): which action it takes on a stormed
lossless queue, and its three timers, in modelled time.

Two presets give the timers a value each is not given:
* classroom (the default): detection 400 us, restoration 800 us, poll 200 us: a storm is seen
  and contained within a run of a few milliseconds at the default dilations;
* sonic: SONiC's own, detection 200 ms, restoration 400 ms (the CLI's 2x detection), poll
  100 ms (orchagent's PFC_WD_POLL_MSECS), checked against orchagent's ranges
  (docs/reference/pfc_failure_modes.md §1.1): a fidelity run of seconds x dilation.
"""

from __future__ import annotations

from typing import Literal, Optional

from pydantic import Field, model_validator

from fabric_emu.spec.errors import problem_at
from fabric_emu.spec.fields import Seconds, Strict
from fabric_emu.spec.units import format_time

PRESETS: dict[str, dict[str, float]] = {
    "classroom": {"detection_time": 400e-6, "restoration_time": 800e-6, "poll_interval": 200e-6},
    "sonic": {"detection_time": 0.2, "restoration_time": 0.4, "poll_interval": 0.1},
}
# orchagent's and the pfcwd CLI's ranges, seconds (pfcwdorch.cpp, sonic-utilities pfcwd/main.py)
SONIC_RANGES: dict[str, tuple[float, float]] = {
    "detection_time": (0.1, 5.0), "restoration_time": (0.1, 60.0), "poll_interval": (0.1, 3.0)}


class PfcwdSpec(Strict):
    """The PFC watchdog on every switch port's lossless queue (SONiC pfcwd), in modelled time.

    A queue is stormed once it stayed paused for detection_time while pause frames kept
    arriving (checked every poll_interval); `drop` then ignores its pauses and drops its
    lossless packets both ways, `forward` ignores its pauses and sends on (the class lossy on
    that port), `alert` only reports. It is restored once no pause frame arrived for
    restoration_time (alert: at the first poll the storm rule no longer holds)."""

    enabled: bool = Field(default=False, description="run the watchdog on every switch port's lossless queue")
    preset: Literal["classroom", "sonic"] = Field(
        default="classroom", description="where unset timers come from: classroom (400 us / 800 us / 200 us) "
                                         "or sonic (200 ms / 400 ms / 100 ms, and SONiC's ranges enforced)")
    ports: Literal["all", "host-facing"] = Field(
        default="all", description="the switch ports watched: all (SONiC's start_default) or host-facing "
                                   "(the ToRs' server ports, as Guo et al. deployed it)")
    action: Literal["drop", "forward", "alert"] = Field(
        default="drop", description="on a storm: drop (SONiC's default), forward, or alert (report only)")
    detection_time: Optional[Seconds] = Field(default=None, gt=0, le=60,
                                              description="paused this long, with pauses arriving: a storm")
    restoration_time: Optional[Seconds] = Field(default=None, gt=0, le=600,
                                                description="no pause frame for this long: restored")
    poll_interval: Optional[Seconds] = Field(default=None, gt=0, le=60,
                                             description="how often each queue is checked")

    @model_validator(mode="before")
    @classmethod
    def _preset_fills(cls, data: object) -> object:
        """Timers not given take the preset's value; which were given is kept for errors."""
        if not isinstance(data, dict):
            return data
        preset = data.get("preset", "classroom")
        if preset not in PRESETS:
            return data  # the field's own check names what is allowed
        return {**data, **{k: v for k, v in PRESETS[preset].items() if data.get(k) is None}}

    @model_validator(mode="after")
    def _timers(self):
        given = {k: getattr(self, k) for k in PRESETS[self.preset]}  # filled in by _preset_fills
        if self.preset == "sonic":
            for k, (lo, hi) in SONIC_RANGES.items():
                if not lo <= given[k] <= hi:
                    raise problem_at("PfcwdSpec", (k,), f"{format_time(given[k])} is outside SONiC's range "
                                     f"{format_time(lo)}..{format_time(hi)} (preset: sonic)", given[k])
        det, res, poll = given["detection_time"], given["restoration_time"], given["poll_interval"]
        if poll > det:
            raise problem_at("PfcwdSpec", ("poll_interval",),
                             f"{format_time(poll)} is longer than detection_time ({format_time(det)})", given["poll_interval"])
        if res < det:
            raise problem_at("PfcwdSpec", ("restoration_time",),
                             f"{format_time(res)} is below detection_time ({format_time(det)})", given["restoration_time"])
        return self
