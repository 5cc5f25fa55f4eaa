"""Incast and flows, pure parts: flow lists, line-rate time, agent configs, the QP table, and
the agent's flow driver run against a stand-in NIC."""

from __future__ import annotations

import json

import pytest

from fabric_emu.nic.config import AgentConfig, ConfigError, FlowConfig, FlowsConfig, RankInfo, RingConfig
from fabric_emu.nic.drivers.flows import FlowRunner, own_qps
from fabric_emu.nic.qps import build_qp_table
from fabric_emu.workloads.collectives import ring_edges
from fabric_emu.spec.workloads import FlowsWorkload, IncastWorkload
from fabric_emu.workloads.flows import Flow, agent_hosts, flows_line_rate_s, workload_flows

HOSTS = [f"h{i}" for i in range(1, 9)]


# ----------------------------------------------------------------------------- flow lists

def test_incast_is_one_flow_per_sender():
    w = IncastWorkload(type="incast", receiver="h3", size=1000, iterations=2, qps_per_sender=2)
    flows = workload_flows(w, HOSTS)
    assert [f.src for f in flows] == ["h1", "h2", "h4", "h5", "h6", "h7", "h8"]
    assert all((f.dst, f.size, f.qps, f.iterations, f.start_s) == ("h3", 1000, 2, 2, 0.0) for f in flows)
    assert flows[0].parts == [500, 500] and flows[0].total_bytes == 2000
    w = IncastWorkload(type="incast", receiver="h3", senders=["h8", "h1"], size=7)
    assert [(f.src, f.dst) for f in workload_flows(w, HOSTS)] == [("h8", "h3"), ("h1", "h3")]


def test_flows_take_the_workload_size_unless_they_have_their_own():
    w = FlowsWorkload(type="flows", size=10, flows=[{"src": "h1", "dst": "h2"},
                                                     {"src": "h2", "dst": "h1", "size": 3, "start": "5ms"}])
    assert workload_flows(w, HOSTS) == [Flow("h1", "h2", 10, 1, 0.0), Flow("h2", "h1", 3, 1, 5e-3)]
    assert agent_hosts(workload_flows(w, HOSTS), HOSTS) == ["h1", "h2"]


def test_line_rate_time_is_the_busiest_link_direction_plus_the_latest_start():
    rate = 8e6  # 1 MB/s
    incast = [Flow(f"h{i}", "h1", 1_000_000) for i in range(2, 5)]
    assert flows_line_rate_s(incast, rate, 1000) == pytest.approx(3.0)  # h1 receives 3 MB
    # full duplex: h1 sends 2 MB and receives 2 MB: 2 s, not 4; h3 starts at 1 ms x 1000
    flows = [Flow("h1", "h2", 2_000_000), Flow("h2", "h1", 1_000_000),
             Flow("h3", "h1", 1_000_000, start_s=1e-3)]
    assert flows_line_rate_s(flows, rate, 1000) == pytest.approx(2.0 + 1.0)
    assert flows_line_rate_s([Flow("h1", "h2", 1_000_000, iterations=3)], rate, 1) == pytest.approx(3.0)


# ----------------------------------------------------------------------------- agent config

def flows_config(host: str = "h1", flows=None) -> AgentConfig:
    flows = flows or (FlowConfig(src="h2", dst="h1", size=100, qps=2),
                      FlowConfig(src="h1", dst="h2", size=50, start_s=0.2, iterations=3))
    return AgentConfig(
        host=host, ip="10.0.1.1" if host == "h1" else "10.0.1.2", rate_bps=50e6, roce_mtu=4096,
        ranks=(RankInfo(name="h1", ip="10.0.1.1", index=0), RankInfo(name="h2", ip="10.0.1.2", index=1)),
        rank=0 if host == "h1" else 1, workload=FlowsConfig(type="flows", flows=flows), seed=1,
        stats_path="/tmp/x.json", timeout_s=10.0)


def test_agent_config_carries_flows_and_still_the_ring():
    cfg = flows_config()
    assert AgentConfig.from_json(cfg.to_json()) == cfg
    assert json.loads(cfg.to_json())["workload"]["flows"][1]["start_s"] == 0.2
    ring = json.loads(cfg.to_json())
    ring["workload"] = {"size": 1000, "iterations": 1, "qps_per_peer": 2}  # no type: the ring
    assert isinstance(AgentConfig.from_json(json.dumps(ring)).workload, RingConfig)


