"""The pure parts of the Cluster Edition adapters (fabric_emu.fabric.cluster): which link gets
which VNI, where nodes go, and the commands that make one machine's end of a cut link."""

from __future__ import annotations

import pytest

from fabric_emu.fabric.cluster import ClusterFabric, placer_for
from fabric_emu.fabric.machines import Machine
from fabric_emu.fabric.stitch_link import stitch_commands, stitch_link_for
from fabric_emu.fabric.wires import wire_commands
from fabric_emu.spec.topology import TopologySpec
from fabric_emu.topo.placement import place
from fabric_emu.topo.plan import build_plan


@pytest.fixture
def plan():
    return build_plan(TopologySpec(name="t", kind="leaf-spine", spines=2, leaves=2, hosts_per_leaf=2))


def test_the_placer_answers_from_the_placement(plan) -> None:
    placement = place(plan, ["a", "b"])
    placer = placer_for(placement)(servers=["a", "b"])
    assert {n: placer.place(n) for n in ("leaf1", "h1", "h2", "leaf2", "h3", "h4")} == \
        {"leaf1": "a", "h1": "a", "h2": "a", "leaf2": "b", "h3": "b", "h4": "b"}
    assert {placer.place("spine1"), placer.place("spine2")} == {"a", "b"}


def test_only_cut_links_get_a_vni_each(plan) -> None:
    placement = place(plan, ["a", "b"])
    link = stitch_link_for(plan, placement, [Machine("a", "10.0.9.1", "10.0.9.1"), Machine("b", "10.0.9.2", "10.0.9.2")])
    assert len(placement.cut) == 2
    assert sorted(link.vnis.values()) == sorted(set(link.vnis.values()))
    assert {frozenset((ln.a_intf, ln.b_intf)) for ln in placement.cut} == set(link.vnis)
    assert link.mtu == plan.mtu


def test_stitch_commands_redirect_both_ways_and_never_fragment() -> None:
    cmds = stitch_commands("leaf1-eth4", 7, "10.210.0.1", "10.210.0.2", "ul0", 4200)
    joined = "\n".join(cmds)
    assert "type veth peer name fest7 mtu 4200" in cmds[0]
    assert "vxlan id 7 local 10.210.0.1 remote 10.210.0.2 dstport 4789 dev ul0 nolearning df set" in joined
    assert "dev fest7 ingress protocol all u32 match u32 0 0 action mirred egress redirect dev fevx7" in joined
    assert "dev fevx7 ingress protocol all u32 match u32 0 0 action mirred egress redirect dev fest7" in joined


@pytest.mark.parametrize("intf, local", [("leaf1;rm -rf /", "10.0.0.1"), ("leaf1-eth4", "10.0.0.1 ; true"),
                                          ("a-name-far-too-long", "10.0.0.1")])
def test_stitch_commands_refuse_names_that_would_reach_a_shell(intf: str, local: str) -> None:
    with pytest.raises(ValueError):
        stitch_commands(intf, 7, local, "10.210.0.2", "ul0", 4200)


def test_only_links_cut_inside_one_machine_get_a_wire(plan, tmp_path) -> None:
    """leaf1 and spine1 share machine a, leaf1 and spine2 do not: the first cut gets a wire
    there, the second is cut at its stitch ends."""
    placement = place(plan, ["a", "b"])
    assert placement.machine_of["spine1"] == placement.machine_of["leaf1"] != placement.machine_of["spine2"]
    cut = frozenset({frozenset(("leaf1", "spine1")), frozenset(("leaf1", "spine2"))})
    fabric = ClusterFabric(plan, placement, [Machine("a", "10.0.9.1", "10.0.9.1"), Machine("b", "10.0.9.2", "10.0.9.2")],
                           None, 6653, tmp_path, "r1", cut=cut)
    assert fabric.wired == {frozenset(("leaf1", "spine1"))}


@pytest.mark.parametrize("port, addr", [("leaf1;reboot", None), ("leaf1-eth3", "02:00:00:00:00:01; true")])
def test_wire_commands_refuse_names_that_would_reach_a_shell(port: str, addr: str | None) -> None:
    with pytest.raises(ValueError):
        wire_commands(port, "spine1-eth1", addr)


def test_cluster_edition_imports_where_distutils_is_gone() -> None:
    """Python 3.12 (Ubuntu 24.04's) has no distutils, which Cluster Edition imports: a Python
    where it cannot be found still imports our adapters (the shim), as this one does."""
    import subprocess
    import sys

    code = ("import importlib.abc, sys\n"
            "class NoDistutils(importlib.abc.MetaPathFinder):\n"
            "    def find_spec(self, name, path=None, target=None):\n"
            "        if name == 'distutils' or name.startswith('distutils.'):\n"
            "            raise ModuleNotFoundError(name)\n"
            "sys.meta_path.insert(0, NoDistutils())\n"
            "sys.modules.pop('distutils', None)\n"
            "import fabric_emu.fabric.cluster as c\n"
            "from distutils.version import StrictVersion\n"
            "assert StrictVersion('1.9.2') < StrictVersion('1.10')\n"
            "print(c.ce.MininetCluster.__name__)\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0 and done.stdout.strip() == "MininetCluster", done.stderr
