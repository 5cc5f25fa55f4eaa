"""Drive the NICs of one run: a few engine processes serve every host; start them together.

Protocol (see fabric_emu.nic.main): each engine prints READY once every host's sockets are
open, waits for a `GO <epoch>` line, runs its hosts' schedules, writes one stats file per host
and prints DONE. One engine per core (at most one per host): an idle host costs an engine
almost nothing, and the engines split the busy ones.
"""

from __future__ import annotations

import json
import os
import select
import subprocess
import sys
import time
from pathlib import Path
from typing import Callable, Protocol

from fabric_emu.workloads import jobs
from fabric_emu.workloads.flows import workload_flows
from fabric_emu.lb import spray
from fabric_emu.nic import fastpath
from fabric_emu.nic.config import (AgentConfig, DcqcnConfig, EngineConfig, FlowConfig, FlowsConfig,
                                     ProgramChannel, ProgramConfig, ProgramOp, RankInfo, RingConfig,
                                     ScaleUpConfig, TransportConfig)
from fabric_emu.spec.experiment import ExperimentSpec
from fabric_emu.spec.workloads import AllReduceWorkload
from fabric_emu.topo.plan import FabricPlan
from fabric_emu.workloads.program import Program
from fabric_emu.state.records import RunRecord
from fabric_emu.state.supervise import Component, Supervisor, describe_exit

class EngineSite(Protocol):
    """Where the NIC engines of a fabric over several machines run (issue 19): each machine
    runs its own hosts' engines, in a folder of its own (fabric_emu.fabric.cluster implements
    it over ssh). Without one, every engine runs here."""

    def machine_of(self, host: str) -> str: ...

    def machine_workdir(self, machine: str) -> Path: ...

    def start_engine(self, machine: str, config_path: Path, config_json: str, log) -> subprocess.Popen:
        """Write the config there and start an engine on it (stdin and stdout: text pipes)."""
        ...

    def read(self, machine: str, path: Path) -> str | None: ...


START_DELAY_S = 0.5  # between GO and the common start time, so every engine is waiting
# An engine that dies fails at once (its stdout closes); one still importing gets two minutes:
# in the lab VM under software emulation 8 hosts' engines took 23 s on a second run.
READY_TIMEOUT_S = 120.0
TICK_PACKETS = 8  # packets a QP may send at line rate between two engine wake-ups
MIN_TICK_S, MAX_TICK_S = 2e-3, 20e-3
WAIT_POLL_S = 0.2  # the wait for DONE wakes this often to let the supervisor look around


def program_configs(spec: ExperimentSpec, plan: FabricPlan) -> dict[str, ProgramConfig]:
    """Each host's part of the run's Program (fabric_emu.workloads.jobs), compute times made emulated."""
    return host_programs(jobs.build_program(jobs.resolve_jobs(spec, plan)), plan.dilation)


def host_programs(program: Program, dilation: float) -> dict[str, ProgramConfig]:
    """Each host's ops as its NIC engine takes them: dependencies as indices into the host's
    own ops, compute times x dilation; every host gets every channel (the QP table)."""
    channels = tuple(ProgramChannel(src=c.src, dst=c.dst, qps=c.qps, via=c.via) for c in program.channels)
    out = {}
    for h in program.hosts:
        ops = program.host_ops(h)
        local = {o.id: i for i, o in enumerate(ops)}
        out[h] = ProgramConfig(type="program", channels=channels, ops=tuple(
            ProgramOp(kind=o.kind, channel=o.channel, nbytes=o.nbytes, seconds=o.seconds * dilation,
                      deps=tuple(local[d] for d in o.deps)) for o in ops))
    return out


def agent_workload(spec: ExperimentSpec, plan: FabricPlan) -> RingConfig | FlowsConfig:
    """The workload as every agent gets it: modelled start times become emulated ones."""
    w = spec.workload
    if isinstance(w, AllReduceWorkload):
        return RingConfig(size=w.size, iterations=w.iterations, qps_per_peer=w.qps_per_peer)
    flows = workload_flows(w, [h.name for h in plan.hosts])
    return FlowsConfig(type="flows", flows=tuple(
        FlowConfig(src=f.src, dst=f.dst, size=f.size, qps=f.qps, iterations=f.iterations,
                   start_s=f.start_s * plan.dilation, gap_s=f.gap_s * plan.dilation) for f in flows))


