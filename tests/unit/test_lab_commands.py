"""The lab's command parsing and `expect` (pure)."""

from __future__ import annotations

import pytest

from fabric_emu.spec.load import load_experiment
from fabric_emu.lab import commands as c
from fabric_emu.lab.expect import ExpectError, evaluate
from tests.conftest import REPO


def test_run_lines_become_workload_mappings():
    assert c.parse_run([]) == c.RunRequest(None, None)
    assert c.parse_run("allreduce 8MB iterations=2 ranks=h1,h2 as ecmp".split()) == c.RunRequest(
        {"type": "allreduce", "size": "8MB", "iterations": 2, "ranks": ["h1", "h2"]}, "ecmp")
    assert c.parse_run("incast h1 4MB".split()).workload == {"type": "incast", "receiver": "h1", "size": "4MB"}
    assert c.parse_run("flows h5-h2:8MB h2-h1:2MB@100us".split()).workload == {"type": "flows", "flows": [
        {"src": "h5", "dst": "h2", "size": "8MB"}, {"src": "h2", "dst": "h1", "size": "2MB", "start": "100us"}]}


@pytest.mark.parametrize("line, msg", [
    ("teleport 8MB", "unknown workload 'teleport'"), ("flows h1h5", "expected SRC-DST:SIZE"),
    ("incast", "give the receiver"), ("allreduce 8MB 2", "expected SIZE"),
    ("allreduce 8MB as last", "a name is")])
def test_bad_run_lines_get_one_line(line, msg):
    with pytest.raises(c.LabInputError, match=msg):
        c.parse_run(line.split())


def test_a_run_workload_is_validated_by_the_spec(tmp_path):
    exp = REPO / "experiments" / "quickstart.yaml"
    sets = [f"{k}={v}" for k, v in c.workload_overrides(c.parse_run(["incast", "h1", "1MB"]).workload).items()]
    assert load_experiment(exp, sets).workload.type == "incast"
    from fabric_emu.spec.errors import SpecError
    bad = [f"{k}={v}" for k, v in c.workload_overrides(c.parse_run(["allreduce", "3XB"]).workload).items()]
    with pytest.raises(SpecError) as e:
        load_experiment(exp, bad)
    assert len(e.value.lines()) == 1 and "workload.size" in e.value.lines()[0]


def test_knobs_become_overrides():
    assert c.parse_switch(["off"], "ecn", c.ECN_KEYS) == {"ecn.enabled": "false"}
    assert c.parse_switch(["on", "xoff=50KB"], "pfc", c.PFC_KEYS) == {"pfc.enabled": "true", "pfc.xoff": "50KB"}
    assert c.parse_cc(["none"]) == {"congestion_control": "none"}
    assert c.parse_set(["transport.retransmit_timeout=262us", "seed=2"]) == {
        "transport.retransmit_timeout": "262us", "seed": "2"}
    with pytest.raises(c.LabInputError, match="topology.spines: the fabric is built"):
        c.parse_set(["topology.spines=4"])
    assert c.parse_dcqcn(["preset=paper"], ("preset",)) == {"dcqcn.preset": "paper"}
    assert c.parse_lb(["spray"]) == c.LbRequest("spray") and c.parse_lb([]) is None
    links = {frozenset(("leaf1", "spine2"))}
    assert c.parse_link(["leaf1-spine2", "down"], links) == c.LinkRequest("leaf1", "spine2", False)
    assert c.parse_link(["spine2", "leaf1", "up"], links).up
    for call, msg in ((lambda: c.parse_switch(["maybe"], "ecn", c.ECN_KEYS), "expected on or off"),
                      (lambda: c.parse_switch(["on", "kfoo=1"], "ecn", c.ECN_KEYS), "unknown setting"),
                      (lambda: c.parse_cc(["reno"]), "expected dcqcn or none"),
                      (lambda: c.parse_lb(["fast"]), "expected one of ecmp, dlb, spray"),
                      (lambda: c.parse_link(["leaf1-leaf2", "down"], links), "not a link"),
                      (lambda: c.parse_link(["leaf1-spine2", "sideways"], links), "expected down or up")):
        with pytest.raises(c.LabInputError, match=msg):
            call()


RUNS = {"ecmp": {"jct_fabric_s": 0.004, "switch": {"pause_tx": 0}},
        "spray": {"jct_fabric_s": 0.002, "switch": {"pause_tx": 3}, "flows": [{"goodput_gbps": 90.0}]}}


