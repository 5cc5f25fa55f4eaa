"""A fabric partitioned over several machines through Mininet's Cluster Edition (issue 19).

Cluster Edition (mininet.examples.cluster, shipped with Debian's mininet) runs each node's
shell on its machine over ssh and gives us its extension points; we fill three of them:

- where nodes go: `placer_for` turns fabric_emu.topo.placement's answer (a leaf with its hosts,
  a pod or a rail group on one machine; the top tier spread) into a Cluster Edition Placer;
- how a link between machines is made: `StitchLink` joins the link's two ends, each a veth on
  its own machine, through one kernel VXLAN device per link and machine (VNI per link) with
  a tc redirect at each end: frames, PFC frames and ECN marks cross unchanged, and no bridge
  is in the path (a Linux bridge drops PFC frames). Its stock links do not fit: GRE forces MTU
  1450 (and this kernel has none), the ssh link needs a tap and PermitTunnel;
- how machines are reached: every ssh of it reads one ssh config file (`-F`), and the switches'
  OpenFlow channel comes back to the head's loopback through `ssh -R`, so the controller
  still listens on loopback only.

Its global clean-up (`mn -c` on every server: it kills every Mininet process there) is never
called: a cluster fabric removes what it made, by name.
"""

from __future__ import annotations

import ipaddress
import json
import os
import re
import select
import shlex
import subprocess
import sys
import time
from collections.abc import Callable
from contextlib import contextmanager
from dataclasses import dataclass
from dataclasses import asdict, field
from functools import partial
from pathlib import Path

from fabric_emu.fabric.build import FabricSwitch, LaunchedController, PlanTopo
from fabric_emu.kernel.vxlan import VXLAN_PORT
from fabric_emu.state.records import RunRecord
from fabric_emu.spec.machines import fits_underlay, underlay_mtu_needed
from fabric_emu.topo.placement import Placement
from fabric_emu.topo.plan import FabricPlan


from fabric_emu.kernel import mininet_compat

mininet_compat.install()  # before any of Mininet: Python 3.12 has no distutils
from mininet.examples import cluster as ce  # noqa: E402  (after mininet_compat)

UNDERLAY_DEVICE_RE = re.compile(r"\bdev (\S+)")


@dataclass
class Stitch:
    """A cut link's end on this machine: its stitch end and its VXLAN device (cluster.stitch_names)."""

    stitch: str
    vxlan: str


@dataclass
class MachineJob:
    run_id: str
    machine: str
    plan: dict  # FabricPlan.to_dict()
    machine_of: dict[str, str]  # every node -> its machine
    host_pids: dict[str, int]  # this machine's hosts -> their shells' pids, as this machine sees them
    ports: dict  # the run's port settings (fabric_emu.ports.model.port_args)
    stitches: list[Stitch] = field(default_factory=list)

    def to_json(self) -> str:
        return json.dumps(asdict(self))

    @classmethod
    def from_json(cls, line: str) -> "MachineJob":
        raw = json.loads(line)
        raw["stitches"] = [Stitch(**s) for s in raw.get("stitches", [])]
        return cls(**raw)


@dataclass(frozen=True)
class Machine:
    """One machine as the cluster sees it: ssh reaches it at ssh_address; its links' tunnels
    end at underlay (the same address on most clusters)."""

    name: str
    ssh_address: str
    underlay: str
    user: str = "root"

    @property
    def dest(self) -> str:
        return f"{self.user}@{self.ssh_address}"


def ssh(ssh_config: Path | None) -> list[str]:
    """Our ssh command: never asks for a password; reads `ssh_config` when given (keys, known
    hosts and users then come from it, not from ~/.ssh), else the user's own ssh set-up."""
    return ["ssh", *(["-F", str(ssh_config)] if ssh_config else []), "-o", "BatchMode=yes"]


def ssh_base(ssh_config: Path | None) -> list[str]:
    """Cluster Edition's ssh command (RemoteMixin.sshbase)."""
    return [*ssh(ssh_config), "-q", "-tt"]