@pytest.mark.parametrize("flow,field", [
    ({"src": "h3", "dst": "h1", "size": 1, "qps": 1}, "workload.flows.0.src"),
    ({"src": "h1", "dst": "h1", "size": 1, "qps": 1}, "workload.flows.0.dst"),
])
def test_agent_config_rejects_flows_outside_the_ranks(flow, field):
    data = json.loads(flows_config().to_json())
    data["workload"]["flows"] = [flow]
    with pytest.raises(ConfigError) as exc:
        AgentConfig.from_json(json.dumps(data))
    assert field in str(exc.value)


def test_orchestrator_dilates_start_times_and_runs_only_the_hosts_involved(spec_dir, tmp_path):
    from fabric_emu.run.prepare import load_checked
    from fabric_emu.nic.launch import agent_configs, unchecked_pairs

    (spec_dir / "exp.yaml").write_text(
        "name: e\ntopology: topo.yaml\nworkload: {type: flows, flows: [{src: h1, dst: h5, size: 1MB},"
        " {src: h3, dst: h5, size: 2MB, qps: 2, start: 100us}]}\n")
    spec, plan, ranks = load_checked(spec_dir / "exp.yaml", [])
    cfgs = agent_configs(spec, plan, ranks, tmp_path)
    assert [c.host for c in cfgs] == ["h1", "h3", "h5"] and [c.rank for c in cfgs] == [0, 1, 2]
    flows = cfgs[0].workload.flows
    assert flows[1].start_s == pytest.approx(100e-6 * 2000) and flows[1].qps == 2
    assert all(c.workload == cfgs[0].workload for c in cfgs)
    # the ring of pings covers h1->h3, h3->h5 and h5->h1; h1->h5 needs its own
    assert unchecked_pairs(cfgs[0].workload, ranks) == [("h1", "h5")]


def test_qp_table_with_one_count_per_flow():
    edges = [("h1", "h2"), ("h3", "h2"), ("h1", "h2")]  # an edge may repeat: two flows
    table = build_qp_table(edges, [2, 1, 3], seed=5)
    assert [(q.src, q.dst, q.index) for q in table] == [
        ("h1", "h2", 0), ("h1", "h2", 1), ("h3", "h2", 0), ("h1", "h2", 0), ("h1", "h2", 1), ("h1", "h2", 2)]
    assert len({q.dst_qpn for q in table}) == 6
    assert len({q.udp_sport for q in table if q.src == "h1"}) == 5
    ring = ring_edges(["h1", "h2", "h3"])  # the ring's table does not change
    assert build_qp_table(ring, 2, seed=5) == build_qp_table(ring, [2, 2, 2], seed=5)
    with pytest.raises(ValueError):
        build_qp_table(edges, [1, 1], seed=5)


def test_own_qps_follow_the_table_order():
    flows = flows_config().workload.flows + (FlowConfig(src="h2", dst="h1", size=9, qps=1),)
    table = build_qp_table([(f.src, f.dst) for f in flows], [f.qps for f in flows], seed=1)
    send, recv = own_qps(flows, "h1")
    assert send == [1] and recv == [0, 0, 2]
    assert [q.dst for q in table if q.src == "h1"] == ["h2"]
    assert len([q for q in table if q.dst == "h1"]) == len(recv)


# ----------------------------------------------------------------------------- the driver

class FakeSendQp:
    def __init__(self):
        self.messages_sent = 0  # last packet handed to the kernel
        self.messages_done = 0  # acknowledged

    def set(self, sent: int, acked: int | None = None) -> None:
        self.messages_sent = sent
        self.messages_done = sent if acked is None else acked


class FakeRecvQp:
    def __init__(self):
        self.messages = 0


class FakeNic:
    def __init__(self, n_send: int, n_recv: int):
        self.send_qps = [FakeSendQp() for _ in range(n_send)]
        self.recv_qps = [FakeRecvQp() for _ in range(n_recv)]
        self.posted: list[tuple[int, int, float]] = []

    def post_write(self, qp: int, nbytes: int, now: float) -> None:
        self.posted.append((qp, nbytes, now))


GO = 1000.0


