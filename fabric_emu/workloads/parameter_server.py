"""Parameter-server training, pure: where the roles go, a job's steps as a Program, and what a
run of it measured.

The model's parameters are sharded over the servers: server j holds shard j, size/len(servers)
bytes (split_even). One step, per worker w:

    compute (modelled) --> push shard j's gradients to server j, every j at once
                       --> pull shard j's parameters back from server j, every j
    server j: receive each worker's push --> apply it (a zero-time op) --> send that worker its pull

so a step moves the same bytes through a server's link, in and out, as a ring all-reduce of S
moves through every rank's (2 (n-1)/n S), but all of them meet at the servers' ports: the pushes
are an incast of every worker onto each server, the pulls a broadcast from it.

Sync and async, and the staleness bound k (stale synchronous parallel, Ho et al. 2013):
* a worker's step n computes once it has pulled step n-1 from every server (its parameters);
* server j sends worker w its step-n pull once it has received w's step-n push AND every worker's
  step-(n-k) push. So no worker gets ahead of the slowest push the servers have applied by more
  than k steps. Sync is k = 0: the step-n pulls wait for every worker's step-n push (a barrier,
  one aggregation op per server and step); async (default k = 1) answers a push as soon as the
  pushes k steps back are in, so a worker slowed for a step holds the others back only k steps
  later, and a short straggler is absorbed.
Deadlock-free under the program's in-order-per-channel rule: a channel (push w->j or pull j->w)
carries exactly one message per step, in step order, and every dependency points to an earlier
step or to an op of the same step that does not wait for the op itself (push n waits for pulls
n-1; pull n waits for pushes n and n-k <= n).

Results (ps_results): the step time from the workers' ops (step n starts at the first worker's
step-n compute and ends when the last worker has pulled step n), the bytes pushed and pulled
that the engines reported as received, each server's pushed bytes (its incast), and how long
workers waited for their pulls.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from fabric_emu.spec.workloads import ParameterServerWorkload
from fabric_emu.workloads.collectives import split_even
from fabric_emu.workloads.program import COMPUTE, COMPUTE_CAT, RECV, Program, Times

PUSH, PULL = "push", "pull"  # the channels' streams and the ops' categories


def roles(w: ParameterServerWorkload, hosts: Sequence[str]) -> tuple[list[str], list[str]]:
    """(workers, servers) of a job on a fabric with these hosts (in host order). A server count
    takes that many hosts from the end of the host list, skipping listed workers; 'all' workers
    are every host that is not a server. Raises ValueError when a role is left empty."""
    if isinstance(w.servers, int):
        pool = [h for h in hosts if not (isinstance(w.workers, list) and h in w.workers)]
        if w.servers > len(pool) - (0 if isinstance(w.workers, list) else 1):
            raise ValueError(f"{w.servers} servers leave no worker on a fabric of {len(hosts)} hosts")
        servers = pool[len(pool) - w.servers:]
    else:
        servers = list(w.servers)
    workers = [h for h in hosts if h not in servers] if w.workers == "all" else list(w.workers)
    if not workers:
        raise ValueError("'all' workers is nobody: every host is a server")
    return workers, servers


ComputeTime = Callable[[int, int], float]  # (worker index, step) -> modelled seconds


def ps_program(job: str, workers: Sequence[str], servers: Sequence[str], size: int, iterations: int, *,
               staleness: int = 0, compute: float | ComputeTime = 0.0, qps: int = 1,
               p: Program | None = None) -> Program:
    """`iterations` parameter-server steps (see the module's docstring); compute may be a function
    of (worker index, step), to model a straggler."""
    p = p if p is not None else Program()
    shards = split_even(size, len(servers))
    seconds = compute if callable(compute) else (lambda _w, _n: float(compute))
    pulled: dict[str, list[int]] = {w: [] for w in workers}  # the worker's last step's pull recvs
    pushes: list[dict[tuple[str, str], int]] = []  # per step: (worker, server) -> the server's recv
    for n in range(iterations):
        pushes.append({})
        for i, w in enumerate(workers):
            c = p.compute(job, w, seconds(i, n), pulled[w], step=n)
            for j, s in enumerate(servers):
                _, rcv = p.transfer(job, PUSH, w, s, shards[j], [c], PUSH, n, qps)
                pushes[n][(w, s)] = rcv
        got: dict[str, list[int]] = {w: [] for w in workers}
        for j, s in enumerate(servers):
            old = n - staleness  # the step whose every push must be in before a pull of step n
            barrier = [pushes[old][(v, s)] for v in workers] if old >= 0 else []
            if staleness == 0:
                applied = p.join(job, s, barrier, step=n)  # sync: the step's aggregation
            for w in workers:
                if staleness > 0:  # async: this worker's push, applied as it arrives
                    applied = p.join(job, s, [pushes[n][(w, s)], *barrier], step=n)
                _, rcv = p.transfer(job, PULL, s, w, shards[j], [applied], PULL, n, qps)
                got[w].append(rcv)
        pulled = got
    return p


def job_program(job: str, w: ParameterServerWorkload, workers: Sequence[str], servers: Sequence[str],
                p: Program | None = None) -> Program:
    """A parameter-server job's steps, from its spec and its placed roles."""
    return ps_program(job, workers, servers, w.size, w.iterations, staleness=w.staleness_bound,
                      compute=w.compute, qps=w.qps_per_peer, p=p)


# --------------------------------------------------------------------------- results

def step_ends(p: Program, times: Times, job: str, workers: Sequence[str]) -> list[tuple[float, float]]:
    """Per step, (start, end): the first worker's compute starts it, the last worker's last pull
    ends it. None entries are skipped by the caller (the job did not finish)."""
    first: dict[int, float] = {}
    last: dict[int, float] = {}
    wset = set(workers)
    for o in p.ops:
        if o.job != job or o.host not in wset or times[o.id] is None:
            continue
        s, e = times[o.id]
        if o.kind == COMPUTE:
            first[o.step] = min(first.get(o.step, s), s)
        elif o.kind == RECV:
            last[o.step] = max(last.get(o.step, e), e)
    return [(first[n], last[n]) for n in sorted(first) if n in last]


def ps_results(job: str, w: ParameterServerWorkload, workers: Sequence[str], servers: Sequence[str],
               p: Program, times: Times, dilation: float) -> dict:
    """A parameter-server job's metrics in summary.json, all from the engines' op times.

    Steps run back to back (a worker starts step n+1 when it has pulled step n), so step n's
    time is from the end of step n-1 (the first step: its first compute) to its end, as the
    ring's iterations; step_time_fabric_s is their mean. algbw is S over the step time, the
    figure a ring all-reduce of the same S reports. wait_fabric_s: per worker and step, from
    the end of its compute to its last pull (its push, the servers' barrier and its pull)."""
    bounds = step_ends(p, times, job, workers)
    steps, prev = [], None
    for n, (s, e) in enumerate(bounds):
        t = e - (s if prev is None else prev)
        steps.append({"step": n, "start": s, "end": e, "time_s": t, "time_fabric_s": t / dilation})
        prev = e
    out: dict = {"mode": w.mode, "staleness": w.staleness_bound, "size_bytes": w.size,
                 "workers": list(workers), "servers": list(servers)}
    if steps:
        t = (bounds[-1][1] - bounds[0][0]) / len(bounds) / dilation
        out.update(step_time_fabric_s=t, algbw_gbps=w.size * 8 / t / 1e9)
    pushed = dict.fromkeys(servers, 0)
    pulled = dict.fromkeys(workers, 0)
    compute_end: dict[tuple[str, int], float] = {}
    pull_end: dict[tuple[str, int], float] = {}
    for o in p.ops:
        if o.job != job or times[o.id] is None:
            continue
        if o.kind == RECV and o.cat == PUSH:
            pushed[o.host] += o.nbytes
        elif o.kind == RECV and o.cat == PULL:
            pulled[o.host] += o.nbytes
            key = (o.host, o.step)
            pull_end[key] = max(pull_end.get(key, 0.0), times[o.id][1])
        elif o.kind == COMPUTE and o.cat == COMPUTE_CAT and o.host in pulled:
            compute_end[(o.host, o.step)] = times[o.id][1]
    waits = [pull_end[k] - compute_end[k] for k in pull_end if k in compute_end]
    out.update(bytes_pushed=sum(pushed.values()), bytes_pulled=sum(pulled.values()),
               server_pushed_bytes=pushed, worker_pulled_bytes=pulled,
               wait_fabric_s=sum(waits) / len(waits) / dilation if waits else None,
               per_step=steps)
    return out
