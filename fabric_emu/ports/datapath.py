"""Install the port programs of bpf/port.c on a fabric's link ends, and read their counters.

Kernel plumbing only; what each port gets comes from fabric_emu.ports.model. The object is
compiled once per source version (clang, cached under /var/lib/fabric-emu/bpf/), loaded by
bpftool with its maps pinned under /sys/fs/bpf/fabric-emu/<run id>/ (the run record lists that
folder, so cleanup removes it), and attached by raw rtnetlink (clsact + direct-action filters);
the charge of each frame entering a switch by a tracepoint (port.c, switch_arrival), whose link
is pinned in the same folder, so removing it detaches them.
"""

from __future__ import annotations

import os
import socket
import subprocess
import struct
import time
from collections.abc import Iterable
from pathlib import Path
from typing import TYPE_CHECKING

from fabric_emu.kernel.compiled import build_cached
from fabric_emu.kernel import bpfsys
from fabric_emu.ports.layout import NPRIO, PER_PRIO_COUNTERS, PORT_COUNTERS, PortTable
from fabric_emu.ports.qp_limiter import QP_MAJOR
from fabric_emu.kernel import rtnl
from fabric_emu.kernel.rtnl import Batch

if TYPE_CHECKING:  # only for types: the PFC daemon imports this module and starts faster without the plan
    from fabric_emu.ports.model import PortEnd

SOURCE = Path(__file__).with_name("bpf") / "port.c"
TC_ACT_OK = 0
CACHE = Path("/var/lib/fabric-emu/bpf")
BPFFS = Path("/sys/fs/bpf")
PIN_ROOT = BPFFS / "fabric-emu"
CLSACT_INGRESS = 0xFFFFFFF2
CLSACT_EGRESS = 0xFFFFFFF3
PROGRAMS = ("switch_egress", "switch_ingress", "host_egress", "host_ingress", "qp_classify",
            "stitch_out", "stitch_in")
TRACEPOINT_PROGRAMS = ("switch_arrival", "switch_arrival_dropped")


def build_object() -> Path:
    """The compiled object for this version of port.c (compiled on first use)."""
    arch_include = f"/usr/include/{os.uname().machine}-linux-gnu"
    return build_cached(SOURCE, CACHE, "port", ".o", lambda out: [
        "clang", "-O2", "-g", "-Wall", "-target", "bpf", "-mcpu=v3", f"-I{arch_include}",
        "-c", str(SOURCE), "-o", str(out)])


def ensure_bpffs() -> None:
    """Mount the BPF filesystem if this machine has not (pins live there)."""
    if not os.path.ismount(BPFFS):
        subprocess.run(["mount", "-t", "bpf", "bpf", str(BPFFS)], check=True, capture_output=True)


def pin_dir(run_id: str) -> Path:
    return PIN_ROOT / run_id


class PortMaps:
    """The pinned maps of one run, opened by any process (runner, PFC daemon, samplers)."""

    def __init__(self, pins: Path):
        self.pins = pins
        self.ports_fd = bpfsys.obj_get(str(pins / "maps" / "ports"))
        self.ifindex_fd = bpfsys.obj_get(str(pins / "maps" / "port_of_ifindex"))
        self.events_fd = bpfsys.obj_get(str(pins / "maps" / "events"))
        self.pairs_fd = bpfsys.obj_get(str(pins / "maps" / "pair_held"))
        self._mem = bpfsys.mmap_array(self.ports_fd)
        self._words = memoryview(self._mem).cast("Q")
        self.table = PortTable(self._words)

    def counters(self, port_id: int) -> dict[str, int]:
        """Every counter of one port: per priority as name_p<k>, per port by name."""
        t = self.table
        out = {f"{name}_p{p}": t.get(port_id, name, p) for name in PER_PRIO_COUNTERS for p in range(NPRIO)}
        out.update({name: t.get(port_id, name) for name in PORT_COUNTERS})
        now = time.monotonic_ns()  # the PFC daemon's clock: a pause still running counts so far
        for p in range(NPRIO):
            if since := t.get(port_id, "paused_since", p):
                out[f"paused_ns_p{p}"] += max(0, now - since)
        return out

    def pairs(self, signed: bool = False) -> dict[tuple[int, int], int]:
        """Lossless bytes held now per (ingress port id, egress port id) of a switch, where any;
        `signed`: every non-zero pair, a negative one (credited more than charged) included."""
        out = {}
        for key, value in bpfsys.map_items(self.pairs_fd, 4, 8):
            (k,), (n,) = struct.unpack("=I", key), struct.unpack("=q" if signed else "=Q", value)
            if (n != 0) if signed else (0 < n < 1 << 63):  # unsigned: a credit landing first
                out[(k >> 16, k & 0xFFFF)] = n
        return out

    def close(self) -> None:
        self.table = None  # type: ignore[assignment]
        self._words.release()
        self._mem.close()
        for fd in (self.ports_fd, self.ifindex_fd, self.events_fd, self.pairs_fd):
            os.close(fd)