def test_sender_posts_at_its_start_and_iterations_back_to_back():
    flows = (FlowConfig(src="h1", dst="h2", size=101, qps=2, iterations=2, start_s=0.5),)
    nic = FakeNic(2, 0)
    run = FlowRunner(flows, "h1", nic, GO)
    assert run.wake_at == GO + 0.5
    run.advance(GO + 0.4)
    assert nic.posted == [] and not run.finished
    run.advance(GO + 0.5)
    assert nic.posted == [(0, 51, GO + 0.5), (1, 50, GO + 0.5)]  # one message per QP
    assert run.wake_at is None
    nic.send_qps[0].set(1, 0)  # one QP's part has left, the other's not yet
    run.advance(GO + 0.6)
    assert len(nic.posted) == 2
    nic.send_qps[1].set(1, 0)  # iteration 0 has left: iteration 1 goes at once, unacknowledged
    run.advance(GO + 0.7)
    assert nic.posted[2:] == [(0, 51, GO + 0.7), (1, 50, GO + 0.7)]
    for sq in nic.send_qps:
        sq.set(2, 1)
    run.advance(GO + 0.9)
    assert not run.finished  # everything has left, not everything is acknowledged
    for sq in nic.send_qps:
        sq.set(2)
    run.advance(GO + 1.0)
    assert run.finished and len(nic.posted) == 4
    (log,) = run.flow_log
    assert log["sent"] == GO + 0.9 and log["acked"] == GO + 1.0 and log["start"] == GO + 0.5
    assert [(it["posted"], it["sent"]) for it in log["iterations"]] == [(GO + 0.5, GO + 0.7), (GO + 0.7, GO + 0.9)]


def test_receiver_finishes_when_every_qp_has_its_messages():
    flows = (FlowConfig(src="h2", dst="h1", size=10, qps=2, iterations=3),
             FlowConfig(src="h3", dst="h1", size=10, qps=1, start_s=1.0))
    nic = FakeNic(0, 3)
    run = FlowRunner(flows, "h1", nic, GO)
    assert run.wake_at is None  # nothing to send: it only waits for data
    nic.recv_qps[0].messages = nic.recv_qps[1].messages = 3
    run.advance(GO + 1)
    assert not run.finished
    nic.recv_qps[2].messages = 1
    run.advance(GO + 2)
    assert run.finished
    assert [(e["flow"], e["role"], e["received"]) for e in run.flow_log] == [
        (0, "receive", GO + 1), (1, "receive", GO + 2)]
    assert run.flow_log[0]["expected_bytes"] == [15, 15]


def test_a_host_that_sends_and_receives_finishes_when_both_are_done():
    flows = (FlowConfig(src="h1", dst="h2", size=10, qps=1), FlowConfig(src="h2", dst="h1", size=10, qps=1))
    nic = FakeNic(1, 1)
    run = FlowRunner(flows, "h1", nic, GO)
    run.advance(GO)
    nic.send_qps[0].set(1)
    run.advance(GO + 1)
    assert not run.finished
    nic.recv_qps[0].messages = 1
    run.advance(GO + 2)
    assert run.finished


def test_driver_refuses_a_nic_that_does_not_match_the_flows():
    flows = (FlowConfig(src="h1", dst="h2", size=10, qps=2),)
    with pytest.raises(ValueError):
        FlowRunner(flows, "h1", FakeNic(1, 0), GO)


def test_with_a_gap_the_next_iteration_waits_for_the_ack_then_the_gap():
    flows = (FlowConfig(src="h1", dst="h2", size=10, qps=1, iterations=2, gap_s=0.3),)
    nic = FakeNic(1, 0)
    run = FlowRunner(flows, "h1", nic, GO)
    run.advance(GO)
    assert nic.posted == [(0, 10, GO)]
    nic.send_qps[0].set(1, 0)  # left the NIC, not acknowledged: no gap starts yet
    run.advance(GO + 0.1)
    assert len(nic.posted) == 1 and run.wake_at is None
    nic.send_qps[0].set(1, 1)  # acknowledged at GO + 0.2: the flow idles until GO + 0.5
    run.advance(GO + 0.2)
    assert len(nic.posted) == 1 and run.wake_at == pytest.approx(GO + 0.5)
    run.advance(GO + 0.45)
    assert len(nic.posted) == 1
    run.advance(GO + 0.5)
    assert nic.posted[1] == (0, 10, GO + 0.5) and run.wake_at is None
    nic.send_qps[0].set(2, 2)
    run.advance(GO + 0.6)
    assert run.finished


def test_gaps_count_in_the_line_rate_time():
    flows = [Flow("h1", "h2", 1_000_000, iterations=3, gap_s=1e-3)]
    assert flows_line_rate_s(flows, 8e6, 1000) == pytest.approx(3.0 + 2 * 1e-3 * 1000)
