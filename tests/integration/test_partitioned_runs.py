"""`fabric-emu run` over two machines (issue 19), as a user runs it: the shipped quickstart and
incast experiments with `--set machines=[...]` (tests/integration/servers.py's two namespace
servers, reached over real ssh through FABRIC_EMU_SSH_CONFIG), and the quickstart without them
on this one machine. The placement keeps each leaf with its hosts and spreads the spines:
quickstart (2 spines x 4 leaves x 2 hosts): leaf1, leaf2, h1-h4 and spine1 on s1, the rest on s2;
incast (2 x 2 x 4): leaf1, h1-h4 (h1 the receiver) and spine1 on s1, leaf2, h5-h8 and spine2 on s2.
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
from tests.integration.fabric_checks import trusted_but_for_late_pauses
from tests.integration.test_cluster import capture, count

pytestmark = [pytest.mark.root, pytest.mark.skipif(os.geteuid() != 0, reason="needs root")]


@pytest.fixture(scope="module")
def servers() -> Iterator[tuple[Server, Server]]:
    with two_servers(f"fesp{os.getpid() % 100000}") as pair:
        yield pair


def run(out: Path, experiment: str, servers: tuple[Server, ...] | None, *sets: str) -> dict:
    """fabric-emu run of a shipped experiment (over the servers when given); its summary.json."""
    cmd = [sys.executable, "-m", "fabric_emu", "run", str(REPO / "experiments" / f"{experiment}.yaml"), "--out", str(out)]
    for s in sets:
        cmd += ["--set", s]
    env = dict(os.environ)
    if servers:
        cmd += ["--set", "machines=[" + ", ".join(f"{{name: {s.name}, address: {s.address}, ssh_address: "
                                                  f"{s.ssh_address}}}" for s in servers) + "]"]
        env["FABRIC_EMU_SSH_CONFIG"] = str(servers[0].ssh_config)
    done = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    (summary,) = out.glob("*/*/summary.json")
    return json.loads(summary.read_text())


def test_the_quickstart_split_over_two_machines_matches_one_machine(servers, tmp_path: Path) -> None:
    split = run(tmp_path / "split", "quickstart", servers)
    whole = run(tmp_path / "whole", "quickstart", None)
    print(f"\nquickstart ring all-reduce busbw: over 2 machines {split['busbw_fraction']:.3f}, on one "
          f"{whole['busbw_fraction']:.3f} of the link (ratio {split['busbw_fraction'] / whole['busbw_fraction']:.3f})")
    for s in (split, whole):
        assert s["status"] == "ok" and trusted_but_for_late_pauses(s), s["fidelity"]
        assert s["switch"]["drops"] == 0 and s["transport"]["retransmitted_packets"] == 0
    assert abs(split["busbw_fraction"] / whole["busbw_fraction"] - 1) <= 0.05
    machines = split["machines"]
    assert machines["by_machine"]["s1"]["hosts"] == ["h1", "h2", "h3", "h4"]
    assert machines["by_machine"]["s2"]["hosts"] == ["h5", "h6", "h7", "h8"]
    assert len(machines["cut_links"]) == 4 and machines["rtt_ms"]["s1->s2"] > 0
    assert "machines" not in whole


def test_the_pfc_incast_split_over_two_machines_is_lossless_and_pauses_cross(servers, tmp_path: Path) -> None:
    """Also captured, on a port of each machine: leaf1-eth1 (to the receiver h1, on s1) and
    spine2-eth1 (to leaf1, on s2); their pcap files come back into the one results folder."""
    pcap = str(tmp_path / "underlay.pcap")
    tcpdump = capture(servers[0], "ul0", "udp port 4789", pcap)
    try:
        s = run(tmp_path / "split", "incast", servers, "capture={ports: [leaf1-eth1, spine2-eth1], packets: 50}")
    finally:
        tcpdump.terminate()
        tcpdump.wait(10)
    (run_dir,) = (tmp_path / "split").glob("*/*/")
    for port in ("leaf1-eth1", "spine2-eth1"):
        assert count(str(run_dir / f"capture-{port}.pcap"), "infiniband") == 50, port  # RoCEv2, decoded
    pauses = count(pcap, "vxlan && eth.type == 0x8808")
    print(f"\nincast over 2 machines: {s['switch']['pause_tx']} pauses sent by switches, {pauses} PFC frames on "
          f"the underlay, {s['switch']['lossless_drops']} lossless drops, receiver link {s['receiver_link_fraction']:.3f}")
    assert s["status"] == "ok", s.get("error")
    # As on one machine (test_lossless_fabric): a pause put into effect late under this kernel's
    # load (issue 20, part 4) may keep frames past the headroom, and must then say so; that is
    # the only thing allowed to cost the run its trust.
    assert trusted_but_for_late_pauses(s), s["fidelity"]
    assert s["switch"]["lossless_drops"] == 0 and s["switch"]["drops"] == 0
    assert s["switch"]["pause_tx"] > 0 and pauses > 0
    # Every byte charged at a switch's ingress was credited back, on its machine: where it arrived,
    # or as it left for the other one (read from both machines' maps once nothing moved).
    acc = s["pfc_accounting"]
    assert acc["settled"] and acc["held_bytes"] == acc["leaked_bytes"] == acc["over_credited_bytes"] == 0, acc


def test_a_cut_link_failing_between_machines_is_rerouted(servers, tmp_path: Path) -> None:
    """link-failure takes leaf1-spine2 down mid-run: split in two, that link is cut (leaf1 on s1,
    spine2 on s2), so each machine's agent takes its end down; the controller reroutes. At
    dilation 4000, not the experiment's 2000: split over two namespace machines on one 2-core
    host it saw the CPU saturated in 23% of samples once (untrusted), the retransmissions after
    the cut on top of a split fabric's ~1.7x CPU per switch packet (benchmarks/machines.py)."""
    s = run(tmp_path / "split", "link-failure", servers, "topology.dilation=4000")
    (event,) = s["events"]
    (failover,) = s["failover"]
    print(f"\nlink-failure over 2 machines: rerouted in {failover['failover_fabric_us']} us modelled, "
          f"{s['transport']['retransmitted_packets']} packets retransmitted, busbw {s['busbw_fraction']:.3f}")
    assert s["status"] == "ok" and trusted_but_for_late_pauses(s), s["fidelity"]
    assert event["ok"] and event["link"] == "leaf1-spine2"
    assert failover["rerouted"] and "leaf1-spine2" in s["machines"]["cut_links"]
    assert s["transport"]["delivered_fraction"] == 1.0  # what the cut link held was lost, and resent


