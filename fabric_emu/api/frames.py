"""A results folder's tables as pandas DataFrames, with typed columns and units.

Each frame has its documented columns (docs/python-api.md) in this order, whatever the CSV
holds: a column the CSV lacks (an older fabric-emu, or no data) is all missing, a column it
has beyond them is kept at the end. A file that is not there gives an empty frame with the
same columns, so analysis code need not ask whether a run paused or ran DCQCN.

Times follow the results folder's convention: `_s` columns are emulated seconds (what the
machine lived through), `_fabric_us` columns modelled microseconds (the fabric's own time,
emulated / dilation); each frame with a time has both. This module is the only one, with
fabric_emu.api.results, that imports pandas: the NIC engines import fabric_emu and stay light.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

CLASSES = (0, 3, 6)  # other traffic, RoCE, CNP (the port classes of fabric_emu.measure.counters)
DTYPES = {"str": "str", "int": "Int64", "float": "float64", "bool": "boolean"}  # nullable: CSVs have gaps


@dataclass(frozen=True)
class Column:
    name: str
    kind: str  # str | int | float | bool
    unit: str  # "" when a count or a name
    meaning: str


def _per_class(stem: str, kind: str, unit: str, meaning: str) -> list[Column]:
    return [Column(f"{stem}_p{p}", kind, unit, f"{meaning}, class {p}") for p in CLASSES]


PORTS = [
    Column("switch", "str", "", "switch name"),
    Column("port", "int", "", "OpenFlow port number"),
    Column("intf", "str", "", "interface name (switch-ethN)"),
    Column("peer", "str", "", "the node at the other end"),
    Column("kind", "str", "", "host or fabric (switch to switch)"),
    Column("rx_bytes", "int", "bytes", "received during the traffic phase"),
    Column("rx_packets", "int", "packets", "received"),
    Column("tx_bytes", "int", "bytes", "sent"),
    Column("tx_packets", "int", "packets", "sent"),
    Column("rx_dropped", "int", "packets", "OVS could not take in"),
    Column("tx_dropped", "int", "packets", "OVS could not hand to the device"),
    Column("rx_socket_drops", "int", "packets", "ovs-vswitchd's receive socket overflowed"),
    *_per_class("queue_drops", "int", "packets", "dropped by the kernel FIFO (should stay 0)"),
    *_per_class("bpf_drops", "int", "packets", "tail drops of the port's admission"),
    *_per_class("ecn_marked", "int", "packets", "ECN CE marked"),
    *_per_class("pause_tx", "int", "frames", "PFC pauses sent (as the ingress port)"),
    *_per_class("pause_rx", "int", "frames", "PFC pauses received"),
    Column("lossless_drops", "int", "packets", "RoCE drops while PFC was on"),
    Column("headroom_overruns", "int", "frames", "RoCE frames in beyond xoff + headroom"),
    *_per_class("max_backlog", "int", "bytes", "deepest egress backlog"),
    Column("max_held_p3", "int", "bytes", "most RoCE bytes held that came in by this port"),
    Column("max_backlog_bytes", "int", "bytes", "deepest egress backlog, all classes"),
    Column("ttl_expired", "int", "packets", "IPv4 packets that came in with no TTL left to forward (routing loops)"),
    Column("cut_drops", "int", "packets", "frames sent out of this port while its link was cut (in drops)"),
    Column("drops", "int", "packets", "all drops at this port"),
    *[c for p in CLASSES for c in (
        Column(f"drops_p{p}", "int", "packets", f"drops, class {p}"),
        Column(f"paused_fabric_us_p{p}", "float", "modelled us", f"egress held by pauses, class {p}"),
        Column(f"paused_s_p{p}", "float", "emulated s", f"egress held by pauses, class {p} (added)"))],
]
FLOWS = [
    Column("src", "str", "", "sending host"),
    Column("dst", "str", "", "receiving host"),
    Column("flow", "int", "", "index of the workload flow (incast, flows); missing for collectives"),
    Column("qpn", "int", "", "sender's queue pair number"),
    Column("dest_qpn", "int", "", "receiver's queue pair number"),
    Column("udp_src", "int", "", "UDP source port (what ECMP hashes)"),
    Column("bytes", "int", "bytes", "payload sent"),
    Column("packets", "int", "packets", "data packets sent"),
    Column("duration_s", "float", "emulated s", "first to last packet sent"),
    Column("duration_fabric_us", "float", "modelled us", "first to last packet sent (added)"),
    Column("rx_bytes", "int", "bytes", "payload the receiver got"),
    Column("rx_duplicates", "int", "packets", "duplicates received"),
    Column("rx_out_of_sequence", "int", "packets", "out of sequence received"),
    Column("rx_out_of_order", "int", "packets", "out of order received"),
    Column("rx_reordered", "int", "", "NAKed gaps a late packet filled (single-path modes)"),
    Column("rx_ecn_ce", "int", "packets", "received with ECN CE"),
    Column("retransmitted", "int", "packets", "RC retransmissions"),
    Column("naks", "int", "", "NAKs received"),
    Column("timeouts", "int", "", "retransmission timeouts"),
    Column("start_s", "float", "emulated s", "first packet, from the NICs' start (GO)"),
    Column("start_fabric_us", "float", "modelled us", "first packet, from GO (added)"),
    Column("completion_s", "float", "emulated s", "first packet sent to last byte received"),
    Column("completion_fabric_us", "float", "modelled us", "first packet sent to last byte received"),
    Column("goodput_gbps", "float", "modelled Gb/s", "bytes received over completion"),
    Column("cnp_received", "int", "", "DCQCN CNPs received"),
    Column("min_rate_gbps", "float", "modelled Gb/s", "lowest DCQCN rate"),
    Column("uplink", "str", "", "the spine OVS chose (ECMP); empty otherwise"),
]
RATES = [
    Column("host", "str", "", "sending host"),
    Column("qpn", "int", "", "queue pair number"),
    Column("dst", "str", "", "receiving host"),
    Column("flow", "int", "", "index of the workload flow"),
    Column("time_s", "float", "emulated s", "when the rate changed, from GO"),
    Column("time_fabric_us", "float", "modelled us", "when the rate changed, from GO"),
    Column("rate_gbps", "float", "modelled Gb/s", "the DCQCN rate from then on"),
]
QUEUES = [
    Column("t_s", "float", "emulated s", "sample time, from GO"),
    Column("t_fabric_us", "float", "modelled us", "sample time, from GO"),
    Column("switch", "str", "", "switch name"),
    Column("port", "int", "", "OpenFlow port number"),
    Column("peer", "str", "", "the node at the other end"),
    Column("backlog_bytes", "int", "bytes", "egress backlog, all classes"),
    *[Column(f"p{p}_bytes", "int", "bytes", f"egress backlog, class {p}") for p in CLASSES],
    Column("paused", "bool", "", "the RoCE class was paused"),
]
PAUSES = [
    Column("node", "str", "", "the paused node (switch or host)"),
    Column("port", "int", "", "its port number"),
    Column("intf", "str", "", "its interface"),
    Column("peer", "str", "", "the node that sent the pause"),
    Column("start_s", "float", "emulated s", "pause start, from GO"),
    Column("end_s", "float", "emulated s", "pause end, from GO; missing if still paused at the end"),
    Column("start_fabric_us", "float", "modelled us", "pause start, from GO"),
    Column("end_fabric_us", "float", "modelled us", "pause end, from GO"),
    Column("duration_s", "float", "emulated s", "end - start (added)"),
    Column("duration_fabric_us", "float", "modelled us", "end - start (added)"),
]
THRESHOLDS = [
    Column("switch", "str", "", "switch name"),
    Column("port", "int", "", "OpenFlow port number"),
    Column("intf", "str", "", "interface name"),
    *[Column(f"limit_p{p}", "int", "bytes", f"admission limit, class {p}") for p in CLASSES],
    Column("ecn", "bool", "", "ECN marking on"),
    Column("kmin", "int", "bytes", "ECN marking starts"),
    Column("kmax", "int", "bytes", "ECN marks with pmax here"),
    Column("pmax", "float", "", "marking probability at kmax"),
    Column("pfc", "bool", "", "PFC on"),
    Column("xoff", "int", "bytes", "pause threshold"),
    Column("xon", "int", "bytes", "resume threshold"),
    Column("headroom", "int", "bytes", "bytes allowed in after a pause"),
]
_WD = "PFC_WD_QUEUE_STATS_"
PFCWD = [
    Column("queue", "str", "", "port and lossless queue, as SONiC names it (leaf2-eth1:3)"),
    Column("intf", "str", "", "interface name"),
    Column("status", "str", "", "operational or stormed, at the end of the run"),
    Column("pause_rx", "int", "frames", "PFC pauses the queue received"),
    Column(f"{_WD}DEADLOCK_DETECTED", "int", "", "storms detected"),
    Column(f"{_WD}DEADLOCK_RESTORED", "int", "", "storms restored"),
    *[Column(f"{_WD}{k}{last}", "int", "packets", f"{what}, while stormed{' (the latest storm)' if last else ''}")
      for last in ("", "_LAST")
      for k, what in (("TX_PACKETS", "sent by the queue"), ("TX_DROPPED_PACKETS", "dropped by the queue"),
                      ("RX_PACKETS", "entered by the port"), ("RX_DROPPED_PACKETS", "dropped on their way in"))],
]
JOBS = [
    Column("name", "str", "", "job name (the workload's type for a single workload)"),
    Column("type", "str", "", "allreduce, incast, pipeline, ..."),
    Column("status", "str", "", "ok or incomplete"),
    Column("ranks", "int", "", "hosts taking part"),
    Column("jct_s", "float", "emulated s", "completion time"),
    Column("jct_fabric_s", "float", "modelled s", "completion time"),
    Column("busbw_gbps", "float", "modelled Gb/s", "nccl-tests bus bandwidth (collectives)"),
    Column("busbw_fraction", "float", "", "busbw over the host link rate (collectives)"),
    Column("step_time_fabric_s", "float", "modelled s", "training step time (pipelines, training)"),
    Column("bubble_fraction", "float", "", "measured pipeline bubble (pipelines, training)"),
]

# frame name -> (CSV file, columns); jobs come from summary.json.
FRAMES: dict[str, tuple[str | None, list[Column]]] = {
    "ports": ("ports.csv", PORTS), "flows": ("flows.csv", FLOWS), "rates": ("rates.csv", RATES),
    "queues": ("queues.csv", QUEUES), "pauses": ("pauses.csv", PAUSES),
    "thresholds": ("thresholds.csv", THRESHOLDS), "pfcwd": ("pfcwd.csv", PFCWD), "jobs": (None, JOBS),
}


def _typed(series: pd.Series, kind: str) -> pd.Series:
    if kind == "bool":
        words = series.astype("str").str.lower().map({"true": True, "1": True, "false": False, "0": False})
        return words.astype("boolean")
    if kind in ("int", "float"):
        numbers = pd.to_numeric(series, errors="coerce")
        return numbers.round().astype("Int64") if kind == "int" else numbers.astype("float64")
    return series.astype("str").where(series.notna())


def shape(raw: pd.DataFrame, columns: list[Column]) -> pd.DataFrame:
    """The documented columns first, typed, then whatever else raw has, as read."""
    out = pd.DataFrame(index=raw.index)
    for c in columns:
        if c.name in raw:
            out[c.name] = _typed(raw[c.name], c.kind)
        else:  # all missing, in the column's own type
            out[c.name] = pd.Series(np.nan if c.kind == "float" else pd.NA, index=raw.index, dtype=DTYPES[c.kind])
    extra = [c for c in raw.columns if c not in out.columns]
    return pd.concat([out, raw[extra]], axis=1) if extra else out


# Columns computed here, not read (a CSV that has them is ignored for them).
_ADDED = {"ports": [f"paused_s_p{p}" for p in CLASSES], "flows": ["duration_fabric_us", "start_fabric_us"],
          "pauses": ["duration_s", "duration_fabric_us"]}


def _added(name: str, df: pd.DataFrame, dilation: float) -> None:
    """The time columns the CSV leaves out, from their twins (emulated s = modelled us x D / 1e6)."""
    def emulated(us: str) -> pd.Series:
        return df[us] * dilation / 1e6

    def modelled(s: str) -> pd.Series:
        return df[s] / dilation * 1e6

    if name == "ports":
        for p in CLASSES:
            df[f"paused_s_p{p}"] = emulated(f"paused_fabric_us_p{p}")
    elif name == "flows":
        df["duration_fabric_us"] = modelled("duration_s")
        df["start_fabric_us"] = modelled("start_s")
    elif name == "pauses":
        df["duration_s"] = df["end_s"] - df["start_s"]
        df["duration_fabric_us"] = df["end_fabric_us"] - df["start_fabric_us"]


def read_frame(run_dir: Path, name: str, dilation: float) -> pd.DataFrame:
    """One CSV of a run's folder as its frame (empty, with the columns, if the file is absent)."""
    file, columns = FRAMES[name]
    assert file is not None
    path = run_dir / file
    # Everything is read as text first: empty cells stay missing and types are ours, not guessed.
    raw = pd.read_csv(path, dtype=str, keep_default_na=False, na_values=[""]) \
        if path.is_file() and path.stat().st_size else pd.DataFrame({c.name: [] for c in columns})
    raw = raw.drop(columns=[c for c in raw.columns if c in _ADDED.get(name, ())])
    df = shape(raw, columns)
    _added(name, df, dilation)
    return df


def jobs_frame(summary: dict) -> pd.DataFrame:
    """One row per job of summary.json's `jobs` (scalar figures only); a run without jobs (the
    ring all-reduce, incast, flows) is one row of its headline figures."""
    entries = summary.get("jobs")
    if not isinstance(entries, list):
        entries = [{"name": summary.get("workload"), "type": (summary.get("workload") or "").split("/")[0],
                    "status": summary.get("status"), "ranks": summary.get("ranks"),
                    **{k: summary[k] for k in ("jct_s", "jct_fabric_s", "busbw_gbps", "busbw_fraction",
                                                "step_time_fabric_s", "bubble_fraction", "algbw_gbps",
                                                "iterations_completed", "iteration_time_fabric_s",
                                                "aggregate_goodput_gbps", "jain_fairness") if k in summary}}]
    rows = [{k: v for k, v in e.items() if isinstance(v, (str, int, float, bool)) or v is None}
            for e in entries if isinstance(e, dict)]
    return shape(pd.DataFrame(rows), JOBS)
