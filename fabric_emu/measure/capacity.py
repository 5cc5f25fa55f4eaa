"""This machine's capacity for `dilation: auto`: measured once (about 6 s, root), then cached.

Two figures, each per core, because the fabric's packets cost CPU in two places:
- OVS: frames/s of the plan's MTU that one netdev bridge forwards between two namespaces when
  a generator faster than it (iperf3 -u, a C program) floods it. ovs-vswitchd forwards every
  `system` port of the userspace datapath in ONE thread (its main thread: no PMD threads
  without DPDK), so this is the switching capacity of the whole fabric, in frame-hops/s. The
  same generator into a plain veth pair shows how fast it is on its own: if it is not well
  above what crossed OVS, the figure is flagged as a lower bound.
- NIC: packets/s one core of a NIC engine sends (fabric_emu.measure.nic_capacity, pluggable).

On OVS's kernel datapath (fabric_emu.kernel.ovs_datapath) no thread forwards: the probe bridge
is a `system` one, and the OVS figure is frames forwarded per second of the kernel CPU time
(softirq, irq and system, from /proc/stat: fabric_emu.measure.softirq) that one hop adds, i.e.
the kernel time per frame through the bridge less that per frame over the direct veth pair
(which has the same sockets, one veth crossing fewer and no OVS). Not yet run on a machine with
the module: the lab VM exercises it.

The cache (STATE_DIR/capacity.json) is keyed by what makes a figure stale: CPU model, cores,
kernel release, OVS version and the probes' versions; one entry per datapath and MTU measured.

The probe builds its network like a run does, so `fabric-emu clean` can remove it after a
kill -9: a RunRecord names its two root-namespace veth ends and the namespace-holder
processes, and its bridge is tagged with the record's run id. It holds the run lock, so it
never shares the machine (or OVS) with a fabric.
"""

from __future__ import annotations

import json
import os
import platform
import subprocess
import time
from pathlib import Path

from pyroute2 import IPRoute

from fabric_emu.kernel import ovs_datapath
from fabric_emu.measure import nic_capacity, softirq
from fabric_emu.state.cleanup import clean_record, clean_stale
from fabric_emu.spec.experiment import ExperimentSpec
from fabric_emu.measure.dilation import Capacity, PlannedLoad, choose_dilation, explain, planned_load
from fabric_emu.topo.plan import FabricPlan, build_plan, roce_path_mtu
from fabric_emu.state.records import OVS_OWNER_KEY, STATE_DIR, RunLock, RunRecord, write_atomic
from fabric_emu.measure.thread_cpu import busy_fractions, ovs_vswitchd_pid, read_threads

PROBE_VERSION = 2  # bump when the OVS probe measures differently (stales every cache); 2: per datapath
CACHE_PATH = STATE_DIR / "capacity.json"
BRIDGE = "fecap-br"
ROOT_ENDS = ("fecap-a", "fecap-b")  # root-namespace veth ends, on the probe bridge
NS_END = "p0"  # each end inside its namespace
DIRECT_ENDS = ("d0", "d1")  # a veth pair straight between the two namespaces (never in root)
ADDRS = ("10.254.0.1", "10.254.0.2")  # inside the probe's own namespaces only
BLAST_S = 2.0
DIRECT_S = 1.0
LIGHT_S, LIGHT_PPS = 1.0, 1000  # frames arriving one by one: what a wakeup of OVS costs
IP_UDP = 20 + 8
ETH_HEADER = 14
MIN_HOP_SHARE = 0.25  # kernel datapath: a hop costs at least this share of the bridge path's time per frame


# --------------------------------------------------------------------------- cache