def program_fd(pins: Path, name: str) -> int:
    """A file descriptor of one of the run's loaded programs (the caller closes it)."""
    return bpfsys.obj_get(str(pins / "progs" / name))


def give_back(fd: int, in_id: int, out_id: int, nbytes: int) -> None:
    """Credit `nbytes` of lossless bytes charged to ingress port in_id and the pair (in_id,
    out_id), as their arrival at the far end would (bpf/port.c, give_back; fd: program_fd's)."""
    # A pair holds at most a port's buffer (megabytes): one run, its length in the u32 field.
    assert 0 < nbytes <= 0xFFFFFFFF, nbytes
    ret, _ = bpfsys.prog_test_run(fd, bytes(14) + struct.pack("=III", in_id, out_id, nbytes))
    if ret != TC_ACT_OK:  # credit_arrival fails only when the egress port has no entry
        raise RuntimeError(f"give_back: no egress port {out_id} in this run's map")


def load(run_id: str) -> Path:
    """Load the programs and create the maps, pinned for this run; returns the pin folder."""
    ensure_bpffs()
    obj = build_object()
    pins = pin_dir(run_id)
    pins.mkdir(parents=True, exist_ok=True)
    subprocess.run(["bpftool", "prog", "loadall", str(obj), str(pins / "progs"),
                    "pinmaps", str(pins / "maps")], check=True, capture_output=True, text=True)
    (pins / "links").mkdir()
    for name in TRACEPOINT_PROGRAMS:  # they charge nothing until attach() names the switch ports
        prog = program_fd(pins, name)
        try:
            link = bpfsys.raw_tracepoint_open(prog)
            try:
                bpfsys.obj_pin(link, str(pins / "links" / name))
            finally:
                os.close(link)
        finally:
            os.close(prog)
    return pins


def netns_inode(netns: str | None) -> int:
    """The inode number of a network namespace (a path under /var/run/netns, or None: this
    process's), as the kernel's struct net has it (ns.inum)."""
    return os.stat(netns or "/proc/self/ns/net").st_ino


