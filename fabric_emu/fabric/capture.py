"""Packet captures on switch ports with tcpdump, kept in the results folder as pcap files."""

from __future__ import annotations

import shutil
import signal
import subprocess
import time
from pathlib import Path

from fabric_emu.spec.events import CaptureSpec
from fabric_emu.state.records import RunRecord
from fabric_emu.wire.roce import ROCE_UDP_PORT

ROCE_FILTER = f"udp dst port {ROCE_UDP_PORT}"
# PFC frames (MAC control, opcode 0x0101) get their own file: the RoCE one fills its count in
# the first milliseconds, and pauses come later. A port sees the pauses it receives: a MAC sends
# its own without passing the capture tap (they bypass the qdisc).
PFC_FILTER = "ether proto 0x8808 and ether[14:2] = 0x0101"
PFC_FRAMES = 1000


class Captures:
    """One tcpdump per port, started before the traffic and stopped after it."""

    def __init__(self, spec: CaptureSpec, workdir: Path, record: RunRecord) -> None:
        self.spec = spec
        self.workdir = workdir
        self.record = record
        self.procs: dict[str, subprocess.Popen] = {}

    def pcap(self, name: str) -> Path:
        return self.workdir / f"{name}.pcap"

    def start(self) -> None:
        for port in self.spec.ports:  # names were checked against the plan: no shell involved
            files = [(f"capture-{port}", self.spec.packets, ROCE_FILTER), (f"pfc-{port}", PFC_FRAMES, PFC_FILTER)]
            for name, count, bpf_filter in files:
                cmd = ["tcpdump", "-i", port, "-p", "-n", "-U", "-c", str(count),
                       "-s", str(self.spec.snaplen), "-w", str(self.pcap(name)), bpf_filter]
                with open(self.workdir / f"tcpdump-{name}.log", "w") as log:
                    p = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT)
                self.procs[name] = p
                self.record.add_process(p.pid, f"tcpdump {name}")
        # tcpdump prints "listening on" once its socket is open; wait so no packet is missed.
        for name in self.procs:
            log = self.workdir / f"tcpdump-{name}.log"
            for _ in range(100):
                if "listening on" in log.read_text() or self.procs[name].poll() is not None:
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
