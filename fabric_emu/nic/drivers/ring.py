"""Drives a ring all-reduce schedule on the NIC: posts each step when its inputs have arrived.

The n-th message completed on every queue pair from the left neighbour is global step n, so
progress is read off the NIC's per-QP message counters; no per-packet callbacks are needed.
A step counts as sent when its last packet has left (what the schedule waits for); the rank
has finished only when every message it sent is acknowledged, as an RDMA completion says.
"""

from __future__ import annotations

from fabric_emu.nic.host_nic import HostNic
from fabric_emu.workloads.collectives import RingAllReduce


class RingRunner:
    wake_at = None  # every step waits for data or for the NIC, never for the clock

    def __init__(self, schedule: RingAllReduce, nic: HostNic):
        if len(nic.send_qps) != schedule.qps_per_peer or len(nic.recv_qps) != schedule.qps_per_peer:
            raise ValueError("the NIC must have qps_per_peer send and receive QPs")
        self.schedule = schedule
        self.nic = nic
        self._total = schedule.total_steps
        self.posted = 0  # global steps handed to the NIC
        self.sent = 0  # global steps whose last packet has left
        self.acked = 0  # global steps whose every message is acknowledged
        self.received = 0  # global steps completed on every QP from the left neighbour
        self.step_log = [self._log_entry(g) for g in range(self._total)]
        self.iteration_log: list[dict] = []

    @property
    def finished(self) -> bool:
        return self.acked == self._total and self.received == self._total

    def advance(self, now: float) -> None:
        """Record what completed and post every step that may start now (called every loop)."""
        received = min(min([rq.messages for rq in self.nic.recv_qps]), self._total)
        sent = min([sq.messages_sent for sq in self.nic.send_qps])
        self.acked = min([sq.messages_done for sq in self.nic.send_qps])
        if received > self.received or sent > self.sent:
            self._record(received, sent, now)
        while self.posted < self._total and self.schedule.may_start(
                self.posted, self.received, self.sent == self.posted):
            self._post(self.posted, now)

    def _record(self, received: int, sent: int, now: float) -> None:
        for g in range(self.received, received):
            self.step_log[g]["received"] = now
        for g in range(self.sent, sent):
            self.step_log[g]["sent"] = now
        self.received, self.sent = received, sent
        per = self.schedule.steps_per_iteration
        for it in self.iteration_log:
            bound = (it["iteration"] + 1) * per
            if it["end"] is None and sent >= bound and received >= bound:
                it["end"] = now
                it["seconds"] = now - it["start"]

    def _post(self, global_step: int, now: float) -> None:
        iteration, k = self.schedule.locate(global_step)
        if k == 0:
            self.iteration_log.append({"iteration": iteration, "start": now, "end": None,
                                       "seconds": None})
        for q, nbytes in enumerate(self.schedule.steps[k].send_parts):
            self.nic.post_write(q, nbytes, now)
        self.step_log[global_step]["start"] = now
        self.posted += 1

    def _log_entry(self, global_step: int) -> dict:
        iteration, k = self.schedule.locate(global_step)
        step = self.schedule.steps[k]
        return {"iteration": iteration, "step": k, "phase": step.phase,
                "send_chunk": step.send_chunk, "recv_chunk": step.recv_chunk,
                "start": None, "sent": None, "received": None}
