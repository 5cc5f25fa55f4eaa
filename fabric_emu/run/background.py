"""Lossy background traffic during a run: iperf3 flows in the default class between hosts.

Each flow's server and client run inside the hosts' namespaces (Mininet's popen), registered
in the run record so a killed run's clean-up finds them. Rates and times in the spec are
modelled: a client sends at gbps / dilation for duration x dilation, starting start x dilation
after the jobs' common start; results come back in modelled Gb/s.
"""

from __future__ import annotations

import json
import signal
import subprocess
import threading
import time

from fabric_emu.spec.events import BackgroundSpec
from fabric_emu.topo.plan import FabricPlan
from fabric_emu.state.records import RunRecord

BASE_PORT = 5201
LONG_S = 3600  # "until the jobs end": the client is told to stop then


class Background:
    def __init__(self, flows: list[BackgroundSpec], fabric, plan: FabricPlan, record: RunRecord):
        self.flows = flows
        self.fabric = fabric
        self.plan = plan
        self.record = record
        self._servers: list[subprocess.Popen] = []
        self._clients: list[subprocess.Popen | None] = [None] * len(flows)
        self._timers: list[threading.Timer] = []
        self._lock = threading.Lock()
        self._stopped = False

    def prepare(self) -> None:
        """Start the servers (before GO, so a client never finds its port closed)."""
        for i, f in enumerate(self.flows):
            srv = self.fabric.host(f.dst).popen(["iperf3", "-s", "-1", "-p", str(BASE_PORT + i)],
                                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            self.record.add_process(srv.pid, f"iperf3 server {f.dst}")
            self._servers.append(srv)
        time.sleep(0.2 if self.flows else 0)

    def start(self, go: float) -> None:
        """Schedule every client from the jobs' common start (epoch seconds)."""
        d = self.plan.dilation
        for i, f in enumerate(self.flows):
            t = threading.Timer(max(0.0, go + f.start * d - time.time()), self._client, (i,))
            t.daemon = True
            t.start()
            self._timers.append(t)

    def _client(self, i: int) -> None:
        f, d = self.flows[i], self.plan.dilation
        secs = max(1, round(f.duration * d)) if f.duration is not None else LONG_S
        cmd = ["iperf3", "-c", self.plan.host_by_name[f.dst].ip, "-p", str(BASE_PORT + i), "-t", str(secs),
               "--json", "-S", "0"]  # TOS 0: the default, lossy class
        if f.protocol == "udp":
            cmd += ["-u", "-l", "1400"]
        if f.gbps is not None:
            cmd += ["-b", f"{f.gbps * 1e9 / d:.0f}"]
        with self._lock:
            if self._stopped:
                return
            c = self.fabric.host(f.src).popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
            self.record.add_process(c.pid, f"iperf3 client {f.src}")
            self._clients[i] = c

    def stop(self) -> list[dict]:
        """Stop what still runs (iperf3 reports on SIGINT) and return each flow's result."""
        with self._lock:
            self._stopped = True
        for t in self._timers:
            t.cancel()
        out = []
        for f, c in zip(self.flows, self._clients):
            row = {"src": f.src, "dst": f.dst, "protocol": f.protocol, "gbps_set": f.gbps, "gbps": None}
            if c is not None:
                if c.poll() is None:
                    c.send_signal(signal.SIGINT)
                try:
                    text, _ = c.communicate(timeout=10)
                except subprocess.TimeoutExpired:
                    c.kill()
                    text, _ = c.communicate()
                row.update(parse_result(text, f.protocol, self.plan.dilation))
            out.append(row)
        for s in self._servers:
            if s.poll() is None:
                s.terminate()
            try:
                s.wait(timeout=5)
            except subprocess.TimeoutExpired:
                s.kill()
        return out


def parse_result(text: str, protocol: str, dilation: float) -> dict:
    """iperf3's --json result: what arrived, in modelled Gb/s, and (udp) what was lost."""
    try:
        end = json.loads(text)["end"]
    except (ValueError, KeyError, TypeError):
        return {"error": "no iperf3 result"}
    if protocol == "tcp":
        s = end.get("sum_received") or {}
        if not s.get("bits_per_second"):  # stopped early: the client never hears the server's count
            s = end.get("sum_sent") or {}
        return {"gbps": s.get("bits_per_second", 0) * dilation / 1e9, "seconds": s.get("seconds"),
                "retransmits": (end.get("sum_sent") or {}).get("retransmits")}
    s = end.get("sum") or {}
    return {"gbps": s.get("bits_per_second", 0) * dilation / 1e9, "seconds": s.get("seconds"),
            "lost_percent": s.get("lost_percent")}
