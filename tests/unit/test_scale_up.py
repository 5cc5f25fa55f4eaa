"""The scale-up domain's fluid model (fabric_emu.nic.scale_up): times of transfers alone, sharing
a port, and on disjoint pairs of a crossbar."""

from __future__ import annotations

import json

import pytest

from fabric_emu.nic.config import (AgentConfig, ConfigError, EngineConfig, ProgramChannel, ProgramConfig,
                                     ProgramOp, RankInfo, ScaleUpConfig)
from fabric_emu.nic.drivers.program import channel_qps
from fabric_emu.nic.launch import engine_configs
from fabric_emu.nic.scale_up import ScaleUpChannels, ScaleUpDomain
from fabric_emu.workloads.program import SCALE_UP, Program
from tests.unit import program_sim

RATE = 1e9  # bytes/s per GPU and direction
LAT = 1e-3


def run_all(d: ScaleUpDomain, late_s: float = 0.0) -> dict:
    """Advance event by event (late_s after each is due, as an engine wakes) until idle; the
    completion time of each transfer."""
    out = {}
    for _ in range(1000):
        t = d.next_event()
        if t is None:
            return out
        out.update(d.advance(t + late_s))
    raise AssertionError("did not finish")


def test_one_transfer_takes_bytes_over_rate_plus_latency():
    d = ScaleUpDomain(RATE, LAT)
    assert d.start("a", "g0", "g1", 4_000_000, 2.0) == []
    assert d.next_event() == pytest.approx(2.0 + LAT)  # begins moving
    assert d.advance(2.0 + LAT) == []
    assert d.next_event() == pytest.approx(2.0 + LAT + 4e-3)
    assert d.advance(2.003) == []  # not yet
    [(key, t)] = d.advance(10.0)  # noticed late: still the exact time
    assert key == "a" and t == pytest.approx(2.0 + LAT + 4e-3)
    assert d.next_event() is None


def test_two_from_one_sender_share_its_egress():
    d = ScaleUpDomain(RATE, 0.0)
    d.start("a", "g0", "g1", 1_000_000, 0.0)
    d.start("b", "g0", "g2", 1_000_000, 0.0)
    done = run_all(d)
    assert done["a"] == pytest.approx(2e-3) and done["b"] == pytest.approx(2e-3)


def test_two_into_one_receiver_share_its_ingress():
    d = ScaleUpDomain(RATE, 0.0)
    d.start("a", "g1", "g0", 1_000_000, 0.0)
    d.start("b", "g2", "g0", 3_000_000, 0.0)
    done = run_all(d)
    # Half the rate each until a ends at 2 ms (b has 2 MB left), then b alone at full rate.
    assert done["a"] == pytest.approx(2e-3)
    assert done["b"] == pytest.approx(4e-3)


def test_crossbar_disjoint_pairs_do_not_slow_each_other():
    d = ScaleUpDomain(RATE, LAT)
    for i, (s, r) in enumerate([("g0", "g1"), ("g1", "g0"), ("g2", "g3"), ("g3", "g2")]):
        d.start(i, s, r, 2_000_000, 0.0)
    done = run_all(d)
    assert all(t == pytest.approx(LAT + 2e-3) for t in done.values()) and len(done) == 4


def test_max_min_fair_rates_per_port():
    # a: g0->g1 and b: g0->g2 share g0's egress, c: g3->g2 shares g2's ingress with b: each
    # gets half; e (g5->g6) shares nothing and gets the full rate.
    d = ScaleUpDomain(RATE, 0.0)
    d.start("a", "g0", "g1", 10**9, 0.0)
    d.start("b", "g0", "g2", 10**9, 0.0)
    d.start("c", "g3", "g2", 10**9, 0.0)
    d.start("e", "g5", "g6", 10**9, 0.0)  # disjoint: full rate
    rates = {m.key: m.rate for m in d._moving}
    assert rates["a"] == pytest.approx(RATE / 2) and rates["b"] == pytest.approx(RATE / 2)
    assert rates["c"] == pytest.approx(RATE / 2) and rates["e"] == pytest.approx(RATE)


