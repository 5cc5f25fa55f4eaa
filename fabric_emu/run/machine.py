"""One machine's share of a fabric split over several machines (issue 19): the traffic classes,
port programs, PFC daemon and cross-machine stitches of the ports on that machine, set up
there by this process, which the head starts over ssh once Cluster Edition has built the
machine's nodes (fabric_emu.fabric.machines.MachineAgents), and torn down by it.

    head -> ssh <machine> <python> -m fabric_emu.run.machine
    stdin:  one line of JSON, the job (MachineJob); then commands, a line each
    stdout: READY <this share's folder here>, or ERROR <why> (and exit 1)
            COUNTERS   -> one line of JSON: every port's program counters here, by interface
            SNAPSHOT   -> {"rows": [its switch ports' PortCounters], "ports": the COUNTERS}
            THRESHOLDS -> the thresholds its switch ports run with (LosslessPorts.installed)
            CHARGES    -> {"held": {port: bytes}, "pairs": [[ingress, egress, bytes], ...]}: its
                          switch ports' lossless accounting now (LosslessPorts.charges; a frame
                          leaving for another machine is credited here, as it leaves)
            CPU_START  -> OK: its CPU monitor starts (the machine, ovs-vswitchd, its PFC daemon and
                          the NIC engines running from its folder); CPU_STOP -> its summary
            LINK <interface> up|down, RATE <interface> <Gb/s>, STORM <host> on|off -> OK: a
                          scheduled event on a port or NIC of this machine's; a switch port's
                          LINK down across machines answers OK <bytes given back>
            CAPTURE_START <CaptureSpec as JSON, of this machine's ports> -> OK: its tcpdumps
            CAPTURE_STOP -> the pcap files here, stopped and closed (the head fetches them)
            STOP     -> the ports torn down, then STOPPED <the PFC daemon's stats as JSON>; exit
    end of stdin, SIGHUP or SIGTERM (the head, or its ssh, went away): torn down; exit

Everything it makes is named in a run record on this machine before it is made, so that a
`fabric-emu clean` there removes it even if this process is killed too; the record also names
the run's bridges (tagged with the run id), so the machine's switches go with it.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import traceback
from dataclasses import asdict
from pathlib import Path

from fabric_emu.fabric.build import prepare_host_interface_command, prepare_switch_port, shape_ports
from fabric_emu.fabric.capture import Captures
from fabric_emu.fabric import wires
from fabric_emu.fabric.machines import MachineJob
from fabric_emu.kernel import rps
from fabric_emu.kernel.ovs_datapath import datapath_of
from fabric_emu.kernel.shaping import open_iproute
from fabric_emu.measure import counters
from fabric_emu.measure.fidelity import CpuMonitor
from fabric_emu.measure.thread_cpu import pfc_processes
from fabric_emu.ports import datapath, queues
from fabric_emu.ports.model import PortEnd, port_plan_from_args, remote_peers, share_of
from fabric_emu.ports.runtime import LosslessPorts
from fabric_emu.spec.events import CaptureSpec
from fabric_emu.state.cleanup import clean_record
from fabric_emu.state.records import RunRecord
from fabric_emu.topo.plan import FabricPlan


class MachineShare:
    """This machine's ports, up and down (the order of RoutedFabric.up: classes, programs and
    daemon, then the stitches)."""

    def __init__(self, job: MachineJob) -> None:
        self.job = job
        self.plan = FabricPlan.from_dict(job.plan)
        whole = port_plan_from_args(self.plan, job.ports)
        self.ports = share_of(whole, job.machine_of, job.machine)
        self.far_peers = remote_peers(whole, job.machine_of, job.machine)
        self.netns_of: dict[str, str | None] = {
            e.node: (f"/proc/{job.host_pids[e.node]}/ns/net" if e.role == "host" else None) for e in self.ports.ends}
        self.record = RunRecord.new(job.run_id)
        self.lossless: LosslessPorts | None = None
        self.workdir: Path | None = None  # the share's folder (the machine's NIC engines write there too)
        self.cpu: CpuMonitor | None = None
        self.captures: Captures | None = None
        self.stitch_of = {s.port: s.stitch for s in job.stitches}  # a cut link's port -> its stitch end
        self.wired = set(job.wires)  # switch ports with a wire to a switch of this machine

    def up(self) -> None:
        rec = self.record
        rec.interfaces = [e.intf for e in self.ports.ends if e.role == "switch"] + [s.vxlan for s in self.job.stitches]
        self.workdir = workdir = rec.new_workdir(prefix=f"fabric-emu-{self.job.machine}-")  # saves the record first
        mask = rps.all_cpus_mask()
        for e in self.ports.ends:  # as Fabric does
            if e.role == "switch":
                prepare_switch_port(e.intf, mask)
            else:  # a host here (Cluster Edition made it, and set only its MTU)
                done = subprocess.run(["nsenter", f"--net={self.netns_of[e.node]}", "sh", "-c",
                                       prepare_host_interface_command(e.intf, self.plan.mtu, mask)],
                                      capture_output=True, text=True, timeout=30)
                if done.returncode or done.stdout.strip() or done.stderr.strip():
                    why = (done.stderr or done.stdout).strip().splitlines()[:1] or [f"exit {done.returncode}"]
                    raise RuntimeError(f"preparing {e.node}'s interface failed: {why[0]}")
        shape_ports(self.ports, self.plan.mtu, self.netns_of.__getitem__)
        self.lossless = LosslessPorts(self.ports, rec, workdir, remote_peers=self.far_peers)
        self.lossless.launch(self.netns_of)
        self.lossless.start()
        for s in self.job.stitches:
            datapath.attach_stitch(self.lossless.pins, s.stitch, s.vxlan)
            # The stitch end receives its switch port's egress, whose qdisc both CPUs may run:
            # steered like every other link end, or two backlogs can reorder a flow (kernel/rps.py)
            rps.steer(s.stitch, mask)
        wires.steer_wires(self.job.wires, mask)

    def counters(self) -> dict:
        return self.lossless.counters() if self.lossless is not None else {}

    def snapshot(self) -> dict:
        ports = self.counters()
        mine = {e.node for e in self.ports.ends if e.role == "switch"}
        return {"rows": [asdict(r) for r in counters.snapshot(self.plan, ports, mine)], "ports": ports}

    def charges(self) -> dict:
        if self.lossless is None or self.lossless.maps is None:
            return {"held": {}, "pairs": []}
        held, pairs = self.lossless.charges()
        return {"held": held, "pairs": [[a, b, n] for (a, b), n in sorted(pairs.items())]}

    def thresholds(self) -> list[dict]:
        return self.lossless.installed() if self.lossless is not None else []

    def cpu_start(self) -> str:
        """The CPU monitor, watching this machine's PFC daemon and its NIC engines: started over
        ssh by the head, they are found by their config in this share's folder."""
        watched = pfc_processes(self.lossless.daemon.pid if self.lossless and self.lossless.daemon else None)
        for proc in Path("/proc").iterdir():
            if proc.name.isdigit():
                try:
                    args = (proc / "cmdline").read_bytes().split(b"\0")
                except OSError:
                    continue
                if b"fabric_emu.nic" in args and any(a.startswith(str(self.workdir).encode() + b"/") for a in args):
                    watched[int(proc.name)] = f"nic {Path(args[-2].decode()).stem.split('.')[0]}"
        self.cpu = CpuMonitor(processes=watched, datapath=datapath_of(self.plan.extra))
        self.cpu.__enter__()
        return "OK"

    def cpu_stop(self) -> dict:
        if self.cpu is None:
            return {}
        self.cpu.__exit__(None, None, None)
        summary, self.cpu = self.cpu.summary(), None
        return summary

    def act(self, command: str, args: list[str]) -> str:
        """A scheduled event's part on this machine: a link end up or down, its rate, a NIC's
        PFC storm. Names must be this share's (they come from the head, checked all the same)."""
        intfs = {e.intf: e for e in self.ports.ends}
        if command in ("LINK", "RATE") and (len(args) != 2 or args[0] not in intfs):
            raise ValueError(f"{command}: not a port of this machine: {' '.join(args)[:60]}")
        if command == "LINK":
            if args[1] not in ("up", "down"):
                raise ValueError(f"LINK: state must be up or down, not {args[1][:10]!r}")
            return self._set_link(intfs[args[0]], args[1] == "up")
        elif command == "RATE":
            end = intfs[args[0]]
            queues.set_link_rate(end.intf, float(args[1]) * 1e9 / self.plan.dilation, self.plan.mtu,
                                 self.netns_of[end.node])
        elif command == "STORM":
            if len(args) != 2 or args[1] not in ("on", "off"):
                raise ValueError("STORM: <host> on|off")
            self.lossless.set_storm(args[0], args[1] == "on")
        return "OK"

    def _set_link(self, end: PortEnd, up: bool) -> str:
        """One end of a link down or up. A switch port's link to another machine is cut as a
        cable is, as on one machine (RoutedFabric.set_link): its stitch end goes down, so the port
        loses its carrier but stays up; marked cut first, its egress program drops and gives back
        what Open vSwitch still sends it, and what its queue held is given back once the kernel
        has purged it (LosslessPorts.switch_link). So is a link the run cuts between two switches
        of this machine, at its wire's end (fabric_emu.fabric.wires). Answers OK, with those bytes
        for a cut. Any other end is taken down itself."""
        stitch = self.stitch_of.get(end.intf)  # only switch ports have a stitch end or a wire
        cable = stitch is not None or end.intf in self.wired

        def wire(on: bool) -> None:
            if end.intf in self.wired:
                wires.set_wire([end.intf], on)
                return
            with open_iproute(self.netns_of[end.node]) as ipr:
                ipr.link("set", index=ipr.link_lookup(ifname=stitch or end.intf)[0], state="up" if on else "down")

        if not cable or self.lossless is None:
            wire(up)
            return "OK"
        given = self.lossless.switch_link([end.intf], up, wire)
        return "OK" if up else f"OK {given}"

    def capture_start(self, spec_json: str) -> str:
        spec = CaptureSpec.model_validate_json(spec_json)
        mine = {e.intf for e in self.ports.ends if e.role == "switch"}
        if not set(spec.ports) <= mine:
            raise ValueError(f"CAPTURE_START: not ports of this machine: {', '.join(sorted(set(spec.ports) - mine))}")
        self.captures = Captures(spec, self.workdir, self.record)
        self.captures.start()
        return "OK"

    def capture_stop(self) -> list[str]:
        """Stop the tcpdumps; their files, closed, in the share's folder (captures/)."""
        if self.captures is None:
            return []
        folder = self.workdir / "captures"
        folder.mkdir(exist_ok=True)
        saved, self.captures = self.captures.stop(folder), None
        return [str(folder / name) for name in saved]

    def down(self) -> dict:
        stats: dict = {}
        try:
            if self.cpu is not None:
                self.cpu_stop()
            if self.captures is not None:
                self.capture_stop()
            if self.lossless is not None:
                stats = self.lossless.stop()
        finally:
            clean_record(self.record)
        return stats


