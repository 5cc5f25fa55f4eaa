"""Pipelines and 3D-parallel training, pure: a step's schedule, where its ranks are placed, and
where its time went.

A training job is a grid of ranks, grid[d][s][t]: data-parallel replica d, pipeline stage s,
tensor-parallel rank t. A pipeline job is the same with one replica and no TP all-reduce (host t
of a stage sends to host t of the next). One step, per replica:

    stage 0 [t0 t1] --activations--> stage 1 [t0 t1] --activations--> stage 2 [t0 t1]
                    <--gradients----                 <--gradients----
    each pass (F or B) of a microbatch: compute, then a TP all-reduce over the stage's group;
    after its last backward, each (s, t) all-reduces its gradients over the replicas (DP).

* stage_order: the order a stage runs its microbatches' passes (gpipe, 1f1b);
* training_step, training_program: one step, and a job's steps, as Program fragments; the TP
  and DP all-reduces are ring all-reduces (fabric_emu.workloads.collectives);
* place, tp_groups: the grid on the fabric's servers and leaves (topology-aware, naive or a host
  list);
* step_split, step_results: where each rank's step time went (compute, tp, pp, dp, waiting) and
  the pipeline bubble: the share of the step a stage did not compute, ideally (p-1)/(m+p-1)
  (bubble_fraction).
"""

from __future__ import annotations

from collections.abc import Sequence
from statistics import mean

from fabric_emu.spec.workloads import PipelineWorkload, TrainingWorkload
from fabric_emu.workloads.collectives import Entry, Exit, hierarchical_allreduce
from fabric_emu.workloads.program import COMPUTE, COMPUTE_CAT, Program, Times


# --------------------------------------------------------------------------- schedule

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
                    tail = hierarchical_allreduce(p, job, group, tp_bytes, tail, stream="tp", cat="tp", step=step,
                                                  qps=qps)
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
                tails.update(hierarchical_allreduce(p, job, group, dp_bytes, {h: tails[h] for h in group},
                                                    stream="dp", cat="dp", step=step, qps=qps))
    return {h: [p.join(job, h, tails[h], step=step)] for h in tails}


def training_program(job: str, w: PipelineWorkload | TrainingWorkload, grid: Grid,
                     p: Program | None = None) -> Program:
    """`w.iterations` training steps back to back: a rank starts step i+1 when its part of step i
    is done. A pipeline job has no TP or DP all-reduce; its gradients default to its activations."""
    p = p if p is not None else Program()
    entry: Entry = {}
    grad = w.gradient_size if isinstance(w, PipelineWorkload) else w.activation_size
    tp_bytes = w.tp_allreduce_size if isinstance(w, TrainingWorkload) else 0
    dp_bytes = w.dp_allreduce_size if isinstance(w, TrainingWorkload) else 0
    for it in range(w.iterations):
        entry = training_step(
            p, job, grid, microbatches=w.microbatches, schedule=w.schedule,
            forward_s=w.forward, backward_s=w.backward_s, activation_bytes=w.activation_size,
            gradient_bytes=w.activation_size if grad is None else grad, tp_bytes=tp_bytes,
            dp_bytes=dp_bytes, entry=entry, step=it)
    return p


def bubble_fraction(stages: int, microbatches: int) -> float:
    """The idle share of a pipeline step with equal stages and free communication: (p-1)/(m+p-1)."""
    return (stages - 1) / (microbatches + stages - 1)


# --------------------------------------------------------------------------- placement

