"""Whether a run's numbers can be trusted, for results: summary.json's `fidelity` block (the
warnings, notes and verdict: the machine's load, late NIC engines, loss no counter saw, and the
lossless class's checks) and `cpu` (the load behind them). The judgements themselves live with
what they judge (fabric_emu.measure.fidelity, results.switch); this gathers them."""

from __future__ import annotations

from dataclasses import asdict

from fabric_emu.cc.charges import charge_notes
from fabric_emu.measure.counters import PortCounters
from fabric_emu.measure.fidelity import scale_up_note, verdict
from fabric_emu.ports.model import settings_of
from fabric_emu.results.switch import daemon_warnings, lossless_warnings
from fabric_emu.spec.experiment import ExperimentSpec
from fabric_emu.state.supervise import when


def trust_section(spec: ExperimentSpec, cpu: dict, agents: dict[str, dict], ports: list[PortCounters],
                  events: list[dict], daemon: dict, reaction: dict | None, unexplained: int,
                  deadlocked: bool = False, fault: str | None = None, restarts: list[dict] = (),
                  charges: dict | None = None, datapath: str = "userspace") -> dict:
    """summary.json's `fidelity` key, and `cpu` when the machine was sampled.

    cpu: the CPU monitor's report; events: the scheduled events that fired; daemon: the PFC
    daemon's report and reaction its summary (results.switch); unexplained: data packets lost
    where no switch counter saw them (results.transport); fault: the error of a run a dead part
    ended (its undelivered packets are that part's doing, not the machine's: no "raise the
    dilation"); restarts: the parts the supervisor brought back (fabric_emu.state.supervise);
    charges: what the lossless accounting held at the end (fabric_emu.cc.charges); datapath: OVS's
    (kernel or userspace)."""
    late = engine_lateness(agents)
    links_failed = any(e.get("kind") == "link" and e.get("state") == "down" and e.get("ok") for e in events)
    # A link taken down loses what was on it, where no switch queue counts it: expected. A run
    # that ended deadlocked lost nothing: what was not delivered is held in the paused buffers.
    warnings = verdict(cpu, list(late.values()), 0 if links_failed or deadlocked or fault else unexplained)
    warnings += restart_warnings(restarts)
    reorder = reordering_warning(spec.load_balancing, agents, links_failed, datapath)
    if reorder and reorder[1]:
        warnings.append(reorder[0])
    if ports:
        ecn, pfc = settings_of(spec)
        warnings += lossless_warnings(ports, asdict(ecn), pfc, reaction)
        warnings += daemon_warnings(daemon)
    note = None
    if fault and unexplained:
        note = (f"{unexplained} packet(s) sent were not delivered: the run was cut short ({fault})")
    elif deadlocked and unexplained:
        note = (f"{unexplained} packet(s) sent were not delivered: the run ended in a PFC deadlock "
                "and they are held in its paused buffers (see deadlocks)")
    elif links_failed and unexplained:
        note = (f"{unexplained} packet(s) were lost where no switch counter saw them: on the "
                "link(s) taken down, with what their queues held (RC resent them)")
    notes = [note] if note else []
    if su := scale_up_note(agents):
        notes.append(su)
    notes += charge_notes(charges)
    machine = {k: v for k, v in cpu.items() if k.startswith("cpu_")}
    if kd := cpu.get("kernel_datapath"):  # no forwarding thread: the busiest CPU's softirq share
        machine["kernel_datapath_softirq_max"] = kd.get("softirq_busiest_cpu_max")
    if reorder and not reorder[1]:  # a rerouted flow may overtake itself; a flow's set-up
        notes.append(reorder[0])
    out: dict = {"fidelity": {**machine, "nic_engine_late_wakes_max": max(late.values()) if late else None,
                              "trusted": not warnings, "warnings": warnings, "notes": notes}}
    if cpu:
        out["cpu"] = cpu_section(cpu)
    return out


# A new flow's first packets: the kernel datapath sends them through ovs-vswitchd (an upcall)
# while it installs the flow, and later packets that take the installed flow can overtake them.
SETUP_PACKETS = 32