def serve(stdin=sys.stdin, stdout=sys.stdout) -> int:
    def say(line: str) -> None:
        stdout.write(line + "\n")
        stdout.flush()

    share = None

    def end(*_args) -> None:
        raise SystemExit(0)

    for sig in (signal.SIGHUP, signal.SIGTERM):
        signal.signal(sig, end)
    try:
        share = MachineShare(MachineJob.from_json(stdin.readline()))
        share.up()
        say(f"READY {share.workdir}")
        answers = {"COUNTERS": share.counters, "SNAPSHOT": share.snapshot, "THRESHOLDS": share.thresholds,
                   "CHARGES": share.charges,
                   "CPU_START": share.cpu_start, "CPU_STOP": share.cpu_stop, "CAPTURE_STOP": share.capture_stop}
        for line in stdin:
            command, _, rest = line.strip().partition(" ")
            if command in ("LINK", "RATE", "STORM", "CAPTURE_START"):
                try:
                    say(share.capture_start(rest) if command == "CAPTURE_START" else share.act(command, rest.split()))
                except (OSError, ValueError, IndexError) as e:
                    say(f"ERROR {str(e).splitlines()[0] if str(e) else type(e).__name__}")
            elif command in answers:
                answer = answers[command]()
                say(answer if isinstance(answer, str) else json.dumps(answer))
            elif command == "STOP":
                stats, share = share.down(), None
                say("STOPPED " + json.dumps(stats))
                return 0
            elif command:
                say(f"ERROR unknown command {command[:40]!r}")
        return 0
    except Exception as e:  # noqa: BLE001 - one line for the head, then everything made goes
        traceback.print_exc()  # to the head's ssh stderr
        say(f"ERROR {type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}")
        return 1
    finally:
        if share is not None:
            share.down()


if __name__ == "__main__":
    os.umask(0o022)
    sys.exit(serve())
