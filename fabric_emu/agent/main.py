"""The host agent process: `python -m fabric_emu.agent CONFIG.json`, one per host namespace.

Protocol with the orchestrator: read the config, open the sockets, print READY; read one line
`GO <epoch seconds>` from stdin; start at that time; run the workload; write the stats JSON
atomically; print DONE and exit 0. SIGTERM, SIGINT or the timeout write the stats with status
"incomplete" and exit 1. A bad config exits 2 before anything is opened.
"""

from __future__ import annotations

import json
import os
import select
import signal
import sys
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from fabric_emu.agent.config import AgentConfig, ConfigError, FlowsConfig
from fabric_emu.agent.flows import FlowRunner, own_qps
from fabric_emu.agent.loop import IDLE_POLL_S, Driver, now, run_loop
from fabric_emu.agent.nic import DcqcnSetup, Nic
from fabric_emu.cc.dcqcn import DcqcnParams
from fabric_emu.agent.qps import build_qp_table
from fabric_emu.agent.ring import RingRunner
from fabric_emu.collectives import RingAllReduce, ring_edges


class StopFlag:
    """Set by SIGTERM/SIGINT; the loops poll it."""

    def __init__(self) -> None:
        self.signal: int | None = None
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, self._handle)

    def _handle(self, signum: int, _frame: object) -> None:
        self.signal = signum

    def __bool__(self) -> bool:
        return self.signal is not None


@dataclass
class Run:
    """What one agent run has done so far: the stats are written from it whatever happens."""

    cfg: AgentConfig
    udp_before: dict[str, int]
    nic: Nic | None = None
    runner: RingRunner | FlowRunner | None = None
    go: float | None = None
    cpu_at_go: float | None = None
    finished: bool = False
    error: str | None = None


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print("usage: python -m fabric_emu.agent CONFIG.json", file=sys.stderr)
        return 2
    try:
        cfg = AgentConfig.from_json(Path(argv[0]).read_text())
    except (OSError, ConfigError) as e:
        print(f"error: {argv[0]}: {e}", file=sys.stderr)
        return 2
    stop = StopFlag()
    run = Run(cfg, udp_counters())
    try:
        _execute(run, stop)
    except (OSError, RuntimeError, ValueError) as e:  # sockets, MTU, the stdin protocol
        run.error = str(e)
        print(f"error: {cfg.host}: {e}", file=sys.stderr)
    except Exception as e:  # a bug: still leave the stats behind, and the traceback
        run.error = f"{type(e).__name__}: {e}"
        traceback.print_exc()
    if not run.finished and run.error is None:
        run.error = f"stopped by signal {stop.signal}" if stop else "timeout"
    stats = _stats(run)
    if run.nic is not None:
        run.nic.close()
    write_atomic(Path(cfg.stats_path), json.dumps(stats, indent=1))
    if run.finished:
        print("DONE", flush=True)
    return 0 if run.finished else 1


def _execute(run: Run, stop: StopFlag) -> None:
    cfg = run.cfg
    make_driver, run.nic = _build(cfg)
    print("READY", flush=True)
    run.go = _wait_for_go(stop, now() + cfg.timeout_s)
    if run.go is None or not _sleep_until(run.go, stop):
        return
    run.runner = make_driver(run.go)
    run.cpu_at_go = time.process_time()
    run.finished = run_loop(run.runner, run.nic, stop, run.go + cfg.timeout_s)


