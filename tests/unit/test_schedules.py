"""Schedules of collectives, pipelines and training steps: step counts, bytes per rank,
dependencies, placement, and their run on fake NICs (tests/unit/program_sim.py)."""

from __future__ import annotations

import pytest

from fabric_emu.workloads import collectives, jobs, training
from fabric_emu.workloads.program import COMPUTE, RECV, SEND, Program
from tests.unit import program_sim

HOSTS = [f"h{i}" for i in range(1, 9)]


def sent_by(p: Program) -> dict[str, int]:
    return p.bytes_sent()


def received_by(p: Program) -> dict[str, int]:
    out: dict[str, int] = {}
    for o in p.ops:
        if o.kind == RECV:
            out[o.host] = out.get(o.host, 0) + o.nbytes
    return out


@pytest.mark.parametrize("coll,algo,steps", [
    ("allreduce", "ring", 14), ("allreduce", "halving-doubling", 6), ("reducescatter", "ring", 7),
    ("allgather", "ring", 7), ("alltoall", "pairwise", 7), ("sendrecv", "ring", 1)])
def test_collective_bytes_and_messages_per_rank(coll, algo, steps):
    size = 8 * 1000 * 1000
    p = collectives.collective_program("j", coll, algo, HOSTS, size)
    p.check()
    n = len(HOSTS)
    want = collectives.bytes_per_rank(coll, size, n)
    for h in HOSTS:
        assert sent_by(p)[h] == pytest.approx(want, rel=1e-6)
        assert received_by(p)[h] == pytest.approx(want, rel=1e-6)
        sends = [o for o in p.host_ops(h) if o.kind == SEND]
        assert len(sends) == steps  # messages a rank sends in one collective


def test_ring_step_waits_for_the_previous_receive():
    p = collectives.collective_program("j", "allreduce", "ring", HOSTS[:4], 4000)
    for h in HOSTS[:4]:
        sends = [o for o in p.host_ops(h) if o.kind == SEND]
        recvs = [o for o in p.host_ops(h) if o.kind == RECV]
        assert sends[0].deps == []
        for k in range(1, len(sends)):
            assert sends[k].deps == [recvs[k - 1].id]


def test_halving_doubling_partners_and_halves():
    segs = collectives.halving_doubling_segments(8, 5)
    assert [s[0] for s in segs] == [1, 7, 4]  # 5 xor 4, 5 xor 2, 5 xor 1
    assert [b - a for _, (a, b) in segs] == [4, 2, 1]  # chunks sent: halves, quarters, ...
    with pytest.raises(ValueError, match="power-of-two"):
        collectives.halving_doubling_segments(6, 0)


def test_alltoall_sends_every_peer_at_once():
    p = collectives.collective_program("j", "alltoall", "pairwise", HOSTS[:4], 4000)
    for h in HOSTS[:4]:
        sends = [o for o in p.host_ops(h) if o.kind == SEND]
        assert {p.channels[o.channel].dst for o in sends} == set(HOSTS[:4]) - {h}
        assert all(o.deps == [] for o in sends)


@pytest.mark.parametrize("coll,algo", sorted(collectives.FRAGMENTS))
def test_collectives_complete_on_fake_nics_in_line_rate_time(coll, algo):
    """On a wire with no latency and no shared links, each collective takes its bytes per rank
    at the link rate (the definition of busbw = link rate), iterations back to back."""
    size, rate = 8_000_000, 1e9
    p = collectives.collective_program("j", coll, algo, HOSTS, size, iterations=2)
    runners, _, end = program_sim.run(p, rate_Bps=rate)
    per_rank = collectives.bytes_per_rank(coll, size, len(HOSTS))
    if coll == "alltoall":  # n-1 messages leave at once over n-1 QPs of one fake NIC
        assert end == pytest.approx(2 * size / len(HOSTS) / rate, rel=1e-6)
    else:
        assert end == pytest.approx(2 * per_rank / rate, rel=1e-6)


@pytest.mark.parametrize("schedule", ["gpipe", "1f1b"])
def test_stage_orders(schedule):
    p, m = 4, 6
    for s in range(p):
        order = training.stage_order(schedule, p, s, m)
        assert sorted(order) == sorted([("F", i) for i in range(m)] + [("B", i) for i in range(m)])
        assert all(order.index(("F", i)) < order.index(("B", i)) for i in range(m))
    assert training.stage_order("1f1b", 4, 0, 6)[:4] == [("F", 0), ("F", 1), ("F", 2), ("F", 3)]
    assert training.stage_order("1f1b", 4, 3, 6)[:4] == [("F", 0), ("B", 0), ("F", 1), ("B", 1)]


