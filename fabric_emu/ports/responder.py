"""The PFC responder (responder.c): the PFC daemon's child that makes every gate change.

The daemon (fabric_emu.ports.pfcd) keeps every decision but one: when a switch port crosses
xoff and its upstream is on this machine, the responder closes that upstream's gate itself, on
whichever CPU runs first (one real-time thread per CPU, up to eight), without waiting for the
daemon, whose one CPU a virtual machine sometimes leaves unrun for milliseconds
(docs/lossless-ports.md#headroom).
Every other change is the daemon's command. Each change carries its cause (the time of the
latest port program event behind it), so a fast close that comes late never undoes the daemon's
later reopening; responder.c says how. The responder reports every change back; the daemon keeps
the books from those reports (pause intervals, reaction times, the watchdog's view).

Compiled on first use with clang and cached per source version, as the port programs are.
"""

from __future__ import annotations

import os
import select
import socket
import struct
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from fabric_emu.kernel.compiled import build_cached
from fabric_emu.ports.layout import OFFSETS, PORT_BYTES
from fabric_emu.ports.queues import LOSSLESS

SOURCE = Path(__file__).with_name("responder.c")
CACHE = Path("/var/lib/fabric-emu/bin")
OP_CLOSE, OP_OPEN, OP_FAST_OFF, OP_FAST_ON = 0, 1, 2, 3
SRC_DAEMON, SRC_FAST = 0, 1
COMMAND = struct.Struct("=IIQQQQ")  # op, port, cause, seq, origin, handled (struct command)
REPORT = struct.Struct("=IBBBBiIQQQQQQ")  # struct report
READY_TIMEOUT_S = 10.0
SO_SNDBUFFORCE = 32  # linux/socket.h (root)


@dataclass(frozen=True)
class Report:
    """One change the responder was given (struct report): applied or not, and when."""

    port: int
    open: bool
    source: int  # SRC_DAEMON or SRC_FAST
    changed: bool  # the gate switched (it was the other way)
    stale: bool  # refused: a change with a later cause was applied first
    error: int  # negative errno of the tc change, 0
    cause: int
    origin: int  # the xoff crossing that closes it (CLOCK_MONOTONIC ns), 0: none
    handled: int  # when that crossing was handled (by the daemon or the responder)
    start_ns: int  # the tc change, start and end (0 if none was made)
    applied_ns: int
    kick_ns: int  # the kick after an opening (ns it took)

    @classmethod
    def unpack(cls, raw: bytes) -> "Report":
        port, is_open, source, changed, stale, error, _, *rest = REPORT.unpack(raw)
        return cls(port, bool(is_open), source, bool(changed), bool(stale), error, *rest)


@dataclass(frozen=True)
class GateSpec:
    """What the responder needs of one port's gate: its namespace's index in `namespaces`, its
    ifindex there, the pre-encoded tc changes (queues.Gate) and the kick frame."""

    port: int
    ns: int
    ifindex: int
    open_msg: bytes
    close_msg: bytes
    kick: bytes


def build() -> Path:
    return build_cached(SOURCE, CACHE, "responder", "", lambda out: [
        "clang", "-O2", "-Wall", "-Werror", "-pthread", str(SOURCE), "-o", str(out)])


def _byte_offset(field: str, i: int = 0) -> int:
    """Of field[i] in struct port (bpf/port.c)."""
    return (OFFSETS[field][0] + i) * 8


def config_text(pins: str, sock_fd: int, priority: int, namespaces: list[str], gates: list[GateSpec],
                fast: dict[int, int]) -> str:
    """responder.c's config: its lines, as its header comment lists them."""
    lines = [f"pins {pins}", f"sock {sock_fd}", f"priority {priority}",
             f"ports {PORT_BYTES} {_byte_offset('link_cut')} {_byte_offset('paused_since', LOSSLESS)}"
             f" {_byte_offset('paused_ns', LOSSLESS)}"]
    lines += [f"ns {i} {path}" for i, path in enumerate(namespaces)]
    lines += [f"gate {g.port} {g.ns} {g.ifindex} {g.open_msg.hex()} {g.close_msg.hex()} {g.kick.hex()}" for g in gates]
    lines += [f"fast {port} {gate}" for port, gate in sorted(fast.items())]
    return "\n".join(lines) + "\n"


class Responder:
    """The running responder: commands go out on a socket pair, reports come back on it."""

    def __init__(self, config_path: Path, pins: str, priority: int, namespaces: list[str],
                 gates: list[GateSpec], fast: dict[int, int]):
        self.sock, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        # Room for the reports of a daemon held back a while (its queue also stops at
        # net.unix.max_dgram_qlen, 512 by default): a responder that cannot report waits.
        theirs.setsockopt(socket.SOL_SOCKET, SO_SNDBUFFORCE, 1 << 20)
        config_path.write_text(config_text(pins, theirs.fileno(), priority, namespaces, gates, fast))
        self.seq = 0
        self.proc = subprocess.Popen([str(build()), str(config_path), str(os.getpid())], pass_fds=(theirs.fileno(),),
                                     stdout=subprocess.PIPE, text=True)
        theirs.close()
        ready, _, _ = select.select([self.proc.stdout], [], [], READY_TIMEOUT_S)
        line = self.proc.stdout.readline() if ready else ""
        if not line.startswith("READY"):
            self.close()
            raise RuntimeError(f"the PFC responder did not start ({line.strip() or 'no answer'})")
        self.workers = int(line.split()[1])

    def fileno(self) -> int:
        return self.sock.fileno()

    def command(self, op: int, port: int, cause: int, origin: int = 0, handled: int = 0) -> None:
        self.seq += 1
        self.sock.send(COMMAND.pack(op, port, cause, self.seq, origin, handled))

    def reports(self) -> Iterator[Report]:
        """Every report waiting, without blocking. A responder that died raises."""
        while (raw := self._recv()) is not None:
            if not raw:
                raise RuntimeError(f"the PFC responder exited ({self.proc.poll()})")
            yield Report.unpack(raw)

    def _recv(self) -> bytes | None:
        """One report's bytes; None: none waiting; b"": the responder is gone."""
        try:
            return self.sock.recv(REPORT.size, socket.MSG_DONTWAIT)
        except BlockingIOError:
            return None

    def close(self) -> list[Report]:
        """Stop it (it exits when its socket closes) and return the reports it left."""
        self.sock.shutdown(socket.SHUT_WR)
        try:
            self.proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        left = []
        while raw := self._recv():
            left.append(Report.unpack(raw))
        self.sock.close()
        if self.proc.stdout is not None:
            self.proc.stdout.close()
        return left
