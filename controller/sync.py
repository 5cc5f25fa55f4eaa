"""Warm start: from what a switch holds to what it should hold, with the fewest messages.

A controller that restarts (or a switch that reconnects) must not wipe the switch's tables: with
fail_mode secure Open vSwitch kept forwarding on them while the controller was away, and a
blanket delete would drop traffic until everything is reinstalled (faucet's "warm start" does
the same: it reads the switch's tables and sends only the difference).

Pure: the app (controller/app.py) reads the switch's flow and group descriptions, turns them into
core.Flow / core.Group values (actions it cannot name become Unknown, so they never compare
equal), and plan_sync says what to send. Every flow and group on our bridges is ours (the bridges
are fabric-emu's, fail-secure, with no other controller), so one that the plan does not want is
deleted, exactly (by table, priority and match; a group by id), never by a wildcard.

Order matters: groups are added or modified before the flows that use them, and flows that are
not wanted are deleted before the groups they may point to.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable
from dataclasses import dataclass

from controller.core import (LB_COOKIE, Bucket, Flow, Group, Message, ResetSwitch)


@dataclass(frozen=True)
class Unknown:
    """An action the app could not translate back: a flow that carries one is always replaced."""

    what: str


@dataclass(frozen=True)
class DeleteFlow:
    """Delete one flow, strictly: this table, priority and exact match only."""

    table: int
    priority: int
    match: dict


@dataclass(frozen=True)
class DeleteGroup:
    group_id: int


@dataclass(frozen=True)
class SyncCounts:
    """What a warm start sent (and left alone), for the log, the ready file and the summary."""

    flows_added: int = 0
    flows_modified: int = 0
    flows_deleted: int = 0
    groups_added: int = 0
    groups_modified: int = 0
    groups_deleted: int = 0
    flows_kept: int = 0
    groups_kept: int = 0

    @property
    def messages(self) -> int:
        return (self.flows_added + self.flows_modified + self.flows_deleted
                + self.groups_added + self.groups_modified + self.groups_deleted)

    def as_dict(self) -> dict[str, int]:
        return {**dataclasses.asdict(self), "messages": self.messages}


def flow_key(f: Flow | DeleteFlow) -> tuple:
    """What identifies a flow in an OpenFlow table: table, priority and the exact match."""
    return f.table, f.priority, tuple(sorted(f.match.items()))


def _flow_body(f: Flow) -> tuple:
    return f.actions, f.goto_table, f.cookie


def _bucket_sig(b: Bucket) -> tuple:
    return b.bucket_id, b.actions, b.watch_port, b.watch_group


def group_signature(g: Group) -> tuple:
    """What makes two groups forward alike: type, buckets and, for select groups, the hash
    (the fields hashed whole and through masks, in any order, and the seed)."""
    hashed = frozenset([(f, None) for f in g.hash_fields] + list(g.hash_masks))
    return g.type, tuple(_bucket_sig(b) for b in g.buckets), hashed, g.hash_basis if hashed else 0


@dataclass(frozen=True)
class SyncPlan:
    messages: list  # core messages plus DeleteFlow / DeleteGroup, in sending order
    counts: SyncCounts


def plan_sync(desired: Iterable[Message], flows: Iterable[Flow], groups: Iterable[Group]) -> SyncPlan:
    """The messages that turn a switch holding `flows` and `groups` into one holding `desired`
    (FabricCore.switch_up's list; its ResetSwitch is ignored, that is the cold start)."""
    want_groups: dict[int, Group] = {}
    want_flows: dict[tuple, Flow] = {}
    for m in desired:
        if isinstance(m, Group):
            want_groups[m.group_id] = m
        elif isinstance(m, Flow):
            want_flows[flow_key(m)] = m
        elif not isinstance(m, ResetSwitch):
            raise TypeError(f"a switch's desired state holds flows and groups only, not {m!r}")
    have_groups = {g.group_id: g for g in groups}
    have_flows = {flow_key(f): f for f in flows}

    group_msgs, added_g, modified_g = [], 0, 0
    for gid, g in want_groups.items():
        have = have_groups.get(gid)
        if have is None:
            group_msgs.append(dataclasses.replace(g, modify=False))
            added_g += 1
        elif group_signature(have) != group_signature(g):
            group_msgs.append(dataclasses.replace(g, modify=True))
            modified_g += 1
    flow_msgs, added_f, modified_f = [], 0, 0
    for key, f in want_flows.items():
        have = have_flows.get(key)
        if have is None:
            added_f += 1
        elif _flow_body(have) != _flow_body(f):
            modified_f += 1  # an add over the same table, priority and match replaces it
        else:
            continue
        flow_msgs.append(f)
    flow_dels = [DeleteFlow(f.table, f.priority, f.match) for key, f in have_flows.items() if key not in want_flows]
    group_dels = [DeleteGroup(gid) for gid in sorted(have_groups) if gid not in want_groups]
    counts = SyncCounts(added_f, modified_f, len(flow_dels), added_g, modified_g, len(group_dels),
                        flows_kept=len(want_flows) - added_f - modified_f,
                        groups_kept=len(want_groups) - added_g - modified_g)
    return SyncPlan([*group_msgs, *flow_msgs, *flow_dels, *group_dels], counts)


def observed_lb_mode(flows: Iterable[Flow]) -> str | None:
    """The load-balancing mode a leaf's table shows (its LB_COOKIE flows: DLB's match the TTL
    the flowlet stage writes, spraying's the UDP source port), so a restarted controller keeps a
    mode changed during the run; None for an empty table (a switch nobody programmed yet)."""
    flows = list(flows)
    if not flows:
        return None
    lb = [f for f in flows if f.cookie == LB_COOKIE]
    if any("nw_ttl" in f.match for f in lb):
        return "dlb"
    if any("udp_src" in f.match for f in lb):
        return "spray"
    return "ecmp"