def placer_for(placement: Placement) -> type[ce.Placer]:
    """A Cluster Edition Placer answering from a fabric_emu placement."""

    class FabricPlacer(ce.Placer):
        def place(self, node: str) -> str:
            return placement.machine_of[node]

    return FabricPlacer


def stitch_names(vni: int) -> tuple[str, str]:
    """A cut link's two devices on each machine: the stitch end of its veth and its VXLAN device."""
    return f"fest{vni}", f"fevx{vni}"


def stitch_commands(intf: str, vni: int, local: str, remote: str, underlay_dev: str, mtu: int,
                    redirect: bool = True) -> list[str]:
    """The commands that make one machine's end of a cut link: the switch port `intf` as one
    end of a veth whose other end (the stitch end) is redirected, both ways, to and from the
    link's VXLAN device. Unicast to the one remote, no learning, never fragmented (df set: a
    frame the underlay cannot carry whole must be lost, not passed in pieces). redirect=False:
    no tc redirect, for the port programs' stitch (fabric_emu.run.machine attaches it)."""
    stitch, vx = stitch_names(vni)
    for name in (intf, stitch, vx, underlay_dev):
        if not re.fullmatch(r"[A-Za-z0-9_.-]{1,15}", name):
            raise ValueError(f"{name!r} is not a usable interface name")
    for address in (local, remote):
        ipaddress.ip_address(address)
    return [
        f"ip link add name {intf} mtu {mtu} type veth peer name {stitch} mtu {mtu}",
        f"ip link add {vx} type vxlan id {vni} local {local} remote {remote} dstport {VXLAN_PORT}"
        f" dev {underlay_dev} nolearning df set",
        f"ip link set {vx} mtu {mtu} up",
        f"ip link set {stitch} up",
    ] + ([] if not redirect else [
        f"tc qdisc add dev {stitch} clsact",
        f"tc filter add dev {stitch} ingress protocol all u32 match u32 0 0 action mirred egress redirect dev {vx}",
        f"tc qdisc add dev {vx} clsact",
        f"tc filter add dev {vx} ingress protocol all u32 match u32 0 0 action mirred egress redirect dev {stitch}",
    ])


class _Tunnel:
    """What Cluster Edition keeps of a link between machines (RemoteLink.tunnel): terminate()
    removes the VXLAN devices; RemoteLink.stop then deletes the two ports, and so the veths."""

    def __init__(self, ends: list[tuple[ce.RemoteMixin, str]]) -> None:
        self.ends = ends

    def terminate(self) -> None:
        for node, device in self.ends:
            node.rcmd(f"ip link del {device} 2>/dev/null")

    def poll(self) -> None:
        return None


class StitchLink(ce.RemoteLink):
    """A Cluster Edition link that, between machines, is a VXLAN-stitched veth on each side
    (see the module's doc). Bound to a run by `stitch_link_for` (VNIs, underlay addresses)."""

    vnis: dict[frozenset[str], int] = {}
    machines: dict[str, Machine] = {}
    mtu: int = 1500
    redirect: bool = True  # False: the machines' port programs stitch (fabric_emu.run.machine)
    devices: dict[tuple[str, str], str] = {}  # (machine, remote underlay address) -> device

    def makeTunnel(self, node1, node2, intfname1, intfname2, addr1=None, addr2=None):  # noqa: N802
        vni = self.vnis[frozenset((intfname1, intfname2))]
        vx = stitch_names(vni)[1]
        made: list[tuple[ce.RemoteMixin, str]] = []  # (node, device): the port takes its veth peer along
        for node, intf, addr, peer in ((node1, intfname1, addr1, node2), (node2, intfname2, addr2, node1)):
            local, remote = self.machines[node.server].underlay, self.machines[peer.server].underlay
            key = (node.server, remote)
            if key not in self.devices:  # one lookup per machine and peer: every link leaves the same way
                self.devices[key] = underlay_device(node.rcmd, remote)
            made += [(node, intf), (node, vx)]
            cmds = stitch_commands(intf, vni, local, remote, self.devices[key], self.mtu, self.redirect)
            if addr:
                cmds.append(f"ip link set {intf} address {addr}")
            # one ssh for the whole end: each command is silent when it works, and the first
            # that fails stops the rest (a new ssh per command made most of a fabric's start-up)
            out = node.rcmd(["sh", "-c", shlex.quote("set -e; " + "; ".join(cmds))]).strip()
            if out:
                _Tunnel(made).terminate()
                raise RuntimeError(f"{node.server}: making {intf}'s end of the link failed: {out.splitlines()[-1]}")
        ends = [(node, name) for node, name in made if name == vx]
        return _Tunnel(ends)


