"""The lab's own commands as data: what a typed line asks for, before anything runs. Pure.

Knobs become `--set` overrides of the lab's experiment (dotted key -> YAML text), so the spec's
own validation judges them and a bad value gets the same one-line error as `fabric-emu run
--set`. A `run` line becomes the workload mapping that replaces the experiment's.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field

from fabric_emu.spec.workloads import WORKLOAD_TYPES


class LabInputError(ValueError):
    """A line the lab cannot take; the message is the one line the user sees."""


NAME_RE = re.compile(r"[A-Za-z][A-Za-z0-9_]*")
RESERVED_NAMES = {"last", "min", "max", "abs", "len", "sum"}
FLOW_RE = re.compile(r"(?P<src>[^-:@\s]+)-(?P<dst>[^-:@\s]+):(?P<size>[^@\s]+)(?:@(?P<start>\S+))?")
LB_MODES = ("ecmp", "dlb", "spray")
ON_OFF = {"on": "true", "off": "false"}


def _value(raw: str) -> str:
    """A key=value's value as YAML text: commas make a list (ranks=h1,h2 -> [h1, h2])."""
    if "," in raw:
        return json.dumps([v for v in raw.split(",") if v])
    return raw


def key_values(words: list[str], command: str) -> dict[str, str]:
    out = {}
    for w in words:
        key, sep, raw = w.partition("=")
        if not sep or not key or not raw:
            raise LabInputError(f"{command}: {w!r}: expected key=value")
        out[key] = _value(raw)
    return out


@dataclass
class RunRequest:
    workload: dict | None  # None: the experiment's own workload
    label: str | None  # `as NAME`: how expect refers to this run


def parse_run(words: list[str]) -> RunRequest:
    """`run [TYPE ARGS... key=value...] [as NAME]`:

    run                               the experiment's own workload
    run allreduce 8MB [iterations=2 ranks=h1,h2,...]   (also reducescatter, allgather, alltoall, sendrecv)
    run incast h1 [4MB] [senders=h2,h3 ...]
    run flows h1-h5:8MB h2-h6:8MB@100us [qps=...]      SRC-DST:SIZE[@START]
    """
    label = None
    if len(words) >= 2 and words[-2] == "as":
        label = words[-1]
        if not NAME_RE.fullmatch(label) or label in RESERVED_NAMES:
            raise LabInputError(f"run: as {label!r}: a name is a letter then letters, digits or _"
                                f" (not {', '.join(sorted(RESERVED_NAMES))})")
        words = words[:-2]
    if not words:
        return RunRequest(None, label)
    kind, rest = words[0], words[1:]
    if kind not in WORKLOAD_TYPES:
        raise LabInputError(f"run: unknown workload {kind!r} (allowed: {', '.join(WORKLOAD_TYPES)};"
                            " or nothing, for the experiment's own)")
    positional = [w for w in rest if "=" not in w]
    options = key_values([w for w in rest if "=" in w], "run")
    workload: dict = {"type": kind}
    if kind == "flows":
        flows = []
        for w in positional:
            m = FLOW_RE.fullmatch(w)
            if not m:
                raise LabInputError(f"run flows: {w!r}: expected SRC-DST:SIZE[@START], as h1-h5:8MB or h2-h1:2MB@100us")
            flows.append({k: v for k, v in m.groupdict().items() if v is not None})
        if not flows:
            raise LabInputError("run flows: give at least one flow, as h1-h5:8MB")
        workload["flows"] = flows
    elif kind == "incast":
        if not positional:
            raise LabInputError("run incast: give the receiver, as `run incast h1 4MB`")
        if len(positional) > 2:
            raise LabInputError(f"run incast: {' '.join(positional[2:])!r}: expected RECEIVER [SIZE] [key=value ...]")
        workload["receiver"] = positional[0]
        if len(positional) == 2:
            workload["size"] = positional[1]
    else:
        if len(positional) > 1:
            raise LabInputError(f"run {kind}: {' '.join(positional[1:])!r}: expected SIZE [key=value ...]")
        if positional:
            workload["size"] = positional[0]
    for key, raw in options.items():
        workload[key] = _scalar(raw)
    return RunRequest(workload, label)


