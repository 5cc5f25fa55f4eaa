"""The NIC engine process: `python -m fabric_emu.nic ENGINE.json` serves the NICs of many hosts.

Protocol with the orchestrator: read the config, open every host's sockets inside its
namespace, print READY; read one line `GO <epoch seconds>` from stdin; start at that time; run
every host's workload; print DONE when every host finished, then keep receiving (and counting)
until a `STOP` line, so packets still in flight when the last ACK came are not lost to the
count; write each host's stats JSON atomically (its own file, as if each host had its own
agent) and exit 0. SIGTERM, SIGINT or the timeout write the stats with status "incomplete" and
exit 1. A bad config exits 2 before anything is opened.
"""

from __future__ import annotations

import ctypes
import json
import os
import select
import signal
import sys
import time
import traceback
from collections.abc import Callable
from pathlib import Path

from fabric_emu.nic.config import AgentConfig, ConfigError, EngineConfig, FlowsConfig, ProgramConfig
from fabric_emu.nic.engine import IDLE_POLL_S, Driver, Engine, Host
from fabric_emu.nic.drivers.flows import FlowRunner, own_qps
from fabric_emu.nic.live import LivePublisher, live_path
from fabric_emu.nic.host_nic import DcqcnSetup, HostLog, HostNic, NicSetup, open_sockets
from fabric_emu.nic.drivers.program import ProgramRunner, fabric_channels
from fabric_emu.nic.scale_up import ScaleUpChannels
from fabric_emu.nic.qps import QueuePair, build_qp_table
from fabric_emu.nic.drivers.ring import RingRunner
from fabric_emu.cc.dcqcn import DcqcnParams
from fabric_emu.workloads.collectives import RingAllReduce, ring_edges
from fabric_emu.kernel.shaping import run_in_netns

DRAIN_LIMIT_S = 30.0  # the longest an engine waits for STOP after its timeout

# Epoch seconds on the monotonic clock: comparable across processes, immune to clock steps.
_EPOCH_OFFSET = time.time() - time.monotonic()


def now() -> float:
    return time.monotonic() + _EPOCH_OFFSET


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


PR_SET_PDEATHSIG = 1  # prctl(2)
END_WITH_PARENT_ENV = "FABRIC_EMU_END_WITH_PARENT"  # set by engines started over ssh (issue 19)


