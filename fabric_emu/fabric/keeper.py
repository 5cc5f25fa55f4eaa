"""Keep a run's controller up: stop, start or restart it when an event says so (`controller:
stop|start|restart`), and restart it when it dies on its own, recording every outage.

While the controller is away the switches keep forwarding on their tables (fail_mode secure,
fabric_emu/fabric/build.py); a new controller process warm-starts (controller/sync.py): it reads
each switch's tables back and sends only the difference. The outage ends when every switch has
answered the barrier after its warm start (the controller's ready file).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

from fabric_emu.fabric.controller import ControllerProcess
from fabric_emu.state.records import RunRecord

WATCH_INTERVAL_S = 0.2
RESYNC_TIMEOUT_S = 60.0
MAX_FAILED_STARTS = 3  # a controller that cannot start again is left down, said once
SYNC_KEYS = ("flows_added", "flows_modified", "flows_deleted", "groups_added", "groups_modified",
             "groups_deleted", "flows_kept", "groups_kept", "messages")


def outage_row(cause: str, down_wall: float, listening_wall: float | None, ready: dict | None,
               go: float, dilation: float) -> dict:
    """One outage for summary.json: when the controller went (from GO), when it listened again,
    when every switch was resynchronised (the ready file's time), how long it lasted (wall and
    modelled) and what the warm starts sent, summed over the switches and per switch."""
    row: dict = {"cause": cause, "down_s": round(down_wall - go, 6),
                 "down_fabric_us": round((down_wall - go) / dilation * 1e6, 3)}
    if listening_wall is not None:
        row["listening_s"] = round(listening_wall - go, 6)
    if not ready:
        row["resynced"] = False
        return row
    end = ready["time"]
    syncs = ready.get("syncs", {})
    row.update(resynced=True, resynced_s=round(end - go, 6), outage_s=round(end - down_wall, 6),
               outage_fabric_us=round((end - down_wall) / dilation * 1e6, 3), switches=len(syncs),
               cold_starts=sum(1 for s in syncs.values() if s.get("cold")),
               warm_start={k: sum(int(s.get(k, 0)) for s in syncs.values()) for k in SYNC_KEYS},
               per_switch={dpid: {k: s[k] for k in SYNC_KEYS if s.get(k)} for dpid, s in sorted(syncs.items())})
    return row


class ControllerKeeper:
    """The traffic phase's keeper of the controller process (one ControllerProcess object, whose
    process it replaces: teardown stops whichever runs at the end)."""

    def __init__(self, ctrl: ControllerProcess, record: RunRecord, dilation: float,
                 say: Callable[[str], None], on_new_pid: Callable[[int, str], None] | None = None):
        self.ctrl, self.record, self.dilation, self.say = ctrl, record, dilation, say
        self.on_new_pid = on_new_pid  # e.g. the CPU monitor's watch
        self.outages: list[dict] = []
        self._lock = threading.Lock()
        self._held_down = False  # stopped by an event: not to be restarted behind its back
        self._open: dict | None = None  # the outage under way: cause, down_wall
        self._failed_starts = 0
        self._go = time.time()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start_watching(self, go: float) -> None:
        """From GO on, restart the controller whenever it dies on its own."""
        self._go = go
        self._thread = threading.Thread(target=self._watch, name="fabric-emu controller keeper", daemon=True)
        self._thread.start()

    def _watch(self) -> None:
        while not self._stop.wait(WATCH_INTERVAL_S):
            with self._lock:
                died = (not self._held_down and self.ctrl.proc.poll() is not None
                        and self._failed_starts < MAX_FAILED_STARTS)
                status, retry = self.ctrl.proc.returncode, self._open is not None
            if died:
                if not retry:
                    self.say(f"the controller died on its own (exit status {status}); restarting it "
                             "(the switches keep forwarding on their tables meanwhile)")
                try:
                    self.act("restart", cause="crashed", down_wall=time.time())
                except RuntimeError as e:
                    self.say(f"could not restart the controller: {e}")

    def act(self, action: str, cause: str = "event", down_wall: float | None = None) -> dict:
        """stop | start | restart; what happened (an outage row once the controller is back)."""
        with self._lock:
            running = self.ctrl.proc.poll() is None
            if action == "start" and self._open is None:
                raise RuntimeError("the controller is running already")
            if action == "stop" and self._open is not None:
                raise RuntimeError("the controller is stopped already")
            if action in ("stop", "restart") and self._open is None:
                t = time.time() if down_wall is None else down_wall
                if running:
                    self.ctrl.kill()
                self._open = {"cause": cause, "down_wall": t}
            if action == "stop":
                self._held_down = True
                return {"down_s": round(self._open["down_wall"] - self._go, 6)}
            self._held_down = False
            return self._bring_back()

    def _bring_back(self) -> dict:
        """Start a new controller process and wait until it resynchronised every switch."""
        opened = self._open
        assert opened is not None
        self.ctrl.respawn()
        self.record.add_process(self.ctrl.pid, "controller")
        if self.on_new_pid is not None:
            self.on_new_pid(self.ctrl.pid, "controller")
        listening = None
        try:
            self.ctrl.wait_listening()
            listening = time.time()
            ready = self.ctrl.ready_info() if self.ctrl.wait_ready(RESYNC_TIMEOUT_S) else None
        except RuntimeError as e:  # it died again while starting: the watch retries, a few times
            ready = None
            self.say(f"the restarted controller failed: {str(e).splitlines()[0]}")
        row = outage_row(opened["cause"], opened["down_wall"], listening, ready, self._go, self.dilation)
        if not ready:
            self._failed_starts += 1
            if self._failed_starts >= MAX_FAILED_STARTS:
                self.say(f"the controller failed to start {MAX_FAILED_STARTS} times: left down")
            return row
        self._failed_starts = 0
        self.outages.append(row)
        self._open = None
        w = row["warm_start"]
        self.say(f"controller back: {row['switches']} switches resynchronised {row['outage_s'] * 1e3:.0f} ms "
                 f"after it went ({w['messages']} flow/group messages, {w['flows_deleted']} flow deletions)")
        return row

    def stop(self) -> list[dict]:
        """Stop watching; the outages, with one still open (the controller stopped for good) last."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=RESYNC_TIMEOUT_S + 5)
        with self._lock:
            if self._open is not None:  # still down at the end: never resynchronised
                self.outages.append(outage_row(self._open["cause"], self._open["down_wall"], None, None,
                                               self._go, self.dilation))
        return list(self.outages)
