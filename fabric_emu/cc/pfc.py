"""PFC (IEEE 802.1Qbb) timing and the two state machines of a lossless link, pure.

The switch's BPF program detects the crossings (bytes held per ingress port above `xoff`, back
below `xon`); these classes decide the frames and the timers:

* PauseSender, one per switch ingress port: on XOFF send a pause with the configured quanta and
  refresh it every half pause time while the port stays above xon; on XON send quanta 0.
* PauseReceiver, one per port that honours PFC (the upstream end of the link): a pause closes its
  lossless queue until the pause time runs out, a later pause extends it, quanta 0 reopens it.

Times are emulated seconds: a quantum is 512 bit times at the MODELLED link rate, times the
dilation (DESIGN.md §2).
"""

from __future__ import annotations

from dataclasses import dataclass

QUANTUM_BITS = 512
MAX_QUANTA = 0xFFFF
REFRESH_FRACTION = 0.5  # refresh a pause when half of it has run


def pause_seconds(quanta: int, link_gbps: float, dilation: float = 1.0) -> float:
    """How long `quanta` pause a link of link_gbps (modelled), in emulated seconds."""
    return quanta * QUANTUM_BITS / (link_gbps * 1e9) * dilation


# Every this often (wall seconds) the PFC daemon checks its senders against the ports'
# xoff_state, which the port programs keep exact: an XOFF or XON event the ring buffer had no
# room for (the daemon was off a CPU) must not leave a port unpaused, or worse, pausing its
# upstream forever.
RECONCILE_S = 0.05


@dataclass
class PauseSender:
    """The pause frames one ingress port sends upstream. Methods return the quanta to send."""

    quanta: int
    refresh_s: float  # emulated seconds between two pauses of one episode
    asserted: bool = False
    next_refresh: float | None = None

    def on_xoff(self, now: float) -> list[int]:
        self.asserted = True
        self.next_refresh = now + self.refresh_s
        return [self.quanta]

    def on_xon(self, now: float) -> list[int]:  # noqa: ARG002 - same shape as the others
        if not self.asserted:
            return []
        self.asserted = False
        self.next_refresh = None
        return [0]

    def on_level(self, xoff: bool, now: float) -> list[int]:
        """The port's xoff_state as the programs keep it: catch up on a lost XOFF or XON event."""
        if xoff == self.asserted:
            return []
        return self.on_xoff(now) if xoff else self.on_xon(now)

    def on_timer(self, now: float) -> list[int]:
        if not self.asserted or self.next_refresh is None or now < self.next_refresh:
            return []
        self.next_refresh = now + self.refresh_s
        return [self.quanta]


@dataclass
class PauseReceiver:
    """Whether one port's lossless queue may send. Methods return "close", "open" or None."""

    paused_until: float | None = None

    @property
    def paused(self) -> bool:
        return self.paused_until is not None

    def on_frame(self, now: float, pause_s: float) -> str | None:
        if pause_s > 0:
            was = self.paused
            self.paused_until = now + pause_s
            return None if was else "close"
        if self.paused:
            self.paused_until = None
            return "open"
        return None

    def on_timer(self, now: float) -> str | None:
        if self.paused_until is not None and now >= self.paused_until:
            self.paused_until = None
            return "open"
        return None


def pfc_frame(src_mac: bytes, quanta: int, priority: int = 3) -> bytes:
    """A PFC frame (MAC control 0x8808, opcode 0x0101) pausing one priority, padded to 60 bytes."""
    times = [0] * 8
    times[priority] = quanta
    body = (0x0101).to_bytes(2, "big") + (1 << priority).to_bytes(2, "big")
    body += b"".join(t.to_bytes(2, "big") for t in times)
    frame = bytes.fromhex("0180c2000001") + src_mac + (0x8808).to_bytes(2, "big") + body
    return frame.ljust(60, b"\0")
