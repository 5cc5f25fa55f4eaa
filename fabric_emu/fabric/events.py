"""Scheduled events of an experiment (`events:`), fired during the traffic phase, and the client
of the controller's REST API that they (and `fabric-emu lb`) use.

An event at modelled time `at` fires at GO + at x dilation on the wall clock. The schedule is
pure (unit-tested); EventRunner is the thread that sleeps until each event and carries it out,
recording when it fired and what the controller answered.
"""

from __future__ import annotations

import json
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass

from fabric_emu.spec.events import EventSpec

REST_TIMEOUT_S = 10.0


@dataclass(frozen=True)
class Scheduled:
    index: int  # position in the spec's events list
    wall_s: float  # when to fire (time.time())
    event: EventSpec


def schedule(events: list[EventSpec], go: float, dilation: float) -> list[Scheduled]:
    """The events in firing order (ties keep the spec's order)."""
    out = [Scheduled(i, go + e.at * dilation, e) for i, e in enumerate(events)]
    return sorted(out, key=lambda s: (s.wall_s, s.index))


class RestError(RuntimeError):
    """The controller refused or could not be reached; the message says why."""


def rest_call(url: str, body: dict | None = None, timeout: float = REST_TIMEOUT_S) -> dict:
    """GET the URL, or PUT the JSON body to it; the JSON answer. Loopback only (the caller
    takes the URL from the run record, which the run wrote)."""
    data = json.dumps(body).encode() if body is not None else None
    req = urllib.request.Request(url, data=data, method="PUT" if data is not None else "GET",
                                 headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            return json.loads(r.read())
    except urllib.error.HTTPError as e:
        try:
            reason = json.loads(e.read()).get("error", "")
        except ValueError:
            reason = ""
        raise RestError(f"{e.code} {e.reason}: {reason}".rstrip(": ")) from None
    except (urllib.error.URLError, OSError) as e:
        raise RestError(f"cannot reach the controller at {url}: {e}") from None


def failovers(fired: list[dict], link_changes: list[dict], dilation: float) -> list[dict]:
    """For each link event that fired: when the controller had every leaf routed around it
    (or back), from the moment the link changed: failover_s (wall) and in modelled time."""
    out = []
    for row in fired:
        if row.get("kind") != "link" or not row.get("ok") or "state" not in row:
            continue
        name = "-".join(sorted(row["link"].split("-")))
        ours = [c for c in link_changes if c["link"] == name and c["state"] == row["state"]
                and c["time"] >= row["fired_wall"] - 0.5]
        match = next(iter(ours), None)
        rec = {"link": row["link"], "state": row["state"], "fired_s": row["fired_s"]}
        if match is None:
            rec.update(rerouted=False)
        else:
            # failover: local: the switches' own detour, as soon as their port went down (the
            # controller heard of it then); global: once the controller rerouted every switch.
            done = match["time"] + match["applied_s"] - row["fired_wall"]
            rec.update(mode="local" if match.get("local") else "global",
                       rerouted=match["answered"] and not match["switch_errors"],
                       failover_s=round(done, 6), failover_fabric_us=round(done / dilation * 1e6, 3))
            converged = next((c for c in ours if c.get("converged")), None)
            if converged is not None:
                end = converged["time"] + converged["applied_s"] - row["fired_wall"]
                rec["converged_fabric_us"] = round(end / dilation * 1e6, 3)
        out.append(rec)
    return out


SetLink = Callable[[str, str, bool], "dict | None"]  # (node, node, up): both ends; what the record adds
SetRate = Callable[[str, str, float], None]  # (node, node, modelled Gb/s)
SetStorm = Callable[[str, bool], None]  # (host, storming)
ControllerAction = Callable[[str], dict]  # stop | start | restart -> what happened (fabric.keeper)


class EventRunner:
    """Fires the schedule in a thread; stop() lists what happened, one dict per event."""

    def __init__(self, events: list[EventSpec], dilation: float, controller_url: str,
                 set_link: SetLink | None = None, set_rate: SetRate | None = None,
                 set_storm: SetStorm | None = None, controller: ControllerAction | None = None):
        self.events, self.dilation, self.url = events, dilation, controller_url
        self.set_link, self.set_rate, self.set_storm = set_link, set_rate, set_storm
        self.controller = controller
        self._done: list[dict] = []
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self, go: float) -> None:
        if not self.events:
            return
        self._thread = threading.Thread(target=self._run, args=(schedule(self.events, go, self.dilation), go),
                                        name="fabric-emu events", daemon=True)
        self._thread.start()

    def _run(self, plan: list[Scheduled], go: float) -> None:
        for s in plan:
            if self._stop.wait(max(0.0, s.wall_s - time.time())):
                return
            fired = time.time()
            e = s.event
            row = {"index": s.index, "at_fabric_s": e.at, "kind": e.kind,
                   "fired_s": round(fired - go, 6), "fired_wall": fired, "late_s": round(fired - s.wall_s, 6)}
            if e.kind == "controller":
                row["controller"] = e.controller
                try:  # restart and start return once every switch is resynchronised
                    done = self.controller(e.controller)
                    row.update(ok=True, **{k: done[k] for k in ("resynced", "outage_s", "outage_fabric_us") if k in done})
                except (OSError, RuntimeError, TypeError) as err:
                    row.update(ok=False, error=str(err))
            elif e.kind == "pfc_storm":
                row.update(nic=e.nic, pfc_storm=e.pfc_storm)
                try:
                    self.set_storm(e.nic, e.pfc_storm == "on")
                    row["ok"] = True
                except (OSError, ValueError, TypeError) as err:
                    row.update(ok=False, error=str(err))
            elif e.kind == "link":
                row.update(link=e.link, **({"state": e.state} if e.state else {"gbps": e.gbps}))
                try:
                    a, b = e.link.split("-")
                    if e.state:
                        row.update(self.set_link(a, b, e.state == "up") or {})
                    else:
                        self.set_rate(a, b, e.gbps)
                    row["ok"] = True
                except (OSError, RuntimeError, TypeError) as err:
                    row.update(ok=False, error=str(err))
            else:
                row["load_balancing"] = e.load_balancing
                try:
                    answer = rest_call(self.url, {"mode": e.load_balancing})
                    row.update(ok=True, applied_s=answer.get("applied_s"),
                               applied_fabric_us=round(answer.get("applied_s", 0) / self.dilation * 1e6, 3),
                               switch_errors=answer.get("switch_errors", []))
                except RestError as err:
                    row.update(ok=False, error=str(err))
            self._done.append(row)

    def final_state(self) -> dict | None:
        """The controller's load-balancing state now (every change, scheduled or made with
        `fabric-emu lb`); None if it cannot be read."""
        try:
            state = rest_call(f"{self.url}?ttl_expired", timeout=3.0)
        except RestError:
            return None
        return {"mode": state.get("mode"), "changes": state.get("changes", []),
                "link_changes": state.get("link_changes", []), "dlb": state.get("dlb", {}),
                "failover": state.get("failover", "global"), "ttl_expired": state.get("ttl_expired", {})}

    def stop(self) -> list[dict]:
        """Stop (events not yet due are dropped) and return what fired."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=REST_TIMEOUT_S + 1)
        return list(self._done)