def _build(cfg: AgentConfig) -> tuple[Callable[[float], Driver], Nic]:
    """The NIC with this host's queue pairs, and how to make the workload's driver at GO."""
    names = tuple(r.name for r in cfg.ranks)
    ip_of = {r.name: r.ip for r in cfg.ranks}
    w = cfg.workload
    if isinstance(w, FlowsConfig):
        table = build_qp_table([(f.src, f.dst) for f in w.flows], [f.qps for f in w.flows], cfg.seed)
        send = [qp for qp in table if qp.src == cfg.host]
        recv = [qp for qp in table if qp.dst == cfg.host]
        nic = Nic(cfg.ip, cfg.rate_bps, cfg.roce_mtu, send, recv, ip_of, now(), _dcqcn(cfg))
        return (lambda go: FlowRunner(w.flows, cfg.host, nic, go)), nic
    schedule = RingAllReduce(names, cfg.rank, w.size, w.qps_per_peer, w.iterations)
    table = build_qp_table(ring_edges(list(names)), w.qps_per_peer, cfg.seed)
    send = [qp for qp in table if qp.src == cfg.host and qp.dst == schedule.right]
    recv = [qp for qp in table if qp.dst == cfg.host and qp.src == schedule.left]
    nic = Nic(cfg.ip, cfg.rate_bps, cfg.roce_mtu, send, recv, ip_of, now(), _dcqcn(cfg))
    return (lambda _go: RingRunner(schedule, nic)), nic


def _dcqcn(cfg: AgentConfig) -> DcqcnSetup | None:
    d = cfg.dcqcn
    if d is None:
        return None
    return DcqcnSetup(DcqcnParams(**d.params), d.dilation, d.line_rate_bps)


def _wait_for_go(stop: StopFlag, deadline: float) -> float | None:
    """The start time from a `GO <epoch>` line on stdin; None on stop or timeout."""
    while not stop and now() < deadline:
        readable, _, _ = select.select([sys.stdin], [], [], IDLE_POLL_S)
        if not readable:
            continue
        line = sys.stdin.readline()
        parts = line.split()
        if len(parts) != 2 or parts[0] != "GO":
            raise RuntimeError(f"expected 'GO <epoch seconds>' on stdin, got {line!r}")
        return float(parts[1])
    return None


def _sleep_until(t: float, stop: StopFlag) -> bool:
    while not stop:
        left = t - now()
        if left <= 0:
            return True
        time.sleep(min(left, IDLE_POLL_S))
    return False


def _stats(run: Run) -> dict:
    nic, runner, after = run.nic, run.runner, udp_counters()
    send_qps = [sq.stats() for sq in nic.send_qps] if nic else []
    recv_qps = [rq.stats() for rq in nic.recv_qps] if nic else []
    w = run.cfg.workload
    if isinstance(w, FlowsConfig):
        log = {"flows": runner.flow_log if runner else []}
        send_flow, recv_flow = own_qps(w.flows, run.cfg.host)
        for qps, flow_of in ((send_qps, send_flow), (recv_qps, recv_flow)):
            for q, k in zip(qps, flow_of):
                q["flow"] = k  # the index of the workload flow this QP carries
    else:
        log = {"iterations": runner.iteration_log if runner else [],
               "steps": runner.step_log if runner else []}
    return {
        "status": "ok" if run.finished else "incomplete",
        "error": run.error,
        "host": run.cfg.host,
        "rank": run.cfg.rank,
        "go": run.go,
        "end": now(),
        # CPU seconds used since GO: tells a starved agent from a saturated one
        "cpu_s": time.process_time() - run.cpu_at_go if run.cpu_at_go is not None else None,
        **log,
        "send_qps": send_qps,
        "recv_qps": recv_qps,
        "pacing": nic.pacing_stats() if nic else None,
        "receive": nic.receive_stats() if nic else None,
        "kernel_udp": {k: after[k] - run.udp_before.get(k, 0) for k in after},
    }


def udp_counters() -> dict[str, int]:
    """This namespace's kernel UDP error counters (/proc/net/snmp), to spot socket drops."""
    try:
        lines = [ln.split() for ln in Path("/proc/net/snmp").read_text().splitlines()
                 if ln.startswith("Udp:")]
    except OSError:
        return {}
    names, values = lines[0][1:], lines[1][1:]
    wanted = ("InErrors", "RcvbufErrors", "SndbufErrors")
    return {k: int(v) for k, v in zip(names, values) if k in wanted}


def write_atomic(path: Path, text: str) -> None:
    """Write via a temporary file and rename, so readers never see half a file."""
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text)
    os.replace(tmp, path)
