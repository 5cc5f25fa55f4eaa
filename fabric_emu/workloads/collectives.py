"""Collective schedules and their metrics, pure: what each rank sends, to whom, and when.

Ring all-reduce = ring reduce-scatter then ring all-gather, 2(n-1) steps. In step k rank r
sends one chunk to its right neighbour (r+1) and receives one from its left neighbour (r-1):
reduce-scatter (k < n-1) sends chunk (r-k) mod n, all-gather (k' = k-(n-1)) sends chunk
(r-k'+1) mod n. Each chunk is split over the queue pairs to the neighbour, one RDMA WRITE
message per queue pair per step, the way NCCL spreads a step over its channels.
Metrics follow nccl-tests (docs/reference/protocol_facts.md §5.1).
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property

REDUCE_SCATTER = "reduce_scatter"
ALL_GATHER = "all_gather"


def split_even(nbytes: int, parts: int) -> list[int]:
    """nbytes in `parts` near-equal pieces, the larger ones first."""
    if parts < 1:
        raise ValueError(f"parts must be >= 1, got {parts}")
    base, extra = divmod(nbytes, parts)
    return [base + 1 if i < extra else base for i in range(parts)]


def chunk_sizes(size: int, n: int) -> list[int]:
    """Bytes of each of the n chunks of an S-byte buffer: S//n, +1 for the first S%n."""
    return split_even(size, n)


def ring_edges(ranks: list[str]) -> list[tuple[str, str]]:
    """The (sender, receiver) pairs of a ring, in rank order."""
    n = len(ranks)
    return [(ranks[r], ranks[(r + 1) % n]) for r in range(n)]


@dataclass(frozen=True)
class RingStep:
    """What one rank does in one step of one iteration."""

    step: int  # 0 .. 2(n-1)-1
    phase: str  # REDUCE_SCATTER | ALL_GATHER
    send_chunk: int
    recv_chunk: int
    send_parts: tuple[int, ...]  # bytes per queue pair to the right neighbour
    recv_parts: tuple[int, ...]  # bytes per queue pair from the left neighbour

    @property
    def send_bytes(self) -> int:
        return sum(self.send_parts)

    @property
    def recv_bytes(self) -> int:
        return sum(self.recv_parts)


@dataclass(frozen=True)
class RingAllReduce:
    """The ring all-reduce schedule of one rank.

    Steps are numbered globally across iterations: g = iteration * steps_per_iteration + step.
    """

    ranks: tuple[str, ...]
    rank: int
    size: int
    qps_per_peer: int
    iterations: int

    def __post_init__(self) -> None:
        if len(self.ranks) < 2:
            raise ValueError("a ring needs at least 2 ranks")
        if not 0 <= self.rank < len(self.ranks):
            raise ValueError(f"rank {self.rank} is not in 0..{len(self.ranks) - 1}")
        if self.size < 0 or self.qps_per_peer < 1 or self.iterations < 1:
            raise ValueError("size >= 0, qps_per_peer >= 1 and iterations >= 1 are required")

    @cached_property
    def n(self) -> int:
        return len(self.ranks)

    @property
    def right(self) -> str:
        return self.ranks[(self.rank + 1) % self.n]

    @property
    def left(self) -> str:
        return self.ranks[(self.rank - 1) % self.n]

    @cached_property
    def steps_per_iteration(self) -> int:
        return 2 * (self.n - 1)

    @cached_property
    def total_steps(self) -> int:
        return self.iterations * self.steps_per_iteration

    @cached_property
    def steps(self) -> tuple[RingStep, ...]:
        """The steps of one iteration (every iteration is the same)."""
        n, r = self.n, self.rank
        chunks = chunk_sizes(self.size, n)
        out = []
        for k in range(self.steps_per_iteration):
            if k < n - 1:
                phase, send, recv = REDUCE_SCATTER, (r - k) % n, (r - k - 1) % n
            else:
                kk = k - (n - 1)
                phase, send, recv = ALL_GATHER, (r - kk + 1) % n, (r - kk) % n
            out.append(RingStep(k, phase, send, recv,
                                tuple(split_even(chunks[send], self.qps_per_peer)),
                                tuple(split_even(chunks[recv], self.qps_per_peer))))
        return tuple(out)

    def locate(self, global_step: int) -> tuple[int, int]:
        """(iteration, step within the iteration) of a global step."""
        return divmod(global_step, self.steps_per_iteration)

    def may_start(self, global_step: int, received_steps: int, all_sent: bool) -> bool:
        """Whether this rank may start sending `global_step`.

        received_steps: global steps fully received from the left neighbour so far;
        all_sent: every earlier step's data has left this rank. Step k>0 needs step k-1's chunk
        (it carries data to reduce or forward); step 0 of a later iteration needs the previous
        iteration finished, sent and received.
        """
        iteration, step = self.locate(global_step)
        if step > 0:
            return received_steps >= global_step
        return iteration == 0 or (received_steps >= global_step and all_sent)


def algbw(size: int, seconds: float) -> float:
    """Algorithm bandwidth in bytes/s: S / t (nccl-tests)."""
    return size / seconds


def allreduce_busbw(algbw_value: float, n: int) -> float:
    """Bus bandwidth of an all-reduce: algbw x 2(n-1)/n, comparable to the link rate."""
    return algbw_value * 2 * (n - 1) / n


def ring_allreduce_line_rate_s(size: int, n: int, iterations: int, rate_bps: float) -> float:
    """Time at line rate: each rank sends 2(n-1)/n x size per iteration (payload only)."""
    return iterations * 2 * (n - 1) / n * size * 8 / rate_bps
