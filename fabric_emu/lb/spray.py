"""Packet spraying: per-packet entropy from the NIC, mapped onto the uplinks by the leaves.

How a queue pair's packets take every uplink (what multipath RoCE NICs do, in the way cheapest
for Open vSwitch):

* the NIC gives each QP `entropies` UDP source ports that differ only in their low bits
  (entropy_ports) and sends packet PSN p from port number p mod entropies, so consecutive
  packets rotate through them;
* each leaf sends a RoCE packet bound for another leaf up the uplink its source port's low bits
  name (bucket_uplinks: bucket b -> uplink b mod n), with one masked match per bucket.

The mapping is exact, so with a power-of-two number of uplinks each one carries 1/n of a QP's
packets. And OVS's flow cache sees only the masked bits, so spraying costs `entropies` cached
flows per leaf pair, not an upcall per new hash value (a select group hashing the full port would
make every source port a new cached flow).
"""

from __future__ import annotations

MAX_ENTROPIES = 64


def is_power_of_two(n: int) -> bool:
    return n > 0 and n & (n - 1) == 0


def default_entropies(uplinks: int) -> int:
    """Entropy values per QP for a leaf with this many uplinks.

    A power of two of uplinks gets exactly one value each (an exact 1/n split). Otherwise the
    masks need a power of two of buckets, and some uplinks get one more bucket than others;
    8 buckets per uplink keep that excess under 1/8 of an uplink's share (for example, 3
    uplinks: 32 buckets as 11/11/10).
    """
    if uplinks < 1:
        raise ValueError(f"a leaf needs an uplink to spray over, got {uplinks}")
    if is_power_of_two(uplinks):
        return uplinks
    n = 1
    while n < 8 * uplinks:
        n <<= 1
    return min(n, MAX_ENTROPIES)


def plan_entropies(uplinks_per_leaf: list[int], requested: int | None) -> int:
    """The entropies every NIC and leaf of a fabric use: the requested number, or the default
    for its widest leaf (1 when no leaf has an uplink: a custom fabric of one switch)."""
    return requested or default_entropies(max([1, *uplinks_per_leaf]))


def entropy_ports(base_port: int, entropies: int) -> list[int]:
    """The QP's UDP source ports: its own with the low bits 0 .. entropies-1 (power of two)."""
    if not is_power_of_two(entropies) or entropies > MAX_ENTROPIES:
        raise ValueError(f"entropies must be a power of two up to {MAX_ENTROPIES}, got {entropies}")
    high = base_port & ~(entropies - 1) & 0xFFFF
    return [high | j for j in range(entropies)]


def bucket_uplinks(entropies: int, uplinks: int) -> list[int]:
    """For each bucket (the low bits of the UDP source port), the index of its uplink."""
    if uplinks < 1:
        raise ValueError(f"a leaf needs an uplink to spray over, got {uplinks}")
    return [b % uplinks for b in range(entropies)]


def shares(entropies: int, uplinks: int) -> list[float]:
    """The fraction of a QP's packets each uplink carries (the NIC rotates through buckets)."""
    counts = [0] * uplinks
    for u in bucket_uplinks(entropies, uplinks):
        counts[u] += 1
    return [c / entropies for c in counts]
