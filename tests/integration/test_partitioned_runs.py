"""`fabric-emu run` over two machines (issue 19), as a user runs it: the experiment lists the
machines (tests/integration/servers.py's two namespace servers, reached over real ssh through
FABRIC_EMU_SSH_CONFIG), and the same experiment without them runs on this one machine.
2 spines x 2 leaves x 2 hosts: leaf1, h1, h2 and spine1 on s1; leaf2, h3, h4 and spine2 on s2.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.conftest import REPO
from tests.integration.servers import Server, two_servers
from tests.integration.test_cluster import capture, count

pytestmark = [pytest.mark.root, pytest.mark.skipif(os.geteuid() != 0, reason="needs root")]

TOPOLOGY = "name: fesp\nkind: leaf-spine\nspines: 2\nleaves: 2\nhosts_per_leaf: 2\n"
RING = "workload: {type: allreduce, algorithm: ring, size: 4MB, iterations: 2}\n"
INCAST = ("workload: {type: incast, receiver: h3, senders: all, size: 2MB, iterations: 1, qps_per_sender: 1}\n"
          "congestion_control: none\n")


@pytest.fixture(scope="module")
def servers() -> Iterator[tuple[Server, Server]]:
    with two_servers(f"fesp{os.getpid() % 100000}") as pair:
        yield pair


def run(folder: Path, name: str, body: str, servers: tuple[Server, ...] | None) -> dict:
    """fabric-emu run of an experiment (over the servers when given); its summary.json."""
    (folder / "topo.yaml").write_text(TOPOLOGY)
    text = f"name: {name}\ntopology: topo.yaml\nseed: 1\n{body}"
    env = dict(os.environ)
    if servers:
        text += "machines:\n" + "".join(f"  - {{name: {s.name}, address: {s.address}, ssh_address: {s.ssh_address}}}\n"
                                        for s in servers)
        env["FABRIC_EMU_SSH_CONFIG"] = str(servers[0].ssh_config)
    (folder / f"{name}.yaml").write_text(text)
    done = subprocess.run([sys.executable, "-m", "fabric_emu", "run", str(folder / f"{name}.yaml"), "--out",
                           str(folder / "results")], cwd=REPO, env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    (summary,) = (folder / "results" / name).glob("*/summary.json")
    return json.loads(summary.read_text())


def test_a_ring_allreduce_split_over_two_machines_matches_one_machine(servers, tmp_path: Path) -> None:
    split = run(tmp_path, "split-ring", RING, servers)
    whole = run(tmp_path, "whole-ring", RING, None)
    print(f"\nring all-reduce busbw: over 2 machines {split['busbw_fraction']:.3f}, on one {whole['busbw_fraction']:.3f}"
          f" of the link (ratio {split['busbw_fraction'] / whole['busbw_fraction']:.3f})")
    for s in (split, whole):
        assert s["status"] == "ok" and s["fidelity"]["trusted"], s["fidelity"]
        assert s["switch"]["drops"] == 0 and s["transport"]["retransmitted_packets"] == 0
    assert abs(split["busbw_fraction"] / whole["busbw_fraction"] - 1) <= 0.05
    machines = split["machines"]["by_machine"]
    assert machines["s1"]["hosts"] == ["h1", "h2"] and machines["s2"]["hosts"] == ["h3", "h4"]
    assert sorted(split["machines"]["cut_links"]) == ["leaf1-spine2", "leaf2-spine1"]
    assert "machines" not in whole


def test_a_pfc_incast_split_over_two_machines_is_lossless_and_pauses_cross(servers, tmp_path: Path) -> None:
    pcap = str(tmp_path / "underlay.pcap")
    tcpdump = capture(servers[1], "ul0", "udp port 4789", pcap)
    try:
        s = run(tmp_path, "split-incast", INCAST, servers)
    finally:
        tcpdump.terminate()
        tcpdump.wait(10)
    pauses = count(pcap, "vxlan && eth.type == 0x8808")
    print(f"\nincast over 2 machines: {s['switch']['pause_tx']} pauses sent by switches, {pauses} PFC frames on "
          f"the underlay, {s['switch']['lossless_drops']} lossless drops, receiver link {s['receiver_link_fraction']:.3f}")
    assert s["status"] == "ok" and s["fidelity"]["trusted"], s["fidelity"]
    assert s["switch"]["lossless_drops"] == 0 and s["switch"]["drops"] == 0
    assert s["switch"]["pause_tx"] > 0 and pauses > 0
