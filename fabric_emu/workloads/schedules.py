"""The schedules of collectives, pipelines and 3D-parallel training steps, as Program fragments.

Each collective adds its operations for a group of hosts (in rank order) to a Program, after
`entry[host]` (ops each rank must finish first), and returns `exit[host]`: the ops whose end is
the collective's end at that rank. So collectives compose: the tensor-parallel all-reduces of a
training step wait for the compute before them, and the compute after waits for them.

Algorithms (the byte counts nccl-tests uses; docs/reference/protocol_facts.md §5):
* ring all-reduce: reduce-scatter then all-gather around the ring, 2(n-1) steps of S/n;
* halving-doubling all-reduce (Rabenseifner): log2 n recursive-halving reduce-scatter steps with
  partners r xor n/2, n/4, ..., then the same steps back for the all-gather (n a power of two);
* reduce-scatter and all-gather: the ring's halves, n-1 steps of S/n each;
* all-to-all: every rank sends S/n to every other rank at once (NCCL posts them as one group);
* sendrecv: every rank sends S to the next rank and receives S from the previous one.
Within a ring or halving-doubling schedule, a rank's step k send waits for its step k-1
receive: the data it forwards or reduces.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from fabric_emu.workloads.collectives import chunk_sizes
from fabric_emu.workloads.program import Program

Entry = dict[str, list[int]]  # host -> ops the fragment waits for at that host
Exit = dict[str, list[int]]

COLLECTIVES = ("allreduce", "reducescatter", "allgather", "alltoall", "sendrecv")
ALGORITHMS = {"allreduce": ("ring", "halving-doubling"), "reducescatter": ("ring",),
              "allgather": ("ring",), "alltoall": ("pairwise",), "sendrecv": ("ring",)}


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

    def sizes(r: int, k: int) -> int:  # fabric_emu.workloads.collectives.RingAllReduce's chunk order
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


# --------------------------------------------------------------------------- pipelines

def stage_order(schedule: str, stages: int, stage: int, microbatches: int) -> list[tuple[str, int]]:
    """The order a stage runs its forward ("F", i) and backward ("B", i) passes.

    gpipe: every forward, then every backward. 1f1b (PipeDream-Flush, Megatron): stage s runs
    stages-s-1 warm-up forwards, then alternates one forward and one backward, then drains the
    backwards. Both have the bubble (p-1)/(m+p-1); 1F1B holds fewer activations."""
    m = microbatches
    if schedule == "gpipe":
        return [("F", i) for i in range(m)] + [("B", i) for i in range(m)]
    if schedule == "1f1b":
        warm = min(stages - stage - 1, m)
        order = [("F", i) for i in range(warm)]
        for i in range(m - warm):
            order += [("F", warm + i), ("B", i)]
        return order + [("B", i) for i in range(m - warm, m)]
    raise ValueError(f"unknown pipeline schedule {schedule!r} (gpipe or 1f1b)")


Grid = list[list[list[str]]]  # grid[d][s][t]: the host of data-parallel replica d, stage s, TP rank t


def training_step(p: Program, job: str, grid: Grid, *, microbatches: int, schedule: str,
                  forward_s: float, backward_s: float, activation_bytes: int, gradient_bytes: int,
                  tp_bytes: int = 0, dp_bytes: int = 0, entry: Entry | None = None, step: int = 0,
                  qps: int = 1) -> Exit:
    """One training step of a (dp x pp x tp) grid; a pipeline job is dp = 1 with no TP all-reduce.

    Per microbatch and stage: the forward compute, the TP all-reduce of its output over the
    stage's tensor-parallel group, then the activations to the same TP rank of the next stage;
    the backward likewise, sending gradients to the previous stage. After its last backward,
    each (stage, TP rank) all-reduces its gradients over the data-parallel replicas. A host's
    compute and TP all-reduces are one stream (each waits for the one before)."""
    entry = entry or {}
    dp, pp, tp = len(grid), len(grid[0]), len(grid[0][0])
    passes: dict[tuple[int, int, int, str, int], int] = {}  # (d, s, t, F/B, i) -> compute op
    arrivals: dict[tuple[int, int, int, str, int], int] = {}  # the recv op that pass waits for
    tails: dict[str, list[int]] = {}
    for d in range(dp):
        for s in range(pp):
            group = grid[d][s]
            tail = {h: list(entry.get(h, [])) for h in group}
            for kind, i in stage_order(schedule, pp, s, microbatches):
                seconds = forward_s if kind == "F" else backward_s
                for t, h in enumerate(group):
                    c = p.compute(job, h, seconds, tail[h], step=step)
                    passes[(d, s, t, kind, i)] = c
                    tail[h] = [c]
                if tp > 1 and tp_bytes > 0:
                    tail = ring_allreduce(p, job, group, tp_bytes, tail, stream="tp", cat="tp", step=step, qps=qps)
                nxt = s + 1 if kind == "F" else s - 1
                if 0 <= nxt < pp:
                    nbytes = activation_bytes if kind == "F" else gradient_bytes
                    for t, h in enumerate(group):
                        _, rcv = p.transfer(job, "pp", h, grid[d][nxt][t], nbytes, tail[h], "pp", step, qps)
                        arrivals[(d, nxt, t, kind, i)] = rcv
            tails.update(tail)
    for key, rcv in arrivals.items():  # a pass waits for its input from the neighbouring stage
        p.add_deps(passes[key], [rcv])
    if dp > 1 and dp_bytes > 0:
        for s in range(pp):
            for t in range(tp):
                group = [grid[d][s][t] for d in range(dp)]
                tails.update(ring_allreduce(p, job, group, dp_bytes, {h: tails[h] for h in group},
                                            stream="dp", cat="dp", step=step, qps=qps))
    return {h: [p.join(job, h, tails[h], step=step)] for h in tails}


def bubble_fraction(stages: int, microbatches: int) -> float:
    """The idle share of a pipeline step with equal stages and free communication: (p-1)/(m+p-1)."""
    return (stages - 1) / (microbatches + stages - 1)


# --------------------------------------------------------------------------- placement

def place(tp: int, pp: int, dp: int, placement: str | Sequence[str],
          hosts_by_leaf: Sequence[Sequence[str]]) -> Grid:
    """grid[d][s][t] for a (tp, pp, dp) job.

    topology-aware: each tensor-parallel group under one leaf where it fits (tp consecutive hosts
    of a leaf), the groups of one replica's stages next to each other (pipeline neighbours on the
    same or the next leaf), the data-parallel replicas after each other, so across leaves.
    naive: ranks fill the hosts in host order, data-parallel index fastest, then stage, then TP
    rank (a launcher that numbers ranks with no thought of the fabric): TP groups spread out.
    A host list: rank r = t + tp*(s + pp*d) runs on hosts[r]."""
    n = tp * pp * dp
    flat = [h for leaf in hosts_by_leaf for h in leaf]
    if len(flat) < n:
        raise ValueError(f"tp x pp x dp = {n} ranks, but the fabric has {len(flat)} hosts")
    if isinstance(placement, str) and placement == "naive":
        at = lambda d, s, t: flat[d + dp * (s + pp * t)]  # noqa: E731
    elif isinstance(placement, str) and placement == "topology-aware":
        groups = tp_groups(tp, hosts_by_leaf)[:pp * dp]
        at = lambda d, s, t: groups[d * pp + s][t]  # noqa: E731
    elif isinstance(placement, str):
        raise ValueError(f"unknown placement {placement!r} (topology-aware, naive or a host list)")
    else:
        hosts = list(placement)
        if len(hosts) != n or len(set(hosts)) != n:
            raise ValueError(f"a placement list needs {n} distinct hosts, got {len(hosts)}")
        at = lambda d, s, t: hosts[t + tp * (s + pp * d)]  # noqa: E731
    return [[[at(d, s, t) for t in range(tp)] for s in range(pp)] for d in range(dp)]


def tp_groups(tp: int, hosts_by_leaf: Sequence[Sequence[str]]) -> list[list[str]]:
    """Groups of tp hosts, leaf by leaf: whole groups inside one leaf first, then the hosts left
    over (in leaf order) grouped as they come."""
    groups: list[list[str]] = []
    spare: list[str] = []
    for leaf in hosts_by_leaf:
        whole = len(leaf) // tp * tp
        groups += [list(leaf[i:i + tp]) for i in range(0, whole, tp)]
        spare += leaf[whole:]
    groups += [spare[i:i + tp] for i in range(0, len(spare) - tp + 1, tp)]
    return groups

