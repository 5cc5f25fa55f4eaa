"""Reaching the machines of a fabric over several machines (issue 19): who they are, the
ssh every command takes, the switches' OpenFlow channel back to the head (ssh -R), and each
machine's agent (fabric_emu.run.machine), which owns its share of the ports."""

from __future__ import annotations

import json
import select
import shlex
import subprocess
import sys
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path


@dataclass
class Stitch:
    """A cut link's end on this machine: its stitch end and its VXLAN device (fabric_emu.fabric.stitch_link.stitch_names),
    and the port here whose veth peer the stitch end is."""

    stitch: str
    vxlan: str
    port: str


@dataclass
class MachineJob:
    run_id: str
    machine: str
    plan: dict  # FabricPlan.to_dict()
    machine_of: dict[str, str]  # every node -> its machine
    host_pids: dict[str, int]  # this machine's hosts -> their shells' pids, as this machine sees them
    ports: dict  # the run's port settings (fabric_emu.ports.model.port_args)
    stitches: list[Stitch]
    wires: list[str]  # switch ports here with a wire to a switch here (fabric.wires)

    def to_json(self) -> str:
        return json.dumps(asdict(self))

    @classmethod
    def from_json(cls, line: str) -> "MachineJob":
        raw = json.loads(line)
        raw["stitches"] = [Stitch(**s) for s in raw["stitches"]]
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


class MachineAgents:
    """One fabric_emu.run.machine process per machine, started over ssh (the same python
    and repository path on every machine, as Cluster Edition assumes its Mininet); each owns
    its machine's share of the ports and tears it down when stopped or when this ssh ends."""

    READY_TIMEOUT_S = 120.0  # a machine compiles the port programs on its first run

    def __init__(self, ssh_config: Path | None, machines: list[Machine], jobs: dict[str, MachineJob],
                 on_start: Callable[[int, str], None] | None = None) -> None:
        repo = Path(__file__).resolve().parents[2]
        self.ssh_config, self.machines = ssh_config, {m.name: m for m in machines}
        self.python = f"cd {shlex.quote(str(repo))} && exec {shlex.quote(sys.executable)}"
        remote = f"{self.python} -m fabric_emu.run.machine"
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

    def ask_one(self, name: str, command: str, timeout_s: float = 30.0, expect: str = "OK") -> str:
        """One machine's answer to a command, which must start with `expect` ("OK": an event's
        part there; "[": a list, as JSON)."""
        p = self.procs[name]
        p.stdin.write(command + "\n")
        p.stdin.flush()
        line = self._line(p, timeout_s)
        if not line.startswith(expect):
            raise RuntimeError(f"machine {name}: {command.split()[0]}: {line or self._error(p)}")
        return line

    def counters(self) -> dict[str, dict]:
        """Every port's program counters on every machine, by machine and interface."""
        return self.ask("COUNTERS")  # type: ignore[return-value]

    def ended(self, name: str) -> str | None:
        """How a machine's agent (its ssh, here) ended, None while it runs: a supervisor's probe."""
        code = self.procs[name].poll()
        return None if code is None else f"ended (its ssh exited with {code})"

    def stop(self) -> dict[str, dict]:
        """Each agent tears its share down and reports its PFC daemon's stats. One that is gone
        (killed, or its machine unreachable for a while) left its share behind: that machine's
        own `fabric-emu clean` removes it, by the record the agent wrote there."""
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
            if name not in stats:
                subprocess.run([*ssh(self.ssh_config), self.machines[name].dest, f"{self.python} -m fabric_emu clean"],
                               capture_output=True, text=True, timeout=120)
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