def test_later_start_joins_and_rates_change_at_that_time():
    d = ScaleUpDomain(RATE, 0.0)
    d.start("a", "g0", "g1", 2_000_000, 0.0)
    assert d.start("b", "g0", "g2", 1_000_000, 1e-3) == []  # a has 1 MB left
    done = run_all(d)
    # From 1 ms both at half rate: b (1 MB) and a (1 MB) both end at 3 ms.
    assert done["a"] == pytest.approx(3e-3) and done["b"] == pytest.approx(3e-3)


def test_start_returns_what_completed_before_it():
    d = ScaleUpDomain(RATE, 0.0)
    d.start("a", "g0", "g1", 1_000_000, 0.0)
    done = d.start("b", "g2", "g3", 1, 5e-3)
    assert [k for k, _ in done] == ["a"] and done[0][1] == pytest.approx(1e-3)


def test_empty_transfer_ends_after_the_latency():
    d = ScaleUpDomain(RATE, LAT)
    d.start("z", "g0", "g1", 0, 1.0)
    assert run_all(d) == {"z": pytest.approx(1.0 + LAT)}


def test_refuses_bad_rates_and_self_transfers():
    with pytest.raises(ValueError):
        ScaleUpDomain(0.0, 0.0)
    with pytest.raises(ValueError):
        ScaleUpDomain(RATE, 0.0).start("a", "g0", "g0", 1, 0.0)


# ---------------------------------------------------------------- the program driver on a domain

def domain(hosts=("g0", "g1", "g2", "g3"), latency=LAT) -> ScaleUpChannels:
    return ScaleUpChannels("srv1", hosts, RATE, latency)


def test_scale_up_message_ends_both_ops_at_its_modelled_time_and_uses_no_qps():
    p = Program()
    s, r = p.transfer("j", "x", "g0", "g1", 4_000_000, via=SCALE_UP)
    fs, fr = p.transfer("j", "y", "h5", "h6", 1_000_000)  # fabric, on the fake wire
    d = domain()
    runners, nics, _ = program_sim.run(p, rate_Bps=1e9, servers=[d])
    t = program_sim.times(p, runners)
    assert t[s] == pytest.approx((0.0, LAT + 4e-3)) and t[r] == pytest.approx((0.0, LAT + 4e-3))
    assert t[fr][1] == pytest.approx(1e-3)
    assert not nics["g0"].send_qps and not nics["g1"].recv_qps and not nics["g0"].posted
    assert d.stats["g0"] == {"sent_bytes": 4_000_000, "sent": 1, "received_bytes": 0, "received": 0}
    assert d.stats["g1"]["received_bytes"] == 4_000_000


def test_dependent_transfer_starts_when_the_first_is_delivered():
    p = Program()
    _, r1 = p.transfer("j", "x", "g0", "g1", 1_000_000, via=SCALE_UP)
    s2, r2 = p.transfer("j", "x", "g1", "g0", 1_000_000, deps=[r1], via=SCALE_UP)
    runners, _, end = program_sim.run(p, servers=[domain()])
    t = program_sim.times(p, runners)
    assert t[s2][0] == pytest.approx(LAT + 1e-3)
    assert t[r2][1] == pytest.approx(2 * (LAT + 1e-3)) and end == pytest.approx(t[r2][1])


def test_messages_of_one_channel_are_delivered_in_order():
    # The second message is smaller and started at once: it ends first in the fluid model, but
    # its ops are done only when the first one is delivered (as on a queue pair).
    p = Program()
    s1, r1 = p.transfer("j", "x", "g0", "g1", 3_000_000, via=SCALE_UP)
    s2, r2 = p.transfer("j", "x", "g0", "g1", 1_000_000, via=SCALE_UP)
    runners, _, _ = program_sim.run(p, servers=[domain(latency=0.0)])
    t = program_sim.times(p, runners)
    assert t[r1][1] == pytest.approx(4e-3) and t[r2][1] == pytest.approx(4e-3)


def test_concurrent_transfers_of_one_sender_take_twice_as_long():
    p = Program()
    ops = [p.transfer("j", f"x{k}", "g0", g, 2_000_000, via=SCALE_UP) for k, g in enumerate(["g1", "g2"])]
    runners, _, _ = program_sim.run(p, servers=[domain(latency=0.0)])
    t = program_sim.times(p, runners)
    assert all(t[r][1] == pytest.approx(4e-3) for _, r in ops)