def _scalar(raw: str):
    """A JSON value when it is one (2, true, [..]), else the text (8MB, h1)."""
    try:
        return json.loads(raw)
    except ValueError:
        return raw


def workload_overrides(workload: dict) -> dict[str, str]:
    """The overrides that make `workload` the experiment's only job."""
    return {"workload": json.dumps(workload), "workloads": "[]"}


def parse_switch(words: list[str], command: str, keys: tuple[str, ...]) -> dict[str, str]:
    """`ecn on|off [key=value ...]`, `pfc on|off [...]`: overrides of the spec's section."""
    if not words or words[0] not in ON_OFF:
        raise LabInputError(f"{command}: expected on or off, then optionally "
                            + " ".join(f"{k}=..." for k in keys))
    out = {f"{command}.enabled": ON_OFF[words[0]]}
    for key, raw in key_values(words[1:], command).items():
        if key not in keys:
            raise LabInputError(f"{command}: {key}: unknown setting (allowed: {', '.join(keys)})")
        out[f"{command}.{key}"] = raw
    return out


ECN_KEYS = ("kmin", "kmax", "pmax")
PFC_KEYS = ("xoff", "xon", "headroom", "quanta")


def parse_cc(words: list[str]) -> dict[str, str]:
    if len(words) != 1 or words[0] not in ("dcqcn", "none"):
        raise LabInputError("cc: expected dcqcn or none")
    return {"congestion_control": words[0]}


def parse_dcqcn(words: list[str], known: tuple[str, ...]) -> dict[str, str]:
    """`dcqcn key=value ...` (known: DcqcnSpec's fields): the next runs' DCQCN parameters."""
    if not words:
        raise LabInputError("dcqcn: expected key=value ..., as `dcqcn preset=paper rate_ai=5Gbps`")
    out = {}
    for key, raw in key_values(words, "dcqcn").items():
        if key not in known:
            raise LabInputError(f"dcqcn: {key}: unknown parameter (allowed: {', '.join(known)})")
        out[f"dcqcn.{key}"] = raw
    return out


@dataclass(frozen=True)
class LbRequest:
    mode: str
    params: dict[str, str] = field(default_factory=dict)


def parse_lb(words: list[str]) -> LbRequest | None:
    """`lb` (show) or `lb MODE [key=value ...]`."""
    if not words:
        return None
    if words[0] not in LB_MODES:
        raise LabInputError(f"lb: got {words[0]!r}; expected one of {', '.join(LB_MODES)}")
    return LbRequest(words[0], key_values(words[1:], "lb"))


@dataclass(frozen=True)
class LinkRequest:
    a: str
    b: str
    up: bool


def parse_link(words: list[str], links: set[frozenset[str]]) -> LinkRequest:
    """`link leaf1-spine2 down|up` (or Mininet's `link leaf1 spine2 down`); links: the fabric's
    switch-to-switch links."""
    if len(words) == 2 and "-" in words[0]:
        (a, _, b), state = words[0].partition("-"), words[1]
    elif len(words) == 3:
        a, b, state = words
    else:
        raise LabInputError("link: expected LINK down|up, as `link leaf1-spine2 down`")
    if state not in ("up", "down"):
        raise LabInputError(f"link: got {state!r}; expected down or up")
    if frozenset((a, b)) not in links:
        example = "-".join(sorted(next(iter(links)))) if links else "leaf1-spine1"
        raise LabInputError(f"link: {a}-{b} is not a link between two switches of this fabric (as {example})")
    return LinkRequest(a, b, state == "up")


# `pfcwd start` keys -> the spec's pfcwd fields (SONiC's CLI names its timers detection-time, ...)
PFCWD_KEYS = {"action": "action", "detection": "detection_time", "restoration": "restoration_time",
              "poll": "poll_interval", "ports": "ports", "preset": "preset"}


@dataclass(frozen=True)
class PfcwdRequest:
    show: str | None  # "config" | "stats" | None (a change)
    overrides: dict[str, str] = field(default_factory=dict)
    every_queue: bool = False  # show stats -e: queues that never stormed too