def place(tp: int, pp: int, dp: int, placement: str | Sequence[str],
          hosts_by_leaf: Sequence[Sequence[str]], servers: Sequence[Sequence[str]] = ()) -> Grid:
    """grid[d][s][t] for a (tp, pp, dp) job.

    topology-aware: each tensor-parallel group inside one server (tp GPUs of it; tp beyond a
    server's GPUs: whole servers under one leaf) or, with single-NIC hosts, under one leaf (tp
    consecutive hosts of it); pipeline stages on different servers; data-parallel replicas
    after each other, so across servers and leaves. A server with room for b groups holds one
    stage of b successive replicas (its data-parallel traffic partly inside it), and a block of
    replicas' stages take successive servers (pipeline neighbours under the same or the next
    leaf). With single-NIC hosts: a replica's stages next to each other, replicas after them.
    naive: ranks fill the hosts in host order, data-parallel index fastest, then stage, then TP
    rank (a launcher that numbers ranks with no thought of the fabric): TP groups spread out
    over servers and leaves.
    A host list: rank r = t + tp*(s + pp*d) runs on hosts[r].
    servers: each server's hosts in GPU order, in host order (empty: single-NIC hosts)."""
    n = tp * pp * dp
    flat = [h for leaf in hosts_by_leaf for h in leaf]
    if len(flat) < n:
        raise ValueError(f"tp x pp x dp = {n} ranks, but the fabric has {len(flat)} hosts")
    if isinstance(placement, str) and placement == "naive":
        at = lambda d, s, t: flat[d + dp * (s + pp * t)]  # noqa: E731
    elif isinstance(placement, str) and placement == "topology-aware":
        slot = _server_slots(tp, pp, dp, servers) if servers else None
        if slot is None:  # single-NIC hosts, or too few servers to keep stages apart
            groups = tp_groups(tp, hosts_by_leaf, servers)[:pp * dp]
            if len(groups) < pp * dp:
                raise ValueError(f"the hosts make {len(groups)} groups of tp {tp} next to each other; "
                                 f"pp x dp is {pp * dp} (a host list places ranks anywhere)")
            slot = {(d, s): groups[d * pp + s] for d in range(dp) for s in range(pp)}
        at = lambda d, s, t: slot[(d, s)][t]  # noqa: E731
    elif isinstance(placement, str):
        raise ValueError(f"unknown placement {placement!r} (topology-aware, naive or a host list)")
    else:
        hosts = list(placement)
        if len(hosts) != n or len(set(hosts)) != n:
            raise ValueError(f"a placement list needs {n} distinct hosts, got {len(hosts)}")
        at = lambda d, s, t: hosts[t + tp * (s + pp * d)]  # noqa: E731
    return [[[at(d, s, t) for t in range(tp)] for s in range(pp)] for d in range(dp)]


