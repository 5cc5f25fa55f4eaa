"""The progress bar of long runs: the payload estimate, its text, and the bar on a terminal."""

from __future__ import annotations

import io
import time

from rich.console import Console

from fabric_emu.spec.workloads import AllReduceWorkload, FlowsWorkload
from fabric_emu.run.progress import DATA_OVERHEAD, RunProgress, payload_estimate, progress_text
from fabric_emu.workloads.flows import planned_bytes


def test_planned_bytes_is_what_the_receivers_get():
    ring = AllReduceWorkload(type="allreduce", size="8MB", iterations=2)
    assert planned_bytes(ring, [f"h{i}" for i in range(1, 9)], []) == 224_000_000  # the quickstart's
    flows = FlowsWorkload(type="flows", flows=[{"src": "h1", "dst": "h2", "size": "1MB", "iterations": 3},
                                               {"src": "h3", "dst": "h2", "size": "2MB"}])
    assert planned_bytes(flows, [], ["h1", "h2", "h3"]) == 5_000_000


def test_payload_estimate_takes_the_headers_off():
    assert payload_estimate(10 * (4096 + DATA_OVERHEAD), 10) == 40960
    assert payload_estimate(100, 5) == 0  # ACKs alone are no payload


def test_text_says_modelled_beside_emulated():
    text = progress_text(12_000_000, 224_000_000, 3.1, 8.96, 4000)
    assert text == "12.0 MB of 224.0 MB delivered, 3.1 s of 9.0 s at line rate (fabric 775 of 2,240 us)"
    assert progress_text(0, 1_000_000, None, 9.0, 4000).endswith("starting")


def test_bar_on_a_terminal_and_nothing_elsewhere():
    sent = [(0, 0)]
    out = io.StringIO()
    console = Console(file=out, force_terminal=True, width=200)
    with RunProgress(console, lambda: sent[0], 8_000_000, 10.0, 1000) as bar:
        bar.start(time.time())
        sent[0] = (4_000_000 + 1000 * DATA_OVERHEAD, 1000)
        time.sleep(1.2)
    assert "4.0 MB of 8.0 MB delivered" in out.getvalue()

    quiet = io.StringIO()
    with RunProgress(Console(file=quiet), lambda: sent[0], 8_000_000, 10.0, 1000) as bar:  # not a terminal
        bar.start(time.time())
        time.sleep(0.6)
    assert quiet.getvalue() == ""
    assert not RunProgress(console, lambda: (0, 0), 1, 1.0, 1000).shown  # a short run


def test_a_callback_is_told_the_progress_without_a_bar():
    """fabric_emu.api's progress callback: the same figures, on no terminal and for a short run."""
    sent = [(0, 0)]
    told: list[tuple[float, str]] = []
    out = io.StringIO()
    with RunProgress(Console(file=out), lambda: sent[0], 8_000_000, 1.0, 1000,
                     on_update=lambda f, text: told.append((f, text))) as bar:
        bar.start(time.time())
        sent[0] = (2_000_000 + 500 * DATA_OVERHEAD, 500)
        time.sleep(0.7)
    assert out.getvalue() == ""  # no bar
    assert told and told[-1][0] == 0.25 and told[-1][1].startswith("2.0 MB of 8.0 MB delivered")