def end_with_parent() -> None:
    """Have the kernel send SIGTERM (the StopFlag: partial stats, then exit) when our parent
    ends. Over ssh the parent is the engine's ssh session, which ends with the head's ssh
    client: without this, an engine mid-run reads no stdin and ran on to its own end (11.6 s
    after a run that a dead machine agent had ended). Only there: locally the parent's thread
    that started us may end first, and PDEATHSIG follows threads."""
    parent = os.getppid()
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_PDEATHSIG)")
    if os.getppid() != parent:  # it ended before we asked
        os.kill(os.getpid(), signal.SIGTERM)


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print("usage: python -m fabric_emu.nic ENGINE.json", file=sys.stderr)
        return 2
    try:
        cfg = EngineConfig.from_json(Path(argv[0]).read_text())
    except (OSError, ConfigError) as e:
        print(f"error: {argv[0]}: {e}", file=sys.stderr)
        return 2
    stop = StopFlag()
    if os.environ.get(END_WITH_PARENT_ENV) == "1":
        end_with_parent()
    hosts: list[Host] = []
    udp_before: dict[str, dict[str, int]] = {}
    go = cpu_at_go = engine = publisher = None
    error: str | None = None
    domains = scale_up_domains(cfg)
    try:
        for hc in cfg.hosts:
            udp_before[hc.host] = udp_counters(hc.netns)
            hosts.append(_open_host(hc, cfg.tick_s, domains))
        publisher = LivePublisher(cfg.engine, hosts, live_path(cfg.hosts[0].stats_path, cfg.engine), now).start()
        print("READY", flush=True)
        timeout = max(hc.timeout_s for hc in cfg.hosts)
        go = _wait_for_go(stop, now() + timeout)
        if go is not None and _sleep_until(go, stop):
            cpu_at_go = os.times()
            engine = Engine(hosts, cfg.tick_s, now, list(domains.values()))
            profile = os.environ.get("FABRIC_EMU_PROFILE")  # a folder: where engine profiles go
            if profile:
                import cProfile
                cProfile.runctx("engine.run(go, stop, go + timeout)", globals(), locals(),
                                f"{profile}/engine{cfg.engine}.prof")
            else:
                engine.run(go, stop, go + timeout)
            if all(h.finished_at for h in hosts):
                # Done; packets still in flight (resends a late ACK made stale) arrive and are
                # counted until the orchestrator, once every engine is done, says STOP.
                print("DONE", flush=True)
                engine.drain(lambda: stop or _stdin_says_stop(), go + timeout + DRAIN_LIMIT_S)
    except (OSError, RuntimeError, ValueError) as e:  # sockets, netlink, MTU, the stdin protocol
        error = str(e)
        print(f"error: engine {cfg.engine}: {e}", file=sys.stderr)
    except Exception as e:  # a bug: still leave the stats behind, and the traceback
        error = f"{type(e).__name__}: {e}"
        traceback.print_exc()
    if error is None and not all(h.finished_at for h in hosts):
        error = f"stopped by signal {stop.signal}" if stop else None
    engine_stats = {"engine": cfg.engine, "hosts": len(cfg.hosts), "cpu_s": None}
    if engine is not None:
        engine_stats.update(wakes=engine.wakes, late_wakes=engine.late_wakes,
                            max_late_s=round(engine.max_late_s, 6), tick_s=cfg.tick_s)
    if cpu_at_go is not None:  # user + system: the kernel's share of sending is the NIC's too
        t = os.times()
        engine_stats.update(cpu_s=t.user + t.system - cpu_at_go.user - cpu_at_go.system,
                            user_s=t.user - cpu_at_go.user, system_s=t.system - cpu_at_go.system)
    by_name = {h.name: h for h in hosts}
    for hc in cfg.hosts:
        h = by_name.get(hc.host)
        stats = _stats(hc, h, go, error, engine_stats, udp_before.get(hc.host, {}))
        if hc.scale_up is not None:  # modelled transfers, no packets: counted apart
            stats["scale_up"] = {"server": hc.scale_up.server,
                                 **domains[hc.scale_up.server].stats.get(hc.host, {})}
        write_atomic(Path(hc.stats_path), json.dumps(stats, indent=1))
    if publisher is not None:
        publisher.stop()
    for h in hosts:
        h.nic.close()
    ok = len(hosts) == len(cfg.hosts) and all(h.finished_at for h in hosts)
    return 0 if ok else 1


def _stdin_says_stop() -> bool:
    """True once the orchestrator wrote STOP (or closed stdin)."""
    readable, _, _ = select.select([sys.stdin], [], [], 0)
    if not readable:
        return False
    line = sys.stdin.readline()
    return not line or line.strip() == "STOP"


def scale_up_domains(cfg: EngineConfig) -> dict[str, ScaleUpChannels]:
    """One modelled scale-up domain per server whose GPUs this engine serves."""
    out: dict[str, ScaleUpChannels] = {}
    for hc in cfg.hosts:
        s = hc.scale_up
        if s is not None and s.server not in out:
            out[s.server] = ScaleUpChannels(s.server, s.hosts, s.rate_bps / 8, s.latency_s)
    return out


def _open_host(cfg: AgentConfig, tick_s: float, domains: dict[str, ScaleUpChannels] | None = None) -> Host:
    """A host's NIC, sockets opened inside its namespace, and how to make its driver at GO."""
    domain = (domains or {}).get(cfg.scale_up.server) if cfg.scale_up else None
    send, recv, make_driver = _queue_pairs(cfg, domain)
    setup = NicSetup(host=cfg.host, ip=cfg.ip, rate_bps=cfg.rate_bps, roce_mtu=cfg.roce_mtu,
                     link_mtu=cfg.link_mtu, transport=cfg.transport,
                     tick_s=tick_s, dcqcn=_dcqcn(cfg), spray_entropies=cfg.spray_entropies)
    ports = [qp.udp_sport for qp in send]
    opener = lambda: open_sockets(setup, ports, cfg.ifname)  # noqa: E731
    socks = run_in_netns(cfg.netns, opener) if cfg.netns else opener()
    ip_of = {r.name: r.ip for r in cfg.ranks}
    log = HostLog(Path(cfg.stats_path).with_name(f"nic-{cfg.host}.log"))
    nic = HostNic(setup, socks, send, recv, ip_of, now(), log)
    return Host(cfg.host, nic, lambda go: make_driver(nic, go))