def check_scale_up(program: ProgramConfig, plan: FabricPlan) -> None:
    """Refuse a scale-up channel whose ends are not GPUs of one server (ValueError, one line)."""
    for i, c in enumerate(program.channels):
        if c.via != "fabric" and not plan.same_server(c.src, c.dst):
            raise ValueError(f"channel {i} ({c.src} -> {c.dst}) is scale-up, but {c.src} and {c.dst}"
                             " are not GPUs of one server (plan.servers)")


def scale_up_config(plan: FabricPlan, host: str) -> ScaleUpConfig | None:
    """The host's server as its engine models it, in emulated units; None outside servers."""
    srv = plan.server_of.get(host)
    if srv is None:
        return None
    return ScaleUpConfig(server=srv.name, hosts=srv.hosts, rate_bps=srv.gbps * 1e9 / plan.dilation,
                         latency_s=srv.latency_s * plan.dilation)


def agent_configs(spec: ExperimentSpec, plan: FabricPlan, ranks: list[str], workdir: Path,
                  netns_of: Callable[[str], str | None] = lambda _h: None) -> list[AgentConfig]:
    infos = tuple(RankInfo(name=h, ip=plan.host_by_name[h].ip, index=i) for i, h in enumerate(ranks))
    if jobs.uses_program(spec):
        programs = program_configs(spec, plan)
        if programs:
            check_scale_up(next(iter(programs.values())), plan)  # every host has every channel
        workload_of = programs.__getitem__
    else:
        workload = agent_workload(spec, plan)
        workload_of = lambda _h: workload  # noqa: E731
    t = spec.transport
    transport = TransportConfig(ack_every=t.ack_every, rto_s=t.retransmit_timeout * plan.dilation,
                                retry_limit=t.retry_limit)
    return [
        AgentConfig(
            host=h, ip=plan.host_by_name[h].ip, rate_bps=plan.host_rate_bps(h), roce_mtu=plan.roce_mtu,
            ranks=infos, rank=i, workload=workload_of(h),
            seed=spec.seed, stats_path=str(workdir / f"agent-{h}.json"), timeout_s=spec.timeout,
            dcqcn=dcqcn_config(spec, plan, h), transport=transport, netns=netns_of(h),
            ifname=plan.host_by_name[h].intf, link_mtu=plan.mtu,
            spray_entropies=spray_entropies(spec, plan), scale_up=scale_up_config(plan, h),
        )
        for i, h in enumerate(ranks)
    ]


def spray_entropies(spec: ExperimentSpec, plan: FabricPlan) -> int:
    """UDP source ports each QP rotates through: 0 (one port) unless the run may spray, at the
    start, by a scheduled event, or live (spray.entropies set: `fabric-emu lb spray` later)."""
    may_spray = (spec.load_balancing == "spray" or spec.spray.entropies is not None
                 or any(e.load_balancing == "spray" for e in spec.events))
    if not may_spray:
        return 0
    return spray.plan_entropies([len(plan.uplinks(leaf.name)) for leaf in plan.leaves],
                                spec.spray.entropies)


def tick_s(plan: FabricPlan) -> float:
    """The engines' tick for this fabric: at the slowest host's line rate."""
    return tick_for(min(plan.host_rate_bps(h.name) for h in plan.hosts), plan.mtu)


def tick_for(rate_bps: float, mtu: int) -> float:
    """The engines' longest sleep while packets wait: TICK_PACKETS full frames at rate_bps, within
    [MIN_TICK_S, MAX_TICK_S] (the QP socket buffers hold two ticks)."""
    return min(MAX_TICK_S, max(MIN_TICK_S, TICK_PACKETS * (mtu + 14) * 8 / rate_bps))


