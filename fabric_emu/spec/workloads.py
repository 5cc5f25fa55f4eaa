"""Workload models: collectives, pipeline and 3D-parallel training, parameter servers, incast and flows."""

from __future__ import annotations

from typing import Annotated, Literal, Optional, Union

from pydantic import Field, ValidationInfo, field_validator, model_validator

from fabric_emu.spec.errors import problem_at
from fabric_emu.spec.fields import Bytes, HostName, JobName, Seconds, Strict


def _distinct_hosts(v: list[str], least: int = 2) -> list[str]:
    if len(v) < least:
        raise ValueError(f"needs at least {least} hosts ('all' or a list of host names)")
    twice = sorted({h for h in v if v.count(h) > 1})
    if twice:
        raise ValueError(f"lists {', '.join(twice)} more than once (each rank is a distinct host)")
    return v


class _Collective(Strict):
    """What every collective has: S bytes (nccl-tests' size), ranks, iterations, QPs per peer."""

    name: Optional[JobName] = Field(default=None, description="the job's name in results (workloads lists)")
    size: Bytes = Field(gt=0, le=100 * 10**9, description="S, bytes: nccl-tests' size of the collective")
    iterations: int = Field(default=1, ge=1, le=1000, description="times the collective runs, one after another")
    ranks: Union[Literal["all"], list[HostName]] = Field(
        default="all", description="'all' (every host, in host order) or host names in rank order")
    qps_per_peer: int = Field(default=1, ge=1, le=64,
                              description="queue pairs between two ranks that exchange data")

    @field_validator("ranks")
    @classmethod
    def _ranks_distinct(cls, v):
        return _distinct_hosts(v) if isinstance(v, list) else v


class AllReduceWorkload(_Collective):
    """All-reduce: every rank ends with the sum of every rank's S bytes."""

    type: Literal["allreduce"] = Field(description="the workload's type")
    algorithm: Optional[Literal["ring", "halving-doubling", "hierarchical"]] = Field(
        default=None, description="ring, halving-doubling (a power of two ranks) or hierarchical (multi-GPU "
                                  "servers: inside each server, across servers, inside again, as NCCL does); "
                                  "default: hierarchical on a fabric with servers, else ring")


class CollectiveWorkload(_Collective):
    """reducescatter, allgather (ring), alltoall (every pair at once), sendrecv (to the next rank)."""

    type: Literal["reducescatter", "allgather", "alltoall", "sendrecv"] = Field(
        description="reducescatter and allgather: ring, n-1 steps of S/n; alltoall: S/n to every other "
                    "rank at once; sendrecv: S to the next rank, S from the previous")

    @property
    def algorithm(self) -> str:
        return {"alltoall": "pairwise"}.get(self.type, "ring")


class _Passes(Strict):
    """Microbatched forward and backward passes (modelled compute times, run x dilation)."""

    name: Optional[JobName] = Field(default=None, description="the job's name in results (workloads lists)")
    microbatches: int = Field(default=8, ge=1, le=256, description="microbatches per training step")
    schedule: Literal["gpipe", "1f1b"] = Field(
        default="1f1b", description="gpipe (every forward, then every backward) or 1f1b (one forward, one backward)")
    forward: Seconds = Field(gt=0, le=10, description="compute per microbatch per stage, forward")
    backward: Optional[Seconds] = Field(default=None, gt=0, le=10, description="default: 2 x forward")
    activation_size: Bytes = Field(ge=0, le=10 * 10**9, description="bytes a stage sends the next, per microbatch")
    iterations: int = Field(default=1, ge=1, le=100, description="training steps")

    @property
    def backward_s(self) -> float:
        return self.backward if self.backward is not None else 2 * self.forward


class PipelineWorkload(_Passes):
    """Pipeline parallelism: stages of hosts in order; host j of a stage talks to host j of the next."""

    type: Literal["pipeline"] = Field(description="the workload's type")
    stages: list[Union[HostName, list[HostName]]] = Field(
        min_length=2, max_length=64,
        description="the stages in order, each a host or a list of hosts (the same number in every stage)")
    gradient_size: Optional[Bytes] = Field(default=None, ge=0, le=10 * 10**9,
                                           description="bytes sent back per microbatch (default: activation_size)")

    @field_validator("stages")
    @classmethod
    def _stages_even(cls, v):
        stages = [[s] if isinstance(s, str) else s for s in v]
        if any(len(s) != len(stages[0]) for s in stages):
            raise ValueError("every stage needs the same number of hosts")
        _distinct_hosts([h for s in stages for h in s])
        return stages