def reordering_warning(load_balancing: str, agents: dict[str, dict], links_failed: bool,
                       datapath: str = "userspace") -> tuple[str, bool] | None:
    """Packets of single-path flows (ECMP, DLB) that arrived out of order: the responder NAKs
    the gap and go-back-N resends what it discarded, so each episode costs time the fabric
    alone would not have spent. Spraying expects it (its receivers place packets by PSN).
    (text, whether it is a warning): a note when links failed (a route that changes can reorder
    a flow in any fabric), or on the kernel datapath when every episode came within its flow's
    first SETUP_PACKETS packets (flow set-up: an upcall, once per flow and switch)."""
    if load_balancing == "spray":
        return None
    qps = [q for a in agents.values() for q in a.get("recv_qps", []) if q.get("reordered")]
    if not qps:
        return None
    count = sum(q["reordered"] for q in qps)
    at_setup = datapath == "kernel" and all(0 <= q.get("reordered_last_at", -1) < SETUP_PACKETS for q in qps)
    if at_setup and not links_failed:
        return (f"{count} time(s) packets of {len(qps)} single-path flow(s) arrived out of order, each within "
                f"its flow's first {SETUP_PACKETS} packets: the kernel datapath hands a new flow's first packets "
                "to ovs-vswitchd (an upcall) while later ones take the flow it installs; each cost a "
                "go-back-N resend (flows.csv rx_reordered)"), False
    why = {"ecmp": "a route changed under them (link events)" if links_failed else
           "ECMP keeps a flow on one path, so the emulator reordered them",
           "dlb": "a flowlet moved to a shorter queue before the previous one drained "
           "(flowlet gap too short) or a route changed"}.get(load_balancing, "a route changed")
    return (f"{count} time(s) packets of {len(qps)} single-path flow(s) arrived out "
            f"of order ({why}); each cost a go-back-N resend (flows.csv rx_reordered)"), not links_failed


def restart_warnings(restarts: list[dict]) -> list[str]:
    """A part that died and was restarted: the run went on, but not as modelled meanwhile."""
    out = []
    for r in restarts:
        line = (f"{r['component']} {r['how']} {when(r['at_s'])} and was restarted in {r['restarted_in_s']:.2f} s")
        if r["kind"] == "pfc-daemon":
            gates = r.get("gates_reopened") or []
            line += (f"; meanwhile no pause was sent or obeyed, {len(gates)} gate(s) it held closed were"
                     " reopened, and its pause intervals and reaction times before the restart are"
                     " missing (pause counters are kept)")
        out.append(line)
    return out


def engine_lateness(agents: dict[str, dict]) -> dict[int, float]:
    """Per NIC engine: the fraction of its wake-ups that came more than a tick late."""
    out = {}
    for a in agents.values():
        e = a.get("engine") or {}
        if e.get("wakes"):
            out[e["engine"]] = e["late_wakes"] / e["wakes"]
    return out


def cpu_section(cpu: dict) -> dict:
    """summary.json's `cpu`: the machine (busy_mean, busy_max, saturated_fraction of all
    cores), `threads`, the busiest thread of each watched process (busy fractions of one
    core), busiest first, OVS's average output batch (packets waiting at each poll) and its
    flow cache's packets and upcalls over the run; on the kernel datapath, `kernel_datapath`
    (fabric_emu.measure.fidelity.CpuMonitor.kernel_datapath) instead of the last two."""
    return {"cores": cpu.get("cores"), "samples": cpu.get("samples"), "interval_s": cpu.get("interval_s"),
            "busy_mean": cpu.get("cpu_busy_mean"), "busy_max": cpu.get("cpu_busy_max"),
            "saturated_fraction": cpu.get("cpu_saturated_fraction"),
            "watched": cpu.get("watched", []), "threads": cpu.get("threads", []),
            "ovs_output_batch": cpu.get("ovs_output_batch"), "ovs_datapath": cpu.get("ovs_datapath"),
            **({"datapath": cpu["datapath"]} if "datapath" in cpu else {}),
            **({"kernel_datapath": cpu["kernel_datapath"]} if "kernel_datapath" in cpu else {})}
