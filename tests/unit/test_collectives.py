"""Ring all-reduce schedule: bytes, chunk order, queue-pair split, start rules, metrics."""

import pytest

from fabric_emu.workloads.collectives import (
    ALL_GATHER,
    REDUCE_SCATTER,
    RingAllReduce,
    algbw,
    allreduce_busbw,
    chunk_sizes,
    ring_edges,
    split_even,
)

RANKS = ("h1", "h2", "h3", "h4", "h5")


def schedules(n: int, size: int, q: int = 1) -> list[RingAllReduce]:
    return [RingAllReduce(RANKS[:n], r, size, q, 1) for r in range(n)]


@pytest.mark.parametrize("n", [2, 3, 4, 5])
@pytest.mark.parametrize("size", [0, 1, 7, 1000, 2_000_003])
def test_every_rank_sends_2_n_minus_1_over_n_of_s(n, size):
    for s in schedules(n, size, q=3):
        sent = sum(step.send_bytes for step in s.steps)
        received = sum(step.recv_bytes for step in s.steps)
        assert len(s.steps) == 2 * (n - 1)
        assert abs(sent - 2 * (n - 1) / n * size) <= 2 * (n - 1)
        assert abs(received - 2 * (n - 1) / n * size) <= 2 * (n - 1)


def test_chunk_sizes():
    assert chunk_sizes(10, 3) == [4, 3, 3]
    assert chunk_sizes(9, 3) == [3, 3, 3]
    assert sum(chunk_sizes(2_000_003, 7)) == 2_000_003


@pytest.mark.parametrize("nbytes,parts", [(10, 3), (2, 4), (0, 2), (333_334, 2)])
def test_qp_split_sums_and_is_near_equal(nbytes, parts):
    pieces = split_even(nbytes, parts)
    assert len(pieces) == parts and sum(pieces) == nbytes
    assert max(pieces) - min(pieces) <= 1


@pytest.mark.parametrize("n", [2, 3, 4, 5])
def test_chunk_indices_follow_the_ring(n):
    scheds = schedules(n, 1000)
    for s in scheds:
        r = s.rank
        for step in s.steps:
            k = step.step
            if k < n - 1:
                assert step.phase == REDUCE_SCATTER
                assert step.send_chunk == (r - k) % n
            else:
                assert step.phase == ALL_GATHER
                assert step.send_chunk == (r - (k - n + 1) + 1) % n
            # what I receive is what my left neighbour sends in the same step
            left = scheds[(r - 1) % n].steps[k]
            assert step.recv_chunk == left.send_chunk
            assert step.recv_parts == left.send_parts
    # after reduce-scatter, rank r owns the reduced chunk (r+1) % n and all-gather starts there
    for s in scheds:
        assert s.steps[n - 1].send_chunk == (s.rank + 1) % n
        assert s.steps[n - 2].recv_chunk == (s.rank + 1) % n


def test_neighbours_and_edges():
    s = RingAllReduce(("a", "b", "c"), 0, 100, 2, 3)
    assert (s.left, s.right) == ("c", "b")
    assert ring_edges(["a", "b", "c"]) == [("a", "b"), ("b", "c"), ("c", "a")]
    assert s.total_steps == 12 and s.locate(5) == (1, 1)


def test_start_rules():
    s = RingAllReduce(("a", "b", "c"), 1, 100, 1, 2)  # 4 steps per iteration
    assert s.may_start(0, received_steps=0, all_sent=False)
    assert not s.may_start(1, received_steps=0, all_sent=True)
    assert s.may_start(1, received_steps=1, all_sent=False)
    # step 0 of iteration 1 needs iteration 0 fully received and sent
    assert not s.may_start(4, received_steps=3, all_sent=True)
    assert not s.may_start(4, received_steps=4, all_sent=False)
    assert s.may_start(4, received_steps=4, all_sent=True)


def test_rejects_bad_rings():
    with pytest.raises(ValueError):
        RingAllReduce(("a",), 0, 10, 1, 1)
    with pytest.raises(ValueError):
        RingAllReduce(("a", "b"), 2, 10, 1, 1)
    with pytest.raises(ValueError):
        RingAllReduce(("a", "b"), 0, 10, 0, 1)


def test_bandwidth_definitions():
    assert algbw(8_000_000, 0.5) == 16_000_000
    assert allreduce_busbw(16e6, 4) == pytest.approx(24e6)
    assert allreduce_busbw(16e6, 2) == pytest.approx(16e6)
    # a ring moving 2(n-1)/n * S per rank at link rate B takes t = S/B * 2(n-1)/n: busbw == B
    n, size, link = 8, 1_000_000, 5e6
    t = size / link * 2 * (n - 1) / n
    assert allreduce_busbw(algbw(size, t), n) == pytest.approx(link)