def drain_s(plan: FabricPlan) -> float:
    """How long the last packets may still be in flight when every NIC is done: a port buffer
    at the slowest link rate, per switch hop, plus the socket buffers (two ticks)."""
    rate = min(plan.host_rate_bps(h.name) for h in plan.hosts)
    return min(5.0, 3 * plan.port_buffer * 8 / rate + 2 * tick_s(plan) + 0.05)


def engine_count(hosts: int) -> int:
    return max(1, min(hosts, os.cpu_count() or 1))


def engine_configs(cfgs: list[AgentConfig], tick: float, engines: int) -> list[EngineConfig]:
    """Hosts dealt round-robin over the engines (neighbours in a ring land on different ones),
    except that a server's GPUs go together to one engine, which models their scale-up domain:
    each server (or lone host) goes, in rank order, to the engine serving fewest hosts so far."""
    units: dict[str, list[AgentConfig]] = {}
    for c in cfgs:
        units.setdefault(c.scale_up.server if c.scale_up else f"host:{c.host}", []).append(c)
    dealt: list[list[AgentConfig]] = [[] for _ in range(engines)]
    for unit in units.values():
        min(dealt, key=len).extend(unit)  # the first of the least loaded: round-robin for lone hosts
    return [EngineConfig(engine=e, tick_s=tick, hosts=tuple(hs)) for e, hs in enumerate(dealt) if hs]


def dcqcn_config(spec: ExperimentSpec, plan: FabricPlan, host: str) -> DcqcnConfig | None:
    if spec.congestion_control != "dcqcn":
        return None
    return DcqcnConfig(params=spec.dcqcn.params(), dilation=plan.dilation,
                       line_rate_bps=plan.host_rate_bps(host) * plan.dilation)


def unchecked_pairs(workload: RingConfig | FlowsConfig | ProgramConfig, ranks: list[str]) -> list[tuple[str, str]]:
    """Sender-receiver pairs that the ring of pings before traffic (fabric.check_reachable)
    did not cover, so whose ARP entries may be missing."""
    if isinstance(workload, RingConfig):
        return []
    ring = {(a, ranks[(i + 1) % len(ranks)]) for i, a in enumerate(ranks)}
    ends = ([c for c in workload.channels if c.via == "fabric"] if isinstance(workload, ProgramConfig)
            else workload.flows)
    return sorted({(f.src, f.dst) for f in ends} - ring)


def _read_line(proc: subprocess.Popen, deadline: float) -> str | None:
    """One line of an agent's stdout, or None at the deadline or EOF."""
    while True:
        left = deadline - time.time()
        if left <= 0:
            return None
        ready, _, _ = select.select([proc.stdout], [], [], min(left, 0.5))
        if ready:
            line = proc.stdout.readline()
            return line.strip() if line else None


def run_agents(spec: ExperimentSpec, plan: FabricPlan, ranks: list[str], fabric, record: RunRecord,
               workdir: Path, say: Callable[[str], None], watch: Callable[[int, str], None] | None = None,
               info: dict | None = None, on_go: Callable[[float], None] | None = None,
               supervisor: Supervisor | None = None, site: EngineSite | None = None) -> dict[str, dict]:
    """Run every rank's NIC to completion (or timeout); returns stats by host name.

    watch(pid, label), when given, is told each engine process (the fidelity monitor samples it);
    info, when given, gets the engines' count, start-up time and memory; on_go(go) is told the
    wall-clock time traffic starts at (scheduled events count from it); supervisor, when given,
    gets the engines as parts whose death ends the run, and is checked while the NICs run; site,
    when given, runs each machine's engines there."""
    procs: dict[str, subprocess.Popen] = {}
    try:
        _start_and_wait(spec, plan, ranks, fabric, record, workdir, say, procs, watch,
                        info if info is not None else {}, on_go, supervisor, site)
    except BaseException as e:
        # Interrupted or failed: engines still write what they measured; keep it for the report.
        _stop(procs)
        e.agent_stats = _collect(ranks, workdir, site)  # type: ignore[attr-defined]
        raise
    finally:
        if supervisor is not None:  # stopped engines are no deaths
            supervisor.remove_kind("nic")
    _stop(procs)
    return _collect(ranks, workdir, site)