@pytest.mark.parametrize("link", ["leaf1-spine2", "leaf1-spine1"], ids=["between-machines", "on-one-machine"])
def test_a_cut_under_pause_gives_back_what_its_queue_held(servers, tmp_path: Path, link: str) -> None:
    """The PFC incast split in two (leaf1 and spine1 on s1, leaf2 and spine2 on s2), one link
    cut at 300 us while PFC holds the spine's queue towards leaf1, as test_lossless_fabric cuts
    a link on one machine. Between machines (leaf1-spine2) each machine takes its stitch end
    down; on one (leaf1-spine1) that machine takes the wire's ends down (the link was built with
    a wire in the middle, as on one machine). Either way the switch ports lose their carrier but
    stay up, their programs give back what Open vSwitch still sends them, and what their queues
    held is given back once the kernel purged them. Nothing stays charged, on either machine;
    every byte arrives."""
    s = run(tmp_path / "split", "incast", servers, f"events=[{{at: 300us, link: {link}, state: down}}]")
    (cut,) = s["events"]
    print(f"\nincast over 2 machines, {link} cut under pause: {cut.get('given_back_bytes')} B given back, "
          f"status {s['status']}, accounting {s.get('pfc_accounting')}")
    assert s["status"] == "ok" and trusted_but_for_late_pauses(s), (s["status"], s["fidelity"])
    assert cut["ok"] and cut["link"] == link and cut["given_back_bytes"] > 0, cut  # the queue held paused frames
    # Before, each: the ports were taken down, frames sent into them were refused unseen (between
    # machines: 7,009 lossless frames dropped elsewhere, 7,155 past the headroom; untrusted).
    assert s["switch"]["lossless_drops"] == 0, s["switch"]
    acc = s["pfc_accounting"]
    assert acc["settled"] and acc["held_bytes"] == acc["queued_bytes"] == acc["leaked_bytes"] == 0, acc
    assert acc["over_credited_bytes"] == 0 and not acc["negative_pairs"], acc
    assert s["transport"]["delivered_fraction"] == 1.0


