"""What the collectives and jobs achieved, for results: the ring all-reduce's iterations and
nccl-tests bandwidths, and the `jobs` of a program run (collectives, pipelines, training), each
with its completion time and bandwidths or step time.

Pure functions of the agents' timestamps. Bandwidths are in Gb/s (bits), modelled (x dilation)
beside emulated, so they compare with link rates.
"""

from __future__ import annotations

from fabric_emu.spec.experiment import ExperimentSpec
from fabric_emu.spec.workloads import AllReduceWorkload
from fabric_emu.topo.plan import FabricPlan
from fabric_emu.workloads import jobs
from fabric_emu.workloads.collectives import allreduce_busbw


def ring_section(w: AllReduceWorkload, plan: FabricPlan, n_ranks: int, agents: dict[str, dict],
                 host_gbps: float) -> dict:
    """The ring all-reduce's results (none until every rank reported an iteration): completion,
    mean iteration time, its bandwidths and each iteration's."""
    iters = iteration_times(agents) if agents and all(a.get("iterations") for a in agents.values()) else []
    if not iters:
        return {}
    jct = iters[-1]["end"] - iters[0]["start"]
    mean_t = jct / len(iters)
    bw = bandwidths(w.size, mean_t, n_ranks, plan.dilation)
    return {
        "iterations_completed": len(iters),
        "jct_s": jct,
        "jct_fabric_s": jct / plan.dilation,
        "iteration_time_s": mean_t,
        "iteration_time_fabric_s": mean_t / plan.dilation,
        **bw,
        "busbw_fraction": bw["busbw_gbps"] / host_gbps,
        "per_iteration": [
            {**it, "time_fabric_s": it["time_s"] / plan.dilation,
             **bandwidths(w.size, it["time_s"], n_ranks, plan.dilation)}
            for it in iters
        ],
    }


def iteration_times(agents: dict[str, dict]) -> list[dict]:
    """Per iteration: end = when the last rank finished it; time = end - previous end.

    Ranks run iterations back to back (as nccl-tests loops do), so iteration i's time is the
    gap between the moments the whole ring finished i-1 and i; the first one starts when the
    first rank started.
    """
    per_rank = [a["iterations"] for a in agents.values()]
    n_iter = min(len(it) for it in per_rank)
    prev_end = min(it[0]["start"] for it in per_rank)
    out = []
    for i in range(n_iter):
        if any(it[i].get("end") is None for it in per_rank):
            break
        end = max(it[i]["end"] for it in per_rank)
        out.append({"iteration": i, "start": prev_end, "end": end, "time_s": end - prev_end})
        prev_end = end
    return out


def bandwidths(size_bytes: int, time_s: float, n_ranks: int, dilation: float) -> dict:
    """nccl-tests algbw and busbw, emulated and modelled (x dilation), in Gb/s."""
    algbw = size_bytes * 8 / time_s / 1e9
    busbw = allreduce_busbw(algbw, n_ranks)
    return {
        "algbw_gbps": algbw * dilation, "busbw_gbps": busbw * dilation,
        "algbw_emulated_gbps": algbw, "busbw_emulated_gbps": busbw,
    }


def jobs_section(spec: ExperimentSpec, plan: FabricPlan, agents: dict[str, dict], alone: dict) -> dict:
    """The `jobs` of a program run, each with its results (fabric_emu.workloads.jobs); a single job's
    headline figures (completion, busbw, step time) also at the top level, as for the ring.
    alone: job name -> its completion time when it ran by itself (several jobs)."""
    js = jobs.resolve_jobs(spec, plan)
    program = jobs.build_program(js)
    times = jobs.op_times(program, {h: a.get("ops") or [] for h, a in agents.items()})
    leaf_of = {h.name: h.leaf for h in plan.hosts}
    out = [jobs.job_results(j, program, times, plan.dilation, spec.topology.host_link.gbps, leaf_of)
           for j in js]
    for r in out:
        if r["name"] in alone and "jct_fabric_s" in r:
            r["jct_alone_fabric_s"] = alone[r["name"]]
            r["slowdown"] = r["jct_fabric_s"] / alone[r["name"]]
    section: dict = {"jobs": out}
    if len(out) == 1:
        section.update({k: v for k, v in out[0].items() if k in HEADLINE_KEYS})
    return section


HEADLINE_KEYS = ("jct_s", "jct_fabric_s", "algbw_gbps", "busbw_gbps", "busbw_fraction",
                 "iteration_time_fabric_s", "step_time_fabric_s", "bubble_fraction")
