"""PFC headroom: the bytes that still arrive after a port decides to pause its upstream.

The SONiC formula (sonic-swss cfgmgr/buffer_headroom_mellanox.lua, docs/reference/
protocol_facts.md §4.2), in modelled units; bytes are the same in the emulated world (DESIGN §2):

    headroom = frame (the upstream's frame already on the wire when the pause arrives)
             + frame (the frame this port is sending when it decides to pause)
             + 2 * cable_length * rate / (1.98e8 m/s * 8)     (bytes on the cable, both ways)
             + peer response: IEEE 802.3 31B.3.7 quanta for the speed * 512 bits / 8

With the defaults (4,214-byte frames, 100 m, 100 Gb/s) that is 46,270 bytes: the same order as
SONiC's Mellanox SN4280 table (43,008 B at 100G/40 m). Rounded up to whole KiB as SONiC does.
"""

from __future__ import annotations

import math

CABLE_M_PER_S = 1.98e8
# IEEE 802.3 31B.3.7 response time in pause quanta, by link speed in Gb/s (the SONiC table).
RESPONSE_QUANTA = ((0.1, 1), (1, 2), (10, 67), (25, 80), (40, 118), (50, 147), (100, 394),
                   (200, 453), (400, 905), (800, 905))


def response_quanta(gbps: float) -> int:
    """The quanta of the first speed in the table at or above gbps (the largest beyond it)."""
    for speed, quanta in RESPONSE_QUANTA:
        if gbps <= speed:
            return quanta
    return RESPONSE_QUANTA[-1][1]


def headroom_bytes(frame_bytes: int, gbps: float, cable_m: float) -> int:
    """The smallest headroom that keeps a link of gbps lossless, rounded up to 1 KiB."""
    cable = 2 * cable_m * gbps * 1e9 / (CABLE_M_PER_S * 8)
    response = response_quanta(gbps) * 512 / 8
    return math.ceil((2 * frame_bytes + cable + response) / 1024) * 1024
