"""The schedules of pipelines and 3D-parallel training steps, as Program fragments.

A training step composes compute with collectives (fabric_emu.workloads.collectives): the
tensor-parallel all-reduces of a step wait for the compute before them, and the compute after
waits for them.
"""

from __future__ import annotations

from collections.abc import Sequence

from fabric_emu.workloads.collectives import Entry, Exit, ring_allreduce
from fabric_emu.workloads.program import Program


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