def placed_engines(cfgs: list[AgentConfig], tick: float, site: EngineSite | None) -> list[tuple[str | None, EngineConfig]]:
    """The engines and the machine each runs on (None: here): a machine's hosts are served by
    engines on that machine, numbered on across machines; their stats go to its folder."""
    if site is None:
        return [(None, ec) for ec in engine_configs(cfgs, tick, engine_count(len(cfgs)))]
    by_machine: dict[str, list[AgentConfig]] = {}
    for c in cfgs:
        m = site.machine_of(c.host)
        by_machine.setdefault(m, []).append(c.model_copy(update={"stats_path": str(site.machine_workdir(m) / f"agent-{c.host}.json")}))
    placed: list[tuple[str | None, EngineConfig]] = []
    for m, group in by_machine.items():
        for ec in engine_configs(group, tick, engine_count(len(group))):
            placed.append((m, ec.model_copy(update={"engine": len(placed)})))
    return placed


def _start_and_wait(spec: ExperimentSpec, plan: FabricPlan, ranks: list[str], fabric,
                    record: RunRecord, workdir: Path, say: Callable[[str], None],
                    procs: dict[str, subprocess.Popen],
                    watch: Callable[[int, str], None] | None, info: dict,
                    on_go: Callable[[float], None] | None = None,
                    supervisor: Supervisor | None = None, site: EngineSite | None = None) -> None:
    cfgs = agent_configs(spec, plan, ranks, workdir, fabric.netns_of)
    for a, b in unchecked_pairs(cfgs[0].workload, ranks):
        # A first packet to an unresolved neighbour waits in a small kernel queue (or is lost).
        fabric.check_reachable([a, b])
    engines = placed_engines(cfgs, tick_s(plan), site)
    started = time.monotonic()
    if any(machine is None for machine, _ in engines):
        # Compiled here once on a first run, not by every engine at once within its start-up
        # time (in the lab VM under software emulation that passed 30 s).
        fastpath.build_library()
    names: dict[str, str] = {}  # engine{N} -> its name in the supervisor's messages
    gives_up = [float("inf")]  # when the engines stop by themselves (their timeout), once GO is sent
    for machine, ec in engines:
        name = f"engine{ec.engine}"
        names[name] = engine_name(ec.engine, [h.host for h in ec.hosts])
        with open(workdir / f"{name}.log", "w") as log:
            if machine is None:
                path = workdir / f"{name}.config.json"
                path.write_text(ec.to_json())
                procs[name] = subprocess.Popen(
                    [sys.executable, "-m", "fabric_emu.nic", str(path)],
                    stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=log, text=True, bufsize=1)
            else:  # its ssh client here: the engine's CPU is that machine's
                procs[name] = site.start_engine(machine, site.machine_workdir(machine) / f"{name}.config.json",
                                                ec.to_json(), log)
        record.add_process(procs[name].pid, f"nic {name}" + (f" (ssh to {machine})" if machine else ""))
        if watch is not None and machine is None:
            watch(procs[name].pid, f"nic {name}")
        if supervisor is not None:
            supervisor.add(Component(names[name], "nic", "fail",
                                     probe=lambda p=procs[name]: _engine_death(p, gives_up[0])))

    deadline = time.time() + READY_TIMEOUT_S
    for name, p in procs.items():
        if _read_line(p, deadline) != "READY":
            try:
                why = f"exited with status {p.wait(timeout=2)}"
            except subprocess.TimeoutExpired:
                why = f"was not ready within {READY_TIMEOUT_S:.0f}s"
            raise RuntimeError(f"NIC {name} did not start: it {why} (see logs/{name}.log)")
    rss = [_rss_bytes(p.pid) for p in procs.values()]
    info.update(engines=len(procs), hosts=len(cfgs), ready_s=round(time.monotonic() - started, 3),
                rss_bytes=sum(rss), rss_bytes_per_host=round(sum(rss) / len(cfgs)))
    say(f"{len(cfgs)} NICs ready in {info['ready_s']:.1f}s ({len(procs)} engine process"
        f"{'es' if len(procs) > 1 else ''}, {sum(rss) / len(cfgs) / 1e6:.1f} MB per host)")

    go = time.time() + START_DELAY_S
    for p in procs.values():
        p.stdin.write(f"GO {go:.6f}\n")
        p.stdin.flush()
    if on_go is not None:
        on_go(go)
    what = " + ".join(w.type for w in spec.jobs)
    say(f"traffic: {what} over {len(ranks)} hosts started")

    if supervisor is not None:
        supervisor.traffic_started(time.monotonic() + max(0.0, go - time.time()))
    gives_up[0] = go + spec.timeout
    deadline = go + spec.timeout + 5.0  # engines enforce the timeout; this is the backstop
    _wait_done(procs, deadline, supervisor, names)
    # Every engine is done (or gave up): let what is still in flight land and be counted.
    _sleep_watching(drain_s(plan), supervisor)
    for p in procs.values():
        try:
            p.stdin.write("STOP\n")
            p.stdin.flush()
        except OSError:
            pass  # it has exited already
    for p in procs.values():
        try:
            p.wait(timeout=max(5.0, deadline - time.time()))
        except subprocess.TimeoutExpired:
            p.kill()


