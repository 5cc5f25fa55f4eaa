"""Every collective, pure: how its ranks' messages are scheduled, and how it is measured.

Algorithms (the byte counts nccl-tests uses; docs/reference/protocol_facts.md §5):
* ring all-reduce: reduce-scatter then all-gather around the ring, 2(n-1) steps of S/n;
* halving-doubling all-reduce (Rabenseifner): log2 n recursive-halving reduce-scatter steps with
  partners r xor n/2, n/4, ..., then the same steps back for the all-gather (n a power of two);
* reduce-scatter and all-gather: the ring's halves, n-1 steps of S/n each;
* all-to-all: every rank sends S/n to every other rank at once (NCCL posts them as one group);
* sendrecv: every rank sends S to the next rank and receives S from the previous one.
Within a ring or halving-doubling schedule, a rank's step k send waits for its step k-1
receive: the data it forwards or reduces.

Ring all-reduce = ring reduce-scatter then ring all-gather, 2(n-1) steps. In step k rank r
sends one chunk to its right neighbour (r+1) and receives one from its left neighbour (r-1):
reduce-scatter (k < n-1) sends chunk (r-k) mod n, all-gather (k' = k-(n-1)) sends chunk
(r-k'+1) mod n. Each chunk is split over the queue pairs to the neighbour, one RDMA WRITE
message per queue pair per step, the way NCCL spreads a step over its channels:

    n = 4, reduce-scatter step k = 0:   r0 --c0--> r1 --c1--> r2 --c2--> r3 --c3--> r0

The same schedules in two forms:
* RingAllReduce: one rank's ring all-reduce, for the ring driver of a single
  `workload: {type: allreduce}` (fabric_emu.nic.drivers.ring);
* Program fragments (ring_allreduce, halving_doubling_allreduce, ring_reducescatter,
  ring_allgather, alltoall, sendrecv; collective_program repeats one): for jobs run as a Program
  (fabric_emu.workloads.jobs) and the TP and DP all-reduces of a training step
  (fabric_emu.workloads.training). A fragment adds its operations for a group of hosts (in rank
  order) after `entry[host]` (ops each rank must finish first) and returns `exit[host]`: the ops
  whose end is the collective's end at that rank. So collectives compose: the tensor-parallel
  all-reduces of a training step wait for the compute before them, and the compute after waits
  for them.

Metrics follow nccl-tests (docs/reference/protocol_facts.md §5.1): algbw = S / t and
busbw = algbw x busbw_factor, comparable to the link rate.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import cached_property

from fabric_emu.workloads.program import Program

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


# --------------------------------------------------------------------------- the ring driver's schedule

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


# --------------------------------------------------------------------------- Program fragments

Entry = dict[str, list[int]]  # host -> ops the fragment waits for at that host
Exit = dict[str, list[int]]


def _stepwise(p: Program, job: str, hosts: Sequence[str], entry: Entry, moves: list[list[tuple[int, int]]],
              stream: str, cat: str | None, step: int, qps: int) -> Exit:
    """Lock-step exchanges: at step k rank r sends moves[k][r] = (peer rank, bytes) once it has
    received its message of step k-1 (the first step waits for `entry`)."""
    last_recv: dict[str, int] = {}
    last_send: dict[str, int] = {}
    for k, step_moves in enumerate(moves):
        got: dict[str, int] = {}
        for r, (peer, nbytes) in enumerate(step_moves):
            h = hosts[r]
            deps = entry.get(h, []) if k == 0 else [last_recv[h]]
            s, rcv = p.transfer(job, stream, h, hosts[peer], nbytes, deps, cat, step, qps)
            last_send[h] = s
            got[hosts[peer]] = rcv
        last_recv = got
    return {h: [last_send[h], last_recv[h]] for h in hosts}


def _ring_steps(p: Program, job: str, hosts: Sequence[str], entry: Entry, sizes: Callable[[int, int], int],
                steps: int, stream: str, cat: str | None, step: int, qps: int) -> Exit:
    """`steps` ring steps: in step k rank r sends sizes(r, k) bytes to r+1."""
    n = len(hosts)
    moves = [[((r + 1) % n, sizes(r, k)) for r in range(n)] for k in range(steps)]
    return _stepwise(p, job, hosts, entry, moves, stream, cat, step, qps)


def _passthrough(hosts: Sequence[str], entry: Entry) -> Exit:
    return {h: list(entry.get(h, [])) for h in hosts}


def ring_allreduce(p: Program, job: str, hosts: Sequence[str], size: int, entry: Entry, *,
                   stream: str = "ring", cat: str | None = None, step: int = 0, qps: int = 1) -> Exit:
    n = len(hosts)
    if n < 2:
        return _passthrough(hosts, entry)
    chunks = chunk_sizes(size, n)

    def sizes(r: int, k: int) -> int:  # RingAllReduce's chunk order
        return chunks[(r - k) % n] if k < n - 1 else chunks[(r - (k - (n - 1)) + 1) % n]

    return _ring_steps(p, job, hosts, entry, sizes, 2 * (n - 1), stream, cat, step, qps)


def ring_reducescatter(p: Program, job: str, hosts: Sequence[str], size: int, entry: Entry, *,
                       stream: str = "ring", cat: str | None = None, step: int = 0, qps: int = 1) -> Exit:
    """n-1 ring steps of S/n: in step k rank r sends chunk r-k (all-gather moves the same bytes)."""
    n = len(hosts)
    if n < 2:
        return _passthrough(hosts, entry)
    chunks = chunk_sizes(size, n)
    return _ring_steps(p, job, hosts, entry, lambda r, k: chunks[(r - k) % n], n - 1, stream, cat, step, qps)


ring_allgather = ring_reducescatter  # the same messages; only what the data means differs


def server_groups(p: Program, hosts: Sequence[str]) -> list[list[str]] | None:
    """The ranks grouped by server (servers in rank order, each one's ranks in GPU order), when
    the ranks fill their servers evenly with two or more on some server; else None."""
    d = p.domains
    if d is None:
        return None
    groups: dict[str, list[str]] = {}
    for h in hosts:
        srv = d.server(h)
        if srv is None:
            return None
        groups.setdefault(srv, []).append(h)
    out = [sorted(g, key=d.gpu) for g in groups.values()]
    if len({len(g) for g in out}) != 1 or len(out[0]) < 2:
        return None
    return out


def hierarchical_allreduce(p: Program, job: str, hosts: Sequence[str], size: int, entry: Entry, *,
                           stream: str = "ring", cat: str | None = None, step: int = 0, qps: int = 1) -> Exit:
    """NCCL's all-reduce over multi-GPU servers: a ring reduce-scatter inside each server (k GPUs,
    scale-up), a ring all-reduce of each GPU's S/k across the servers among the GPUs of the same
    index (one ring per index, so every NIC works, each on its own rail), a ring all-gather inside
    each server. A rank sends 2(k-1)/k S inside its server and 2(m-1)/m S/k on the fabric (m
    servers): 2(n-1)/n S in all, as a flat ring. Ranks that do not fill their servers evenly
    (or p.domains None) run a flat ring."""
    groups = server_groups(p, hosts)
    if groups is None or len(groups) == 1:
        return ring_allreduce(p, job, hosts, size, entry, stream=stream, cat=cat, step=step, qps=qps)
    k = len(groups[0])
    kw = dict(stream=stream, cat=cat, step=step, qps=qps)
    inside: Exit = {}
    for g in groups:
        inside.update(ring_reducescatter(p, job, g, size, entry, **kw))
    # after k-1 steps of ring_reducescatter GPU l holds chunk l+1 reduced over its server
    chunks = chunk_sizes(size, k)
    across: Exit = {}
    for local in range(k):
        ring = [g[local] for g in groups]
        across.update(ring_allreduce(p, job, ring, chunks[(local + 1) % k], inside, **kw))
    out: Exit = {}
    for g in groups:
        out.update(ring_allgather(p, job, g, size, across, **kw))
    return out


def halving_doubling_segments(n: int, rank: int) -> list[tuple[int, tuple[int, int]]]:
    """Rabenseifner's reduce-scatter by recursive halving, for one rank: per step, (partner,
    (first chunk, end chunk) of what it sends). The all-gather walks these steps backwards,
    sending what it kept."""
    if n & (n - 1) or n < 2:
        raise ValueError(f"halving-doubling needs a power-of-two number of ranks, got {n}")
    lo, hi = 0, n
    out = []
    mask = n >> 1
    while mask:
        mid = (lo + hi) // 2
        if rank & mask:  # keep the upper half, send the lower
            out.append((rank ^ mask, (lo, mid)))
            lo = mid
        else:
            out.append((rank ^ mask, (mid, hi)))
            hi = mid
        mask >>= 1
    return out


def halving_doubling_allreduce(p: Program, job: str, hosts: Sequence[str], size: int, entry: Entry, *,
                               stream: str = "hd", cat: str | None = None, step: int = 0,
                               qps: int = 1) -> Exit:
    n = len(hosts)
    if n < 2:
        return _passthrough(hosts, entry)
    chunks = chunk_sizes(size, n)
    segs = [halving_doubling_segments(n, r) for r in range(n)]
    steps = len(segs[0])

    def seg_bytes(a: int, b: int) -> int:
        return sum(chunks[a:b])

    # Reduce-scatter steps 0..L-1, then all-gather steps L-1..0 (send the half kept at that step).
    plan: list[list[tuple[int, int]]] = []  # per phase step: per rank (partner, bytes)
    for k in range(steps):
        plan.append([(segs[r][k][0], seg_bytes(*segs[r][k][1])) for r in range(n)])
    for k in reversed(range(steps)):
        # at all-gather step k a rank sends what its partner sent it at reduce-scatter step k
        plan.append([(segs[r][k][0], seg_bytes(*segs[segs[r][k][0]][k][1])) for r in range(n)])
    return _stepwise(p, job, hosts, entry, plan, stream, cat, step, qps)


def alltoall(p: Program, job: str, hosts: Sequence[str], size: int, entry: Entry, *,
             stream: str = "a2a", cat: str | None = None, step: int = 0, qps: int = 1) -> Exit:
    n = len(hosts)
    if n < 2:
        return _passthrough(hosts, entry)
    chunks = chunk_sizes(size, n)
    ends: Exit = {h: [] for h in hosts}
    for k in range(1, n):  # NCCL posts every peer's send and receive as one group
        for r, h in enumerate(hosts):
            peer = hosts[(r + k) % n]
            s, rcv = p.transfer(job, stream, h, peer, chunks[(r + k) % n], entry.get(h, []), cat, step, qps)
            ends[h].append(s)
            ends[peer].append(rcv)
    return ends


def sendrecv(p: Program, job: str, hosts: Sequence[str], size: int, entry: Entry, *,
             stream: str = "sr", cat: str | None = None, step: int = 0, qps: int = 1) -> Exit:
    n = len(hosts)
    if n < 2:
        return _passthrough(hosts, entry)
    ends: Exit = {h: [] for h in hosts}
    for r, h in enumerate(hosts):
        peer = hosts[(r + 1) % n]
        s, rcv = p.transfer(job, stream, h, peer, size, entry.get(h, []), cat, step, qps)
        ends[h].append(s)
        ends[peer].append(rcv)
    return ends


FRAGMENTS = {("allreduce", "ring"): ring_allreduce,
             ("allreduce", "hierarchical"): hierarchical_allreduce,
             ("allreduce", "halving-doubling"): halving_doubling_allreduce,
             ("reducescatter", "ring"): ring_reducescatter,
             ("allgather", "ring"): ring_allgather,
             ("alltoall", "pairwise"): alltoall,
             ("sendrecv", "ring"): sendrecv}


def collective_program(job: str, collective: str, algorithm: str, hosts: Sequence[str], size: int,
                       iterations: int = 1, qps: int = 1, p: Program | None = None) -> Program:
    """`iterations` back-to-back collectives of S bytes: a rank starts iteration i+1 when its
    part of iteration i is done (as nccl-tests loops)."""
    frag = FRAGMENTS[(collective, algorithm)]
    p = p if p is not None else Program()
    entry: Entry = {h: [] for h in hosts}
    for it in range(iterations):
        ends = frag(p, job, hosts, size, entry, cat=collective, step=it, qps=qps)
        entry = {h: [p.join(job, h, ends[h], step=it)] for h in hosts}
    return p


# --------------------------------------------------------------------------- metrics

def algbw(size: int, seconds: float) -> float:
    """Algorithm bandwidth in bytes/s: S / t (nccl-tests)."""
    return size / seconds


def allreduce_busbw(algbw_value: float, n: int) -> float:
    """Bus bandwidth of an all-reduce: algbw x 2(n-1)/n, comparable to the link rate."""
    return algbw_value * 2 * (n - 1) / n


def ring_allreduce_line_rate_s(size: int, n: int, iterations: int, rate_bps: float) -> float:
    """Time at line rate: each rank sends 2(n-1)/n x size per iteration (payload only)."""
    return iterations * 2 * (n - 1) / n * size * 8 / rate_bps


def busbw_factor(collective: str, n: int) -> float:
    """nccl-tests' bus bandwidth = algbw x this (the fraction a rank's link carries)."""
    if collective == "allreduce":
        return 2 * (n - 1) / n
    if collective in ("reducescatter", "allgather", "alltoall"):
        return (n - 1) / n
    if collective == "sendrecv":
        return 1.0
    raise ValueError(f"unknown collective {collective!r}")


def bytes_per_rank(collective: str, size: int, n: int) -> float:
    """Payload bytes each rank sends in one collective of S bytes (the busbw numerator)."""
    return busbw_factor(collective, n) * size


def collective_results(collective: str, algorithm: str, size: int, n: int, bounds: list[tuple[float, float]],
                       dilation: float, host_gbps: float) -> dict:
    """A collective job's metrics in summary.json, from the (start, end) of each iteration."""
    factor = busbw_factor(collective, n)
    per = []
    for k, (s, e) in enumerate(bounds):
        t = (e - s) / dilation
        algbw = size * 8 / t / 1e9
        per.append({"iteration": k, "time_fabric_s": t, "time_s": e - s, "algbw_gbps": algbw,
                    "busbw_gbps": algbw * factor})
    # back to back, a rank starts the next iteration when its part is done: the mean is the
    # whole time over the iterations (nccl-tests' average), not the mean of overlapping ones
    t = (bounds[-1][1] - bounds[0][0]) / len(bounds) / dilation
    algbw = size * 8 / t / 1e9
    return {"algorithm": algorithm, "size_bytes": size, "iteration_time_fabric_s": t,
            "algbw_gbps": algbw, "busbw_gbps": algbw * factor, "busbw_factor": factor,
            "busbw_fraction": algbw * factor / host_gbps, "per_iteration": per}
