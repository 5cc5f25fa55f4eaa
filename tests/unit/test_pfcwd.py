"""The PFC watchdog without root: its state machine (SONiC's detection and restoration rules,
each action), the per-switch poll schedule and counters, the timers' validation, storm events,
and the summary's view of the daemon's log."""

from __future__ import annotations

from pathlib import Path

import pytest

from fabric_emu.cc.pfcwd import QueueWatchdog, Sample, Timers
from fabric_emu.ports.watchdog import PREFIX, PortWatchdogs, poll_phase
from fabric_emu.results.pfcwd import pfcwd_rows, drops_counted_off_the_switches, pfcwd_section
from fabric_emu.run.prepare import load_checked
from fabric_emu.spec.errors import SpecError

US = 1_000
STORM = Path(__file__).resolve().parents[2] / "experiments" / "pfc-storm.yaml"


def _timers(action: str = "drop") -> Timers:
    return Timers(detection_ns=400 * US, restoration_ns=800 * US, poll_ns=200 * US, action=action)


class Queue:
    """A queue's pause state over modelled time, as the daemon would report it at each poll."""

    def __init__(self, paused_from: int | None = None, paused_to: int | None = None, refresh_us: int = 168):
        self.paused_from, self.paused_to, self.refresh = paused_from, paused_to, refresh_us

    def sample(self, t_us: int) -> Sample:
        a, b = self.paused_from, self.paused_to
        paused = a is not None and a <= t_us and (b is None or t_us < b)
        frames = 0 if a is None or t_us < a else (min(t_us, b if b is not None else t_us) - a) // self.refresh + 1
        return Sample(t_us * US, paused, frames, 1 if a is not None and t_us >= a else 0)


def _run(wd: QueueWatchdog, q: Queue, until_us: int, phase_us: int = 0) -> list[tuple[int, str]]:
    out = []
    for t in range(phase_us, until_us, 200):
        what = wd.poll(q.sample(t))
        if what:
            out.append((t, what))
    return out


@pytest.mark.parametrize("phase_us", [0, 1, 57, 100, 199])
def test_a_storm_longer_than_detection_plus_poll_is_detected_within_that_window(phase_us: int) -> None:
    """SONiC's test rule: detected between detection and detection + poll after the queue became
    continuously paused, wherever the polls fall."""
    start = 1_003
    got = _run(QueueWatchdog(_timers()), Queue(start, start + 2_000), 6_000, phase_us)
    (t_storm, what), *_ = got
    assert what == "storm"
    assert 400 <= t_storm - start <= 600


def test_a_storm_shorter_than_detection_is_not_detected() -> None:
    assert _run(QueueWatchdog(_timers()), Queue(1_003, 1_003 + 390), 6_000, 50) == []


