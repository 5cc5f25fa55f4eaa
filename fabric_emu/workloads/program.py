"""Per-rank programs: the general shape of every collective and training workload, pure.

A program is, for every host, a list of operations with dependencies:
* send: post one RDMA WRITE message on a channel (a (src, dst) connection of one job, with its
  own queue pairs); it is done when its last packet has left the NIC;
* recv: wait for the matching message on a channel; done when it has arrived whole;
* compute: hold the host's stream for a modelled time (a GPU kernel; 0 s is a join).

Operations run as soon as their dependencies (operations of the same host) are done. Across
hosts the only link is data: the n-th send on a channel is the n-th recv at the other end,
because RC delivers a queue pair's messages in order and a sender posts a channel's messages in
their order. So a step starts exactly when the data it needs has arrived, as in NCCL.

Every workload (collectives, pipelines, 3D-parallel training, several jobs) is built into one
Program (fabric_emu.workloads.collectives, training; jobs puts an experiment's jobs together);
the NIC engines run each host's part of it (fabric_emu.nic.drivers.program) and report when each
operation started and ended (Times).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

SEND, RECV, COMPUTE = "send", "recv", "compute"
FABRIC, SCALE_UP = "fabric", "scale-up"  # a channel's path
# What an operation's time counts as in a step's split (fabric_emu.workloads.training.step_split).
COMPUTE_CAT, SYNC_CAT = "compute", "sync"


@dataclass(frozen=True)
class Channel:
    """A one-way connection of one job: its queue pairs carry the channel's messages in order."""

    job: str
    stream: str  # what it carries (ring, tp, pp, dp, ...): pairs may have one per stream
    src: str
    dst: str
    qps: int = 1
    via: str = FABRIC  # FABRIC: RoCE packets through the switches; SCALE_UP: modelled inside a server


@dataclass
class Op:
    id: int  # index in Program.ops
    host: str
    kind: str  # SEND | RECV | COMPUTE
    job: str
    cat: str  # what the time counts as: compute, sync, or a communication kind (tp, pp, dp, ...)
    step: int  # iteration of the job
    deps: list[int] = field(default_factory=list)  # ops of the same host
    channel: int = -1  # send, recv
    seq: int = -1  # the message's index on its channel
    nbytes: int = 0  # send, recv
    seconds: float = 0.0  # compute: modelled seconds


@dataclass
class Program:
    channels: list[Channel] = field(default_factory=list)
    ops: list[Op] = field(default_factory=list)
    _chan_index: dict[tuple[str, str, str, str, str], int] = field(default_factory=dict, repr=False)
    _sent: list[int] = field(default_factory=list, repr=False)  # messages per channel so far

    # ------------------------------------------------------------------ building
    def channel(self, job: str, stream: str, src: str, dst: str, qps: int = 1, via: str = FABRIC) -> int:
        if src == dst:
            raise ValueError(f"{job}: a channel from {src} to itself")
        key = (job, stream, src, dst, via)
        c = self._chan_index.get(key)
        if c is None:
            c = self._chan_index[key] = len(self.channels)
            self.channels.append(Channel(job, stream, src, dst, qps, via))
            self._sent.append(0)
        return c

    def _add(self, op: Op) -> int:
        for d in op.deps:
            if self.ops[d].host != op.host:
                raise ValueError(f"op {op.id} on {op.host} depends on op {d} of {self.ops[d].host}")
        self.ops.append(op)
        return op.id

    def compute(self, job: str, host: str, seconds: float, deps: Iterable[int] = (),
                cat: str = COMPUTE_CAT, step: int = 0) -> int:
        if seconds < 0:
            raise ValueError(f"compute time must be >= 0, got {seconds}")
        return self._add(Op(len(self.ops), host, COMPUTE, job, cat, step, sorted(set(deps)),
                            seconds=seconds))

    def join(self, job: str, host: str, deps: Iterable[int], step: int = 0) -> int:
        """A zero-time operation done when all of deps are: one handle for many."""
        return self.compute(job, host, 0.0, deps, SYNC_CAT, step)

    def transfer(self, job: str, stream: str, src: str, dst: str, nbytes: int,
                 deps: Iterable[int] = (), cat: str | None = None, step: int = 0,
                 qps: int = 1, via: str = FABRIC) -> tuple[int, int]:
        """One message from src to dst after deps (ops of src): (its send op, its recv op).
        `via` SCALE_UP: across the server's scale-up domain (both GPUs of one server)."""
        if nbytes < 0:
            raise ValueError(f"message size must be >= 0, got {nbytes}")
        c = self.channel(job, stream, src, dst, qps, via)
        seq = self._sent[c]
        self._sent[c] += 1
        cat = cat or stream
        s = self._add(Op(len(self.ops), src, SEND, job, cat, step, sorted(set(deps)), c, seq, nbytes))
        r = self._add(Op(len(self.ops), dst, RECV, job, cat, step, [], c, seq, nbytes))
        return s, r

    def add_deps(self, op: int, deps: Iterable[int]) -> None:
        """More dependencies for an op made before the ops it waits for existed."""
        o = self.ops[op]
        for d in deps:
            if self.ops[d].host != o.host:
                raise ValueError(f"op {op} on {o.host} depends on op {d} of {self.ops[d].host}")
            if d not in o.deps:
                o.deps.append(d)
        o.deps.sort()

    # ------------------------------------------------------------------ reading
    @property
    def hosts(self) -> list[str]:
        """Every host with an operation, in first-appearance order."""
        return list(dict.fromkeys(o.host for o in self.ops))

    def host_ops(self, host: str) -> list[Op]:
        return [o for o in self.ops if o.host == host]

    def jobs(self) -> list[str]:
        return list(dict.fromkeys(o.job for o in self.ops))

    def check(self) -> None:
        """Every op's dependencies come before it (so the graph has no cycle) and every
        channel's sends and recvs pair up."""
        if not _acyclic(self):
            raise ValueError("the operations' dependencies form a cycle")
        sends: dict[int, int] = {}
        recvs: dict[int, int] = {}
        for o in self.ops:
            if o.kind == SEND:
                sends[o.channel] = sends.get(o.channel, 0) + 1
            elif o.kind == RECV:
                recvs[o.channel] = recvs.get(o.channel, 0) + 1
        if sends != recvs:
            raise ValueError("a channel's sends and recvs do not pair up")

    def bytes_sent(self) -> dict[str, int]:
        out: dict[str, int] = {}
        for o in self.ops:
            if o.kind == SEND:
                out[o.host] = out.get(o.host, 0) + o.nbytes
        return out


Times = list[tuple[float, float] | None]  # per op id: (start, end) emulated epoch seconds


def _acyclic(p: Program) -> bool:
    """Kahn's algorithm over the ops' same-host dependencies."""
    indeg = [len(o.deps) for o in p.ops]
    users: list[list[int]] = [[] for _ in p.ops]
    for o in p.ops:
        for d in o.deps:
            users[d].append(o.id)
    ready = [i for i, n in enumerate(indeg) if n == 0]
    seen = 0
    while ready:
        i = ready.pop()
        seen += 1
        for u in users[i]:
            indeg[u] -= 1
            if indeg[u] == 0:
                ready.append(u)
    return seen == len(p.ops)

