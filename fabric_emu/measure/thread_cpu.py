"""CPU use per thread, from /proc: a single saturated thread (OVS's forwarding thread, a NIC
engine) limits a run even while the machine as a whole looks half idle.

A thread's busy fraction over an interval is the CPU time it got (utime + stime of
/proc/<pid>/task/<tid>/stat, in clock ticks) over the interval's length: 1.0 is one whole core.
Reading is cheap (one directory listing and one small file per thread), so a monitor can watch
every NIC engine, the controller and ovs-vswitchd twice a second.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

CLK_TCK = os.sysconf("SC_CLK_TCK")
THREAD_SATURATED = 0.95  # busy fraction of one core at or above which a thread is saturated
OVS_PIDFILES = ("/var/run/openvswitch/ovs-vswitchd.pid", "/run/openvswitch/ovs-vswitchd.pid")

Snapshot = dict[int, tuple[str, int]]  # tid -> (thread name, utime + stime in clock ticks)


def parse_task_stat(text: str) -> tuple[str, int]:
    """(thread name, utime + stime ticks) from one /proc/<pid>/task/<tid>/stat line."""
    # The name sits in parentheses and may itself hold spaces and ')': split at the last one.
    head, _, rest = text.rpartition(")")
    name = head.partition("(")[2]
    fields = rest.split()  # fields[0] is the state (field 3 of proc(5)): utime is 14, stime 15
    return name, int(fields[11]) + int(fields[12])


def read_threads(pid: int) -> Snapshot | None:
    """Every thread of a process now; None once the process is gone."""
    base = f"/proc/{pid}/task"
    try:
        tids = os.listdir(base)
    except OSError:
        return None
    out: Snapshot = {}
    for tid in tids:
        try:
            fd = os.open(f"{base}/{tid}/stat", os.O_RDONLY)
        except OSError:
            continue  # the thread exited between the listing and now
        try:
            text = os.read(fd, 1024).decode(errors="replace")
        finally:
            os.close(fd)
        if text:
            out[int(tid)] = parse_task_stat(text)
    return out


def children_of(pid: int) -> list[int]:
    """The processes whose parent is `pid` now (the PFC daemon's responder, say)."""
    out = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            text = open(f"/proc/{entry}/stat").read()
        except OSError:
            continue  # gone meanwhile
        if int(text.rpartition(")")[2].split()[1]) == pid:  # field 4 of proc(5), after the state
            out.append(int(entry))
    return out


def pfc_processes(daemon_pid: int | None) -> dict[int, str]:
    """A PFC daemon and its responder (its child), by pid, labelled for the CPU monitor."""
    if daemon_pid is None:
        return {}
    return {daemon_pid: "pfc-daemon", **dict.fromkeys(children_of(daemon_pid), "pfc-responder")}


def ovs_vswitchd_pid(pidfiles: tuple[str, ...] = OVS_PIDFILES) -> int | None:
    """The running ovs-vswitchd's pid from its pidfile (None if none runs)."""
    for path in pidfiles:
        try:
            pid = int(open(path).read().strip())
        except (OSError, ValueError):
            continue
        try:
            if open(f"/proc/{pid}/comm").read().strip() == "ovs-vswitchd":
                return pid
        except OSError:
            continue  # a stale pidfile
    return None


def busy_fractions(before: Snapshot, after: Snapshot, seconds: float, tick_hz: int = CLK_TCK) -> dict[int, float]:
    """Busy fraction of one core per thread between two snapshots `seconds` apart. A thread
    born in between counts from zero; one that ended is left out."""
    if seconds <= 0:
        return {}
    out = {}
    for tid, (_, ticks) in after.items():
        prev = before.get(tid, (None, 0))[1]
        out[tid] = min(1.0, max(0, ticks - prev) / tick_hz / seconds)
    return out


@dataclass
class ThreadSeries:
    """One thread's busy fractions, sample by sample, while it lived."""

    label: str
    pid: int
    tid: int
    name: str
    busy: list[float] = field(default_factory=list)
    # For a thread whose CPU time alone does not show it is behind (OVS's forwarding thread):
    # per sample, whether other evidence says it was (then saturated = busy AND behind).
    behind: list[bool] | None = None

    def saturated(self, threshold: float = THREAD_SATURATED) -> int:
        """Samples in which it was saturated."""
        if self.behind is None:
            return sum(b >= threshold for b in self.busy)
        return sum(b >= threshold and k for b, k in zip(self.busy, self.behind))


def thread_rows(series: list[ThreadSeries], samples: int, saturated: float = THREAD_SATURATED) -> list[dict]:
    """Per thread: mean and max busy fraction while it lived, and the fraction of all `samples`
    of the phase in which it was saturated (a thread that lived briefly counts for little)."""
    rows = []
    for s in series:
        if not s.busy:
            continue
        n = max(samples, len(s.busy))
        row = {
            "label": s.label, "pid": s.pid, "tid": s.tid, "thread": s.name,
            "busy_mean": round(sum(s.busy) / len(s.busy), 3), "busy_max": round(max(s.busy), 3),
            "saturated_fraction": round(s.saturated(saturated) / n, 3),
        }
        if s.behind is not None:  # also how often it was merely fully busy
            row["busy_saturated_fraction"] = round(sum(b >= saturated for b in s.busy) / n, 3)
        rows.append(row)
    return rows


def busiest_per_label(rows: list[dict], top: int | None = None) -> list[dict]:
    """Each label's busiest thread (most often saturated, then busiest on average), busiest
    labels first; the first `top` of them."""
    def key(r: dict) -> tuple:
        return (r["saturated_fraction"], r["busy_mean"], r["busy_max"])

    best: dict[str, dict] = {}
    for r in rows:
        if r["label"] not in best or key(r) > key(best[r["label"]]):
            best[r["label"]] = r
    ranked = sorted(best.values(), key=key, reverse=True)
    return ranked[:top] if top is not None else ranked


class ThreadWatch:
    """Busy fractions of every thread of the watched processes. watch() may be called from any
    thread at any time (a NIC engine registers as it starts); sample() takes one sample of all."""

    def __init__(self, reader: Callable[[int], Snapshot | None] = read_threads,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self._read = reader
        self._clock = clock
        self._lock = threading.Lock()
        self._procs: dict[int, tuple[str, Snapshot, float]] = {}  # pid -> (label, last, when)
        self._series: dict[tuple[int, int], ThreadSeries] = {}
        self.samples = 0

    def watch(self, pid: int, label: str) -> None:
        """Sample every thread of `pid` from now on, reported under `label` (a pid watched
        twice keeps its first label)."""
        snap = self._read(pid)
        if snap is None:
            return
        with self._lock:
            self._procs.setdefault(pid, (label, snap, self._clock()))

    @property
    def labels(self) -> dict[int, str]:
        with self._lock:
            return {pid: label for pid, (label, _, _) in self._procs.items()}

    def sample(self) -> None:
        with self._lock:
            procs = list(self._procs.items())
        gone = []
        for pid, (label, before, t0) in procs:
            after, t1 = self._read(pid), self._clock()
            if after is None:
                gone.append(pid)
                continue
            for tid, busy in busy_fractions(before, after, t1 - t0).items():
                s = self._series.get((pid, tid))
                if s is None:
                    s = self._series[(pid, tid)] = ThreadSeries(label, pid, tid, after[tid][0])
                s.name = after[tid][0]  # threads may name themselves after they start
                s.busy.append(busy)
            with self._lock:
                self._procs[pid] = (label, after, t1)
        with self._lock:
            for pid in gone:
                self._procs.pop(pid, None)
            self.samples += 1

    def mark_behind(self, pid: int, tid: int, behind: bool) -> None:
        """Whether this thread was behind in the sample just taken (see ThreadSeries.behind)."""
        s = self._series.get((pid, tid))
        if s is not None and s.busy:
            if s.behind is None:
                s.behind = []
            # samples without evidence (before it, or when it failed): busy alone decides
            s.behind.extend([True] * (len(s.busy) - 1 - len(s.behind)))
            s.behind.append(behind)

    def rows(self) -> list[dict]:
        return thread_rows(list(self._series.values()), self.samples)
