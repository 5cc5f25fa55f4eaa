"""Drive the host agents of one run: start them in their hosts, start them together, collect.

Protocol (see fabric_emu.agent): each agent prints READY once its sockets are open, waits for
a `GO <epoch>` line, runs its schedule, writes its stats file and prints DONE.
"""

from __future__ import annotations

import json
import select
import subprocess
import sys
import time
from pathlib import Path
from typing import Callable

from fabric_emu import traffic
from fabric_emu.agent.config import AgentConfig, DcqcnConfig, FlowConfig, FlowsConfig, RankInfo, RingConfig
from fabric_emu.config import AllReduceWorkload, ExperimentSpec
from fabric_emu.plan import FabricPlan
from fabric_emu.records import RunRecord

START_DELAY_S = 0.5  # between GO and the common start time, so every agent is waiting
READY_TIMEOUT_S = 30.0


def agent_workload(spec: ExperimentSpec, plan: FabricPlan) -> RingConfig | FlowsConfig:
    """The workload as every agent gets it: modelled start times become emulated ones."""
    w = spec.workload
    if isinstance(w, AllReduceWorkload):
        return RingConfig(size=w.size, iterations=w.iterations, qps_per_peer=w.qps_per_peer)
    flows = traffic.workload_flows(w, [h.name for h in plan.hosts])
    return FlowsConfig(type="flows", flows=tuple(
        FlowConfig(src=f.src, dst=f.dst, size=f.size, qps=f.qps, iterations=f.iterations,
                   start_s=f.start_s * plan.dilation) for f in flows))


def agent_configs(spec: ExperimentSpec, plan: FabricPlan, ranks: list[str], workdir: Path) -> list[AgentConfig]:
    infos = tuple(RankInfo(name=h, ip=plan.host_by_name[h].ip, index=i) for i, h in enumerate(ranks))
    workload = agent_workload(spec, plan)
    return [
        AgentConfig(
            host=h, ip=plan.host_by_name[h].ip, rate_bps=plan.host_rate_bps(h), roce_mtu=plan.roce_mtu,
            ranks=infos, rank=i, workload=workload,
            seed=spec.seed, stats_path=str(workdir / f"agent-{h}.json"), timeout_s=spec.timeout,
            dcqcn=dcqcn_config(spec, plan, h),
        )
        for i, h in enumerate(ranks)
    ]


def dcqcn_config(spec: ExperimentSpec, plan: FabricPlan, host: str) -> DcqcnConfig | None:
    if spec.congestion_control != "dcqcn":
        return None
    return DcqcnConfig(params=spec.dcqcn.params(), dilation=plan.dilation,
                       line_rate_bps=plan.host_rate_bps(host) * plan.dilation)


def unchecked_pairs(workload: RingConfig | FlowsConfig, ranks: list[str]) -> list[tuple[str, str]]:
    """Sender-receiver pairs that the ring of pings before traffic (fabric.check_reachable)
    did not cover, so whose ARP entries may be missing."""
    if isinstance(workload, RingConfig):
        return []
    ring = {(a, ranks[(i + 1) % len(ranks)]) for i, a in enumerate(ranks)}
    return sorted({(f.src, f.dst) for f in workload.flows} - ring)


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
               workdir: Path, say: Callable[[str], None]) -> dict[str, dict]:
    """Run every rank's agent to completion (or timeout); returns stats by host name."""
    procs: dict[str, subprocess.Popen] = {}
    try:
        _start_and_wait(spec, plan, ranks, fabric, record, workdir, say, procs)
    except BaseException as e:
        # Interrupted or failed: agents still write what they measured; keep it for the report.
        _stop(procs)
        e.agent_stats = _collect(ranks, workdir)  # type: ignore[attr-defined]
        raise
    _stop(procs)
    return _collect(ranks, workdir)


def _start_and_wait(spec: ExperimentSpec, plan: FabricPlan, ranks: list[str], fabric,
                    record: RunRecord, workdir: Path, say: Callable[[str], None],
                    procs: dict[str, subprocess.Popen]) -> None:
    cfgs = agent_configs(spec, plan, ranks, workdir)
    for a, b in unchecked_pairs(cfgs[0].workload, ranks):
        # A first packet to an unresolved neighbour waits in a small kernel queue (or is lost).
        fabric.check_reachable([a, b])
    for cfg in cfgs:
        path = workdir / f"agent-{cfg.host}.config.json"
        path.write_text(cfg.to_json())
        with open(workdir / f"agent-{cfg.host}.log", "w") as log:
            procs[cfg.host] = fabric.host(cfg.host).popen(
                [sys.executable, "-m", "fabric_emu.agent", str(path)],
                stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=log, text=True, bufsize=1)
        record.add_process(procs[cfg.host].pid, f"agent {cfg.host}")

    deadline = time.time() + READY_TIMEOUT_S
    for host, p in procs.items():
        if _read_line(p, deadline) != "READY":
            raise RuntimeError(f"agent on {host} did not start (see logs/agent-{host}.log)")

    go = time.time() + START_DELAY_S
    for p in procs.values():
        p.stdin.write(f"GO {go:.6f}\n")
        p.stdin.flush()
    say(f"traffic: {spec.workload.type} over {len(ranks)} hosts started")

    deadline = go + spec.timeout + 5.0  # agents enforce the timeout; this is the backstop
    for host, p in procs.items():
        _read_line(p, deadline)  # DONE, or None when the agent gave up
        try:
            p.wait(timeout=max(0.1, deadline - time.time()))
        except subprocess.TimeoutExpired:
            p.kill()


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


def _collect(ranks: list[str], workdir: Path) -> dict[str, dict]:
    stats = {}
    for h in ranks:
        path = workdir / f"agent-{h}.json"
        try:
            stats[h] = json.loads(path.read_text())
        except (OSError, ValueError):
            stats[h] = {"status": "missing", "host": h}
    return stats