def test_expect_shows_the_figures_it_compared():
    out = evaluate("spray.jct_fabric_s < 0.75 * ecmp.jct_fabric_s", RUNS)
    assert out.ok and out.shown == "0.002 < 0.75 * 0.004"
    assert not evaluate("spray.flows[0].goodput_gbps > 95", RUNS).ok
    assert evaluate("spray.switch.pause_tx > 0 and ecmp.switch.pause_tx == 0", RUNS).ok
    assert evaluate("max(1, spray.switch.pause_tx) == 3", RUNS).ok


@pytest.mark.parametrize("text, msg", [
    ("nosuch.jct_s > 0", "no run named 'nosuch'"), ("spray.jct > 0", "spray.jct: no such figure"),
    ("spray.jct_fabric_s", "not a comparison"), ("__import__('os').system('x') == 0", "not allowed"),
    ("spray.jct_fabric_s <", "not an expression"), ("spray.flows[5].goodput_gbps > 0", "no such figure")])
def test_expect_refuses_what_it_cannot_evaluate(text, msg):
    with pytest.raises(ExpectError, match=msg):
        evaluate(text, RUNS)


def test_pfcwd_lines_become_watchdog_overrides_or_views():
    req = c.parse_pfcwd("start action=forward detection=600us ports=host-facing".split())
    assert req.show is None and req.overrides == {"pfcwd.enabled": "true", "pfcwd.action": "forward",
                                                  "pfcwd.detection_time": "600us", "pfcwd.ports": "host-facing"}
    assert c.parse_pfcwd(["stop"]).overrides == {"pfcwd.enabled": "false"}
    assert c.parse_pfcwd([]).show == "config" and c.parse_pfcwd("show config".split()).show == "config"
    stats = c.parse_pfcwd("show stats -e".split())
    assert stats.show == "stats" and stats.every_queue
    # the storm's events go through the spec's validation like --set
    spec = load_experiment(REPO / "experiments" / "pfc-storm.yaml",
                           [f"{k}={v}" for k, v in c.parse_storm("h5 500us-2ms".split()).items()])
    assert [(e.nic, e.pfc_storm, e.at) for e in spec.events] == [("h5", "on", 500e-6), ("h5", "off", 2e-3)]
    assert c.parse_storm(["none"]) == {"events": "[]"}


@pytest.mark.parametrize("words, msg", [
    ("start shutdown=1", "unknown setting"), ("restart", "expected start"), ("show stats -x", "only -e"),
])
def test_bad_pfcwd_lines_get_one_line(words, msg):
    with pytest.raises(c.LabInputError, match=msg):
        c.parse_pfcwd(words.split())


@pytest.mark.parametrize("words", ["h4", "h4 1ms", "h4 -3ms", "h4 1ms-"])
def test_bad_storm_lines_get_one_line(words):
    with pytest.raises(c.LabInputError, match="storm"):
        c.parse_storm(words.split())


def test_pfcwd_views_print_as_sonic_does(tmp_path):
    from rich.console import Console

    from fabric_emu.lab import views

    w = "PFC_WD_QUEUE_STATS_"
    row = {"queue": "leaf2-eth1:3", "intf": "leaf2-eth1", "status": "stormed", "pause_rx": 12,
           **{f"{w}{k}": 0 for k in ("DEADLOCK_RESTORED", "TX_PACKETS", "RX_PACKETS", "RX_DROPPED_PACKETS",
                                     "TX_PACKETS_LAST", "RX_PACKETS_LAST", "RX_DROPPED_PACKETS_LAST")},
           f"{w}DEADLOCK_DETECTED": 1, f"{w}TX_DROPPED_PACKETS": 300, f"{w}TX_DROPPED_PACKETS_LAST": 300}
    quiet = {**row, "queue": "leaf1-eth1:3", "status": "operational", f"{w}DEADLOCK_DETECTED": 0,
             f"{w}TX_DROPPED_PACKETS": 0, f"{w}TX_DROPPED_PACKETS_LAST": 0}
    import csv
    with open(tmp_path / "pfcwd.csv", "w", newline="") as f:
        wr = csv.DictWriter(f, list(row))
        wr.writeheader()
        wr.writerows([quiet, row])
    con = Console(record=True, width=200)
    views.print_pfcwd_stats(con, tmp_path, every_queue=False)
    text = con.export_text()
    assert "STORM DETECTED/RESTORED" in text and "leaf2-eth1:3" in text and "leaf1-eth1:3" not in text
    assert "stormed" in text and "0/300" in text and "1 queues that never stormed left out" in text