def test_scale_up_channels_get_no_queue_pairs():
    cfg = ProgramConfig(type="program", channels=(
        ProgramChannel(src="g0", dst="g1", qps=2), ProgramChannel(src="g0", dst="g1", via="scale-up"),
        ProgramChannel(src="g0", dst="g1", qps=1)), ops=())
    send, recv = channel_qps(cfg, "g0")
    assert send == {0: [0, 1], 2: [2]} and recv == {}
    assert channel_qps(cfg, "g1")[1] == {0: [0, 1], 2: [2]}


# ---------------------------------------------------------------- refusals and placement

SRV = ScaleUpConfig(server="srv1", hosts=("g0", "g1"), rate_bps=8e9, latency_s=1e-3)
RANKS = tuple(RankInfo(name=h, ip=f"10.0.0.{i + 1}", index=i) for i, h in enumerate(["g0", "g1", "h2"]))


def agent(host: str, channel: ProgramChannel, scale_up: ScaleUpConfig | None = SRV, **over) -> AgentConfig:
    i = [r.name for r in RANKS].index(host)
    prog = ProgramConfig(type="program", channels=(channel,), ops=(
        ProgramOp(kind="send" if host == channel.src else "recv", channel=0, nbytes=10),))
    return AgentConfig(host=host, ip=RANKS[i].ip, rate_bps=1e9, roce_mtu=4096, ranks=RANKS, rank=i,
                       workload=prog, seed=1, stats_path=f"/tmp/{host}.json", timeout_s=10.0,
                       scale_up=scale_up, **over)


def test_agent_refuses_scale_up_to_a_host_of_another_server():
    bad = ProgramChannel(src="g0", dst="h2", via="scale-up")
    text = json.dumps({**json.loads(agent("g0", ProgramChannel(src="g0", dst="g1")).to_json()),
                       "workload": json.loads(ProgramConfig(type="program", channels=(bad,), ops=()).model_dump_json())})
    with pytest.raises(ConfigError) as e:
        AgentConfig.from_json(text)
    assert str(e.value).startswith("workload.channels.0.via") and "not GPUs of one server" in str(e.value)


def test_engine_refuses_a_server_split_over_engines():
    ch = ProgramChannel(src="g0", dst="g1", via="scale-up")
    ok = EngineConfig(engine=0, tick_s=1e-3, hosts=(agent("g0", ch), agent("g1", ch)))
    text = json.dumps({**json.loads(ok.to_json()), "hosts": [json.loads(agent("g0", ch).to_json())]})
    with pytest.raises(ConfigError) as e:
        EngineConfig.from_json(text)
    assert "g1 is served by another engine" in str(e.value)


def test_engine_configs_keep_a_servers_gpus_together():
    ch = ProgramChannel(src="g0", dst="g1", via="scale-up")
    cfgs = [agent("g0", ch), agent("h2", ch, scale_up=None), agent("g1", ch)]
    engines = engine_configs(cfgs, 1e-3, 2)
    assert [[h.host for h in e.hosts] for e in engines] == [["g0", "g1"], ["h2"]]
    # Without servers: round-robin, as before.
    lone = [agent(h, ProgramChannel(src="g0", dst="g1"), scale_up=None) for h in ("g0", "g1", "h2")]
    assert [[h.host for h in e.hosts] for e in engine_configs(lone, 1e-3, 2)] == [["g0", "h2"], ["g1"]]


# ---------------------------------------------------------------- results and fidelity notes

def test_results_count_scale_up_apart_and_note_it_was_modelled():
    from fabric_emu.measure.fidelity import scale_up_note
    from fabric_emu.results.table import summary_rows
    from fabric_emu.results.transport import nic_rows, scale_up_totals, transport_totals
    agents = {
        "g0": {"send_qps": [], "recv_qps": [],
               "scale_up": {"server": "srv1", "sent_bytes": 4096, "sent": 2, "received_bytes": 0, "received": 0}},
        "g1": {"send_qps": [], "recv_qps": [],
               "scale_up": {"server": "srv1", "sent_bytes": 0, "sent": 0, "received_bytes": 4096, "received": 2}},
        "h2": {"send_qps": [], "recv_qps": []},
    }
    tr = {**transport_totals(agents), **scale_up_totals(agents)}
    assert tr["scale_up_bytes"] == 4096 and tr["scale_up_transfers"] == 2 and tr["bytes_received"] == 0
    rows = nic_rows(agents)
    assert rows["g1"]["scale_up_bytes_received"] == 4096 and "scale_up_bytes_sent" not in rows["h2"]
    note = scale_up_note(agents)
    assert note is not None and "2 scale-up transfer(s)" in note and "4,096 bytes" in note and "modelled" in note
    assert scale_up_note({"h2": agents["h2"]}) is None and scale_up_totals({"h2": agents["h2"]}) == {}
    s = {"status": "ok", "workload": "x", "dilation": 1.0,
         "transport": {**tr, "retransmitted_packets": 0, "naks": 0, "timeouts": 0}}
    assert ("scale-up transfers / bytes (modelled)", "2 / 4,096", "") in summary_rows(s)