class TrainingWorkload(_Passes):
    """A 3D-parallel training step: tp x pp x dp ranks placed on the fabric."""

    type: Literal["training"] = Field(description="the workload's type")
    tp: int = Field(default=1, ge=1, le=64, description="tensor-parallel ranks per group")
    pp: int = Field(default=1, ge=1, le=64, description="pipeline stages")
    dp: int = Field(default=1, ge=1, le=256, description="data-parallel replicas")
    placement: Union[Literal["topology-aware", "naive"], list[HostName]] = Field(
        default="topology-aware",
        description="topology-aware (each TP group inside a server, or under one leaf with single-NIC hosts; "
                    "a replica's stages on different servers, next to each other; replicas across the fabric), "
                    "naive (hosts in host order, the data-parallel index fastest), or tp x pp x dp host "
                    "names (rank t + tp(s + pp d) on the r-th host)")
    tp_allreduce_size: Bytes = Field(default=0, ge=0, le=10 * 10**9,
                                     description="bytes of the TP all-reduce after each pass")
    dp_allreduce_size: Bytes = Field(default=0, ge=0, le=100 * 10**9,
                                     description="gradient bytes per rank all-reduced across replicas")

    @model_validator(mode="after")
    def _placement_fits(self):
        n = self.tp * self.pp * self.dp
        if n < 2:
            raise problem_at("TrainingWorkload", ("dp",), "tp x pp x dp must be at least 2 ranks", self.dp)
        if isinstance(self.placement, list):
            if len(self.placement) != n:
                raise problem_at("TrainingWorkload", ("placement",),
                                 f"lists {len(self.placement)} hosts; tp x pp x dp is {n}", self.placement)
            _distinct_hosts(self.placement)
        return self


class ParameterServerWorkload(Strict):
    """Parameter-server training: workers push each step's gradients to the servers (each holds
    one shard of the parameters) and pull the updated shard back, sync or async with a staleness
    bound (fabric_emu.workloads.parameter_server)."""

    type: Literal["parameter-server"] = Field(description="the workload's type")
    name: Optional[JobName] = Field(default=None, description="the job's name in results (workloads lists)")
    size: Bytes = Field(gt=0, le=100 * 10**9,
                        description="the model's gradient bytes per worker per step (an all-reduce's S); "
                                    "each server holds size / servers of them")
    servers: Union[int, list[HostName]] = Field(
        default=1, description="host names, or a count: that many hosts from the end of the host list "
                               "(not counting listed workers)")
    workers: Union[Literal["all"], list[HostName]] = Field(
        default="all", description="'all' (every host that is not a server) or host names")
    iterations: int = Field(default=1, ge=1, le=1000, description="training steps")
    mode: Literal["sync", "async"] = Field(
        default="sync", description="sync: a server answers a step's pulls once every worker pushed it; "
                                    "async: it answers each push as it arrives, within `staleness`")
    staleness: Optional[int] = Field(
        default=None, ge=0, le=1000,
        description="async: how many steps a worker may run ahead of the slowest worker's push the "
                    "servers have applied (default 1; 0 is sync)")
    compute: Seconds = Field(default=0.0, ge=0, le=10,
                             description="modelled compute per step per worker, before its push")
    qps_per_peer: int = Field(default=1, ge=1, le=64,
                              description="queue pairs between a worker and a server, each way")

    @field_validator("servers")
    @classmethod
    def _servers_fit(cls, v):
        if isinstance(v, int):
            if v < 1:
                raise ValueError(f"needs at least 1 server, got {v}")
            return v
        return _distinct_hosts(v, least=1)

    @field_validator("workers")
    @classmethod
    def _workers_distinct(cls, v):
        return _distinct_hosts(v, least=1) if isinstance(v, list) else v

    @model_validator(mode="after")
    def _roles_fit(self):
        if isinstance(self.servers, list) and isinstance(self.workers, list):
            both = [h for h in self.workers if h in self.servers]
            if both:
                raise problem_at("ParameterServerWorkload", ("workers", self.workers.index(both[0])),
                                 f"{both[0]} is also a server; a host is a worker or a server", both[0])
        if self.mode == "sync" and self.staleness:
            raise problem_at("ParameterServerWorkload", ("staleness",),
                             "applies to mode: async (sync has staleness 0)", self.staleness)
        return self

    @property
    def staleness_bound(self) -> int:
        """Steps a worker may run ahead of the slowest applied push: 0 in sync mode."""
        if self.mode == "sync":
            return 0
        return 1 if self.staleness is None else self.staleness


