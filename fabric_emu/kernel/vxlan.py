"""The VXLAN tunnel of one cross-machine link (issue 19): one kernel VXLAN device per link per
machine, unicast to the other machine's underlay address. The port programs move frames
between it and the link's stitch end (fabric_emu.ports.datapath.attach_stitch); no Linux
bridge, which would drop PFC frames (01:80:c2:00:00:01).
"""

from __future__ import annotations

import os

from pyroute2.netlink.exceptions import NetlinkError

from fabric_emu.kernel.shaping import open_iproute

VXLAN_PORT = 4789  # IANA's; the kernel's default is still Linux's old 8472
DF_SET = 1  # enum ifla_vxlan_df: never fragment the outer packet (see create)


def underlay_mtu(netns: str | None, device: str) -> int:
    """The MTU of the underlay device the tunnels leave by."""
    with open_iproute(netns) as ipr:
        (link,) = ipr.get_links(ipr.link_lookup(ifname=device)[0])
        return int(link.get_attr("IFLA_MTU"))


def create(netns: str | None, name: str, vni: int, local: str, remote: str, underlay: str, mtu: int) -> int:
    """A VXLAN device `name` (up, MTU `mtu`) carrying VNI `vni` from `local` to `remote` over
    the device `underlay`; returns its ifindex. No learning: the one remote takes every frame.

    The outer packets never fragment (DF): a link the underlay cannot carry whole must lose its
    full frames (the preflight refuses it: fabric_emu.spec.machines.fits_underlay), not pass
    them in pieces whose reassembly the modelled link knows nothing of. The MTU is set after
    the device exists: given with it, the kernel would cap it at the underlay's less the
    encapsulation without a word; set, it refuses (EINVAL), and the device goes again."""
    with open_iproute(netns) as ipr:
        (lower,) = ipr.link_lookup(ifname=underlay)
        ipr.link("add", ifname=name, kind="vxlan", vxlan_id=vni, vxlan_local=local, vxlan_group=remote,
                 vxlan_port=VXLAN_PORT, vxlan_learning=0, vxlan_link=lower, vxlan_df=DF_SET)
        (index,) = ipr.link_lookup(ifname=name)
        try:
            ipr.link("set", index=index, mtu=mtu, state="up")
        except NetlinkError as e:
            ipr.link("del", index=index)
            raise OSError(e.code, f"{name}: MTU {mtu} refused: {underlay} is too small to carry it in VXLAN "
                                  f"({os.strerror(e.code)})") from e
        return index


def delete(netns: str | None, name: str) -> None:
    """Remove a link's VXLAN device (gone already is fine)."""
    with open_iproute(netns) as ipr:
        for index in ipr.link_lookup(ifname=name):
            ipr.link("del", index=index)
