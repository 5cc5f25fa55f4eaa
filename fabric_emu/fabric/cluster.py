"""A fabric partitioned over several machines through Mininet's Cluster Edition (issue 19).

Cluster Edition (mininet.examples.cluster, shipped with Debian's mininet) runs each node's
shell on its machine over ssh and gives us its extension points; we fill three of them:

- where nodes go: `placer_for` turns fabric_emu.topo.placement's answer (a leaf with its hosts,
  a pod or a rail group on one machine; the top tier spread) into a Cluster Edition Placer;
- how a link between machines is made: fabric_emu.fabric.stitch_link.StitchLink, a veth on
  each machine joined to a VXLAN device per link, no bridge in the path (GRE, Cluster
  Edition's own, forces MTU 1450, and this kernel has none; its ssh link needs a tap and
  PermitTunnel);
- how machines are reached: fabric_emu.fabric.machines (one ssh command, the switches'
  OpenFlow channel back to the head's loopback through `ssh -R`, each machine's agent).

ClusterFabric puts them together, and is the EngineSite the NIC engines run from. Cluster
Edition's global clean-up (`mn -c` on every server: it kills every Mininet process there) is
never called: a cluster fabric removes what it made, by name and record.
"""

from __future__ import annotations

import os
import shlex
import subprocess
import sys
from contextlib import contextmanager
from functools import partial
from pathlib import Path

from fabric_emu.fabric.build import FabricSwitch, LaunchedController, PlanTopo
from fabric_emu.fabric.machines import (ControlTunnels, Machine, MachineAgents, MachineJob, Stitch, ssh,
                                        ssh_run)
from fabric_emu.fabric.stitch_link import ce, cut_vnis, stitch_link_for, stitch_names
from fabric_emu.fabric.underlay import check_underlay
from fabric_emu.state.records import RunRecord
from fabric_emu.topo.placement import Placement
from fabric_emu.topo.plan import FabricPlan


def ssh_base(ssh_config: Path | None) -> list[str]:
    """Cluster Edition's ssh command (RemoteMixin.sshbase)."""
    return [*ssh(ssh_config), "-q", "-tt"]


def placer_for(placement: Placement) -> type[ce.Placer]:
    """A Cluster Edition Placer answering from a fabric_emu placement."""

    class FabricPlacer(ce.Placer):
        def place(self, node: str) -> str:
            return placement.machine_of[node]

    return FabricPlacer


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
                 ports: dict | None = None, record: RunRecord | None = None,
                 cut: frozenset[frozenset[str]] = frozenset()) -> None:
        """ports: the port model on every machine (its classes, port programs, PFC daemon;
        fabric_emu.run.machine), built from these settings (fabric_emu.ports.model.port_args);
        None: plain links, stitched by tc.
        record: the head's run record, which names every ssh client of the fabric as it starts,
        so that a clean after a kill -9 of the head ends them, and with them each machine's
        share (its agent and node shells end with their ssh session).
        cut: the switch pairs whose link the run's events cut; those on one machine get a wire
        there (fabric_emu.fabric.wires), those between machines are cut at their stitch ends."""
        self.plan, self.placement, self.machines = plan, placement, machines
        self.ssh_config, self.controller_port, self.workdir, self.run_id = ssh_config, controller_port, workdir, run_id
        self.ports = ports
        self.record = record
        at = placement.machine_of
        self.wired = frozenset(pair for pair in cut if len({at[n] for n in pair}) == 1)
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
                                                    redirect=self.ports is None, wired=self.wired),
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
        told, or when this ssh ends (its session ends, and the kernel signals the engine)."""
        m, repo = self._machine(machine), Path(__file__).resolve().parents[2]
        ssh_to = [*ssh(self.ssh_config), m.dest]
        subprocess.run(ssh_to + [f"cat > {shlex.quote(str(config_path))}"], input=config_json, text=True,
                       check=True, timeout=60)
        # it ends with its ssh session too (fabric_emu.nic.main.end_with_parent; the name is
        # spelled here because fabric and nic are sibling layers): mid-run it reads no stdin
        remote = (f"cd {shlex.quote(str(repo))} && exec env FABRIC_EMU_END_WITH_PARENT=1 {shlex.quote(sys.executable)} "
                  f"-m fabric_emu.nic {shlex.quote(str(config_path))}")
        return subprocess.Popen(ssh_to + [remote], stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=log,
                                text=True, bufsize=1)

    def read_bytes(self, machine: str, path: Path) -> bytes | None:
        """A file on a machine (a pcap, say), or None if it cannot be read."""
        done = subprocess.run([*ssh(self.ssh_config), self._machine(machine).dest, f"cat {shlex.quote(str(path))}"],
                              capture_output=True, timeout=120)
        return done.stdout if done.returncode == 0 else None

    def read(self, machine: str, path: Path) -> str | None:
        data = self.read_bytes(machine, path)
        return data.decode(errors="replace") if data is not None else None

    def _record(self, processes: list[tuple[int, str]]) -> None:
        if self.record is not None:
            self.record.add_processes(processes)

    def jobs(self, ports: dict) -> dict[str, MachineJob]:
        """What each machine's agent sets up: its ports (from the whole plan), its hosts' pids
        as it sees them (Cluster Edition asked there), its ends of the links between machines,
        and its switch ports with a wire."""
        assert self.net is not None
        vnis, at = cut_vnis(self.plan, self.placement), self.placement.machine_of
        jobs = {}
        for m in self.machines:
            mine = [n for n, where in at.items() if where == m.name]
            stitches = [Stitch(*stitch_names(vnis[frozenset((ln.a_intf, ln.b_intf))]),
                               port=ln.a_intf if at[ln.a] == m.name else ln.b_intf)
                        for ln in self.placement.cut if m.name in (at[ln.a], at[ln.b])]
            jobs[m.name] = MachineJob(
                run_id=self.run_id, machine=m.name, plan=self.plan.to_dict(), machine_of=self.placement.machine_of,
                host_pids={h: self.net.get(h).pid for h in mine if h in self.plan.host_by_name},
                ports=ports, stitches=stitches,
                wires=[intf for ln in self.plan.links if frozenset((ln.a, ln.b)) in self.wired and at[ln.a] == m.name
                       for intf in (ln.a_intf, ln.b_intf)])
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
