"""Pure parts of the lossless ports: RED profile, PFC timing and state machines, headroom,
the BPF struct layout, and the ECN/PFC spec checks."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from fabric_emu.cc.headroom import headroom_bytes, response_quanta
from fabric_emu.cc.pfc import PauseReceiver, PauseSender, pause_seconds, pfc_frame
from fabric_emu.cc.red import PMAX_SCALE, mark_probability, pmax_scaled
from fabric_emu.config import SpecError, load_experiment
from fabric_emu.ports import layout

C_SOURCE = Path(__file__).resolve().parents[2] / "fabric_emu" / "ports" / "bpf" / "port.c"


# ------------------------------------------------------------------ RED
@pytest.mark.parametrize("depth, expected", [
    (0, 0.0), (100_000, 0.0), (100_001, 0.2 / 300_000), (250_000, 0.1), (400_000, 0.2), (400_001, 1.0)])
def test_mark_probability_follows_the_profile(depth: int, expected: float) -> None:
    assert mark_probability(depth, 100_000, 400_000, 0.2) == pytest.approx(expected)


def test_pmax_scaled_saturates_at_certainty() -> None:
    assert pmax_scaled(1.0) == PMAX_SCALE
    assert pmax_scaled(0.5) == PMAX_SCALE // 2


# ------------------------------------------------------------------ PFC timing
def test_pause_quanta_are_512_bit_times_at_the_modelled_rate_times_the_dilation() -> None:
    # 100 Gb/s: 5.12 ns a quantum, 65535 quanta = 335.5 us (protocol_facts §4.1)
    assert pause_seconds(65535, 100) == pytest.approx(335.5392e-6)
    assert pause_seconds(65535, 100, dilation=2000) == pytest.approx(0.6710784)
    assert pause_seconds(1, 25) == pytest.approx(20.48e-9)


def test_sender_pauses_refreshes_while_asserted_and_resumes_once() -> None:
    s = PauseSender(quanta=0xFFFF, refresh_s=0.3)
    assert s.on_timer(0.0) == []
    assert s.on_xoff(1.0) == [0xFFFF]
    assert s.on_timer(1.2) == []  # not yet half a pause
    assert s.on_timer(1.31) == [0xFFFF]  # refreshed before the upstream's pause runs out
    assert s.on_timer(1.5) == []
    assert s.on_xon(1.55) == [0]
    assert s.on_xon(1.56) == []  # nothing to resume
    assert s.on_timer(5.0) == []  # no refresh after the resume


def test_receiver_pauses_extends_expires_and_resumes_on_zero() -> None:
    r = PauseReceiver()
    assert r.on_frame(0.0, 0.5) == "close"
    assert r.on_frame(0.4, 0.5) is None  # a refresh extends the pause
    assert r.on_timer(0.6) is None  # would have expired without the refresh
    assert r.on_timer(0.9) == "open"
    assert r.on_frame(1.0, 0.5) == "close"
    assert r.on_frame(1.1, 0.0) == "open"  # quanta 0: resume at once
    assert r.on_frame(1.2, 0.0) is None


def test_pfc_frame_bytes_match_the_scapy_definition() -> None:
    from scapy.contrib.mac_control import MACControlClassBasedFlowControl
    from scapy.layers.l2 import Ether

    raw = pfc_frame(bytes.fromhex("0efeffff0007"), 0xFFFF, priority=3)
    assert len(raw) == 60
    pkt = Ether(raw)
    assert pkt.dst == "01:80:c2:00:00:01" and pkt.type == 0x8808
    pfc = pkt[MACControlClassBasedFlowControl]
    assert pfc.c3_enabled == 1 and pfc.c3_pause_time == 0xFFFF
    assert pfc.c0_enabled == 0 and pfc.c0_pause_time == 0


# ------------------------------------------------------------------ headroom
def test_headroom_formula_matches_sonic_tables_within_their_rounding() -> None:
    assert response_quanta(100) == 394 and response_quanta(25) == 80 and response_quanta(1600) == 905
    # SONiC Mellanox SN4280, 100G: 5 m -> 300 m adds 37,888 B; the formula's cable term 37,247 B
    delta = headroom_bytes(4214, 100, 300) - headroom_bytes(4214, 100, 5)
    assert abs(delta - 37_888) < 2048
    assert headroom_bytes(4214, 100, 100) % 1024 == 0


# ------------------------------------------------------------------ BPF layout
def test_python_layout_mirrors_struct_port() -> None:
    body = re.search(r"struct port \{(.*?)\n\};", C_SOURCE.read_text(), re.S).group(1)
    fields = []
    for decl in re.findall(r"__u64 ([^;]+);", body):
        for name in decl.split(","):
            m = re.fullmatch(r"\s*(\w+)(?:\[(\w+)\])?\s*", name)
            n = m.group(2)
            fields.append((m.group(1), 1 if n is None else (layout.NPRIO if n == "NPRIO" else int(n))))
    assert tuple(fields) == layout.FIELDS


def test_event_struct_matches() -> None:
    body = re.search(r"struct event \{(.*?)\n\};", C_SOURCE.read_text(), re.S).group(1)
    sizes = [8 if t == "__u64" else 4 for t in re.findall(r"(__u64|__u32) \w+;", body)]
    assert sum(sizes) == layout.EVENT.size


# ------------------------------------------------------------------ spec
def _load(spec_dir: Path, *sets: str):
    return load_experiment(spec_dir / "exp.yaml", list(sets))


def test_defaults_are_on_and_headroom_is_computed(spec_dir: Path) -> None:
    spec = _load(spec_dir)
    assert spec.ecn.enabled and spec.pfc.enabled
    assert spec.pfc.headroom == headroom_bytes(4214, 100, 100)


@pytest.mark.parametrize("sets, field, words", [
    (["ecn.kmin=500KB"], "ecn.kmin", "not below kmax"),
    (["pfc.xon=200KB"], "pfc.xon", "not below xoff"),
    (["ecn.kmax=2MB"], "ecn.kmax", "beyond topology.port_buffer"),
    (["pfc.xoff=990KB"], "pfc.xoff", "beyond topology.port_buffer"),
    (["pfc.headroom=8KB"], "pfc.headroom", "cannot keep 100 Gb/s lossless"),
    (["pfc.quanta=0"], "pfc.quanta", "greater than or equal to 1"),
    (["ecn.pmax=1.5"], "ecn.pmax", "less than or equal to 1"),
])
def test_impossible_thresholds_are_input_errors(spec_dir: Path, sets, field, words) -> None:
    with pytest.raises(SpecError) as e:
        _load(spec_dir, *sets)
    (problem,) = e.value.problems
    assert problem[1] == field and words in problem[2]


def test_thresholds_checks_skip_what_is_off(spec_dir: Path) -> None:
    spec = _load(spec_dir, "pfc.enabled=false", "pfc.headroom=8KB", "ecn.enabled=false", "ecn.kmax=2MB")
    assert not spec.pfc.enabled and not spec.ecn.enabled
