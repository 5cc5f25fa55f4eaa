"""The fidelity warning for single-path flows that arrived out of order (results.trust)."""

from __future__ import annotations

from fabric_emu.results.trust import reordering_warning


def agents(*reordered: int) -> dict:
    return {"h2": {"recv_qps": [{"src": "h1", "qpn": 10 + i, "reordered": n} for i, n in enumerate(reordered)]}}


def test_ecmp_reordering_is_the_emulators_and_counted_per_flow():
    w = reordering_warning("ecmp", agents(2, 0, 1), links_failed=False)
    assert w is not None and w.startswith("3 time(s) packets of 2 single-path flow(s)")
    assert "emulator" in w


def test_after_a_link_event_or_under_dlb_it_names_the_fabric_cause():
    assert "route changed" in reordering_warning("ecmp", agents(1), links_failed=True)
    assert "flowlet" in reordering_warning("dlb", agents(1), links_failed=False)


def test_spraying_and_clean_runs_have_no_warning():
    assert reordering_warning("spray", agents(5), links_failed=False) is None
    assert reordering_warning("ecmp", agents(0, 0), links_failed=False) is None
    assert reordering_warning("ecmp", {}, links_failed=False) is None
