"""What a running fabric publishes so that other processes can read it live: `live.json` in the
run's work folder, named by the run record (RunRecord.live_path).

The run (today `fabric-emu run`, later `fabric-emu lab`) writes it once its fabric is up, and
rewrites it (atomically) as the run moves on: the baseline counters when traffic starts, GO,
the final counters (ports.csv's rows, and the PFC watchdog's storm counts) when traffic ends. Readers need nothing else: the port
list, the BPF pin folder, the NIC engines' live files, the controller's URL are all here.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path

from fabric_emu.state.records import write_atomic


@dataclass
class LivePort:
    id: int  # the port's index in the run's BPF port map
    switch: str
    port: int
    intf: str
    peer: str
    kind: str
    gbps: float


@dataclass
class LiveManifest:
    run_id: str
    experiment: str
    dilation: float
    load_balancing: str
    congestion_control: str
    workdir: str  # the NIC engines publish engine<N>.live.json here
    pins: str  # the run's BPF pin folder (maps/ports)
    controller_url: str
    ports: list[LivePort]
    results_dir: str = ""
    metrics_url: str = ""
    go: float | None = None  # when traffic started (epoch seconds)
    baseline: list[dict] | None = None  # PortCounters rows (asdict) when traffic started
    final: list[dict] | None = None  # PortCounters.row() of the traffic phase: ports.csv
    ended: float | None = None  # when traffic ended (epoch)
    final_storms: dict[str, dict[str, int]] | None = None  # intf -> PFC watchdog storm counts then
    path: str = field(default="", repr=False)

    def save(self) -> None:
        d = asdict(self)
        d.pop("path")
        write_atomic(Path(self.path), json.dumps(d))

    @classmethod
    def load(cls, path: str | Path) -> "LiveManifest":
        d = json.loads(Path(path).read_text())
        d = {k: v for k, v in d.items() if k in cls.__dataclass_fields__}
        d["ports"] = [LivePort(**p) for p in d["ports"]]
        d.pop("path", None)
        return cls(**d, path=str(path))

    @property
    def phase(self) -> str:
        if self.final is not None:
            return "done"
        return "traffic" if self.baseline is not None else "setup"
