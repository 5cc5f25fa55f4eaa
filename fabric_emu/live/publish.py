"""The run's side of live views: write the live manifest as the run moves on, and serve the
Prometheus exporter from it. `fabric-emu run` uses it, and `fabric-emu lab`, which keeps a fabric
up, calls traffic_started and traffic_ended once per run between start and close.
"""

from __future__ import annotations

import time
from dataclasses import asdict
from pathlib import Path

from fabric_emu.live.manifest import LiveManifest, LivePort
from fabric_emu.topo.plan import FabricPlan
from fabric_emu.ports.layout import PortTable
from fabric_emu.ports.model import PortEnd
from fabric_emu.state.records import RunRecord


def live_ports(plan: FabricPlan, ends: list[PortEnd]) -> list[LivePort]:
    """Every switch port in plan order (as ports.csv), with its BPF map index."""
    ids = {e.intf: e for e in ends}
    return [LivePort(ids[p.intf].id, sw.name, p.port, p.intf, p.peer, p.kind, ids[p.intf].gbps)
            for sw in plan.switches for p in plan.ports(sw.name)]


class RunPublisher:
    """Owns the live manifest and the exporter of one run."""

    def __init__(self, record: RunRecord, manifest: LiveManifest, metrics_port: int | None) -> None:
        self.record = record
        self.manifest = manifest
        self.metrics_port = metrics_port  # None: no exporter
        self.server = None
        self.reader = None

    def start(self) -> None:
        """Publish the manifest and start the exporter; both are named in the run record."""
        self.manifest.save()
        self.record.live_path = self.manifest.path
        if self.metrics_port is not None:
            from fabric_emu.live.exporter import MetricsServer
            from fabric_emu.live.reader import LiveReader

            self.reader = LiveReader(self.manifest.path)
            self.server = MetricsServer(self.reader.snapshot, self.metrics_port)
            self.record.metrics_url = self.manifest.metrics_url = self.server.url
            self.manifest.save()
        self.record.save()

    def traffic_started(self, before: list) -> None:
        """Counters count from here (the run's `before` snapshot: PortCounters rows). In a lab
        this starts its next run: the previous run's final counters stop being shown."""
        self.manifest.baseline = [asdict(c) for c in before]
        self.manifest.final = self.manifest.final_storms = self.manifest.ended = self.manifest.go = None
        self.manifest.save()
        if self.server is not None:
            self.server.freeze(None)

    def go(self, t: float) -> None:
        self.manifest.go = t
        self.manifest.save()

    def traffic_ended(self, rows: list[dict], table: PortTable | None = None) -> None:
        """The traffic phase's counters (ports.csv's rows): every reader shows these from now
        on, and the exporter keeps serving them (with the NICs' last numbers) until close().
        table: the ports map, for the watchdog's storm counts (read now: a lab's next daemon
        zeroes them)."""
        from fabric_emu.live.reader import final_storms

        self.manifest.final = rows
        self.manifest.final_storms = final_storms(table, self.manifest.ports) if table is not None else None
        self.manifest.ended = time.time()
        self.manifest.save()
        if self.server is not None:
            self.server.freeze(self.reader.snapshot())

    def close(self, linger_s: float = 0.0) -> None:
        """Stop the exporter, after serving the final snapshot linger_s more seconds (so a
        scraper gets the last values even when the run is short)."""
        if self.server is None:
            return
        if linger_s > 0 and self.manifest.final is not None:
            time.sleep(linger_s)
        self.server.stop()
        self.reader.close()
        self.server = None


def manifest_path(workdir: Path) -> str:
    return str(workdir / "live.json")
