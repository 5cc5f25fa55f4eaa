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

Multi-GPU servers (Domains): a transfer between two GPUs of one server goes across the server's
scale-up domain (via SCALE_UP: modelled by the engines, no packets), as NCCL uses NVLink; every
other transfer is RoCE through the fabric. With PXN (rail-optimized fabrics) a transfer from
server A's GPU on rail i to server B's GPU on rail j != i is relayed: A:i -> A:j across A's
scale-up domain, then A:j -> B:j on rail j, so it never crosses between rails in the fabric.
Program.transfer decides this for every workload, from the Domains the job was given.

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
    relay: bool = False  # PXN's second hop: messages another GPU sent (counted once, as theirs)


@dataclass
class Domains:
    """Which hosts are GPUs of one server, and whether cross-rail transfers take PXN's relay."""

    gpus: dict[str, tuple[str, ...]]  # server -> its hosts, GPU 0 first
    pxn: bool = False  # relay through the destination rail's GPU of the source server
    _at: dict[str, tuple[str, int]] = field(default_factory=dict, repr=False)  # host -> (server, GPU)

    def __post_init__(self) -> None:
        self._at = {h: (srv, i) for srv, hosts in self.gpus.items() for i, h in enumerate(hosts)}

    def server(self, host: str) -> str | None:
        at = self._at.get(host)
        return at[0] if at else None

    def gpu(self, host: str) -> int | None:
        """A host's GPU index in its server (on rail-optimized fabrics: its rail - 1)."""
        at = self._at.get(host)
        return at[1] if at else None

    def same_server(self, a: str, b: str) -> bool:
        sa = self.server(a)
        return sa is not None and sa == self.server(b)

    def relay(self, src: str, dst: str) -> str | None:
        """PXN's relay for src -> dst: src's server's GPU with dst's index (on dst's rail), if
        src and dst are GPUs of different servers with different indices (and PXN is on)."""
        if not self.pxn:
            return None
        a, b = self._at.get(src), self._at.get(dst)
        if a is None or b is None or a[0] == b[0] or a[1] == b[1]:
            return None
        return self.gpus[a[0]][b[1]]


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
    domains: Domains | None = None  # the job being built's servers (None: single-NIC hosts)
    _chan_index: dict[tuple[str, str, str, str, str], int] = field(default_factory=dict, repr=False)
    _sent: list[int] = field(default_factory=list, repr=False)  # messages per channel so far

    # ------------------------------------------------------------------ building
    def channel(self, job: str, stream: str, src: str, dst: str, qps: int = 1, via: str = FABRIC,
                relay: bool = False) -> int:
        if src == dst:
            raise ValueError(f"{job}: a channel from {src} to itself")
        key = (job, stream, src, dst, via)
        c = self._chan_index.get(key)
        if c is None:
            c = self._chan_index[key] = len(self.channels)
            self.channels.append(Channel(job, stream, src, dst, qps, via, relay))
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
                 qps: int = 1, via: str | None = None) -> tuple[int, int]:
        """One message from src to dst after deps (ops of src): (its send op, its recv op).
        `via` None: as `domains` says (SCALE_UP between GPUs of one server, PXN's relay, else
        FABRIC); SCALE_UP or FABRIC: that path, whatever the domains."""
        if via is None and self.domains is not None:
            if self.domains.same_server(src, dst):
                via = SCALE_UP
            elif (relay := self.domains.relay(src, dst)) is not None:
                # Each (stream, src, dst) keeps channels of its own through the relay, so its
                # messages stay in order and wait for no other pair's.
                pxn = f"{stream}+pxn:{src}>{dst}"
                s, hop = self._message(job, pxn, src, relay, nbytes, deps, cat or stream, step, qps, SCALE_UP)
                _, r = self._message(job, pxn, relay, dst, nbytes, [hop], cat or stream, step, qps, FABRIC, True)
                return s, r
        return self._message(job, stream, src, dst, nbytes, deps, cat or stream, step, qps, via or FABRIC)

    def _message(self, job: str, stream: str, src: str, dst: str, nbytes: int, deps: Iterable[int],
                 cat: str, step: int, qps: int, via: str, relay: bool = False) -> tuple[int, int]:
        if nbytes < 0:
            raise ValueError(f"message size must be >= 0, got {nbytes}")
        c = self.channel(job, stream, src, dst, qps, via, relay)
        seq = self._sent[c]
        self._sent[c] += 1
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

    def sent_by_via(self, job: str | None = None) -> dict[str, int]:
        """Bytes sent (every hop) across the fabric and across scale-up domains, of one job or all."""
        out = {FABRIC: 0, SCALE_UP: 0}
        for o in self.ops:
            if o.kind == SEND and (job is None or o.job == job):
                out[self.channels[o.channel].via] += o.nbytes
        return out

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