def _server_slots(tp: int, pp: int, dp: int, servers: Sequence[Sequence[str]]) -> dict | None:
    """(d, s) -> its TP group's hosts, each server holding one stage of b successive replicas
    (b = the server's GPUs // tp, at most dp), stages of a replica block on successive servers;
    None when tp does not divide a server's GPUs (or is beyond them) or servers run out."""
    gpus = len(servers[0])
    if tp > gpus or gpus % tp or any(len(srv) != gpus for srv in servers):
        return None
    b = min(gpus // tp, dp)
    blocks = -(-dp // b)
    if blocks * pp > len(servers):
        return None
    out = {}
    for d in range(dp):
        for s in range(pp):
            srv = servers[(d // b) * pp + s]
            i = d % b
            out[(d, s)] = list(srv[i * tp:(i + 1) * tp])
    return out


def tp_groups(tp: int, hosts_by_leaf: Sequence[Sequence[str]],
              servers: Sequence[Sequence[str]] = ()) -> list[list[str]]:
    """Groups of tp hosts, leaf by leaf: whole groups inside one leaf first, then the hosts left
    over (in leaf order) grouped as they come. With servers and tp within a server's GPUs,
    servers take the leaves' place: whole groups inside one server first."""
    domains = servers if servers and tp <= min(len(srv) for srv in servers) else hosts_by_leaf
    groups: list[list[str]] = []
    spare: list[str] = []
    for dom in domains:
        whole = len(dom) // tp * tp
        groups += [list(dom[i:i + tp]) for i in range(0, whole, tp)]
        spare += dom[whole:]
    groups += [spare[i:i + tp] for i in range(0, len(spare) - tp + 1, tp)]
    return groups


# --------------------------------------------------------------------------- results

SPLIT_KEYS = ("compute", "tp", "pp", "dp", "waiting")


def step_split(p: Program, times: Times, job: str, step: int, bounds: tuple[float, float]) -> dict[str, dict[str, float]]:
    """Per host of the job: where its step's time went (emulated seconds, summing to the step).

    A host's stream is its compute ops (and joins) in order. Between one's end and the next's
    start the stream waits on the next op's dependencies: each stretch until a dependency ends
    counts as that dependency's kind (tp or dp all-reduce, pp activations or gradients, which
    includes the pipeline's bubble); compute counts as compute; what is left after the host's
    last op, until the slowest rank ends the step, is waiting."""
    start, end = bounds
    out: dict[str, dict[str, float]] = {}
    for h in dict.fromkeys(o.host for o in p.ops if o.job == job and o.kind == COMPUTE):  # not relays
        split = dict.fromkeys(SPLIT_KEYS, 0.0)
        cursor = start
        for o in p.ops:
            if o.host != h or o.job != job or o.step != step or o.kind != COMPUTE:
                continue
            s, e = times[o.id]
            for dep_end, cat in sorted((times[d][1], _kind(p.ops[d].cat)) for d in o.deps):
                if dep_end > cursor:
                    upto = min(dep_end, s)
                    split[cat] += max(0.0, upto - cursor)
                    cursor = max(cursor, upto)
            split["waiting"] += max(0.0, s - cursor)  # the engine's own delay
            if o.cat == COMPUTE_CAT:
                split["compute"] += e - s
            cursor = max(cursor, e)
        split["waiting"] += max(0.0, end - cursor)
        out[h] = split
    return out


def _kind(cat: str) -> str:
    if cat in ("tp", "pp", "dp", "compute"):
        return cat
    return "waiting"  # sync: the previous step, on a host that started it late


def step_results(job: str, w: PipelineWorkload | TrainingWorkload, grid: Grid, p: Program, times: Times,
                 bounds: list[tuple[float, float]], dilation: float) -> dict:
    """A pipeline or training job's metrics in summary.json, from the (start, end) of each step."""
    steps = []
    for k, b in enumerate(bounds):
        split = step_split(p, times, job, k, b)
        t = b[1] - b[0]
        busy = {h: s["compute"] / t for h, s in split.items()}
        steps.append({"step": k, "time_fabric_s": t / dilation, "time_s": t,
                      "split_fabric_s": {key: mean(s[key] for s in split.values()) / dilation for key in SPLIT_KEYS},
                      "bubble_fraction": 1 - mean(busy.values()),
                      "stage_busy_fabric_s": [mean(split[h]["compute"] for rep in grid for h in rep[s]) / dilation
                                              for s in range(len(grid[0]))]})
    pp = len(grid[0])
    out = {"stages": pp, "microbatches": w.microbatches, "schedule": w.schedule,
           "step_time_fabric_s": mean(s["time_fabric_s"] for s in steps),
           "bubble_fraction": mean(s["bubble_fraction"] for s in steps),
           "bubble_fraction_ideal": bubble_fraction(pp, w.microbatches),
           "split_fabric_s": {key: mean(s["split_fabric_s"][key] for s in steps) for key in SPLIT_KEYS},
           "stage_busy_fabric_s": [mean(s["stage_busy_fabric_s"][i] for s in steps) for i in range(pp)],
           "per_step": steps}
    if isinstance(w, TrainingWorkload):
        out.update(tp=w.tp, pp=w.pp, dp=w.dp,
                   placement=w.placement if isinstance(w.placement, str) else "explicit",
                   grid=grid)
        n = w.tp * w.pp * w.dp
        comm = sum(o.nbytes for o in p.ops if o.job == job and o.kind == "send" and not p.channels[o.channel].relay)
        # per-job bandwidth: every rank's bytes over the step time (how hard the job drives its links)
        out["busbw_gbps"] = comm / n / w.iterations * 8 / out["step_time_fabric_s"] / 1e9
    return out