def test_a_queue_that_resumes_in_between_is_no_storm() -> None:
    """Congestion pauses come and go (running -> paused again): never continuous, no storm."""
    wd = QueueWatchdog(_timers())
    for t in range(0, 4_000, 200):
        assert wd.poll(Sample(t * US, True, t, t // 200)) is None  # a new pause every poll


def test_paused_without_new_frames_is_no_storm() -> None:
    wd = QueueWatchdog(_timers())
    for t in range(0, 2_000, 200):
        assert wd.poll(Sample(t * US, True, 1, 1)) is None


def test_drop_restores_after_the_restoration_time_without_a_pause_frame() -> None:
    q = Queue(1_000, 3_000)
    got = _run(QueueWatchdog(_timers("drop")), q, 8_000)
    assert [w for _, w in got] == ["storm", "restore"]
    last_frame = 1_000 + (3_000 - 1_000 - 1) // 168 * 168
    assert 800 <= got[1][0] - last_frame <= 1_000


def test_a_new_pause_frame_resets_restoration() -> None:
    wd = QueueWatchdog(_timers("forward"))
    rx = 0
    for t in range(0, 1_000, 200):  # stormed
        rx += 2
        wd.poll(Sample(t * US, True, rx, 1))
    assert wd.status == "stormed"
    for t in range(1_000, 3_000, 200):  # a frame every poll: never restored
        rx += 1
        assert wd.poll(Sample(t * US, False, rx, 1)) is None


def test_alert_restores_at_the_first_poll_that_is_not_stormy() -> None:
    got = _run(QueueWatchdog(_timers("alert")), Queue(1_000, 2_000), 4_000)
    assert [w for _, w in got] == ["storm", "restore"]
    assert got[1][0] - 2_000 <= 200


@pytest.mark.parametrize("kwargs", [dict(poll_ns=500, detection_ns=400), dict(restoration_ns=300),
                                    dict(action="shutdown")])
def test_timers_that_cannot_work_are_refused(kwargs: dict) -> None:
    base = dict(detection_ns=400, restoration_ns=800, poll_ns=200, action="drop")
    with pytest.raises(ValueError):
        Timers(**{**base, **kwargs})


# ------------------------------------------------------------------ the daemon's book
class FakeTable:
    def __init__(self) -> None:
        self.v: dict[tuple[int, str, int], int] = {}

    def get(self, port: int, name: str, i: int = 0) -> int:
        return self.v.get((port, name, i), 0)

    def set(self, port: int, name: str, value: int, i: int = 0) -> None:
        self.v[(port, name, i)] = value


def test_each_switch_polls_at_its_own_phase_and_counts_only_while_stormed() -> None:
    table = FakeTable()
    d = 1000.0  # dilation: a 200 us poll is 0.2 s of wall time
    wds = PortWatchdogs(_timers(), {1: ("leaf2-eth1", "leaf2"), 2: ("spine1-eth2", "spine1")}, table, d, seed=1)
    wds.anchor(0.0)
    assert wds.next_poll() == pytest.approx(min(poll_phase(1, s) for s in ("leaf2", "spine1")) * 0.2)
    wds.on_gate(1, True, 0.001)
    t, stormed_at = 0.0, None
    while t < 3.0:
        t += 0.01
        if int(t * 100) % 17 == 0:  # a pause frame every 170 ms (170 us modelled)
            wds.on_pause_frame(1, t)
        table.set(1, "tx_packets", 10 + int(t * 100), 3)  # keeps moving, counted only while stormed
        table.set(1, "drops", int(t * 50), 3)
        for pid, what in wds.due(t):
            if what == "storm":
                stormed_at = t
        if stormed_at and t > 1.0:
            break
    assert stormed_at is not None and 0.4 <= stormed_at - 0.001 <= 0.6 + 0.01
    report = wds.report()
    q = report["queues"]["leaf2-eth1"]
    assert q[f"{PREFIX}DEADLOCK_DETECTED"] == 1 and q["status"] == "stormed"
    assert 0 < q[f"{PREFIX}TX_DROPPED_PACKETS"] == q[f"{PREFIX}TX_DROPPED_PACKETS_LAST"] < 100
    assert report["queues"]["spine1-eth2"][f"{PREFIX}DEADLOCK_DETECTED"] == 0
    assert table.get(1, "wd_status") == 1 and table.get(2, "wd_status") == 0


def test_summary_has_the_episode_in_modelled_time_and_the_explained_drops() -> None:
    q = {f"{PREFIX}{k}": 0 for k in ("DEADLOCK_DETECTED", "DEADLOCK_RESTORED", "TX_PACKETS",
                                     "TX_DROPPED_PACKETS", "RX_PACKETS", "RX_DROPPED_PACKETS")}
    q.update({f"{PREFIX}DEADLOCK_DETECTED": 1, f"{PREFIX}DEADLOCK_RESTORED": 1, f"{PREFIX}RX_DROPPED_PACKETS": 7})
    daemon = {"watchdog": {"action": "drop", "detection_ns": 400_000, "restoration_ns": 800_000, "poll_ns": 200_000,
                           "polls": 30, "queues": {"leaf2-eth1": {"status": "operational", "pause_rx": 12, **q}},
                           "episodes": [{"intf": "leaf2-eth1", "queue": 3, "action": "drop", "paused_since_s": 102.0,
                                         "detected_s": 103.0, "mitigated_s": 103.001, "last_pause_s": 105.0,
                                         "restored_s": 106.6}]},
              "storms": [{"nic": "h4", "intf": "h4-eth0", "on_s": 102.0, "off_s": 106.0, "frames": 12}],
              "storm_nic_drops": {"h4-eth0": 5}}
    s = pfcwd_section(daemon, t0=100.0, dilation=2000.0, traffic_fabric_s=0.01)
    (e,) = s["pfcwd"]["episodes"]
    assert e["detection_latency_fabric_us"] == pytest.approx(500.0)
    assert e["restored_fabric_us"] == pytest.approx(3300.0)
    assert s["pfcwd"]["storms_per_fabric_s"] == 100.0
    assert s["pfc_storms"][0]["on_fabric_us"] == 1000.0 and s["pfc_storm_nic_drops"] == {"h4": 5}
    assert drops_counted_off_the_switches(daemon) == 12
    assert pfcwd_rows(daemon)[0]["queue"] == "leaf2-eth1:3"


# ------------------------------------------------------------------ the spec
def _problem(*sets: str) -> tuple[str, str]:
    with pytest.raises(SpecError) as e:
        load_checked(STORM, list(sets))
    (problem,) = e.value.problems
    return problem[1], problem[2]


def test_the_presets_fill_the_timers() -> None:
    spec, _, _ = load_checked(STORM, ["pfcwd.enabled=true"])
    assert (spec.pfcwd.detection_time, spec.pfcwd.restoration_time, spec.pfcwd.poll_interval) == (400e-6, 800e-6, 200e-6)
    spec, _, _ = load_checked(STORM, ["pfcwd.enabled=true", "pfcwd.preset=sonic"])
    assert (spec.pfcwd.detection_time, spec.pfcwd.restoration_time, spec.pfcwd.poll_interval) == (0.2, 0.4, 0.1)


@pytest.mark.parametrize("sets, field, words", [
    (["pfcwd.poll_interval=500us"], "pfcwd.poll_interval", "longer than detection_time"),
    (["pfcwd.restoration_time=300us"], "pfcwd.restoration_time", "below detection_time"),
    (["pfcwd.preset=sonic", "pfcwd.detection_time=50ms"], "pfcwd.detection_time", "outside SONiC's range"),
    (["pfcwd.preset=sonic", "pfcwd.poll_interval=5s", "pfcwd.detection_time=5s"], "pfcwd.poll_interval",
     "outside SONiC's range"),
    (["pfcwd.enabled=true", "pfcwd.poll_interval=100us", "pfcwd.detection_time=400us"], "pfcwd.poll_interval",
     "pause refresh period"),
    (["pfcwd.enabled=true", "pfc.enabled=false"], "pfcwd.enabled", "needs pfc.enabled"),
    (["pfcwd.action=shutdown"], "pfcwd.action", "drop"),
    (["events=[{at: 1ms, nic: h9, pfc_storm: on}]"], "events.0.nic", "unknown host 'h9'"),
    (["events=[{at: 1ms, nic: h1}]"], "events.0", "nic and pfc_storm"),
    (["events=[{at: 1ms, nic: h1, pfc_storm: on, link: leaf1-spine1, state: down}]"], "events.0", "one of"),
])
def test_bad_watchdog_and_storm_settings_are_one_clear_line(sets, field, words) -> None:
    got_field, msg = _problem(*sets)
    assert got_field == field and words in msg, (got_field, msg)


def test_storm_events_take_yaml_on_and_off() -> None:
    spec, _, _ = load_checked(STORM, [])
    assert [(e.kind, e.nic, e.pfc_storm) for e in spec.events] == [("pfc_storm", "h4", "on"), ("pfc_storm", "h4", "off")]


@pytest.mark.parametrize("value, field, words", [
    ("{drain: 50Gbps, xoff: 100KB, xon: 100KB}", "pfc.nic_receive.xon", "not below xoff"),
    ("{drain: 50Gbps, buffer: 100KB}", "pfc.nic_receive.xoff", "not below buffer"),
    ("{xoff: 100KB}", "pfc.nic_receive.drain", "required"),
])
def test_bad_nic_receive_buffers_are_one_clear_line(value, field, words) -> None:
    got_field, msg = _problem(f"pfc.nic_receive={value}")
    assert got_field == field and words.lower() in msg.lower(), (got_field, msg)


def test_nic_receive_becomes_the_switch_ports_config_words() -> None:
    from fabric_emu.ports.model import nic_receive_config, port_plan, settings_of

    spec, plan, _ = load_checked(STORM, ["pfc.nic_receive={drain: 50Gbps}"])
    r = spec.pfc.nic_receive
    pp = port_plan(plan, *settings_of(spec), nic_receive=(r.drain, r.buffer, r.xoff, r.xon))
    # 50 Gb/s modelled at dilation 2000: 3.125 MB/s emulated
    assert nic_receive_config(pp) == {"nic_rx_rate": 3_125_000, "nic_rx_limit": 512_000, "nic_rx_xoff": 128_000}
    off = port_plan(plan, *settings_of(spec))
    assert nic_receive_config(off)["nic_rx_rate"] == 0