def refused_split_quickstart(servers: tuple[Server, ...], out: Path) -> str:
    """The quickstart over the servers, which must fail before anything is built: its error."""
    cmd = [sys.executable, "-m", "fabric_emu", "run", str(REPO / "experiments" / "quickstart.yaml"), "--out",
           str(out), "--set", "machines=[" + ", ".join(
               f"{{name: {s.name}, address: {s.address}, ssh_address: {s.ssh_address}}}" for s in servers) + "]"]
    done = subprocess.run(cmd, cwd=REPO, env={**os.environ, "FABRIC_EMU_SSH_CONFIG": str(servers[0].ssh_config)},
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 1, done.stdout[-2000:]
    assert "fabric up" not in done.stdout
    for s in servers:
        assert s.run(["ovs-vsctl", "--timeout=10", "list-br"]).stdout.split() == []
        assert s.run(["find", "/var/lib/fabric-emu/runs", "-type", "f"]).stdout.split() == []
    return done.stderr


def test_a_1500_byte_underlay_fails_the_run_before_anything_is_built(tmp_path: Path) -> None:
    with two_servers(f"fesm{os.getpid() % 100000}", underlay_mtu=1500) as small:
        error = refused_split_quickstart(small, tmp_path)
    assert "MTU 1500" in error and "at least 4250" in error, error


def test_an_underlay_too_slow_for_the_cut_links_fails_the_run(tmp_path: Path) -> None:
    """The quickstart split in two has 4 cut links of 100 Gb/s at dilation 4000: up to 100 Mb/s
    out of each machine, which an underlay shaped to 150 Mb/s cannot carry with room to spare."""
    with two_servers(f"fesb{os.getpid() % 100000}") as slow:
        for s in slow:
            s.run(["tc", "qdisc", "add", "dev", "ul0", "root", "tbf", "rate", "150mbit", "burst", "256kb",
                   "latency", "20ms"], check=True)
        error = refused_split_quickstart(slow, tmp_path)
    assert "cut links carry up to 100 Mb/s at dilation 4000" in error and "use a dilation of at least" in error, error


def test_a_machine_agent_killed_mid_run_ends_it_and_its_machine_is_cleaned(servers, tmp_path: Path) -> None:
    """kill -9 of s2's agent (it owns s2's ports and PFC daemon) while the ring runs: the run ends
    at once as failed, naming it, and s2's own `fabric-emu clean`, run by the head over ssh,
    removes what that agent left there, by its record."""
    import threading
    import time

    s2 = servers[1]
    killed: list[str] = []

    def kill_when_running() -> None:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and not killed:
            engines = s2.run(["pgrep", "-f", "fabric_emu.nic"]).stdout.split()
            agent = s2.run(["pgrep", "-f", "fabric_emu.run.machine"]).stdout.split()
            if engines and len(agent) == 1:
                time.sleep(3.0)  # the ring is under way
                s2.run(["kill", "-9", agent[0]])
                killed.append(agent[0])
            time.sleep(0.2)

    killer = threading.Thread(target=kill_when_running, daemon=True)
    killer.start()
    cmd = [sys.executable, "-m", "fabric_emu", "run", str(REPO / "experiments" / "quickstart.yaml"), "--out",
           str(tmp_path), "--set", "workload.size=64MB", "--set", "machines=[" + ", ".join(
               f"{{name: {s.name}, address: {s.address}, ssh_address: {s.ssh_address}}}" for s in servers) + "]"]
    t = time.monotonic()
    done = subprocess.run(cmd, cwd=REPO, env={**os.environ, "FABRIC_EMU_SSH_CONFIG": str(servers[0].ssh_config)},
                          capture_output=True, text=True, timeout=600)
    took = time.monotonic() - t
    killer.join(5)
    assert killed, "the agent was never seen running"
    (summary,) = tmp_path.glob("*/*/summary.json")
    s = json.loads(summary.read_text())
    print(f"\nagent of s2 killed: the run ended {s['status']} after {took:.0f} s in all: {s.get('error')}")
    assert done.returncode == 1 and s["status"] == "failed"
    assert "the machine agent of s2" in s["error"]
    for server in servers:
        assert server.run(["ovs-vsctl", "--timeout=10", "list-br"]).stdout.split() == [], server.name
        assert server.run(["find", "/var/lib/fabric-emu/runs", "-type", "f"]).stdout.split() == [], server.name
        assert server.run(["find", "/sys/fs/bpf/fabric-emu", "-mindepth", "1"]).stdout.split() == [], server.name
    # The NIC engines there end with their ssh sessions (fabric_emu.nic.main.end_with_parent),
    # which the head's teardown closes: measured 0.0 s after the run (was 11.6 s without it)
    t = time.monotonic()
    while time.monotonic() - t < 5 and any(s.run(["pgrep", "-f", "fabric_emu"]).stdout.split() for s in servers):
        time.sleep(0.2)
    print(f"the machines' last fabric-emu processes ended {time.monotonic() - t:.1f} s after the run")
    for server in servers:
        assert server.run(["pgrep", "-af", "fabric_emu"]).stdout.split() == [], server.name
