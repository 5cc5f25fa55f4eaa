"""The lab's prompt: Mininet's CLI (`h1 ping h2`, `h3 tcpdump -i h3-eth0`, `xterm h1`, `nodes`,
`net`, `pingall`, ...) with the lab's commands added as do_<name> methods.

Every lab command answers bad input with one line and never a traceback. Ctrl-C interrupts the
command that is running (a ping, a run); at the empty prompt it leaves the lab, as quit and
Ctrl-D do. Script mode (`fabric-emu lab EXP --script FILE`) feeds the same commands from a file,
echoing each, and stops at the first that fails (an `expect` that does not hold, an error).
"""

from __future__ import annotations

import shlex
import sys
import traceback
from collections.abc import Callable, Iterable
from typing import TextIO

from fabric_emu.kernel import mininet_compat

mininet_compat.install()  # before any of Mininet: Python 3.12 has no distutils
from mininet.cli import CLI
from rich.console import Console

from fabric_emu.spec.errors import SpecError
from fabric_emu.spec.transport import DcqcnSpec
from fabric_emu.lab import commands, views
from fabric_emu.lab.expect import ExpectError, evaluate
from fabric_emu.lab.session import LabExit, LabSession

PROMPT = "lab> "
# Mininet's commands that make sense here, for `help` (its own `help mininet` shows them all).
MININET_COMMANDS = ("nodes", "net", "links", "intfs", "dump", "pingall", "pingpair", "iperf",
                    "xterm", "sh", "py", "source")
LAB_COMMANDS = ("run", "lb", "ecn", "pfc", "pfcwd", "storm", "cc", "dcqcn", "set", "link", "ports", "queues",
                "flows", "deadlocks", "knobs", "runs", "save", "expect", "quit")
DCQCN_KEYS = tuple(DcqcnSpec.model_fields)


