"""One machine's share of a fabric split over several machines (issue 19): the traffic classes,
port programs, PFC daemon and cross-machine stitches of the ports on that machine, set up
there by this process, which the head starts over ssh once Cluster Edition has built the
machine's nodes (fabric_emu.fabric.cluster.MachineAgents), and torn down by it.

    head -> ssh <machine> <python> -m fabric_emu.fabric.machine
    stdin:  one line of JSON, the job (MachineJob); then commands, a line each
    stdout: READY <this share's folder here>, or ERROR <why> (and exit 1)
            COUNTERS -> one line of JSON: every port's counters here, by interface
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
import sys
import traceback
from dataclasses import asdict, dataclass, field
from pathlib import Path

from fabric_emu.kernel import rps
from fabric_emu.ports import datapath, queues
from fabric_emu.ports.model import EcnSettings, PfcSettings, port_plan, remote_peers, share_of
from fabric_emu.ports.runtime import LosslessPorts
from fabric_emu.state.cleanup import clean_record
from fabric_emu.state.records import RunRecord
from fabric_emu.topo.plan import FabricPlan


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
    ecn: dict  # EcnSettings
    pfc: dict  # PfcSettings
    stitches: list[Stitch] = field(default_factory=list)

    def to_json(self) -> str:
        return json.dumps(asdict(self))

    @classmethod
    def from_json(cls, line: str) -> "MachineJob":
        raw = json.loads(line)
        raw["stitches"] = [Stitch(**s) for s in raw.get("stitches", [])]
        return cls(**raw)


class MachineShare:
    """This machine's ports, up and down (the order of RoutedFabric.up: classes, programs and
    daemon, then the stitches)."""

    def __init__(self, job: MachineJob) -> None:
        self.job = job
        self.plan = FabricPlan.from_dict(job.plan)
        whole = port_plan(self.plan, EcnSettings(**job.ecn), PfcSettings(**job.pfc))
        self.ports = share_of(whole, job.machine_of, job.machine)
        self.far_peers = remote_peers(whole, job.machine_of, job.machine)
        self.netns_of: dict[str, str | None] = {
            e.node: (f"/proc/{job.host_pids[e.node]}/ns/net" if e.role == "host" else None) for e in self.ports.ends}
        self.record = RunRecord.new(job.run_id)
        self.lossless: LosslessPorts | None = None
        self.workdir: Path | None = None  # the share's folder (the machine's NIC engines write there too)

    def up(self) -> None:
        rec = self.record
        rec.interfaces = [e.intf for e in self.ports.ends if e.role == "switch"] + [s.vxlan for s in self.job.stitches]
        self.workdir = workdir = rec.new_workdir(prefix=f"fabric-emu-{self.job.machine}-")  # saves the record first
        self._prepare_switch_ports()
        queues.shape_all(queues.PortQueues(e.intf, e.emulated_bps, self.plan.mtu, self.ports.settings(e).fifo_limits,
                                           self.netns_of[e.node], qp_classes=e.role != "switch")
                         for e in self.ports.ends)
        self.lossless = LosslessPorts(self.ports, rec, workdir, remote_peers=self.far_peers)
        self.lossless.launch(self.netns_of)
        self.lossless.start()
        for s in self.job.stitches:
            datapath.attach_stitch(self.lossless.pins, s.stitch, s.vxlan)

    def _prepare_switch_ports(self) -> None:
        """As Fabric._prepare_interfaces does for the switch ports: no IPv6 chatter, receive
        packet steering (a flow must not be reordered by the emulator)."""
        mask = rps.all_cpus_mask()
        for e in self.ports.ends:
            if e.role == "switch":
                Path(f"/proc/sys/net/ipv6/conf/{e.intf}/disable_ipv6").write_text("1")
                rps.steer(e.intf, mask)

    def counters(self) -> dict:
        return self.lossless.counters() if self.lossless is not None else {}

    def down(self) -> dict:
        stats: dict = {}
        try:
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
        for line in stdin:
            command = line.strip()
            if command == "COUNTERS":
                say(json.dumps(share.counters()))
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
