"""summary.json: what ran and how it ended, then each area's part in a fixed order: what the
workload achieved (results.jobs for collectives and jobs, results.transport for incast and
flows), what the queue pairs counted (results.transport), the switch ports (results.switch),
events and load balancing (results.routing), and whether to trust it all (results.trust).

Pure functions: every figure comes from counters and timestamps the run measured, never from
the configuration echoed back.
"""

from __future__ import annotations

from fabric_emu.kernel.ovs_datapath import datapath_fields, datapath_of
from fabric_emu.results.deadline import deadline_report
from fabric_emu.results.jobs import jobs_section, ring_section
from fabric_emu.results.pfcwd import drops_counted_off_the_switches, label_storm_episodes, pfcwd_section
from fabric_emu.results.routing import routing_section
from fabric_emu.results.switch import reaction_summary, switch_section
from fabric_emu.results.transport import flows_section, transport_section
from fabric_emu.results.trust import trust_section
from fabric_emu.spec.experiment import ExperimentSpec
from fabric_emu.spec.workloads import AllReduceWorkload
from fabric_emu.topo.plan import FabricPlan
from fabric_emu.workloads import jobs
from fabric_emu.workloads.flows import planned_bytes
from fabric_emu.workloads.jobs import uses_program


def build_summary(spec: ExperimentSpec, plan: FabricPlan, ranks: list[str], traffic: dict,
                  state: dict) -> dict:
    """summary.json from the traffic phase's measurements (traffic) and the run's state (status,
    error); its keys keep one order, so summaries diff well."""
    agents = traffic.get("agents") or {}
    ports = traffic.get("ports") or []
    daemon = traffic.get("pfc_daemon") or {}
    switch = switch_section(plan, ports)
    transport = transport_section(plan, agents, switch["switch"]["drops"] + drops_counted_off_the_switches(daemon) if switch else None)
    reaction = reaction_summary(daemon, plan.dilation)
    unexplained = transport.get("transport", {}).get("unexplained_loss_packets", 0)
    pfcwd = pfcwd_section(daemon, traffic.get("go_monotonic", 0.0), plan.dilation, traffic.get("traffic_fabric_s"))
    deadlocks = traffic.get("deadlocks")  # fabric_emu.cc.deadlock.DeadlockTracker, with PFC on
    deadlock_summary = deadlocks.summary() if deadlocks is not None else None
    if deadlocks is not None:
        label_storm_episodes(pfcwd, deadlocks.episodes, plan)
    deadline = None
    if state["status"] != "ok" and not state.get("error"):  # cut short by the deadline?
        deadline = deadline_section(spec, plan, ranks, agents,
                                    deadlocks is not None and deadlocks.summary()["deadlocked_at_end"])
        if deadline is not None:
            state = {**state, "error": deadline["message"]}
    return {
        **run_section(spec, plan, ranks, state),
        **({"deadline": deadline} if deadline is not None else {}),
        **workload_results(spec, plan, ranks, agents, traffic.get("alone") or {}),
        **({"background": traffic["background"]} if traffic.get("background") else {}),
        **transport,
        **switch,
        **({"nic": traffic["nics"]} if traffic.get("nics") else {}),
        **routing_section(traffic.get("events") or [], traffic.get("lb") or {}, plan.dilation),
        # each time the controller was away (fabric_emu.fabric.keeper.outage_row)
        **({"controller_outages": traffic["controller_outages"]} if traffic.get("controller_outages") else {}),
        **({"pfc_reaction": reaction} if reaction else {}),
        **pfcwd,
        **({"deadlocks": deadlock_summary} if deadlock_summary is not None else {}),
        **({"pfc_accounting": traffic["charges"]} if traffic.get("charges") else {}),  # fabric_emu.cc.charges
        **trust_section(spec, traffic.get("cpu") or {}, agents, ports, traffic.get("events") or [], daemon,
                        reaction, unexplained,
                        deadlocked=bool(deadlock_summary and deadlock_summary["deadlocked_at_end"]),
                        fault=state.get("error") if state.get("fault") else None,
                        restarts=traffic.get("restarts") or [], charges=traffic.get("charges"),
                        datapath=datapath_of(plan.extra)),
        **({"dilation_auto": plan.extra["dilation_auto"]} if "dilation_auto" in plan.extra else {}),
        **({"restarts": traffic["restarts"]} if traffic.get("restarts") else {}),
        **({"machines": traffic["machines"]} if traffic.get("machines") else {}),  # over several machines
    }


def run_section(spec: ExperimentSpec, plan: FabricPlan, ranks: list[str], state: dict) -> dict:
    """What ran and how it ended: the keys every summary starts with."""
    w = spec.workload
    out: dict = {
        "status": state["status"],
        "experiment": spec.name,
        "load_balancing": spec.load_balancing,
        "congestion_control": spec.congestion_control,
        "workload": " + ".join(_workload_name(j) for j in spec.jobs),
        "ranks": len(ranks),
        **({"size_bytes": w.size} if w is not None and hasattr(w, "size") else {}),
        "dilation": plan.dilation,
        **datapath_fields(plan.extra),
        "host_link_gbps": spec.topology.host_link.gbps,
    }
    if state.get("error"):
        out["error"] = state["error"]
    return out


def deadline_section(spec: ExperimentSpec, plan: FabricPlan, ranks: list[str], agents: dict[str, dict],
                     deadlocked_at_end: bool) -> dict | None:
    """summary.json's `deadline` (and its error line) when the deadline cut the run short:
    whether flows were still progressing, and what to set (results.deadline)."""
    if spec.timeout is None:
        return None
    if uses_program(spec):
        program = jobs.build_program(jobs.resolve_jobs(spec, plan))
        planned = jobs.fabric_bytes(program)  # as the NICs' receive QPs count
    else:
        planned = planned_bytes(spec.workload, ranks, [h.name for h in plan.hosts])
    return deadline_report(agents, timeout_s=spec.timeout, dilation=plan.dilation,
                           retransmit_timeout_s=spec.transport.retransmit_timeout,
                           lossy=not spec.pfc.enabled, planned_bytes=planned,
                           deadlocked_at_end=deadlocked_at_end)


def workload_results(spec: ExperimentSpec, plan: FabricPlan, ranks: list[str], agents: dict[str, dict],
                     alone: dict) -> dict:
    """What the workload achieved, from the area that measures its kind: a program's jobs, an
    incast's or flows workload's flows, the ring all-reduce's iterations.
    alone: job name -> its completion time when it ran by itself (several jobs)."""
    w, host_gbps = spec.workload, spec.topology.host_link.gbps
    if uses_program(spec):
        return jobs_section(spec, plan, agents, alone)
    if not isinstance(w, AllReduceWorkload):
        return flows_section(w, plan, agents, host_gbps)
    return ring_section(w, plan, len(ranks), agents, host_gbps)


def _workload_name(w) -> str:
    algo = getattr(w, "algorithm", None)
    return f"{w.type}/{algo}" if w.type == "allreduce" else w.type
