"""Packet captures on switch ports with tcpdump, kept in the results folder as pcap files."""

from __future__ import annotations

import shutil
import signal
import subprocess
import time
from pathlib import Path

from fabric_emu.config import CaptureSpec
from fabric_emu.records import RunRecord
from fabric_emu.roce import ROCE_UDP_PORT

ROCE_FILTER = f"udp dst port {ROCE_UDP_PORT}"


class Captures:
    """One tcpdump per port, started before the traffic and stopped after it."""

    def __init__(self, spec: CaptureSpec, workdir: Path, record: RunRecord) -> None:
        self.spec = spec
        self.workdir = workdir
        self.record = record
        self.procs: dict[str, subprocess.Popen] = {}

    def pcap(self, port: str) -> Path:
        return self.workdir / f"capture-{port}.pcap"

    def start(self) -> None:
        for port in self.spec.ports:  # names were checked against the plan: no shell involved
            cmd = ["tcpdump", "-i", port, "-p", "-n", "-U", "-c", str(self.spec.packets),
                   "-s", str(self.spec.snaplen), "-w", str(self.pcap(port)), ROCE_FILTER]
            with open(self.workdir / f"tcpdump-{port}.log", "w") as log:
                p = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT)
            self.procs[port] = p
            self.record.add_process(p.pid, f"tcpdump {port}")
        # tcpdump prints "listening on" once its socket is open; wait so no packet is missed.
        for port in self.procs:
            log = self.workdir / f"tcpdump-{port}.log"
            for _ in range(100):
                if "listening on" in log.read_text() or self.procs[port].poll() is not None:
                    break
                time.sleep(0.05)

    def stop(self, run_dir: Path) -> list[str]:
        """Stop every tcpdump and move its file into the results; returns the file names."""
        for p in self.procs.values():
            if p.poll() is None:
                p.send_signal(signal.SIGINT)  # tcpdump flushes and closes the file on SIGINT
        saved = []
        for port, p in self.procs.items():
            try:
                p.wait(timeout=5)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()
            src = self.pcap(port)
            if src.exists():
                tmp = run_dir / f".{src.name}.tmp"
                shutil.copyfile(src, tmp)
                tmp.rename(run_dir / src.name)
                saved.append(src.name)
        return saved