def attach(pins: Path, ends: Iterable[PortEnd], netns_of: dict[str, str | None], maps: PortMaps) -> None:
    """Attach the programs to every link end: switch ports get switch_egress + switch_ingress
    and an entry in port_of_ifindex; host NICs get host_egress + host_ingress, and qp_classify
    on their per-QP HTB 30: when shape_classes built one (queues.PortQueues.qp_classes).
    Raw rtnetlink requests on one socket per namespace (fabric_emu.kernel.rtnl), as the class
    trees are built: pyroute2's tc() took ~0.2 s of a 32-host fabric's start-up here.
    Switch ports must share one network namespace (their ifindexes key port_of_ifindex), whose
    inode switch_arrival compares each frame's device's with."""
    ends = list(ends)
    switch_netns = {netns_of.get(e.node) for e in ends if e.role == "switch"}
    if len(switch_netns) > 1:
        raise ValueError(f"switch ports in more than one network namespace: {sorted(map(str, switch_netns))}")
    if switch_netns:
        netns_fd = bpfsys.obj_get(str(pins / "maps" / "switch_netns"))
        try:
            bpfsys.map_update(netns_fd, struct.pack("=I", 0), struct.pack("=I", netns_inode(switch_netns.pop())))
        finally:
            os.close(netns_fd)
    fds = {name: bpfsys.obj_get(str(pins / "progs" / name)) for name in PROGRAMS}
    socks: dict[str | None, socket.socket] = {}
    try:
        for end in ends:
            netns = netns_of.get(end.node)
            if netns not in socks:
                socks[netns] = rtnl.netlink_socket(netns)
            sock = socks[netns]
            index = rtnl.link_index(sock, end.intf)
            where = f"{end.intf}" + (f" in {netns}" if netns else "")
            b = Batch()
            b.add(rtnl.RTM_NEWQDISC, rtnl.CREATE, rtnl.clsact_qdisc(index), f"{where}: clsact not created")
            role = "switch" if end.role == "switch" else "host"
            for parent, prog in ((CLSACT_EGRESS, f"{role}_egress"), (CLSACT_INGRESS, f"{role}_ingress")):
                b.add(rtnl.RTM_NEWTFILTER, rtnl.CREATE, rtnl.bpf_filter(index, parent, fds[prog], prog, 1),
                      f"{where}: {prog} not attached")
            if end.role != "switch" and QP_MAJOR in rtnl.qdisc_handles(sock, index):
                # classid 30:0, not 0: the program sets only the minor (port.c, qp_limiter)
                b.add(rtnl.RTM_NEWTFILTER, rtnl.CREATE,
                      rtnl.bpf_filter(index, QP_MAJOR, fds["qp_classify"], "qp_classify", QP_MAJOR),
                      f"{where}: qp_classify not attached")
            b.send(sock)
            if end.role == "switch":
                bpfsys.map_update(maps.ifindex_fd, struct.pack("=I", index), struct.pack("=I", end.id))
    finally:
        for fd in fds.values():
            os.close(fd)
        for sock in socks.values():
            sock.close()


def attach_stitch(pins: Path, stitch_ifname: str, vxlan_ifname: str, netns: str | None = None) -> None:
    """Join one end of a cross-machine link to its tunnel (port.c, "Cross-machine links"):
    stitch_out on the stitch end's ingress, stitch_in on the VXLAN device's ingress, and where
    each sends its frames. The targets go in first: a frame that met a filter with none would
    be dropped."""
    fds = {name: bpfsys.obj_get(str(pins / "progs" / name)) for name in ("stitch_out", "stitch_in")}
    peers = bpfsys.obj_get(str(pins / "maps" / "stitch_peer"))
    sock = rtnl.netlink_socket(netns)
    try:
        stitch, vxlan = rtnl.link_index(sock, stitch_ifname), rtnl.link_index(sock, vxlan_ifname)
        bpfsys.map_update(peers, struct.pack("=I", stitch), struct.pack("=I", vxlan))
        bpfsys.map_update(peers, struct.pack("=I", vxlan), struct.pack("=I", stitch))
        b = Batch()
        for index, name, prog in ((stitch, stitch_ifname, "stitch_out"), (vxlan, vxlan_ifname, "stitch_in")):
            where = name + (f" in {netns}" if netns else "")
            b.add(rtnl.RTM_NEWQDISC, rtnl.CREATE, rtnl.clsact_qdisc(index), f"{where}: clsact not created")
            b.add(rtnl.RTM_NEWTFILTER, rtnl.CREATE, rtnl.bpf_filter(index, CLSACT_INGRESS, fds[prog], prog, 1),
                  f"{where}: {prog} not attached")
        b.send(sock)
    finally:
        sock.close()
        os.close(peers)
        for fd in fds.values():
            os.close(fd)


def configure(maps: PortMaps, port_id: int, fields: dict[str, int | list[int]]) -> None:
    """Write a port's config fields (before traffic; the programs read them per packet)."""
    for name, value in fields.items():
        if isinstance(value, list):
            for i, v in enumerate(value):
                maps.table.set(port_id, name, v, i)
        else:
            maps.table.set(port_id, name, value)


def installed(maps: PortMaps, port_id: int) -> dict[str, int | list[int]]:
    """The config fields as the programs see them (read back from the map)."""
    t = maps.table
    return {"flags": t.get(port_id, "flags"), "limit": [t.get(port_id, "limit", p) for p in range(NPRIO)],
            **{k: t.get(port_id, k) for k in ("kmin", "kmax", "pmax32", "xoff", "xon", "headroom")}}
