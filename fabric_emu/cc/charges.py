"""What the lossless class's buffer accounting still holds when a run's traffic has ended.

A lossless frame is charged to the switch port it enters by (`held`, in the port's tc ingress
hook, before Open vSwitch reads it), added per (ingress, egress) pair when an egress port admits
it (`pair_held`), and both are credited back when it arrives at the far end or an egress port
drops it (fabric_emu/ports/bpf/port.c). Once nothing moves, for every ingress port

    held - sum over egress ports of pair_held = bytes Open vSwitch lost after the charge

(a table-miss drop, a full packet socket, a port taken down that had no wire: TTL expiries are
not charged, and a link with a wire gives back what is sent into it cut), and what the
pairs still hold is waiting in egress queues (a paused or deadlocked buffer). A negative pair,
or pairs above held, means a frame was credited without its charge: the accounting itself is
off, and ports may have stopped pausing too early. Pure: readings in, a summary out.

Why only at the end: a frame can wait inside Open vSwitch for as long as its egress port is
paused (two runs that credited a leak after a still second, a PFC-storm lab and a rerouting
fabric, each got exactly one 4,154-byte frame back later: issue 20), so while traffic flows
"charged and in no queue" does not mean lost.
"""

from __future__ import annotations

SIGN_BIT = 1 << 63


def signed(u64: int) -> int:
    """A counter the programs decrement, read as the signed number it is (a wrap is negative)."""
    return u64 - (1 << 64) if u64 >= SIGN_BIT else u64


def charge_audit(held: dict[str, int], pairs: dict[tuple[str, str], int], settled: bool) -> dict:
    """summary.json's `pfc_accounting`: held: signed bytes charged per switch ingress port
    (interface name); pairs: signed bytes per (ingress, egress) interface; settled: whether two
    readings agreed (nothing was moving)."""
    queued: dict[str, int] = {}  # what egress queues hold of each ingress port's bytes
    owed: dict[str, int] = {}  # what negative pairs gave back without a charge
    for (ingress, _), n in pairs.items():
        into = queued if n > 0 else owed
        into[ingress] = into.get(ingress, 0) + abs(n)
    leaked, over = {}, {}
    for port in sorted(set(held) | set(queued) | set(owed)):
        diff = held.get(port, 0) - queued.get(port, 0)
        if diff > 0 and port not in owed:
            leaked[port] = diff
        elif diff < 0 or port in owed:
            over[port] = max(0, -diff) + owed.get(port, 0)
    negative = sorted(f"{a}>{b}" for (a, b), n in pairs.items() if n < 0)
    return {"settled": settled, "held_bytes": sum(n for n in held.values() if n > 0),
            "queued_bytes": sum(n for n in pairs.values() if n > 0),
            "leaked_bytes": sum(leaked.values()), "leaked_by_port": leaked,
            "over_credited_bytes": sum(over.values()), "over_credited_by_port": over,
            "negative_pairs": negative}


def charge_notes(audit: dict | None) -> list[str]:
    """Fidelity notes for what the accounting still held at the end."""
    if not audit:
        return []
    notes = []
    if audit["leaked_bytes"]:
        worst = max(audit["leaked_by_port"].items(), key=lambda kv: kv[1])
        notes.append(f"{audit['leaked_bytes']} B of lossless frames stayed charged to "
                     f"{len(audit['leaked_by_port'])} switch ingress port(s) at the end, in no queue "
                     f"(most on {worst[0]}: {worst[1]} B): frames Open vSwitch dropped after the port "
                     "admitted them; those ports sat that much nearer their pause threshold")
    if audit["over_credited_bytes"] or audit["negative_pairs"]:
        notes.append(f"the lossless accounting gave back {audit['over_credited_bytes']} B more than it charged "
                     f"on {len(audit['over_credited_by_port'])} port(s)"
                     + (f" ({len(audit['negative_pairs'])} negative pair(s))" if audit["negative_pairs"] else "")
                     + ": those ports could pause later than the modelled switch")
    return notes