def test_launch_refuses_scale_up_outside_a_server_and_configs_the_domain_in_emulated_units():
    import dataclasses

    from fabric_emu.nic.launch import check_scale_up, scale_up_config
    from fabric_emu.spec.topology import TopologySpec
    from fabric_emu.topo.plan import Server, build_plan
    plan = build_plan(TopologySpec(name="t", kind="leaf-spine", spines=1, leaves=2, hosts_per_leaf=2,
                                   dilation=100))
    plan = dataclasses.replace(plan, servers=[Server("srv1", ("h1", "h2"), 800.0, 2e-6)])
    ok = ProgramConfig(type="program", channels=(ProgramChannel(src="h1", dst="h2", via="scale-up"),), ops=())
    check_scale_up(ok, plan)
    bad = ProgramConfig(type="program", channels=(ProgramChannel(src="h1", dst="h3", via="scale-up"),), ops=())
    with pytest.raises(ValueError, match="channel 0 .h1 -> h3. is scale-up, but h1 and h3 are not GPUs of one server"):
        check_scale_up(bad, plan)
    su = scale_up_config(plan, "h2")
    assert su.rate_bps == pytest.approx(800e9 / 100) and su.latency_s == pytest.approx(2e-4)
    assert scale_up_config(plan, "h3") is None


@pytest.mark.parametrize("late_s", [0.0, 37e-6])
@pytest.mark.parametrize("rate", [3.125e6, 1e9 / 3, 12.5e9 / 4000])
def test_epoch_sized_times_end_every_transfer(rate, late_s):
    # The engines' clock is epoch seconds (~1.8e9): a float step there is ~0.2 us, so bytes
    # left after an event may not reach zero exactly; every transfer must still end, once.
    d = ScaleUpDomain(rate, 5e-3)
    t0 = 1796402249.114113
    d.start("a", "g0", "g1", 2_000_003, t0)
    d.start("b", "g0", "g1", 2_000_001, t0 + 1e-7)
    d.start("c", "g1", "g0", 999_999, t0 + 3e-7)
    done = run_all(d, late_s)  # an engine's wake-ups come late, and then this looped forever
    assert set(done) == {"a", "b", "c"} and d.next_event() is None
    assert done["c"] - t0 == pytest.approx(999_999 / rate + 5e-3, rel=1e-4)
    assert done["a"] - t0 == pytest.approx(2 * 2_000_003 / rate + 5e-3, rel=1e-4)


def test_a_late_advance_at_epoch_times_does_not_loop():
    # The case of a real run that spun forever before `advance` ended transfers by their own
    # end time: 2 MB each way at 100 Gb/s / 4000, the engine waking 37 us late.
    d = ScaleUpDomain(100e9 / 4000 / 8, 0.08)
    t0 = 1796402336.737856
    for k, (s, r) in enumerate([("h1", "h3"), ("h1", "h3"), ("h3", "h1")]):
        d.start(k, s, r, 2_000_000, t0)
    done = run_all(d, 37e-6)
    assert done[2] - t0 == pytest.approx(0.72) and done[0] - t0 == pytest.approx(1.36)


def test_fabric_figures_of_a_program_leave_scale_up_out():
    from fabric_emu.workloads import jobs
    p = Program()
    p.transfer("j", "x", "g0", "g1", 5_000, via=SCALE_UP)
    p.transfer("j", "y", "g0", "h2", 7_000)
    assert jobs.fabric_bytes(p) == 7_000 and jobs.pairs(p) == [("g0", "h2")]
