"""Per-thread CPU: parsing /proc task stat lines, busy fractions, the per-process busiest thread,
and the fidelity verdict on a single saturated thread (fabricated /proc text, no root)."""

from __future__ import annotations

import os

from fabric_emu.measure.fidelity import CpuMonitor, verdict
from fabric_emu.measure.thread_cpu import (ThreadSeries, ThreadWatch, busiest_per_label, busy_fractions,
                                   parse_task_stat, read_threads, thread_rows)


def stat_line(tid: int, name: str, utime: int, stime: int) -> str:
    """A /proc/<pid>/task/<tid>/stat line as the kernel writes it (52 fields)."""
    fields = ["S", "1", str(tid), str(tid), "0", "-1", "4194560", "100", "0", "0", "0",
              str(utime), str(stime), "0", "0", "20", "0", "12", "0", "12345"] + ["0"] * 32
    return f"{tid} ({name}) {' '.join(fields)}\n"


def test_parse_task_stat_sums_user_and_system_ticks():
    assert parse_task_stat(stat_line(4242, "ovs-vswitchd", 700, 300)) == ("ovs-vswitchd", 1000)
    # A thread name may hold spaces and parentheses (prctl PR_SET_NAME takes anything).
    assert parse_task_stat(stat_line(7, "a) (b", 1, 2)) == ("a) (b", 3)


def test_read_threads_of_this_process_and_of_a_gone_one():
    snap = read_threads(os.getpid())
    assert os.getpid() in snap and all(ticks >= 0 for _, ticks in snap.values())
    assert read_threads(2**22 + 1) is None  # beyond pid_max: no such process


def test_busy_fractions_are_of_one_core_and_count_new_threads_from_zero():
    before = {1: ("main", 100), 2: ("handler1", 50), 3: ("gone", 10)}
    after = {1: ("main", 150), 2: ("handler1", 50), 4: ("new", 25)}
    busy = busy_fractions(before, after, 0.5, tick_hz=100)
    assert busy == {1: 1.0, 2: 0.0, 4: 0.5}
    # Tick rounding can claim a little more than the interval: capped at one core.
    assert busy_fractions({1: ("m", 0)}, {1: ("m", 52)}, 0.5, tick_hz=100) == {1: 1.0}
    assert busy_fractions(before, after, 0.0) == {}


def test_thread_rows_saturated_fraction_is_over_the_whole_phase():
    series = [ThreadSeries("ovs-vswitchd", 10, 10, "ovs-vswitchd", [1.0, 0.97, 0.5, 0.2]),
              ThreadSeries("ovs-vswitchd", 10, 11, "handler1", [0.0, 0.01, 0.0, 0.0]),
              # an engine that lived for 2 of the phase's 4 samples, saturated in both
              ThreadSeries("nic engine0", 20, 20, "python3", [1.0, 1.0]),
              ThreadSeries("controller", 30, 30, "python3", [])]
    rows = {(r["label"], r["tid"]): r for r in thread_rows(series, samples=4)}
    assert rows[("ovs-vswitchd", 10)] == {
        "label": "ovs-vswitchd", "pid": 10, "tid": 10, "thread": "ovs-vswitchd",
        "busy_mean": 0.667, "busy_max": 1.0, "saturated_fraction": 0.5}
    assert rows[("nic engine0", 20)]["saturated_fraction"] == 0.5
    assert rows[("nic engine0", 20)]["busy_mean"] == 1.0  # while it lived
    assert ("controller", 30) not in rows  # never sampled


def test_busiest_thread_per_label_busiest_first():
    rows = [
        {"label": "ovs-vswitchd", "tid": 10, "thread": "ovs-vswitchd", "busy_mean": 0.6, "busy_max": 1.0,
         "saturated_fraction": 0.3},
        {"label": "ovs-vswitchd", "tid": 11, "thread": "handler1", "busy_mean": 0.01, "busy_max": 0.02,
         "saturated_fraction": 0.0},
        {"label": "controller", "tid": 30, "thread": "python3", "busy_mean": 0.05, "busy_max": 0.1,
         "saturated_fraction": 0.0},
        {"label": "nic engine0", "tid": 20, "thread": "python3", "busy_mean": 0.7, "busy_max": 0.9,
         "saturated_fraction": 0.0},
    ]
    best = busiest_per_label(rows)
    assert [(r["label"], r["thread"]) for r in best] == [
        ("ovs-vswitchd", "ovs-vswitchd"), ("nic engine0", "python3"), ("controller", "python3")]
    assert len(busiest_per_label(rows, top=2)) == 2


class FakeProc:
    """Fabricated /proc for ThreadWatch: ticks per thread, advanced by the test."""

    def __init__(self) -> None:
        self.t = 0.0
        self.procs: dict[int, dict[int, list]] = {}

    def read(self, pid: int):
        threads = self.procs.get(pid)
        if threads is None:
            return None
        return {tid: parse_task_stat(stat_line(tid, name, ticks, 0)) for tid, (name, ticks) in threads.items()}

    def run(self, seconds: float, busy: dict[tuple[int, int], float]) -> None:
        self.t += seconds
        for (pid, tid), frac in busy.items():
            self.procs[pid][tid][1] += round(frac * seconds * 100)