class IncastWorkload(Strict):
    """Every sender writes `size` bytes to one receiver, `iterations` times.

    Iterations run back to back per sender, with no barrier: a sender posts iteration i+1 as
    soon as its own iteration-i message has left its NIC.
    """

    type: Literal["incast"] = Field(description="the workload's type")
    receiver: HostName = Field(description="the host every sender writes to")
    senders: Union[Literal["all"], list[HostName]] = Field(
        default="all", description="'all' (every host but the receiver) or a list of host names")
    size: Bytes = Field(gt=0, le=100 * 10**9, description="bytes per sender per iteration")
    iterations: int = Field(default=1, ge=1, le=1000, description="messages of `size` each sender sends")
    qps_per_sender: int = Field(default=1, ge=1, le=64, description="queue pairs from each sender")

    @field_validator("senders")
    @classmethod
    def _senders_distinct(cls, v):
        if isinstance(v, list):
            if not v:
                raise ValueError("is empty ('all' or a list of host names)")
            twice = sorted({h for h in v if v.count(h) > 1})
            if twice:
                raise ValueError(f"lists {', '.join(twice)} more than once (each sender is a distinct host)")
        return v

    @model_validator(mode="after")
    def _receiver_is_not_a_sender(self):
        if isinstance(self.senders, list) and self.receiver in self.senders:
            i = self.senders.index(self.receiver)
            raise problem_at("IncastWorkload", ("senders", i),
                             f"{self.receiver} is the receiver; a host cannot send to itself", self.receiver)
        if self.size < self.qps_per_sender:
            raise problem_at("IncastWorkload", ("size",),
                             f"{self.size} B is smaller than qps_per_sender ({self.qps_per_sender});"
                             " every queue pair needs at least one byte", self.size)
        return self


class FlowSpec(Strict):
    """One RDMA WRITE flow: `size` bytes from src to dst over `qps` queue pairs."""

    src: HostName = Field(description="the sending host")
    dst: HostName = Field(description="the receiving host")
    size: Optional[Bytes] = Field(default=None, gt=0, le=100 * 10**9,
                                  description="bytes (default: the workload's size)")
    qps: int = Field(default=1, ge=1, le=64, description="queue pairs the flow's bytes are split over")
    start: Seconds = Field(default=0.0, ge=0, le=60,
                           description="modelled fabric time after the common start")
    iterations: int = Field(default=1, ge=1, le=10_000, description="times the flow sends `size`")
    gap: Seconds = Field(default=0.0, ge=0, le=60,
                         description="idle time between an iteration's acknowledgement and the next "
                                     "(0: the next is posted as soon as the last has left)")

    @field_validator("dst")
    @classmethod
    def _not_to_itself(cls, v, info: ValidationInfo):
        if v == info.data.get("src"):
            raise ValueError(f"is the same host as src ({v}); a flow goes between two hosts")
        return v


class FlowsWorkload(Strict):
    """Independent RDMA WRITE flows, each starting at its own time."""

    type: Literal["flows"] = Field(description="the workload's type")
    flows: list[FlowSpec] = Field(max_length=1024, description="the flows, 1 to 1024")
    size: Optional[Bytes] = Field(default=None, gt=0, le=100 * 10**9,
                                  description="bytes of every flow that does not give its own size")

    @field_validator("flows")
    @classmethod
    def _flows_not_empty(cls, v):
        if not v:
            raise ValueError("is empty (list at least one flow with src, dst and size)")
        return v

    @model_validator(mode="after")
    def _every_flow_has_a_size(self):
        for i, f in enumerate(self.flows):
            size = f.size if f.size is not None else self.size
            if size is None:
                raise problem_at("FlowsWorkload", ("flows", i, "size"),
                                 "required field is missing (or set workload.size for every flow"
                                 " without its own)", None)
            if size < f.qps:
                raise problem_at("FlowsWorkload", ("flows", i, "size"),
                                 f"{size} B is smaller than qps ({f.qps}); every queue pair needs"
                                 " at least one byte", size)
        return self


WORKLOAD_TYPES = ("allreduce", "incast", "flows", "reducescatter", "allgather", "alltoall", "sendrecv",
                  "pipeline", "training", "parameter-server")
Workload = Annotated[Union[AllReduceWorkload, CollectiveWorkload, IncastWorkload, FlowsWorkload,
                           PipelineWorkload, TrainingWorkload, ParameterServerWorkload], Field(discriminator="type")]
# Workloads that run as per-rank programs (fabric_emu.workloads.program); only these go in `workloads`.
JobWorkload = Annotated[Union[AllReduceWorkload, CollectiveWorkload, PipelineWorkload, TrainingWorkload,
                              ParameterServerWorkload], Field(discriminator="type")]
