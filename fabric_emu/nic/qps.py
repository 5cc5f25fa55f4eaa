"""The queue pairs of a run, drawn reproducibly from the seed so every agent agrees on them.

Every agent rebuilds the same table from (edges, qps_per_peer, seed): the QPN at each end of
every (sender, receiver, q) connection, the initial PSN, and the sender's fixed UDP source port.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass

from fabric_emu.wire.roce import PSN_MASK, rdma_udp_sport

_SPORT_MIN = 0xC000  # the RoCEv2 source-port range is 0xC000..0xFFFF
_SPORT_COUNT = 0x4000
_FIRST_QPN = 2  # QP0 and QP1 are the InfiniBand management QPs


@dataclass(frozen=True)
class QueuePair:
    src: str
    dst: str
    index: int  # 0 .. qps_per_peer-1 within the (src, dst) pair (or flow)
    src_qpn: int  # the requester's QP: CNPs come back to it
    dst_qpn: int  # the responder's QP: the BTH DestQP of every data packet
    start_psn: int
    udp_sport: int


def build_qp_table(edges: list[tuple[str, str]], qps_per_peer: int | Sequence[int],
                   seed: int) -> list[QueuePair]:
    """One QueuePair per (edge, q), in edge order; QPNs are unique, source ports unique per host.

    qps_per_peer is one count for every edge, or one count per edge (a workload's flows may
    each have their own; an edge may repeat, each occurrence gets its own queue pairs).
    A source port is bumped to the next free one when the Linux formula repeats a port already
    used by the same sender: each QP owns a socket bound to its port.
    """
    counts = [qps_per_peer] * len(edges) if isinstance(qps_per_peer, int) else list(qps_per_peer)
    if len(counts) != len(edges):
        raise ValueError(f"{len(counts)} queue pair counts for {len(edges)} edges")
    rng = random.Random(seed)
    count = sum(counts)
    qpns = rng.sample(range(_FIRST_QPN, PSN_MASK + 1), 2 * count)
    psns = [rng.randrange(PSN_MASK + 1) for _ in range(count)]
    used: dict[str, set[int]] = {}
    table = []
    for i, ((src, dst), q) in enumerate((e, q) for e, n in zip(edges, counts) for q in range(n)):
        src_qpn, dst_qpn = qpns[2 * i], qpns[2 * i + 1]
        taken = used.setdefault(src, set())
        if len(taken) >= _SPORT_COUNT:
            raise ValueError(f"{src}: more than {_SPORT_COUNT} queue pairs")
        sport = rdma_udp_sport(src_qpn, dst_qpn)
        while sport in taken:
            sport = _SPORT_MIN + (sport - _SPORT_MIN + 1) % _SPORT_COUNT
        taken.add(sport)
        table.append(QueuePair(src, dst, q, src_qpn, dst_qpn, psns[i], sport))
    return table