def test_thread_watch_samples_every_thread_and_forgets_ended_processes():
    fake = FakeProc()
    fake.procs = {100: {100: ["ovs-vswitchd", 0], 101: ["handler1", 0]}, 200: {200: ["python3", 0]}}
    w = ThreadWatch(reader=fake.read, clock=lambda: fake.t)
    w.watch(100, "ovs-vswitchd")
    w.watch(200, "nic engine0")
    w.watch(100, "something else")  # the first label stays
    w.watch(999, "never existed")  # nothing to watch
    for _ in range(4):
        fake.run(0.5, {(100, 100): 1.0, (100, 101): 0.02, (200, 200): 0.4})
        w.sample()
    del fake.procs[200]  # the engine exits
    fake.run(0.5, {(100, 100): 0.5})
    w.sample()
    assert w.samples == 5 and w.labels == {100: "ovs-vswitchd"}
    best = busiest_per_label(w.rows())
    assert [(r["label"], r["thread"], r["saturated_fraction"]) for r in best] == [
        ("ovs-vswitchd", "ovs-vswitchd", 0.8), ("nic engine0", "python3", 0.0)]
    assert best[0]["busy_mean"] == 0.9 and best[1]["busy_mean"] == 0.4


def test_one_saturated_thread_makes_the_run_untrusted_and_names_it():
    cpu = {"cpu_saturated_fraction": 0.0, "saturated_threads": [
        {"label": "ovs-vswitchd", "thread": "ovs-vswitchd", "tid": 4242, "saturated_fraction": 0.45}]}
    (w,) = verdict(cpu, [0.0])
    assert w.startswith("ovs-vswitchd thread ovs-vswitchd (tid 4242) saturated in 45% of samples")
    assert w.endswith("raise the dilation")
    assert verdict({"cpu_saturated_fraction": 0.0, "saturated_threads": []}, [0.0]) == []


def test_monitor_summary_lists_threads_and_only_often_saturated_ones_for_the_verdict():
    cpu = CpuMonitor(ovs=False)
    fake = FakeProc()
    fake.procs = {1: {1: ["ovs-vswitchd", 0]}, 2: {2: ["python3", 0]}}
    cpu.threads = ThreadWatch(reader=fake.read, clock=lambda: fake.t)
    cpu.watch(1, "ovs-vswitchd")
    cpu.watch(2, "nic engine0")
    for i in range(10):  # OVS saturated in 3 of 10 samples, the engine in 2 of 10
        fake.run(0.5, {(1, 1): 1.0 if i < 3 else 0.3, (2, 2): 1.0 if i < 2 else 0.5})
        cpu.threads.sample()
    s = cpu.summary()
    assert [t["label"] for t in s["threads"]] == ["ovs-vswitchd", "nic engine0"]
    assert [t["label"] for t in s["saturated_threads"]] == ["ovs-vswitchd"]  # 30% > 20%, 20% is not
    assert s["watched"] == ["nic engine0", "ovs-vswitchd"] and s["samples"] == 10
    assert len(verdict(s, [])) == 1


def test_monitor_measures_a_busy_process_it_watches():
    import subprocess
    import sys

    spinner = subprocess.Popen([sys.executable, "-c", "import time\nend = time.monotonic() + 0.8\n"
                                "while time.monotonic() < end: pass"])
    try:
        with CpuMonitor(interval_s=0.1, ovs=False) as cpu:
            cpu.watch(spinner.pid, "spinner")
            spinner.wait()
    finally:
        spinner.kill()
        spinner.wait()
    (row,) = busiest_per_label(cpu.threads.rows())
    assert row["label"] == "spinner" and cpu.threads.samples >= 4
    # It wanted a whole core; it got most of one unless this machine is badly oversubscribed.
    assert row["busy_max"] >= 0.5, row


PMD_STATS = """\
pmd thread numa_id 0 core_id 3:
  packets received: 999
  avg. packets per output batch: 30.00
main thread:
  packets received: 25392
  packet recirculations: 0
  avg. datapath passes per packet: 1.00
  simple match hits: 25380
  miss with success upcall: 10
  miss with failed upcall: 2
  avg. packets per output batch: 1.01
"""


def test_parse_the_main_threads_pmd_stats():
    from fabric_emu.measure.ovs_stats import parse_main_thread

    assert parse_main_thread(PMD_STATS) == {"packets": 25392, "output_batch": 1.01, "upcalls": 12}
    assert parse_main_thread("please specify an existing datapath\n") is None


def test_ovs_thread_is_saturated_only_while_its_batches_show_it_behind():
    """Busy alone: OVS's thread reads >= 95% while forwarding frames one by one (batch 1.0)
    and keeping up; it is behind when its output batches fill (towards 32)."""
    fake = FakeProc()
    fake.procs = {1: {1: ["ovs-vswitchd", 0]}, 2: {2: ["python3", 0]}}
    w = ThreadWatch(reader=fake.read, clock=lambda: fake.t)
    w.watch(1, "ovs-vswitchd")
    w.watch(2, "nic engine0")
    batches = [None, 1.0, 1.0, 25.0, 30.0, 1.0, 1.0, 1.0, 1.0, 1.0]  # None: no statistics
    for b in batches:
        fake.run(0.5, {(1, 1): 1.0, (2, 2): 1.0})
        w.sample()
        if b is not None:
            w.mark_behind(1, 1, b >= 16)
    rows = {r["label"]: r for r in w.rows()}
    # busy in all 10 samples; behind in 2, plus the one without statistics (busy decides)
    assert rows["ovs-vswitchd"]["busy_saturated_fraction"] == 1.0
    assert rows["ovs-vswitchd"]["saturated_fraction"] == 0.3
    assert rows["nic engine0"]["saturated_fraction"] == 1.0 and "busy_saturated_fraction" not in rows["nic engine0"]
    (warning,) = verdict({"saturated_threads": [{**rows["ovs-vswitchd"], "tid": 1}]}, [])
    assert "saturated in 30% of samples" in warning and "packets waiting at every poll" in warning
