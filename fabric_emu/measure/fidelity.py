"""Watch the machine during a run: if the CPU saturates, results are wrong, not slow.

Two views: the machine as a whole (every core busy), and every thread of the processes that
carry the traffic (ovs-vswitchd, whose main thread forwards every packet of the userspace
datapath's netdev ports; the controller; the PFC daemon; the NIC engines, which register with
watch() as they start). One saturated thread is a bottleneck however idle the other cores are.
OVS's forwarding thread counts as saturated only while its output batches also show it behind
(fabric_emu.measure.ovs_stats: its CPU time alone does not).

On OVS's kernel datapath no thread forwards: the kernel does, in softirq (fabric_emu.measure.
softirq). There the monitor samples every CPU's softirq share instead, and the kernel datapath's
lookup counters (`ovs-dpctl show`: lost upcalls are packets dropped before any switch counted
them); ovs-vswitchd is still watched, as any other process (its handlers take the upcalls).
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterator

from fabric_emu.kernel.ovs_datapath import dpctl_stats
from fabric_emu.measure import softirq
from fabric_emu.measure.ovs_stats import BEHIND_BATCH, BatchSampler
from fabric_emu.measure.sampling import Sampler
from fabric_emu.measure.thread_cpu import THREAD_SATURATED, ThreadWatch, busiest_per_label, ovs_vswitchd_pid

CPU_SATURATED = 0.95  # busy fraction of all cores above which a sample counts as saturated
SATURATED_SAMPLES = 0.2  # saturated in more samples than this: the run is not trusted
TOP_THREADS = 8  # labels listed in summary.json's cpu.threads (busiest first)
# A CPU this much in softirq in a sample is the kernel datapath's bottleneck. A first figure,
# to be checked against runs in a VM with the module (none on our CI kernel).
SOFTIRQ_SATURATED = 0.9


def _cpu_times() -> tuple[int, int]:
    """(busy, total) jiffies summed over all cores."""
    with open("/proc/stat") as f:
        parts = [int(x) for x in f.readline().split()[1:]]
    idle = parts[3] + parts[4]  # idle + iowait
    total = sum(parts[:8])  # guest time is already counted in user
    return total - idle, total


class CpuMonitor(Sampler):
    """Samples whole-machine CPU use, and every thread of the watched processes, while traffic
    runs. ovs-vswitchd is watched from the start; `processes` ({pid: label}) too; anything
    else that starts later registers with watch(pid, label)."""

    def __init__(self, interval_s: float = 0.5, processes: dict[int, str] | None = None,
                 ovs: bool = True, datapath: str = "userspace") -> None:
        self.interval_s = interval_s
        self.samples: list[float] = []
        self.threads = ThreadWatch()
        self._initial = dict(processes or {})
        self._ovs = ovs
        self._ovs_pid: int | None = None
        self._batches: BatchSampler | None = None
        self.ovs_batches: list[float] = []  # OVS main thread's avg output batch, per sample
        self.ovs_packets = self.ovs_upcalls = 0  # what its flow cache saw over the whole phase
        self.datapath = datapath
        self.softirq_max: list[float] = []  # kernel datapath: the busiest CPU's softirq share, per sample
        self._stat0: softirq.CpuTimes | None = None  # /proc/stat at the start and end of the phase
        self._stat1: softirq.CpuTimes | None = None
        self._dp0: dict | None = None  # the kernel datapath's lookup counters, the same
        self._dp1: dict | None = None
        self._seconds = 0.0

    def watch(self, pid: int, label: str) -> None:
        """Sample every thread of this process from now on (cheap: call it for each of 128
        processes if need be). Safe from any thread, before or during the phase."""
        self.threads.watch(pid, label)

    def ticks(self) -> Iterator[None]:
        kernel = self.datapath == "kernel"
        if self._ovs and (pid := ovs_vswitchd_pid()) is not None:
            self.watch(pid, "ovs-vswitchd")
            if not kernel:  # its main thread forwards only on the userspace datapath
                self._ovs_pid, self._batches = pid, BatchSampler(pid)
        for pid, label in self._initial.items():
            self.watch(pid, label)
        if kernel:
            self._dp0 = dpctl_stats()
            self._stat0 = stat = softirq.read_proc_stat()
            self._t0 = time.monotonic()
        busy0, total0 = _cpu_times()
        while True:
            yield
            busy1, total1 = _cpu_times()
            if total1 > total0:
                self.samples.append((busy1 - busy0) / (total1 - total0))
            busy0, total0 = busy1, total1
            self.threads.sample()
            self._sample_ovs_batches()
            if kernel:
                now = softirq.read_proc_stat()
                per_cpu = softirq.shares(stat, now)
                if per_cpu:
                    self.softirq_max.append(max(c.softirq for c in per_cpu.values()))
                stat = now

    def __exit__(self, *exc) -> None:
        super().__exit__(*exc)
        if self._stat0 is not None:  # the whole phase, for the kernel datapath's totals
            self._stat1, self._seconds = softirq.read_proc_stat(), time.monotonic() - self._t0
            self._dp1 = dpctl_stats()

    def kernel_datapath(self) -> dict | None:
        """What the kernel datapath cost over the phase: the busiest CPU's softirq share per
        sample (mean, max, and the fraction of samples at SOFTIRQ_SATURATED or above), softirq
        and system CPU seconds over all CPUs (also per second: cores' worth), and its lookups."""
        if self._stat0 is None or self._stat1 is None:
            return None
        secs = softirq.cpu_seconds(self._stat0, self._stat1)
        n = len(self.softirq_max)
        lookups = None
        if self._dp0 is not None and self._dp1 is not None:
            lookups = {k: self._dp1[k] - self._dp0[k] for k in ("hit", "missed", "lost")}
        return {
            "softirq_busiest_cpu_mean": round(sum(self.softirq_max) / n, 3) if n else None,
            "softirq_busiest_cpu_max": round(max(self.softirq_max), 3) if n else None,
            "softirq_saturated_fraction": round(sum(x >= SOFTIRQ_SATURATED for x in self.softirq_max) / n, 3)
                                          if n else None,
            "saturated_at": SOFTIRQ_SATURATED,
            "softirq_cpu_s": round(secs["softirq"], 3), "system_cpu_s": round(secs["system"], 3),
            "softirq_cores": round(secs["softirq"] / self._seconds, 3) if self._seconds > 0 else None,
            "system_cores": round(secs["system"] / self._seconds, 3) if self._seconds > 0 else None,
            "lookups": lookups,
        }

    def _sample_ovs_batches(self) -> None:
        """Mark OVS's forwarding (main) thread behind or not in the sample just taken."""
        if self._batches is None:
            return
        stats = self._batches.sample()
        if stats is None:  # no statistics: its CPU time alone decides
            return
        batch = stats["output_batch"] if stats["packets"] else 0.0
        self.ovs_batches.append(batch)
        self.ovs_packets += stats["packets"]
        self.ovs_upcalls += stats["upcalls"]
        self.threads.mark_behind(self._ovs_pid, self._ovs_pid, batch >= BEHIND_BATCH)

    def summary(self) -> dict:
        """Machine figures (cpu_busy_*, as before) and `threads`: each watched process's busiest
        thread, busiest first, and `saturated_threads`: every thread saturated in more than
        SATURATED_SAMPLES of the samples (what verdict() judges)."""
        rows = self.threads.rows()
        threads = {
            "cores": os.cpu_count(), "interval_s": self.interval_s, "samples": self.threads.samples,
            "datapath": self.datapath,
            **({"kernel_datapath": self.kernel_datapath()} if self.datapath == "kernel" else {}),
            "watched": sorted(set(self.threads.labels.values()) | {r["label"] for r in rows}),
            "ovs_output_batch": ({"mean": round(sum(self.ovs_batches) / len(self.ovs_batches), 2),
                                  "max": round(max(self.ovs_batches), 2), "behind_at": BEHIND_BATCH}
                                 if self.ovs_batches else None),
            # Flow-cache misses sent to the OpenFlow tables: each costs far more than a cached
            # packet (e.g. a select group hashing a field that varies per packet makes many).
            "ovs_datapath": ({"packets": self.ovs_packets, "upcalls": self.ovs_upcalls}
                             if self.ovs_batches else None),
            "threads": busiest_per_label(rows, TOP_THREADS),
            "saturated_threads": sorted((r for r in rows if r["saturated_fraction"] > SATURATED_SAMPLES),
                                        key=lambda r: -r["saturated_fraction"]),
        }
        if not self.samples:
            return {"cpu_busy_mean": None, "cpu_busy_max": None, "cpu_saturated_fraction": None, **threads}
        return {
            "cpu_busy_mean": round(sum(self.samples) / len(self.samples), 3),
            "cpu_busy_max": round(max(self.samples), 3),
            "cpu_saturated_fraction": round(
                sum(s >= CPU_SATURATED for s in self.samples) / len(self.samples), 3),
            **threads,
        }


LATE_WAKES = 0.05  # fraction of a NIC engine's wake-ups more than a tick late that it may have


def verdict(cpu: dict, late_fractions: list[float], unexplained_loss: int = 0) -> list[str]:
    """Reasons the run's numbers cannot be trusted (empty: nothing found)."""
    warnings = []
    # Every switch drop is counted where it happens (the port programs' drops return
    # TC_ACT_STOLEN, so OVS never discards the rest of a send batch): any other loss is the
    # emulator's own.
    if unexplained_loss:
        warnings.append(f"{unexplained_loss} packet(s) were lost where no switch counter saw them "
                        "(host or kernel buffers of the emulator): raise the dilation")
    sat = cpu.get("cpu_saturated_fraction")
    if sat is not None and sat > SATURATED_SAMPLES:
        warnings.append(f"CPU saturated in {sat:.0%} of samples: raise the dilation")
    warnings += kernel_datapath_warnings(cpu.get("kernel_datapath"))
    for t in cpu.get("saturated_threads") or []:
        behind = ", packets waiting at every poll" if "busy_saturated_fraction" in t else ""
        warnings.append(f"{t['label']} thread {t['thread']} (tid {t['tid']}) saturated in "
                        f"{t['saturated_fraction']:.0%} of samples (>= {THREAD_SATURATED:.0%} of one "
                        f"core{behind}): raise the dilation")
    # The kernel paces the NICs from socket buffers two ticks deep: an engine that woke more
    # than a tick late may have let them run dry, so the NICs, not the fabric, set the rate.
    late = [f for f in late_fractions if f > LATE_WAKES]
    if late:
        warnings.append(f"{len(late)} NIC engine(s) woke more than a tick late in up to "
                        f"{max(late):.0%} of their wake-ups: the NICs, not the fabric, may have "
                        "limited the rate")
    return warnings


def kernel_datapath_warnings(kd: dict | None) -> list[str]:
    """The kernel datapath's reasons not to trust a run: a CPU saturated with softirq work, and
    upcalls it lost (each a packet dropped where no switch counter sees it)."""
    if not kd:
        return []
    out = []
    sat = kd.get("softirq_saturated_fraction")
    if sat is not None and sat > SATURATED_SAMPLES:
        out.append(f"a CPU spent >= {kd['saturated_at']:.0%} of its time in softirq (the kernel "
                   f"datapath's forwarding) in {sat:.0%} of samples: raise the dilation")
    lost = (kd.get("lookups") or {}).get("lost")
    if lost:
        out.append(f"OVS's kernel datapath lost {lost} upcall(s) (ovs-dpctl show): packets dropped "
                   "before any switch counter; if every upcall is lost, ovs-vswitchd may have no "
                   "handler threads (restart it with the datapath present: scripts/setup.sh)")
    return out


def scale_up_note(agents: dict[str, dict]) -> str | None:
    """What a run did not emulate: transfers inside servers (scale-up, NVLink-class) are
    modelled by the NIC engines, so no switch, queue or NIC packet path saw their bytes."""
    su = [a["scale_up"] for a in agents.values() if a.get("scale_up")]
    transfers = sum(s.get("received", 0) for s in su)
    if not transfers:
        return None
    nbytes = sum(s.get("received_bytes", 0) for s in su)
    return (f"{transfers:,} scale-up transfer(s) inside servers ({nbytes:,} bytes) were modelled, not "
            "emulated: each took its bytes over the server's scale-up bandwidth (shared max-min fairly "
            "per GPU and direction) plus its latency, with no packets (docs/scale-up.md)")


def merge_machine_cpu(by_machine: dict[str, dict]) -> dict:
    """Each machine's CpuMonitor.summary() as one for the fidelity check (issue 19): the
    busiest machine's figures, and every machine's threads, each labelled with its machine, so
    a saturated thread anywhere is judged; `machines` keeps each machine's own summary."""
    if not by_machine:
        return {}
    busiest = max(by_machine.values(), key=lambda s: s.get("cpu_busy_mean") or 0.0)

    def labelled(key: str) -> list[dict]:
        rows = [{**t, "label": f"{m}: {t['label']}"} for m, s in by_machine.items() for t in s.get(key) or []]
        return sorted(rows, key=lambda t: -t.get("saturated_fraction", 0.0)) if key == "saturated_threads" else rows

    sat = [s["cpu_saturated_fraction"] for s in by_machine.values() if s.get("cpu_saturated_fraction") is not None]
    return {**busiest, "cpu_saturated_fraction": max(sat) if sat else None,
            "cpu_busy_max": max((s.get("cpu_busy_max") or 0.0 for s in by_machine.values()), default=None),
            "threads": labelled("threads"), "saturated_threads": labelled("saturated_threads"),
            "machines": by_machine}