def underlay_device(rcmd: Callable[[str], str], remote: str) -> str:
    """The device a machine reaches `remote` by (its route), run on that machine."""
    match = UNDERLAY_DEVICE_RE.search(rcmd(f"ip route get {remote}"))
    if not match:
        raise RuntimeError(f"no route to the underlay address {remote}")
    return match.group(1)


def cut_vnis(plan: FabricPlan, placement: Placement) -> dict[frozenset[str], int]:
    """A VNI per cut link (its index in the plan, from 1), by its two interfaces."""
    return {frozenset((ln.a_intf, ln.b_intf)): i for i, ln in enumerate(plan.links, start=1) if ln in placement.cut}


def stitch_link_for(plan: FabricPlan, placement: Placement, machines: list[Machine],
                    redirect: bool = True) -> type[StitchLink]:
    """StitchLink bound to one fabric."""
    return type("FabricStitchLink", (StitchLink,), {"vnis": cut_vnis(plan, placement), "mtu": plan.mtu,
                                                    "machines": {m.name: m for m in machines},
                                                    "redirect": redirect, "devices": {}})


def check_underlay(machines: list[Machine], fabric_mtu: int, run_on: Callable[[Machine, str], str]) -> None:
    """Refuse, before anything is built, an underlay that cannot carry a full fabric frame in
    VXLAN between some two machines. run_on(machine, command) runs a command there."""
    for m in machines:
        for peer in machines:
            if peer is m:
                continue
            ipaddress.ip_address(peer.underlay)  # nothing else reaches the shell
            out = run_on(m, f"d=$(ip route get {peer.underlay} | grep -o 'dev [^ ]*' | cut -d' ' -f2) && "
                            "echo $d $(cat /sys/class/net/$d/mtu)").split()
            if len(out) != 2 or not out[1].isdigit():
                raise RuntimeError(f"machines: {m.name} has no route to {peer.name}'s underlay address {peer.underlay}")
            device, mtu = out[0], int(out[1])
            if not fits_underlay(fabric_mtu, mtu):
                raise ValueError(f"machines: {m.name} reaches {peer.name} ({peer.underlay}) by {device}, MTU {mtu}: "
                                 f"the fabric's {fabric_mtu}-byte frames in VXLAN need an underlay MTU of at least "
                                 f"{underlay_mtu_needed(fabric_mtu)}")


RTT_RE = re.compile(r"rtt min/avg/max/mdev = [\d.]+/([\d.]+)/")


@dataclass(frozen=True)
class Underlay:
    """What the preflight measured: each machine's clock against the head's (offset,
    uncertainty, seconds) and each pair's underlay round trip (seconds)."""

    clocks: dict[str, tuple[float, float]]
    rtt: dict[tuple[str, str], float]

    def to_dict(self) -> dict:
        return {"clock_offset_ms": {m: round(o * 1e3, 3) for m, (o, _) in self.clocks.items()},
                "clock_uncertainty_ms": {m: round(u * 1e3, 3) for m, (_, u) in self.clocks.items()},
                "rtt_ms": {f"{a}->{b}": round(r * 1e3, 3) for (a, b), r in self.rtt.items()}}