def engine_name(engine: int, hosts: list[str], most: int = 6) -> str:
    """An engine as a user reads it: "NIC engine 2 (hosts h3, h7)"."""
    shown = ", ".join(hosts[:most]) + (f" and {len(hosts) - most} more" if len(hosts) > most else "")
    return f"NIC engine {engine} (host{'s' if len(hosts) > 1 else ''} {shown})"


def _engine_death(p: subprocess.Popen, gives_up: float) -> str | None:
    """How an engine died, or None: running, or it stopped by itself at its timeout (it wrote
    its stats and exits 1 without DONE: the deadline's doing, which the summary explains)."""
    how = describe_exit(p.poll())
    if how is not None and p.returncode >= 0 and time.time() >= gives_up:
        return None
    return how


def _wait_done(procs: dict[str, subprocess.Popen], deadline: float, supervisor: Supervisor | None,
               names: dict[str, str]) -> None:
    """Until every engine said DONE (or gave up: EOF), or the deadline; the supervisor looks
    around at every wake-up, so a dead engine (EOF without DONE) or another dead part ends the
    wait at once instead of at the deadline."""
    pending = dict(procs)
    while pending:
        left = deadline - time.time()
        if left <= 0:
            return
        ready, _, _ = select.select([p.stdout for p in pending.values()], [], [], min(left, WAIT_POLL_S))
        for name in [n for n, p in pending.items() if p.stdout in ready]:
            p = pending.pop(name)
            if p.stdout.readline():  # DONE: its exit after STOP is no death
                if supervisor is not None:
                    supervisor.remove(names[name])
                continue
            # EOF: it gave up at its timeout, or it died
            if supervisor is not None:  # EOF without DONE: it died (give its exit status a moment)
                try:
                    p.wait(timeout=1.0)
                except subprocess.TimeoutExpired:
                    pass
                supervisor.check(force=True)
        if supervisor is not None:
            supervisor.check()


def _sleep_watching(seconds: float, supervisor: Supervisor | None) -> None:
    end = time.monotonic() + seconds
    while (left := end - time.monotonic()) > 0:
        time.sleep(min(left, WAIT_POLL_S))
        if supervisor is not None:
            supervisor.check()


def _rss_bytes(pid: int) -> int:
    """Resident memory of a process (0 if it is gone)."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


def _stop(procs: dict[str, subprocess.Popen]) -> None:
    for p in procs.values():
        if p.poll() is None:
            p.terminate()  # agents write their partial stats on SIGTERM
    for p in procs.values():
        try:
            p.wait(timeout=5)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()


def _collect(ranks: list[str], workdir: Path, site: EngineSite | None = None) -> dict[str, dict]:
    stats = {}
    for h in ranks:
        try:
            if site is None:
                text = (workdir / f"agent-{h}.json").read_text()
            else:
                machine = site.machine_of(h)
                text = site.read(machine, site.machine_workdir(machine) / f"agent-{h}.json") or ""
            stats[h] = json.loads(text)
        except (OSError, ValueError):
            stats[h] = {"status": "missing", "host": h}
    return stats