class LabCLI(CLI):
    prompt = PROMPT

    def __init__(self, session: LabSession, console: Console, script: Iterable[str] | None = None,
                 stdin: TextIO = sys.stdin, debug: bool = False) -> None:
        self.session = session
        self.out = console
        self.script = list(script) if script is not None else None
        self.debug = debug
        self.failed: str | None = None  # script mode: the first command that failed
        self.transcript: list[str] = []  # what was typed, for `save`
        self.busy = False  # a command is running (Ctrl-C interrupts it, not the lab)
        self.left_by = "quit"
        super().__init__(session.routed.fabric.net, stdin=stdin)  # runs the loop (Mininet's way)

    # ------------------------------------------------------------------ loop
    def run(self) -> None:
        if self.script is not None:
            self._run_script()
            return
        while True:
            try:
                for node in self.mn.values():  # as Mininet: nothing left waiting on a node
                    while node.waiting:
                        node.sendInt()
                        node.waitOutput()
                self.cmdloop()
                break
            except KeyboardInterrupt:
                if self.busy:
                    self.busy = False
                    self.out.print("\ninterrupted")
                    continue
                self.out.print("\nleaving the lab (Ctrl-C)")
                self.left_by = "Ctrl-C"
                break

    def _run_script(self) -> None:
        for raw in self.script:
            line = raw.strip()
            if not line or line.startswith("#"):
                continue
            self.out.print(f"{PROMPT}{line}", markup=False, highlight=False)
            stop = self.onecmd(line)
            if self.failed or stop:
                break

    def precmd(self, line: str) -> str:
        self.busy = True
        if line.strip() and line.strip() != "EOF":
            self.transcript.append(line.strip())
        return line

    def postcmd(self, stop: bool, line: str) -> bool:
        self.busy = False
        return stop

    def onecmd(self, line: str) -> bool:
        """Every command: one line for bad input, LabExit passes (SIGTERM/SIGHUP leave)."""
        try:
            return bool(super().onecmd(line))
        except LabExit:
            raise
        except KeyboardInterrupt:
            raise
        except (commands.LabInputError, ExpectError) as e:
            self._fail(str(e))
        except SpecError as e:
            self._fail("; ".join(e.lines()))
        except Exception as e:  # noqa: BLE001 - the lab stays up; one line unless --debug
            if self.debug:
                traceback.print_exc()
            self._fail(f"{line.split()[0] if line.split() else line}: {type(e).__name__}: {e}")
        return False

    def _fail(self, msg: str) -> None:
        self.out.print(f"error: {msg}", style="red", markup=False, highlight=False)
        if self.script is not None and self.failed is None:
            self.failed = msg

    def default(self, line: str) -> None:
        first = line.split()[0] if line.split() else line
        if first in self.mn:
            return super().default(line)
        raise commands.LabInputError(f"unknown command {first!r} (type help for the list)")

    def emptyline(self) -> bool:
        return False

    # ------------------------------------------------------------------ help and leaving
    def do_help(self, line: str) -> None:
        """help [COMMAND]: the commands, one line each; with a name, that command in full."""
        name = line.strip()
        if name == "mininet":
            return super().do_help("")
        if name:
            doc = getattr(self, f"do_{name}", None)
            if doc is None or not doc.__doc__:
                raise commands.LabInputError(f"help: no command {name!r} (type help for the list)")
            self.out.print(_dedent(doc.__doc__), markup=False, highlight=False)
            return None
        self.out.print("lab commands:", highlight=False)
        for cmd in LAB_COMMANDS:
            first = _dedent(getattr(self, f"do_{cmd}").__doc__).splitlines()[0]
            self.out.print(f"  {first}", markup=False, highlight=False)
        self.out.print("Mininet's, as always: <node> <command> (h1 ping -c3 h2, h3 tcpdump -ni h3-eth0), "
                       + ", ".join(MININET_COMMANDS) + "; `help mininet` lists them all.",
                       markup=False, highlight=False)
        return None

    def do_quit(self, line: str) -> bool:
        """quit (or exit, Ctrl-D, Ctrl-C at the prompt): tear the fabric down and leave."""
        self.left_by = "quit"
        return True

    def do_exit(self, line: str) -> bool:
        """exit: as quit."""
        return self.do_quit(line)

    def do_EOF(self, line: str) -> bool:
        self.out.print("")
        self.left_by = "Ctrl-D"
        return True

    # ------------------------------------------------------------------ traffic
    def do_run(self, line: str) -> None:
        """run [WORKLOAD] [as NAME]: run a workload, print its summary, write its results folder.
        run                                   the experiment's own workload
        run allreduce 8MB [iterations=2 ranks=h1,h2,h3,h4 algorithm=halving-doubling]
        run alltoall 4MB                      (also reducescatter, allgather, sendrecv)
        run incast h1 4MB [senders=h2,h3]     every other host (or senders) to h1
        run flows h1-h5:8MB h2-h6:8MB@100us   SRC-DST:SIZE[@START], any number
        `as NAME` names the run for expect (otherwise run1, run2, ...; last is the latest)."""
        req = commands.parse_run(shlex.split(line))
        run = self.session.run(req.workload, req.label, f"run {line}".strip())
        name = req.label or f"run{run.number}"
        status = run.summary.get("status")
        if status == "incomplete" and (run.summary.get("deadlocks") or {}).get("deadlocked_at_end"):
            # Not the lab's failure: the flows could not finish because the fabric locked up.
            self.out.print(f"{name}: incomplete: it ended in a PFC deadlock, the bytes left held in paused buffers "
                           f"(deadlocks); results in {run.run_dir}", highlight=False, soft_wrap=True)
            return
        self.out.print(f"{name}: {status}; results in {run.run_dir}", highlight=False, soft_wrap=True)
        if status != "ok":
            raise commands.LabInputError(f"run: {name} did not finish ok ({run.summary.get('error', status)})")

    def do_expect(self, line: str) -> None:
        """expect EXPRESSION: check figures of the runs, as `expect spray.jct_fabric_s < 0.8 * ecmp.jct_fabric_s`.
        A run's figures are its summary.json keys (last.switch.pause_tx, ecmp.flows[0].goodput_gbps);
        numbers, + - * /, comparisons, and/or/not, min max abs len. Prints ok or FAILED with the values."""
        outcome = evaluate(line, self.session.named_runs())
        if outcome.ok:
            self.out.print(f"ok: {outcome.shown}", markup=False, highlight=False)
        else:
            raise ExpectError(f"expect FAILED: {outcome.shown}")

    # ------------------------------------------------------------------ knobs
    def do_lb(self, line: str) -> None:
        """lb [ecmp|dlb|spray] [key=value]: show or change the load balancing, live (controller)."""
        req = commands.parse_lb(shlex.split(line))
        if req is None:
            from fabric_emu.lb.view import print_lb_state

            print_lb_state(self.out, self.session.record.run_id, self.session.lb_state())
            return
        change = self.session.set_lb(req)
        self.out.print(f"load balancing is now {change['mode']}: every leaf applied it in "
                       f"{change['applied_s'] * 1e3:.1f} ms", highlight=False)

    def do_ecn(self, line: str) -> None:
        """ecn on|off [kmin=SIZE kmax=SIZE pmax=P]: ECN marking at every switch port (applied now)."""
        spec = self.session.set_ports(commands.parse_switch(shlex.split(line), "ecn", commands.ECN_KEYS))
        e = spec.ecn
        self.out.print(f"ECN {'on' if e.enabled else 'off'} at every switch port (kmin {e.kmin} B, "
                       f"kmax {e.kmax} B, pmax {e.pmax:g})", highlight=False)

    def do_pfc(self, line: str) -> None:
        """pfc on|off [xoff=SIZE xon=SIZE headroom=SIZE quanta=N]: PFC on the RoCE class (applied now)."""
        spec = self.session.set_ports(commands.parse_switch(shlex.split(line), "pfc", commands.PFC_KEYS))
        p = spec.pfc
        self.out.print(f"PFC {'on' if p.enabled else 'off'} at every switch port (xoff {p.xoff} B, "
                       f"xon {p.xon} B, headroom {p.headroom} B)", highlight=False)

    def do_pfcwd(self, line: str) -> None:
        """pfcwd start|stop|show config|show stats: the switches' PFC watchdog, as SONiC's CLI has it.
        pfcwd start [action=drop|forward|alert detection=400us restoration=800us poll=200us
                     ports=all|host-facing preset=classroom|sonic]   (applied now, for the next runs)
        pfcwd stop
        pfcwd show config               the watched ports, their action and timers
        pfcwd show stats [-e]           the last run's counters per queue (-e: every queue)"""
        req = commands.parse_pfcwd(shlex.split(line))
        if req.show == "config":
            views.print_pfcwd_config(self.out, self.session.spec, self.session.routed.ports.ports)
        elif req.show == "stats":
            views.print_pfcwd_stats(self.out, self._last_dir(), req.every_queue)
        else:
            wd = self.session.set_watchdog(req.overrides).pfcwd
            self.out.print(f"PFC watchdog {'started' if wd.enabled else 'stopped'}"
                           + (f": action {wd.action} on {wd.ports} switch ports, detection "
                              f"{wd.detection_time * 1e6:g} us, restoration {wd.restoration_time * 1e6:g} us, "
                              f"poll {wd.poll_interval * 1e6:g} us (modelled)" if wd.enabled else ""),
                           highlight=False)

    def do_storm(self, line: str) -> None:
        """storm NIC FROM-TO | storm none: that NIC storms in the next runs (as `storm h4 1ms-3ms`: it stops draining and pauses its leaf from 1 ms to 3 ms of modelled time)."""
        spec = self.session.turn(commands.parse_storm(shlex.split(line)))
        storms = [e for e in spec.events if e.kind == "pfc_storm"]
        self.out.print("no PFC storm in the next runs" if not storms else
                       f"{storms[0].nic}'s NIC storms from {storms[0].at * 1e6:g} us to {storms[-1].at * 1e6:g} us"
                       " (modelled) in the next runs", highlight=False)

    def do_cc(self, line: str) -> None:
        """cc dcqcn|none: the NICs' congestion control, from the next run on."""
        spec = self.session.turn(commands.parse_cc(shlex.split(line)))
        self.out.print(f"congestion control {spec.congestion_control} from the next run on", highlight=False)

    def do_dcqcn(self, line: str) -> None:
        """dcqcn KEY=VALUE ...: DCQCN parameters from the next run on (preset=mlx5|paper, rate_ai=5Gbps, ...)."""
        spec = self.session.turn(commands.parse_dcqcn(shlex.split(line), DCQCN_KEYS))
        dq = {k: v for k, v in spec.dcqcn.model_dump(exclude={"preset"}).items() if v is not None}
        self.out.print(f"DCQCN preset {spec.dcqcn.preset}" + "".join(f", {k}={v}" for k, v in dq.items())
                       + " from the next run on" + ("" if spec.congestion_control == "dcqcn"
                                                   else " (congestion control is none: `cc dcqcn`)"),
                       highlight=False)

    def do_set(self, line: str) -> None:
        """set KEY=VALUE ...: any other setting of the experiment from the next run on (transport.retransmit_timeout=262us, seed=2, timeout=60s)."""
        overrides = commands.parse_set(shlex.split(line))
        self.session.turn(overrides)
        self.out.print("from the next run on: " + ", ".join(f"{k}={v}" for k, v in overrides.items()),
                       markup=False, highlight=False)

    def do_link(self, line: str) -> None:
        """link LINK down|up: cut a fabric link or restore it, as `link leaf1-spine2 down` (the controller reroutes)."""
        plan = self.session.plan
        switches = set(plan.switch_by_name)
        links = {frozenset((ln.a, ln.b)) for ln in plan.links if ln.a in switches and ln.b in switches}
        req = commands.parse_link(shlex.split(line), links)
        self.session.set_link(req)
        self.out.print(f"link {req.a}-{req.b} {'up' if req.up else 'down'}", highlight=False)

    # ------------------------------------------------------------------ views
    def _snapshot(self):
        from fabric_emu.live.reader import LiveReader

        reader = LiveReader(self.session.record.live_path)
        try:
            return reader.snapshot()
        finally:
            reader.close()

    def _last_dir(self):
        return self.session.runs[-1].run_dir if self.session.runs else None

    def do_ports(self, line: str) -> None:
        """ports [SWITCH]: every switch port's counters (bytes, drops, ECN marks, pauses) and link state."""
        switch = line.strip() or None
        if switch and switch not in self.session.plan.switch_by_name:
            raise commands.LabInputError(f"ports: no switch {switch!r} (switches: "
                                         f"{', '.join(s.name for s in self.session.plan.switches)})")
        views.print_ports(self.out, self._snapshot(), switch)

    def do_queues(self, line: str) -> None:
        """queues: the ECN/PFC thresholds installed now and how deep each queue got in the last run."""
        views.print_queues(self.out, self._last_dir(), self.session.routed.ports.installed())

    def do_flows(self, line: str) -> None:
        """flows: the last run's queue pairs: path, bytes, completion time, goodput, DCQCN's lowest rate."""
        views.print_flows(self.out, self._last_dir(), self._snapshot())

    def do_deadlocks(self, line: str) -> None:
        """deadlocks [now|last]: PFC deadlock cycles now (members, bytes held) and the last run's (formations, period).
        deadlocks now     the cycles of lossless buffers waiting on each other now, read from the switches
        deadlocks last    the last run's summary.json deadlocks: formations, first formed, period, unbroken at the end"""
        parts = commands.parse_deadlocks(shlex.split(line))
        if "now" in parts:
            from fabric_emu.live.reader import LiveReader

            reader = LiveReader(self.session.record.live_path)
            try:
                cycles, paused = reader.deadlocks_now(), reader.paused_now()
            finally:
                reader.close()
            views.print_deadlocks_now(self.out, cycles, paused)
        if "last" in parts:
            last = self.session.runs[-1] if self.session.runs else None
            views.print_deadlocks_last(self.out, None if last is None else (last.label or f"run{last.number}"),
                                       None if last is None else last.summary)

    def do_knobs(self, line: str) -> None:
        """knobs: the settings the next run gets (load balancing, ECN, PFC, congestion control, links)."""
        mode = self.session.lb_state().get("mode", self.session.spec.load_balancing)
        views.print_knobs(self.out, self.session.spec, mode,
                          ["-".join(sorted(link)) for link in self.session.links_down])

    def do_runs(self, line: str) -> None:
        """runs: this session's runs, their names, status and folders."""
        if not self.session.runs:
            self.out.print("no run yet")
        for r in self.session.runs:
            jct = r.summary.get("jct_fabric_s")
            self.out.print(f"run{r.number}{' (' + r.label + ')' if r.label else ''}: {r.summary.get('status')}"
                           + (f", completion {jct * 1e6:,.0f} us" if jct else "") + f"  {r.command}  {r.run_dir}",
                           markup=False, highlight=False, soft_wrap=True)

    def do_save(self, line: str) -> None:
        """save [NAME]: copy this session's runs and commands into results/lab/NAME/."""
        import time

        name = line.strip() or time.strftime("session-%Y%m%dT%H%M%S")
        if not commands.NAME_RE.fullmatch(name.replace("-", "_")):
            raise commands.LabInputError(f"save: {name!r}: a name is letters, digits, - and _")
        dest = self.session.save(name, self.transcript)
        self.out.print(f"saved {len(self.session.runs)} run(s) and the commands in {dest}",
                       highlight=False, soft_wrap=True)


def _dedent(doc: str) -> str:
    import inspect

    return inspect.cleandoc(doc)


def script_lines(path: str, stdin: TextIO) -> list[str]:
    if path == "-":
        return stdin.read().splitlines()
    with open(path) as f:
        return f.read().splitlines()


SayFn = Callable[[str], None]