def parse_pfcwd(words: list[str]) -> PfcwdRequest:
    """`pfcwd start [action=drop|forward|alert detection=400us restoration=800us poll=200us
    ports=all|host-facing preset=classroom|sonic]`, `pfcwd stop`, `pfcwd show config|stats [-e]`."""
    if not words or words[:2] == ["show", "config"]:
        return PfcwdRequest("config")
    if words[:2] == ["show", "stats"]:
        extra = words[2:]
        if extra not in ([], ["-e"]):
            raise LabInputError("pfcwd: show stats takes only -e (every queue, not just those that stormed)")
        return PfcwdRequest("stats", every_queue=bool(extra))
    if words == ["stop"]:
        return PfcwdRequest(None, {"pfcwd.enabled": "false"})
    if words[0] != "start":
        raise LabInputError("pfcwd: expected start [key=value ...], stop, show config or show stats")
    out = {"pfcwd.enabled": "true"}
    for key, raw in key_values(words[1:], "pfcwd start").items():
        if key not in PFCWD_KEYS:
            raise LabInputError(f"pfcwd start: {key}: unknown setting (allowed: {', '.join(PFCWD_KEYS)})")
        out[f"pfcwd.{PFCWD_KEYS[key]}"] = raw
    return PfcwdRequest(None, out)


def parse_storm(words: list[str]) -> dict[str, str]:
    """`storm NIC FROM-TO` (as `storm h4 1ms-3ms`): that NIC storms in the next runs, between
    two modelled times from the start of traffic; `storm none`: no storm. Either replaces the
    experiment's events."""
    if words == ["none"]:
        return {"events": "[]"}
    if len(words) != 2 or "-" not in words[1]:
        raise LabInputError("storm: expected NIC FROM-TO (as `storm h4 1ms-3ms`) or none")
    nic, (start, _, end) = words[0], words[1].partition("-")
    if not start or not end:
        raise LabInputError(f"storm: {words[1]!r}: expected FROM-TO, as 1ms-3ms")
    return {"events": json.dumps([{"at": start, "nic": nic, "pfc_storm": "on"},
                                  {"at": end, "nic": nic, "pfc_storm": "off"}])}


# Keys `set` leaves to the command that applies them (or that cannot change with the fabric up).
SET_ELSEWHERE = {"topology": "the fabric is built: leave the lab and start it with --set",
                 "load_balancing": "use lb", "ecn": "use ecn", "pfc": "use pfc", "workload": "use run",
                 "workloads": "use run", "congestion_control": "use cc", "dcqcn": "use dcqcn",
                 "spray": "the fabric is built with it: start the lab with --set",
                 "dlb": "the fabric is built with it: start the lab with --set",
                 "paths": "the fabric is routed with them: leave the lab and start it with --set",
                 "failover": "the fabric is routed with it: leave the lab and start it with --set",
                 "capture": "the lab does not capture (use tcpdump on a node)", "pfcwd": "use pfcwd start|stop", "name": "the lab's experiment keeps its name"}


def parse_set(words: list[str]) -> dict[str, str]:
    """`set dotted.key=value ...`: any other setting of the spec for the next runs (as `--set`)."""
    if not words:
        raise LabInputError("set: expected dotted.key=value, as `set transport.retransmit_timeout=262us`")
    out = {}
    for w in words:
        key, sep, raw = w.partition("=")
        if not sep or not key or not raw:
            raise LabInputError(f"set: {w!r}: expected dotted.key=value")
        top = key.split(".")[0]
        if top in SET_ELSEWHERE:
            raise LabInputError(f"set: {key}: {SET_ELSEWHERE[top]}")
        out[key] = raw
    return out


DEADLOCK_PARTS = ("now", "last")


def parse_deadlocks(words: list[str]) -> tuple[str, ...]:
    """`deadlocks [now|last]`: the cycles in the fabric now, the last run's deadlock summary, or
    both (nothing given)."""
    if not words:
        return DEADLOCK_PARTS
    if len(words) == 1 and words[0] in DEADLOCK_PARTS:
        return (words[0],)
    raise LabInputError("deadlocks: expected nothing, now (the cycles now) or last (the last run's summary)")