def clock_offset(ssh_config: Path | None, m: Machine, samples: int = 5) -> tuple[float, float]:
    """A machine's wall clock minus the head's, and how far off that can be (half the best
    round trip), over one ssh session: a new connection per sample would cost far more."""
    p = subprocess.Popen([*ssh(ssh_config), m.dest, "while read _; do date +%s.%N; done"], stdin=subprocess.PIPE,
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, bufsize=1)
    try:
        best: tuple[float, float] | None = None
        for _ in range(samples + 1):  # the first answer also waits for the session: not kept
            t0 = time.time()
            p.stdin.write("\n")
            p.stdin.flush()
            line = p.stdout.readline()
            t1 = time.time()
            if not line:
                raise RuntimeError(f"{m.name}: cannot read its clock over ssh: {p.stderr.read().strip()}")
            offset, half = float(line) - (t0 + t1) / 2, (t1 - t0) / 2
            if best is None or half < best[1]:
                best = (offset, half)
        return best
    finally:
        p.stdin.close()
        p.wait(10)


def underlay_rtt(ssh_config: Path | None, m: Machine, peer: Machine) -> subprocess.Popen:
    """Ping the peer's underlay address from machine m (5 pings, 0.2 s apart): started, to be
    read with rtt_of."""
    return subprocess.Popen([*ssh(ssh_config), m.dest, f"ping -n -q -c 5 -i 0.2 -W 1 {peer.underlay}"],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def preflight(ssh_config: Path | None, machines: list[Machine], pairs: set[tuple[str, str]]) -> Underlay:
    """Each machine's clock, and the underlay round trip of every pair of machines a cut link joins."""
    by_name = {m.name: m for m in machines}
    pings = {(a, b): underlay_rtt(ssh_config, by_name[a], by_name[b]) for a, b in sorted(pairs)}
    clocks = {m.name: clock_offset(ssh_config, m) for m in machines}
    rtt = {}
    for (a, b), p in pings.items():
        out, _ = p.communicate(timeout=30)
        match = RTT_RE.search(out)
        if not match:
            raise RuntimeError(f"machines: {a} cannot ping {b}'s underlay address {by_name[b].underlay}: "
                               f"{out.strip().splitlines()[-1] if out.strip() else 'no answer'}")
        rtt[(a, b)] = float(match.group(1)) / 1e3
    return Underlay(clocks, rtt)


def ssh_run(ssh_config: Path | None, machine: Machine, command: str, timeout: float = 30) -> str:
    """A command on a machine over ssh (its output and errors)."""
    done = subprocess.run([*ssh(ssh_config), machine.dest, command],
                          capture_output=True, text=True, timeout=timeout)
    return done.stdout + done.stderr


class ControlTunnels:
    """The switches' OpenFlow channel: one `ssh -R` per machine, so a switch connecting to
    tcp:127.0.0.1:<port> on its own machine reaches the controller on the head's loopback."""

    def __init__(self, ssh_config: Path | None, machines: list[Machine], port: int) -> None:
        self.procs: list[subprocess.Popen] = []
        try:
            for m in machines:
                proc = subprocess.Popen(
                    [*ssh(ssh_config), "-N", "-o", "ExitOnForwardFailure=yes",
                     "-R", f"127.0.0.1:{port}:127.0.0.1:{port}", m.dest],
                    stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
                self.procs.append(proc)
            for m, proc in zip(machines, self.procs):
                self._wait_forwarding(ssh_config, m, port, proc)
        except BaseException:
            self.stop()
            raise

    @staticmethod
    def _wait_forwarding(ssh_config: Path | None, m: Machine, port: int, proc: subprocess.Popen) -> None:
        probe = f"ss -Hltn 'sport = :{port}' | grep -c 127.0.0.1"
        for _ in range(100):
            if proc.poll() is not None:
                raise RuntimeError(f"{m.name}: the OpenFlow tunnel ended: {proc.stderr.read().decode().strip()}")
            if ssh_run(ssh_config, m, probe).strip() not in ("", "0"):
                return
        raise RuntimeError(f"{m.name}: the OpenFlow tunnel to port {port} did not come up")

    def stop(self) -> None:
        for proc in self.procs:
            if proc.poll() is None:
                proc.terminate()
            try:
                proc.wait(5)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        self.procs = []


@contextmanager
def _home(folder: Path):
    """Cluster Edition makes $HOME/.ssh/mn when constructed: let that be a folder of the run's."""
    old = os.environ.get("HOME")
    os.environ["HOME"] = str(folder)
    try:
        yield
    finally:
        if old is None:
            os.environ.pop("HOME", None)
        else:
            os.environ["HOME"] = old


class ClusterFabric:
    """Build, start and stop one fabric over several machines (Cluster Edition over ssh).

    The topology, names, ports and addresses come from the plan; every node goes where the
    placement says. The controller runs on the head, on loopback (fabric_emu.fabric.controller)."""

    def __init__(self, plan: FabricPlan, placement: Placement, machines: list[Machine], ssh_config: Path | None,
                 controller_port: int, workdir: Path, run_id: str,
                 ports: dict | None = None, record: RunRecord | None = None) -> None:
        """ports: the port model on every machine (its classes, port programs, PFC daemon;
        fabric_emu.run.machine), built from these settings (fabric_emu.ports.model.port_args);
        None: plain links, stitched by tc.
        record: the head's run record, which names every ssh client of the fabric as it starts,
        so that a clean after a kill -9 of the head ends them, and with them each machine's
        share (its agent and node shells end with their ssh session)."""
        self.plan, self.placement, self.machines = plan, placement, machines
        self.ssh_config, self.controller_port, self.workdir, self.run_id = ssh_config, controller_port, workdir, run_id
        self.ports = ports
        self.record = record
        self.checked = False  # the underlay's MTU (a preflight that checked it sets this)
        self.net: ce.MininetCluster | None = None
        self.tunnels: ControlTunnels | None = None
        self.agents: MachineAgents | None = None

    def check(self) -> None:
        """What must hold before anything is built (the underlay's MTU)."""
        check_underlay(self.machines, self.plan.mtu, partial(ssh_run, self.ssh_config))

    def build(self) -> None:
        if not self.checked:
            self.check()
        base = ssh_base(self.ssh_config)
        host_cls = type("ClusterHost", (ce.RemoteHost,), {"sshbase": base})
        switch_cls = type("ClusterSwitch", (_ClusterSwitch,), {"sshbase": base})
        net_cls = type("Cluster", (_Cluster,), {"sshcmd": ssh(self.ssh_config)})
        home = self.workdir / "home"
        home.mkdir(parents=True, exist_ok=True)
        with _home(home):
            self.net = net_cls(topo=PlanTopo(plan=self.plan), servers=[m.name for m in self.machines],
                               serverIP={m.name: m.ssh_address for m in self.machines}, user=self.machines[0].user,
                               placement=placer_for(self.placement), host=host_cls,
                               switch=partial(switch_cls, run_id=self.run_id, datapath="user"),
                               link=stitch_link_for(self.plan, self.placement, self.machines,
                                                    redirect=self.ports is None),
                               controller=None, autoSetMacs=False, autoStaticArp=False, build=False,
                               waitConnected=False)
        self.net.addController(LaunchedController("c0", ip="127.0.0.1", port=self.controller_port))
        try:
            self.net.build()
        finally:
            self._record([(n.shell.pid, f"ssh shell {n.name}") for n in self.net.hosts + self.net.switches
                          if n.shell is not None])
        self._set_mtu()

    def _set_mtu(self) -> None:
        """The fabric's MTU on every link end, each set on its own machine (the cut links'
        ends have it already)."""
        assert self.net is not None
        for ln in self.plan.links:
            if ln in self.placement.cut:
                continue
            for node, intf in ((ln.a, ln.a_intf), (ln.b, ln.b_intf)):
                out = self.net.get(node).cmd(f"ip link set dev {intf} mtu {self.plan.mtu}").strip()
                if out:
                    raise RuntimeError(f"{node}: MTU {self.plan.mtu} not set on {intf}: {out}")

    def start(self) -> None:
        assert self.net is not None, "build() first"
        self.tunnels = ControlTunnels(self.ssh_config, self.machines, self.controller_port)
        self._record([(p.pid, "ssh OpenFlow tunnel") for p in self.tunnels.procs])
        self.net.start()
        if self.ports is not None:
            self.agents = MachineAgents(self.ssh_config, self.machines, self.jobs(self.ports),
                                        on_start=lambda pid, name: self._record([(pid, f"ssh machine agent {name}")]))

    # -- what the NIC engines need of the fabric (fabric_emu.nic.launch: fabric, EngineSite) --
    def netns_of(self, node: str) -> str | None:
        """A host's namespace as its machine sees it (where its engine runs)."""
        assert self.net is not None
        return f"/proc/{self.net.get(node).pid}/ns/net" if node in self.plan.host_by_name else None

    def check_reachable(self, ranks: list[str], attempts: int = 3) -> None:
        """Every rank pings its ring neighbour (which also fills the ARP caches)."""
        assert self.net is not None
        pending = [(a, ranks[(i + 1) % len(ranks)]) for i, a in enumerate(ranks)]
        for _ in range(attempts):
            pending = [(a, b) for a, b in pending if " 1 received" not in
                       self.net.get(a).cmd(f"ping -c1 -W2 -q {self.plan.host_by_name[b].ip}")]
            if not pending:
                return
        raise RuntimeError("no connectivity: " + ", ".join(f"{a} -> {b}" for a, b in pending))

    def machine_of(self, host: str) -> str:
        return self.placement.machine_of[host]

    def machine_workdir(self, machine: str) -> Path:
        assert self.agents is not None, "the machines' shares are not up"
        return self.agents.workdirs[machine]

    def _machine(self, name: str) -> Machine:
        return next(m for m in self.machines if m.name == name)

    def start_engine(self, machine: str, config_path: Path, config_json: str, log) -> subprocess.Popen:
        """A NIC engine on that machine over ssh (its config written there first): it stops when
        told, or when this ssh ends (its stdin closes)."""
        m, repo = self._machine(machine), Path(__file__).resolve().parents[2]
        ssh_to = [*ssh(self.ssh_config), m.dest]
        subprocess.run(ssh_to + [f"cat > {shlex.quote(str(config_path))}"], input=config_json, text=True,
                       check=True, timeout=60)
        remote = (f"cd {shlex.quote(str(repo))} && exec {shlex.quote(sys.executable)} -m fabric_emu.nic "
                  f"{shlex.quote(str(config_path))}")
        return subprocess.Popen(ssh_to + [remote], stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=log,
                                text=True, bufsize=1)

    def read(self, machine: str, path: Path) -> str | None:
        done = subprocess.run([*ssh(self.ssh_config), self._machine(machine).dest, f"cat {shlex.quote(str(path))}"],
                              capture_output=True, text=True, timeout=60)
        return done.stdout if done.returncode == 0 else None

    def _record(self, processes: list[tuple[int, str]]) -> None:
        if self.record is not None:
            self.record.add_processes(processes)

    def jobs(self, ports: dict) -> dict[str, MachineJob]:
        """What each machine's agent sets up: its ports (from the whole plan), its hosts' pids
        as it sees them (Cluster Edition asked there), its ends of the cut links."""
        assert self.net is not None
        vnis, at = cut_vnis(self.plan, self.placement), self.placement.machine_of
        jobs = {}
        for m in self.machines:
            mine = [n for n, where in at.items() if where == m.name]
            stitches = [Stitch(*stitch_names(vnis[frozenset((ln.a_intf, ln.b_intf))])) for ln in self.placement.cut
                        if m.name in (at[ln.a], at[ln.b])]
            jobs[m.name] = MachineJob(
                run_id=self.run_id, machine=m.name, plan=self.plan.to_dict(), machine_of=self.placement.machine_of,
                host_pids={h: self.net.get(h).pid for h in mine if h in self.plan.host_by_name},
                ports=ports, stitches=stitches)
        return jobs

    def stop(self) -> dict[str, dict]:
        """Everything down, each machine's share first; returns each machine's PFC daemon stats."""
        stats: dict[str, dict] = {}
        try:
            if self.agents is not None:
                stats = self.agents.stop()
        finally:
            self.agents = None
            try:
                if self.net is not None:
                    self.net.stop()
            finally:
                self.net = None
                if self.tunnels is not None:
                    self.tunnels.stop()
                    self.tunnels = None
        return stats



class MachineAgents:
    """One fabric_emu.run.machine process per machine, started over ssh (the same python
    and repository path on every machine, as Cluster Edition assumes its Mininet); each owns
    its machine's share of the ports and tears it down when stopped or when this ssh ends."""

    READY_TIMEOUT_S = 120.0  # a machine compiles the port programs on its first run

    def __init__(self, ssh_config: Path | None, machines: list[Machine], jobs: dict[str, MachineJob],
                 on_start: Callable[[int, str], None] | None = None) -> None:
        repo = Path(__file__).resolve().parents[2]
        remote = f"cd {shlex.quote(str(repo))} && exec {shlex.quote(sys.executable)} -m fabric_emu.run.machine"
        self.procs: dict[str, subprocess.Popen] = {}
        self.workdirs: dict[str, Path] = {}  # each share's folder, on its machine
        try:
            for m in machines:
                self.procs[m.name] = p = subprocess.Popen(
                    [*ssh(ssh_config), m.dest, remote],
                    stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, bufsize=1)
                if on_start is not None:
                    on_start(p.pid, m.name)
                p.stdin.write(jobs[m.name].to_json() + "\n")
                p.stdin.flush()
            for name, p in self.procs.items():
                line = self._line(p, self.READY_TIMEOUT_S)
                if not line.startswith("READY "):
                    raise RuntimeError(f"machine {name}: its ports did not come up: {line or self._error(p)}")
                self.workdirs[name] = Path(line.split(" ", 1)[1])
        except BaseException:
            self.stop()
            raise

    @staticmethod
    def _line(p: subprocess.Popen, timeout_s: float) -> str:
        ready, _, _ = select.select([p.stdout], [], [], timeout_s)
        return p.stdout.readline().strip() if ready else ""

    @staticmethod
    def _error(p: subprocess.Popen) -> str:
        if p.poll() is None:
            return "no answer"
        return (p.stderr.read().strip().splitlines() or [f"ssh exited with {p.returncode}"])[-1]

    def ask(self, command: str, timeout_s: float = 30.0) -> dict[str, object]:
        """Every machine's answer to a command (fabric_emu.run.machine), by machine: all are
        asked first, then read, so the machines answer at the same time."""
        for p in self.procs.values():
            p.stdin.write(command + "\n")
            p.stdin.flush()
        out = {}
        for name, p in self.procs.items():
            line = self._line(p, timeout_s)
            if not line or line.startswith("ERROR"):
                raise RuntimeError(f"machine {name}: {command}: {line or self._error(p)}")
            out[name] = line if line == "OK" else json.loads(line)
        return out

    def counters(self) -> dict[str, dict]:
        """Every port's program counters on every machine, by machine and interface."""
        return self.ask("COUNTERS")  # type: ignore[return-value]

    def stop(self) -> dict[str, dict]:
        stats = {}
        for name, p in self.procs.items():
            try:
                p.stdin.write("STOP\n")
                p.stdin.flush()
                line = self._line(p, 60.0)
                if line.startswith("STOPPED "):
                    stats[name] = json.loads(line[len("STOPPED "):])
            except (OSError, ValueError):
                pass  # it is gone already: closing its ssh below makes it clean up
            try:
                p.stdin.close()
            except OSError:
                pass
            try:
                p.wait(30)
            except subprocess.TimeoutExpired:
                p.terminate()
                p.wait(10)
        self.procs = {}
        return stats


class _ClusterSwitch(ce.RemoteOVSSwitch, FabricSwitch):
    """A fabric switch on its machine's Open vSwitch."""

    def isOldOVS(self) -> bool:  # noqa: N802
        # Cluster Edition asks each machine's version through distutils' StrictVersion (deprecated,
        # gone in 3.12) to tell OVS < 1.10 apart; our set-up installs 3.x everywhere.
        return False


class _Cluster(ce.MininetCluster):
    """MininetCluster without its loopback rewrite of the controller's address: the switches
    reach the head's loopback through the control tunnels."""

    def addController(self, *args, **kwargs):  # noqa: N802
        return ce.Mininet.addController(self, *args, **kwargs)