@pytest.mark.parametrize("schedule", ["gpipe", "1f1b"])
@pytest.mark.parametrize("p_,m", [(4, 8), (2, 4), (3, 1)])
def test_pipeline_bubble_matches_theory(schedule, p_, m):
    prog = Program()
    grid = [[[f"h{s + 1}"] for s in range(p_)]]
    training.training_step(prog, "pipe", grid, microbatches=m, schedule=schedule, forward_s=1.0,
                           backward_s=2.0, activation_bytes=0, gradient_bytes=0)
    prog.check()
    runners, _, end = program_sim.run(prog, rate_Bps=1e12)
    assert end == pytest.approx((m + p_ - 1) * 3.0)
    t = program_sim.times(prog, runners)
    split = training.step_split(prog, t, "pipe", 0, (0.0, end))
    busy = [s["compute"] / end for s in split.values()]
    assert 1 - sum(busy) / len(busy) == pytest.approx(training.bubble_fraction(p_, m))
    for s in split.values():  # the split accounts for the whole step
        assert sum(s.values()) == pytest.approx(end)
        assert s["compute"] == pytest.approx(3.0 * m)


def test_training_step_split_and_messages():
    prog = Program()
    grid = training.place(2, 2, 2, "topology-aware", [HOSTS[:4], HOSTS[4:]])
    training.training_step(prog, "t", grid, microbatches=4, schedule="1f1b", forward_s=1e-3,
                           backward_s=2e-3, activation_bytes=1000, gradient_bytes=1000,
                           tp_bytes=100_000, dp_bytes=1_000_000)
    prog.check()
    runners, _, end = program_sim.run(prog, rate_Bps=1e8, latency_s=1e-5)
    t = program_sim.times(prog, runners)
    split = training.step_split(prog, t, "t", 0, (0.0, end))
    for h, s in split.items():
        assert sum(s.values()) == pytest.approx(end)
        assert s["tp"] > 0 and s["dp"] > 0 and s["compute"] == pytest.approx(4 * 3e-3)
    # every pass all-reduces over TP (2 ring steps per rank), forward and backward, per microbatch
    tp_sends = [o for o in prog.host_ops("h1") if o.kind == SEND and o.cat == "tp"]
    assert len(tp_sends) == 4 * 2 * 2
    assert sum(o.nbytes for o in prog.host_ops("h1") if o.kind == SEND and o.cat == "dp") == 1_000_000


def test_placement_topology_aware_vs_naive():
    leaves = [HOSTS[:4], HOSTS[4:]]
    aware = training.place(2, 2, 2, "topology-aware", leaves)
    leaf = {h: i for i, hs in enumerate(leaves) for h in hs}
    for rep in aware:  # TP groups and pipeline neighbours under one leaf, replicas across
        for stage in rep:
            assert len({leaf[h] for h in stage}) == 1
        assert len({leaf[h] for stage in rep for h in stage}) == 1
    assert leaf[aware[0][0][0]] != leaf[aware[1][0][0]]
    naive = training.place(2, 2, 2, "naive", leaves)
    assert [h for rep in naive for st in rep for h in st] != [h for rep in aware for st in rep for h in st]
    assert all(len({leaf[h] for h in stage}) == 2 for rep in naive for stage in rep)  # TP spans leaves
    explicit = training.place(2, 1, 1, ["h3", "h7"], leaves)
    assert explicit == [[["h3", "h7"]]]
    with pytest.raises(ValueError, match="ranks"):
        training.place(4, 2, 2, "naive", leaves)


def test_tp_groups_stay_in_a_leaf_when_they_fit():
    assert training.tp_groups(2, [["a", "b", "c"], ["d", "e", "f"]]) == [["a", "b"], ["d", "e"], ["c", "f"]]


def test_program_rejects_cross_host_dependencies_and_cycles():
    p = Program()
    a = p.compute("j", "h1", 1.0)
    with pytest.raises(ValueError, match="depends"):
        p.compute("j", "h2", 1.0, [a])
    b = p.compute("j", "h1", 1.0, [a])
    p.add_deps(a, [b])
    with pytest.raises(ValueError, match="cycle"):
        p.check()


def test_channel_messages_post_in_order_even_when_ready_out_of_order():
    """The second message of a channel becomes ready first; it still waits for the first."""
    p = Program()
    slow = p.compute("j", "h1", 5.0)
    s1, _ = p.transfer("j", "x", "h1", "h2", 10, [slow])
    s2, _ = p.transfer("j", "x", "h1", "h2", 20)
    runners, nics, end = program_sim.run(p, rate_Bps=1e6)
    assert [n for _, n in nics["h1"].posted] == [10, 20]
    t = program_sim.times(p, runners)
    assert t[s2][0] == 0.0 and t[s2][1] >= 5.0
    assert jobs.op_times(p, {h: r.op_log() for h, r in runners.items()})[p.ops[-1].id] is not None
    assert p.ops[-1].kind == RECV and p.ops[0].kind == COMPUTE


def test_step_bounds_start_each_step_at_its_first_send_not_at_its_recvs():
    """A recv waits from the host's start whatever its step: step 2 starts when step 2's
    first send does, not at time 0."""
    from fabric_emu.workloads.jobs import step_bounds
    from fabric_emu.workloads.program import Program

    p = Program()
    s0, r0 = p.transfer("j", "ring", "a", "b", 100, step=0)
    s1, r1 = p.transfer("j", "ring", "a", "b", 100, deps=[s0], step=1)
    times = [None] * len(p.ops)
    times[s0], times[r0] = (1.0, 2.0), (0.0, 2.5)
    times[s1], times[r1] = (2.0, 3.0), (0.0, 3.5)
    assert step_bounds(p, times, "j") == [(1.0, 2.5), (2.0, 3.5)]