def _queue_pairs(cfg: AgentConfig, domain: ScaleUpChannels | None = None
                 ) -> tuple[list[QueuePair], list[QueuePair], Callable[[HostNic, float], Driver]]:
    """This host's send and receive QPs (from the table every host rebuilds alike) and its driver."""
    names = tuple(r.name for r in cfg.ranks)
    w = cfg.workload
    if isinstance(w, ProgramConfig):
        edges = fabric_channels(w)  # scale-up channels have no queue pairs
        table = build_qp_table([(s, d) for s, d, _ in edges], [q for _, _, q in edges], cfg.seed)
        send = [qp for qp in table if qp.src == cfg.host]
        recv = [qp for qp in table if qp.dst == cfg.host]
        return send, recv, lambda nic, _go: ProgramRunner(w, cfg.host, nic, domain)
    if isinstance(w, FlowsConfig):
        table = build_qp_table([(f.src, f.dst) for f in w.flows], [f.qps for f in w.flows], cfg.seed)
        send = [qp for qp in table if qp.src == cfg.host]
        recv = [qp for qp in table if qp.dst == cfg.host]
        return send, recv, lambda nic, go: FlowRunner(w.flows, cfg.host, nic, go)
    schedule = RingAllReduce(names, cfg.rank, w.size, w.qps_per_peer, w.iterations)
    table = build_qp_table(ring_edges(list(names)), w.qps_per_peer, cfg.seed)
    send = [qp for qp in table if qp.src == cfg.host and qp.dst == schedule.right]
    recv = [qp for qp in table if qp.dst == cfg.host and qp.src == schedule.left]
    return send, recv, lambda nic, _go: RingRunner(schedule, nic)


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


def _stats(cfg: AgentConfig, host: Host | None, go: float | None, engine_error: str | None,
           engine: dict, udp_before: dict[str, int]) -> dict:
    nic = host.nic if host else None
    runner = host.driver if host else None
    finished = bool(host and host.finished_at)
    error = (host.error if host else None) or (None if finished else engine_error)
    if not finished and error is None:
        error = "timeout"
    send_qps = [sq.stats() for sq in nic.send_qps] if nic else []
    recv_qps = [rq.stats() for rq in nic.recv_qps] if nic else []
    w = cfg.workload
    if isinstance(w, ProgramConfig):
        log = {"ops": runner.op_log() if runner else []}
    elif isinstance(w, FlowsConfig):
        log = {"flows": runner.flow_log if runner else []}
        send_flow, recv_flow = own_qps(w.flows, cfg.host)
        for qps, flow_of in ((send_qps, send_flow), (recv_qps, recv_flow)):
            for q, k in zip(qps, flow_of):
                q["flow"] = k  # the index of the workload flow this QP carries
    else:
        log = {"iterations": runner.iteration_log if runner else [],
               "steps": runner.step_log if runner else []}
    after = udp_counters(cfg.netns)
    return {
        "status": "ok" if finished else "incomplete",
        "error": error,
        "host": cfg.host,
        "rank": cfg.rank,
        "go": go,
        "end": host.finished_at if finished else now(),
        "engine": engine,  # CPU is the engine's, shared by its hosts
        **log,
        "send_qps": send_qps,
        "recv_qps": recv_qps,
        "pacing": nic.pacing_stats() if nic else None,
        "receive": nic.receive_stats() if nic else None,
        "kernel_udp": {k: after[k] - udp_before.get(k, 0) for k in after},
    }


def udp_counters(netns: str | None) -> dict[str, int]:
    """A namespace's kernel UDP error counters (/proc/<pid>/net/snmp), to spot socket drops."""
    path = Path(netns).parent.parent / "net/snmp" if netns else Path("/proc/net/snmp")
    try:
        lines = [ln.split() for ln in path.read_text().splitlines() if ln.startswith("Udp:")]
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
