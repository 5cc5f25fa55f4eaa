"""Live NIC numbers for `fabric-emu top` and the Prometheus exporter.

A daemon thread of the engine process rewrites one small JSON file per engine once a second
(atomically: readers see the old or the new file, never half of one): each queue pair's counters
so far and its send rate over the last interval. Nothing is added to the per-packet path: the
thread only reads counters the NIC keeps anyway, and wakes once a second (the GIL is taken for
well under a millisecond per wake-up).
"""

from __future__ import annotations

import json
import os
import threading
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from fabric_emu.nic.engine import Host

PUBLISH_INTERVAL_S = 1.0


def live_path(stats_path: str, engine: int) -> Path:
    """Where engine `engine` publishes: beside its hosts' stats files (the run's workdir)."""
    return Path(stats_path).with_name(f"engine{engine}.live.json")


class LivePublisher:
    """Rewrites `path` every interval_s with the QP counters of `hosts`, until stop()."""

    def __init__(self, engine: int, hosts: list["Host"], path: Path, clock: Callable[[], float],
                 interval_s: float = PUBLISH_INTERVAL_S) -> None:
        self.engine = engine
        self.hosts = hosts
        self.path = path
        self.clock = clock
        self.interval_s = interval_s
        self._last: dict[tuple[str, int], tuple[float, int]] = {}  # (host, qpn) -> (t, frame bytes)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True, name="live-publisher")

    def start(self) -> "LivePublisher":
        self._thread.start()
        return self

    def stop(self) -> None:
        """Publish once more (the final counters) and end the thread."""
        self._stop.set()
        self._thread.join(timeout=2 * self.interval_s)
        self.publish()

    def _run(self) -> None:
        while not self._stop.wait(self.interval_s):
            try:
                self.publish()
            except (OSError, RuntimeError, ValueError):
                pass  # a reader may lose one refresh; the NIC must not notice

    def publish(self) -> None:
        t = self.clock()
        out = {"engine": self.engine, "t": t, "interval_s": self.interval_s, "hosts": {}}
        for h in self.hosts:
            nic = h.nic
            send = []
            for sq in list(nic.send_qps):
                key = (h.name, sq.qp.src_qpn)
                t0, b0 = self._last.get(key, (t, sq.frame_bytes))
                frames = sq.frame_bytes
                self._last[key] = (t, frames)
                r = sq.req
                send.append({"qpn": sq.qp.src_qpn, "remote_qpn": sq.qp.dst_qpn, "dst": sq.qp.dst,
                             "udp_src": sq.qp.udp_sport,
                             "bytes_sent": r.bytes_sent, "bytes_acked": r.bytes_acked,
                             "frame_bytes": frames, "packets": r.packets_sent,
                             "retransmitted": r.retransmitted, "cnp_received": sq.cnp_received,
                             "dcqcn_rate_bps": sq.rate_bps,  # modelled; None: not limited
                             "tx_bps": (frames - b0) * 8 / (t - t0) if t > t0 else 0.0})  # emulated
            recv = [{"qpn": rq.qp.dst_qpn, "src": rq.qp.src, "bytes": rq.resp.bytes,
                     "packets": rq.resp.packets, "ecn_ce": rq.ecn_ce, "cnp_sent": rq.cnp_sent}
                    for rq in list(nic.recv_qps)]
            out["hosts"][h.name] = {"done": h.done, "send": send, "recv": recv}
        tmp = self.path.with_name(f".{self.path.name}.tmp")
        tmp.write_text(json.dumps(out))
        os.replace(tmp, self.path)