def cpu_count() -> int:
    """Cores this process may run on (a container or taskset may allow fewer than exist)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def ovs_version() -> str | None:
    try:
        out = subprocess.run(["ovs-vswitchd", "--version"], capture_output=True, text=True, timeout=10).stdout
    except (OSError, subprocess.SubprocessError):
        return None
    return out.splitlines()[0].split()[-1] if out.strip() else None


def machine_key() -> dict:
    """What a cached capacity holds for: any change here means measure again."""
    return {"cpu_model": _cpu_model(), "cores": cpu_count(), "kernel": platform.release(),
            "openvswitch": ovs_version(), "probe_version": PROBE_VERSION,
            "nic_probe_version": nic_capacity.PROBE_VERSION}


def cached(mtu: int, path: Path | None = None, key: dict | None = None,
           datapath: str = "userspace") -> Capacity | None:
    """The cached capacity on this datapath at this MTU if it is still this machine's; None otherwise."""
    path = path or CACHE_PATH
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    if data.get("machine") != (key or machine_key()):
        return None
    entry = data.get("by_datapath", {}).get(datapath, {}).get(str(mtu))
    try:
        return Capacity.from_dict(entry) if entry else None
    except (KeyError, TypeError, ValueError):
        return None


def store(cap: Capacity, path: Path | None = None, key: dict | None = None) -> None:
    """Add a measurement to the cache (dropping entries of another machine key)."""
    path = path or CACHE_PATH
    key = key or machine_key()
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        data = {}
    if data.get("machine") != key:
        data = {"machine": key, "by_datapath": {}}
    data["by_datapath"].setdefault(cap.datapath, {})[str(cap.mtu)] = {**cap.to_dict(), "measured": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
    path.parent.mkdir(parents=True, exist_ok=True)
    write_atomic(path, json.dumps(data, indent=1) + "\n")


def get(mtu: int, measure_if_missing: bool, datapath: str = "userspace") -> Capacity | None:
    """The cached capacity on this datapath, else a new measurement (when allowed), else None."""
    cap = cached(mtu, datapath=datapath)
    if cap is None and measure_if_missing:
        cap = measure(mtu, datapath)
        store(cap)
    return cap


# --------------------------------------------------------------------------- auto


PROVISIONAL_DILATION = 2000.0  # the topology default: only for showing a plan not yet measured
NOT_MEASURED = ("this machine's capacity on the {datapath} datapath is not measured yet: `fabric-emu run` "
                "measures it (root, about 6 s, cached in {path}), as does `sudo fabric-emu show`")


def with_dilation(spec: ExperimentSpec, dilation: float) -> ExperimentSpec:
    return spec.model_copy(update={"topology": spec.topology.model_copy(update={"dilation": float(dilation)})})


def resolve_auto(spec: ExperimentSpec, plan_at_1: FabricPlan, ranks: list[str],
                 measure: bool, datapath: str = "userspace") -> tuple[ExperimentSpec, FabricPlan]:
    """`dilation: auto` -> the spec and plan at the chosen dilation, from the capacity of the
    OVS datapath the run uses; the plan's extra["dilation_auto"] holds the figures behind the
    choice. Without a cached capacity and without leave to measure, a provisional dilation,
    marked so (for `show` only)."""
    load: PlannedLoad = planned_load(spec, plan_at_1, ranks)
    cap = get(plan_at_1.mtu, measure_if_missing=measure, datapath=datapath)
    if cap is None:
        d = PROVISIONAL_DILATION
        info = {"dilation": None, "provisional_dilation": d, "planned_at_dilation_1": load.to_dict(),
                "reason": NOT_MEASURED.format(path=CACHE_PATH, datapath=datapath)}
    else:
        d = choose_dilation(load, cap)
        info = {**explain(load, cap, d), "capacity_details": cap.details}
    spec = with_dilation(spec, d)
    plan = build_plan(spec.topology)
    plan.extra["dilation_auto"] = info
    return spec, plan


# --------------------------------------------------------------------------- measuring


class ProbeError(RuntimeError):
    """The machine could not be measured (no OVS, no iperf3, a run in progress, ...)."""


def _run(*cmd: str, timeout: float = 20) -> str:
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    if r.returncode != 0:
        raise ProbeError(f"{' '.join(cmd[:4])}: {(r.stderr.strip() or r.stdout.strip()).splitlines()[-1:]}")
    return r.stdout


def _in_ns(holder: int, *cmd: str) -> list[str]:
    return ["nsenter", f"--net=/proc/{holder}/ns/net", "--", *cmd]


class ProbeNet:
    """Two namespaces, a veth pair straight between them, and a bridge (netdev, or system on the
    kernel datapath) joining them; removed on exit (and by `fabric-emu clean` from its record if
    this process dies)."""

    def __init__(self, mtu: int, datapath: str = "userspace") -> None:
        self.mtu = mtu
        self.datapath = datapath
        self.record = RunRecord.new(f"capacity-probe-{os.getpid()}")
        self.holders: list[int] = []
        self._procs: list[subprocess.Popen] = []

    def __enter__(self) -> "ProbeNet":
        self.record.interfaces = list(ROOT_ENDS)
        self.record.save()
        try:
            self._build()
        except BaseException:
            self.__exit__()
            raise
        return self

    def __exit__(self, *exc) -> None:
        for p in self._procs:
            if p.poll() is None:
                p.kill()
            p.wait()
        clean_record(self.record)

    def _holder(self) -> int:
        # A namespace held by a sleeping process: it vanishes with the process, and takes
        # its veth ends (and so their root-namespace peers) with it.
        p = subprocess.Popen(["unshare", "--net", "--", "sleep", "600"], stdin=subprocess.DEVNULL,
                             start_new_session=True)
        self._procs.append(p)
        self.record.add_process(p.pid, "capacity-probe namespace")
        mine = os.readlink("/proc/self/ns/net")
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline:
            try:
                if os.readlink(f"/proc/{p.pid}/ns/net") != mine:
                    return p.pid
            except OSError:
                pass
            time.sleep(0.01)
        raise ProbeError("a probe namespace did not start")

    def _build(self) -> None:
        with IPRoute() as ipr:
            taken = {ln.get_attr("IFLA_IFNAME") for ln in ipr.get_links()} & set(ROOT_ENDS)
        if taken or BRIDGE in _run("ovs-vsctl", "--timeout=10", "list-br").split():
            raise ProbeError(f"names the probe needs are in use: {', '.join(sorted(taken) or [BRIDGE])}")
        a, b = self.holders = [self._holder(), self._holder()]
        mtu = str(self.mtu)
        _run("ip", "link", "add", DIRECT_ENDS[0], "netns", str(a), "type", "veth",
             "peer", "name", DIRECT_ENDS[1], "netns", str(b))
        for root_end, holder in zip(ROOT_ENDS, (a, b)):
            _run("ip", "link", "add", root_end, "mtu", mtu, "type", "veth", "peer", "name", NS_END,
                 "netns", str(holder))
            Path(f"/proc/sys/net/ipv6/conf/{root_end}/disable_ipv6").write_text("1")
            _run("ip", "link", "set", root_end, "up")
        for holder, addr, direct in zip((a, b), ADDRS, DIRECT_ENDS):
            # As on the fabric's hosts: checksums in software (the userspace datapath forwards
            # partially checksummed packets unfixed), and the same on the direct pair.
            script = (f"ip link set lo up; for i in {NS_END} {direct}; do ip link set $i mtu {mtu} up;"
                      f" ethtool -K $i tx off >/dev/null; done; ip addr add {addr}/30 dev {NS_END};"
                      f" ip addr add 10.254.1.{addr.rsplit('.', 1)[1]}/30 dev {direct}")
            _run(*_in_ns(holder, "sh", "-c", script))
        ovs_datapath.prepare(self.datapath)  # as a fabric does before its first bridge
        _run("ovs-vsctl", "--timeout=10", "--", "add-br", BRIDGE, "--", "set", "bridge", BRIDGE,
             f"datapath_type={ovs_datapath.DATAPATH_TYPE[self.datapath]}", "fail_mode=secure",
             "protocols=OpenFlow15",
             f"external_ids:{OVS_OWNER_KEY}={self.record.run_id}",
             "--", "add-port", BRIDGE, ROOT_ENDS[0], "--", "set", "interface", ROOT_ENDS[0], "ofport_request=1",
             "--", "add-port", BRIDGE, ROOT_ENDS[1], "--", "set", "interface", ROOT_ENDS[1], "ofport_request=2")
        for src, dst in ((1, 2), (2, 1)):
            _run("ovs-ofctl", "-O", "OpenFlow15", "add-flow", BRIDGE, f"in_port={src},actions=output:{dst}")

    def udp_blast(self, dst_addr: str, seconds: float, rate: str = "0", port: int = 5301) -> dict:
        """iperf3 -u from the first namespace to dst_addr in the second: frames sent and
        received per second, with frames of the full MTU."""
        a, b = self.holders
        server = subprocess.Popen(_in_ns(b, "iperf3", "-s", "-1", "-B", dst_addr, "-p", str(port)),
                                  stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
        self._procs.append(server)
        self.record.add_process(server.pid, "capacity-probe iperf3 server")
        payload = self.mtu - IP_UDP
        cmd = _in_ns(a, "iperf3", "-u", "-c", dst_addr, "-p", str(port), "-b", rate, "-l", str(payload),
                     "-t", f"{seconds:g}", "-J", "--pacing-timer", "100")
        for _ in range(20):  # until the server listens
            r = subprocess.run(cmd, capture_output=True, text=True, timeout=seconds + 20)
            try:
                out = json.loads(r.stdout)
            except ValueError:
                out = {"error": r.stderr.strip() or "no output"}
            if "error" not in out:
                break
            time.sleep(0.1)
        else:
            raise ProbeError(f"iperf3 through the probe network failed: {out['error']}")
        server.wait(timeout=10)
        sent, recv = out["end"]["sum_sent"], out["end"]["sum_received"]
        return {"sent_pps": sent["packets"] / sent["seconds"],
                "received_pps": (recv["packets"] - recv["lost_packets"]) / recv["seconds"],
                "received": recv["packets"] - recv["lost_packets"],
                "frame_bytes": payload + IP_UDP + ETH_HEADER}


def _ovs_thread_busy(ovs_pid: int, run) -> tuple[dict, str, float]:
    """(what run() returned, the busiest ovs-vswitchd thread and its busy fraction meanwhile)."""
    before, t0 = read_threads(ovs_pid) or {}, time.monotonic()
    result = run()
    after, t1 = read_threads(ovs_pid) or {}, time.monotonic()
    busy = busy_fractions(before, after, t1 - t0)
    tid = max(busy, key=busy.get)
    return result, f"{after[tid][0]} (tid {tid})", busy[tid]


def measure(mtu: int, datapath: str = "userspace") -> Capacity:
    """Measure this machine now on this OVS datapath (root; about 6 s). Takes the run lock for
    the while."""
    if os.geteuid() != 0:
        raise ProbeError("measuring this machine's capacity needs root (sudo)")
    ovs_pid = ovs_vswitchd_pid()
    if ovs_pid is None:
        raise ProbeError("ovs-vswitchd is not running (scripts/setup.sh starts it)")
    if datapath == "kernel":
        return measure_kernel(mtu)
    lock = RunLock()
    if not lock.acquire():
        raise ProbeError("a fabric-emu run is in progress: cannot measure this machine now")
    try:
        clean_stale()
        with ProbeNet(mtu) as net:
            direct = net.udp_blast("10.254.1.2", DIRECT_S, port=5302)
            ovs, thread, busy = _ovs_thread_busy(ovs_pid, lambda: net.udp_blast(ADDRS[1], BLAST_S))
            light_rate = str(LIGHT_PPS * (mtu + ETH_HEADER) * 8)
            light, _, light_busy = _ovs_thread_busy(
                ovs_pid, lambda: net.udp_blast(ADDRS[1], LIGHT_S, rate=light_rate, port=5303))
        nic = nic_capacity.nic_capacity_pps(payload=roce_path_mtu(mtu))
    finally:
        lock.release()
    forwarded = ovs["received_pps"]
    # On a small machine OVS shares the cores with iperf3's sender and receiver, so its thread
    # got only part of one: per whole core, scale up (its cost per frame is what was measured).
    per_core = forwarded / max(busy, 0.05)
    # The generator is fast enough if it offered OVS (or a plain veth pair took from it) half
    # again what OVS forwarded; otherwise the figure is a lower bound.
    generator_limited = busy < 0.9 and max(ovs["sent_pps"], direct["received_pps"]) < 1.5 * forwarded
    details = {
        "ovs": {"forwarded_pps": round(forwarded), "offered_pps": round(ovs["sent_pps"]),
                "thread": thread, "thread_busy": round(busy, 3), "frame_bytes": ovs["frame_bytes"],
                "seconds": BLAST_S, "generator_limited": generator_limited},
        "ovs_light": {"forwarded_pps": round(light["received_pps"]), "thread_busy": round(light_busy, 3),
                      "seconds": LIGHT_S},
        "direct_veth": {"received_pps": round(direct["received_pps"]), "sent_pps": round(direct["sent_pps"])},
        "nic": {**nic, "pps": round(nic["pps"])},
    }
    wakeup_s = light_busy / light["received_pps"] if light["received_pps"] else 0.0
    return Capacity(ovs_pps=round(per_core), nic_pps=round(nic["pps"]), cores=cpu_count(), mtu=mtu,
                    ovs_wakeup_s=round(wakeup_s, 7), details=details)


# --------------------------------------------------------------------------- the kernel datapath


def kernel_time(times: dict[str, float]) -> float:
    """Kernel CPU seconds of a softirq.cpu_seconds result: softirq (with irq) and system time,
    since a softirq run on a sender's way out of its syscall may be charged to either."""
    return times["softirq"] + times["system"]


def kernel_hop_cost(bridge_s: float, bridge_frames: int, direct_s: float, direct_frames: int) -> float:
    """Kernel CPU seconds one switch hop of the kernel datapath adds per frame: per frame through
    the bridge (two veth crossings and OVS) less per frame over the direct pair (one crossing),
    at least MIN_HOP_SHARE of the former (tick-granular counts of a short blast can make the
    difference small or negative)."""
    if bridge_frames <= 0 or bridge_s <= 0:
        raise ProbeError("no kernel CPU time or no frames counted through the probe bridge")
    through = bridge_s / bridge_frames
    direct = direct_s / direct_frames if direct_frames > 0 else 0.0
    return max(through - direct, MIN_HOP_SHARE * through)


def _kernel_time_during(run) -> tuple[dict, dict[str, float]]:
    """(what run() returned, softirq and system CPU seconds over all CPUs meanwhile)."""
    before = softirq.read_proc_stat()
    result = run()
    return result, softirq.cpu_seconds(before, softirq.read_proc_stat())


def measure_kernel(mtu: int) -> Capacity:
    """measure() on OVS's kernel datapath: the probe bridge is a `system` one and the figure is
    frames per second of the kernel CPU time a hop adds (see the module doc). No wakeup cost: no
    thread polls."""
    usable, why = ovs_datapath.probe_module()
    if not usable:
        raise ProbeError(f"the kernel datapath: {why}")
    lock = RunLock()
    if not lock.acquire():
        raise ProbeError("a fabric-emu run is in progress: cannot measure this machine now")
    try:
        clean_stale()
        with ProbeNet(mtu, "kernel") as net:
            direct, direct_t = _kernel_time_during(lambda: net.udp_blast("10.254.1.2", DIRECT_S, port=5302))
            ovs, ovs_t = _kernel_time_during(lambda: net.udp_blast(ADDRS[1], BLAST_S))
        nic = nic_capacity.nic_capacity_pps(payload=roce_path_mtu(mtu))
    finally:
        lock.release()
    hop = kernel_hop_cost(kernel_time(ovs_t), ovs["received"], kernel_time(direct_t), direct["received"])
    details = {
        "ovs": {"datapath": "kernel", "forwarded_pps": round(ovs["received_pps"]),
                "offered_pps": round(ovs["sent_pps"]), "frame_bytes": ovs["frame_bytes"], "seconds": BLAST_S,
                "softirq_s": round(ovs_t["softirq"], 3), "system_s": round(ovs_t["system"], 3),
                "direct_softirq_s": round(direct_t["softirq"], 3), "direct_system_s": round(direct_t["system"], 3),
                "hop_us": round(hop * 1e6, 2)},
        "direct_veth": {"received_pps": round(direct["received_pps"]), "sent_pps": round(direct["sent_pps"])},
        "nic": {**nic, "pps": round(nic["pps"])},
    }
    return Capacity(ovs_pps=round(1 / hop), nic_pps=round(nic["pps"]), cores=cpu_count(), mtu=mtu,
                    details=details, datapath="kernel")
