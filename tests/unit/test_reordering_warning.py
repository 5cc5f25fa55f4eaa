"""The fidelity warning for single-path flows that arrived out of order (results.trust)."""

from __future__ import annotations

from fabric_emu.results.trust import reordering_warning


def agents(*reordered: int) -> dict:
    return {"h2": {"recv_qps": [{"src": "h1", "qpn": 10 + i, "reordered": n} for i, n in enumerate(reordered)]}}


def test_ecmp_reordering_is_the_emulators_and_counted_per_flow():
    w, warn = reordering_warning("ecmp", agents(2, 0, 1), links_failed=False)
    assert warn and w.startswith("3 time(s) packets of 2 single-path flow(s)")
    assert "emulator" in w


def test_after_a_link_event_or_under_dlb_it_names_the_fabric_cause():
    assert reordering_warning("ecmp", agents(1), links_failed=True) == (
        "1 time(s) packets of 1 single-path flow(s) arrived out of order (a route changed under them (link "
        "events)); each cost a go-back-N resend (flows.csv rx_reordered)", False)
    assert "flowlet" in reordering_warning("dlb", agents(1), links_failed=False)[0]


def at(*where: int) -> dict:
    return {"h2": {"recv_qps": [{"src": "h1", "qpn": 10 + i, "reordered": 1, "reordered_last_at": n}
                                for i, n in enumerate(where)]}}


def test_on_the_kernel_datapath_a_flows_set_up_is_a_note_and_later_reordering_a_warning():
    text, warn = reordering_warning("ecmp", at(0, 3), links_failed=False, datapath="kernel")
    assert not warn and "within its flow's first 32 packets" in text and "upcall" in text
    assert reordering_warning("ecmp", at(0, 40), links_failed=False, datapath="kernel")[1]
    assert reordering_warning("ecmp", at(0, 3), links_failed=False, datapath="userspace")[1]
    assert reordering_warning("ecmp", agents(1), links_failed=False, datapath="kernel")[1]  # no position: a warning


def test_spraying_and_clean_runs_have_no_warning():
    assert reordering_warning("spray", agents(5), links_failed=False) is None
    assert reordering_warning("ecmp", agents(0, 0), links_failed=False) is None
    assert reordering_warning("ecmp", {}, links_failed=False) is None
