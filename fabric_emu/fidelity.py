"""Watch the machine during a run: if the CPU saturates, results are wrong, not slow."""

from __future__ import annotations

from collections.abc import Iterator

from fabric_emu.sampling import Sampler

CPU_SATURATED = 0.95  # busy fraction of all cores above which a sample counts as saturated


def _cpu_times() -> tuple[int, int]:
    """(busy, total) jiffies summed over all cores."""
    with open("/proc/stat") as f:
        parts = [int(x) for x in f.readline().split()[1:]]
    idle = parts[3] + parts[4]  # idle + iowait
    total = sum(parts[:8])  # guest time is already counted in user
    return total - idle, total


class CpuMonitor(Sampler):
    """Samples whole-machine CPU use while traffic runs."""

    def __init__(self, interval_s: float = 0.5) -> None:
        self.interval_s = interval_s
        self.samples: list[float] = []

    def ticks(self) -> Iterator[None]:
        busy0, total0 = _cpu_times()
        while True:
            yield
            busy1, total1 = _cpu_times()
            if total1 > total0:
                self.samples.append((busy1 - busy0) / (total1 - total0))
            busy0, total0 = busy1, total1

    def summary(self) -> dict:
        if not self.samples:
            return {"cpu_busy_mean": None, "cpu_busy_max": None, "cpu_saturated_fraction": None}
        return {
            "cpu_busy_mean": round(sum(self.samples) / len(self.samples), 3),
            "cpu_busy_max": round(max(self.samples), 3),
            "cpu_saturated_fraction": round(
                sum(s >= CPU_SATURATED for s in self.samples) / len(self.samples), 3),
        }


# Under tail drop OVS loses a few packets uncounted: when a full egress queue refuses the first
# packet of a send batch, netdev-linux discards the rest of the batch. Up to this fraction of
# the counted drops is that effect; more points at the emulator itself.
BATCH_LOSS_FRACTION = 0.02


def loss_note(unexplained_loss: int, counted_drops: int) -> str | None:
    """A note when uncounted loss is within what OVS's batch discard explains."""
    if unexplained_loss and counted_drops and unexplained_loss <= BATCH_LOSS_FRACTION * counted_drops + 2:
        return (f"{unexplained_loss} packet(s) lost beyond the {counted_drops} counted drops: "
                "when a full egress queue refuses the first packet of a batch, OVS's userspace "
                "datapath discards the rest of the batch uncounted")
    return None


def verdict(cpu: dict, pacing_ratios: list[float], unexplained_loss: int = 0,
            counted_drops: int = 0) -> list[str]:
    """Reasons the run's numbers cannot be trusted (empty: nothing found)."""
    warnings = []
    if unexplained_loss and loss_note(unexplained_loss, counted_drops) is None:
        warnings.append(f"{unexplained_loss} packet(s) were lost where no switch counter saw them "
                        "(host or kernel buffers of the emulator): raise the dilation")
    sat = cpu.get("cpu_saturated_fraction")
    if sat is not None and sat > 0.2:
        warnings.append(f"CPU saturated in {sat:.0%} of samples: raise the dilation")
    slow = [r for r in pacing_ratios if r < 0.9]
    if slow:
        warnings.append(f"{len(slow)} host agent(s) sent below 90% of their paced rate "
                        f"(worst {min(slow):.2f}): the agents, not the fabric, limited the rate")
    return warnings
