"""The two-server harness (tests/integration/servers.py) measured: ssh lands in each server's
own namespaces, each server's Open vSwitch is its own, the underlay joins the servers (with
jumbo frames when its MTU allows them) and only them, and nothing the harness made outlives it,
also when its set-up fails midway."""

from __future__ import annotations

import os
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.integration import servers as servers_mod
from tests.integration.servers import Server, two_servers

pytestmark = [pytest.mark.root, pytest.mark.skipif(os.geteuid() != 0, reason="needs root")]

TAG = f"fesv{os.getpid() % 100000}"
NAMESPACES = ("net", "mnt", "pid")


@pytest.fixture(scope="module")
def servers() -> tuple[Server, Server]:
    with two_servers(TAG) as pair:
        yield pair


def ns_links(pid: int | str) -> list[str]:
    """The namespaces of pid (or "self") as seen from here, e.g. net:[4026532176]."""
    return [os.readlink(f"/proc/{pid}/ns/{ns}") for ns in NAMESPACES]


def nspid(pid: int) -> list[int]:
    """pid's NSpid line: its pid in each PID namespace from the root one down."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("NSpid:"):
            return [int(x) for x in line.split()[1:]]
    raise AssertionError(f"no NSpid in /proc/{pid}/status")


def processes_in_pidns(link: str) -> list[int]:
    """Pids (root namespace) of the processes whose PID namespace is link (pid:[...])."""
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if os.readlink(entry / "ns/pid") == link:
                    found.append(int(entry.name))
            except OSError:
                pass
    return found


def listeners() -> set[str]:
    """The root namespace's listening TCP sockets (local address:port)."""
    out = subprocess.run(["ss", "-Hltn"], capture_output=True, text=True, check=True).stdout
    return {line.split()[3] for line in out.splitlines() if line.strip()}


def ovs_list_br(s: Server | None) -> list[str]:
    """Bridges in s's Open vSwitch database (the root namespace's when s is None)."""
    cmd = ["ovs-vsctl", "--timeout=5", "list-br"]
    p = s.run(cmd) if s else subprocess.run(cmd, capture_output=True, text=True)
    assert p.returncode == 0, p.stderr
    return p.stdout.split()


def test_ssh_lands_in_each_servers_own_namespaces(servers):
    root = ns_links("self")
    seen = []
    for s in servers:
        p = s.ssh("readlink " + " ".join(f"/proc/self/ns/{ns}" for ns in NAMESPACES))
        assert p.returncode == 0, p.stderr
        over_ssh = p.stdout.split()
        assert over_ssh == ns_links(s.pid), f"ssh to {s.name} is not in the namespaces of its init {s.pid}"
        assert all(a != b for a, b in zip(over_ssh, root)), f"{s.name} shares a namespace with root: {over_ssh}"
        seen.append(over_ssh)
    assert all(a != b for a, b in zip(*seen)), f"s1 and s2 share a namespace: {seen}"


def test_a_shell_over_ssh_has_two_pids(servers):
    """`echo $$` over ssh reports the shell's pid in the server's PID namespace; from root the
    same process has another pid, two levels deep (NSpid), and the root pid named that way is
    not it."""
    s = servers[0]
    client = subprocess.Popen(s.ssh_argv("echo $$; exec sleep 30"), stdout=subprocess.PIPE, text=True)
    try:
        inner = int(client.stdout.readline())
        pidns = os.readlink(f"/proc/{s.pid}/ns/pid")
        matches = [p for p in processes_in_pidns(pidns) if nspid(p)[-1] == inner]
        assert len(matches) == 1, f"no single process of {s.name} has pid {inner} there: {matches}"
        outer = matches[0]
        assert nspid(outer) == [outer, inner] and outer != inner
        assert Path(f"/proc/{outer}/comm").read_text().strip() == "sleep"
        assert not Path(f"/proc/{inner}").exists() or os.readlink(f"/proc/{inner}/ns/pid") != pidns
        os.kill(outer, 9)  # the session's sleep, found just above
    finally:
        client.kill()
        client.wait()


def test_ssh_by_address_as_mininet_cluster_runs_it(servers):
    """Mininet Cluster Edition's own command line (RemoteMixin.sshbase, -F inserted) to
    root@<ssh_address>, with a tty and sudo on both ends: the output is the command's alone
    (no sudo or ssh warnings, which would reach Mininet through the tty)."""
    from mininet.examples.cluster import RemoteMixin

    for s in servers:
        base = list(RemoteMixin.sshbase)
        base[1:1] = ["-F", str(s.ssh_config)]
        cmd = ["sudo", "-E", "-u", "root", *base, f"root@{s.ssh_address}", "sudo", "-E", "echo", s.name]
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=30, stdin=subprocess.DEVNULL)
        assert p.returncode == 0, p.stderr
        assert p.stdout.replace("\r", "") == f"{s.name}\n" and p.stderr == ""


def test_a_bridge_belongs_to_one_server(servers):
    s1, s2 = servers
    br = f"{TAG}b"
    p = s1.ssh(f"ovs-vsctl --timeout=10 add-br {br} -- set bridge {br} datapath_type=netdev")
    assert p.returncode == 0, p.stderr
    try:
        assert br in ovs_list_br(s1)
        assert br not in ovs_list_br(s2)
        assert br not in ovs_list_br(None), "the machine's own Open vSwitch got the server's bridge"
        # its port device lives in s1's network namespace only
        assert s1.run(["ip", "link", "show", "dev", br]).returncode == 0
        assert subprocess.run(["ip", "link", "show", "dev", br], capture_output=True).returncode != 0
        ids = [(s.run(cmd) if s else subprocess.run(cmd, capture_output=True, text=True)).stdout.strip()
               for s in (s1, s2, None)
               for cmd in [["ovs-vsctl", "--timeout=5", "get", "Open_vSwitch", ".", "external_ids:system-id"]]]
        assert all(ids) and len(set(ids)) == 3, f"system-ids not distinct: {ids}"
    finally:
        s1.run(["ovs-vsctl", "--timeout=10", "--if-exists", "del-br", br])


def test_each_server_has_its_own_sysfs_and_bpf_fs(servers):
    s1, s2 = servers
    for s in servers:
        p = s.run(["ls", "/sys/class/net"])
        assert p.returncode == 0 and set(p.stdout.split()) == {"lo", "mgmt0", "ul0"}, p.stdout + p.stderr
        assert s.run(["ls", "/sys/fs/cgroup"]).stdout.split() == sorted(os.listdir("/sys/fs/cgroup"))
    d = f"/sys/fs/bpf/{TAG}"
    assert s1.run(["mkdir", d]).returncode == 0
    try:
        assert s1.run(["test", "-d", d]).returncode == 0
        assert s2.run(["test", "-e", d]).returncode != 0 and not os.path.exists(d)
    finally:
        s1.run(["rmdir", d])


def ping(s: Server, *args: str) -> subprocess.CompletedProcess:
    return s.run(["ping", "-c1", "-W2", *args])


def test_underlay_joins_the_servers_with_jumbo_frames(servers):
    s1, s2 = servers
    for s in servers:
        assert s.run(["cat", "/sys/class/net/ul0/mtu"]).stdout.strip() == "9000"
    for a, b in ((s1, s2), (s2, s1)):
        p = ping(a, b.address)
        assert p.returncode == 0, p.stdout + p.stderr
        p = ping(a, "-M", "do", "-s", "8000", b.address)
        assert p.returncode == 0 and " 0% packet loss" in p.stdout, p.stdout + p.stderr


def test_underlay_of_1500_refuses_a_jumbo_ping(servers):
    """A second harness beside the first (its own management subnets), MTU 1500."""
    with two_servers(f"{TAG}x", underlay_mtu=1500) as (s1, s2):
        assert s1.ssh_address not in {s.ssh_address for s in servers}
        assert ping(s1, s2.address).returncode == 0
        p = ping(s1, "-M", "do", "-s", "8000", s2.address)
        assert p.returncode != 0 and "message too long" in (p.stdout + p.stderr).lower(), p.stdout + p.stderr
        assert ping(s1, "-M", "do", "-s", "1472", s2.address).returncode == 0


def test_the_underlay_is_private_to_the_servers(servers):
    s1, s2 = servers
    assert ping(s1, s2.address).returncode == 0
    addrs = subprocess.run(["ip", "-4", "-o", "addr"], capture_output=True, text=True, check=True).stdout
    assert "10.210.0." not in addrs
    mgmt = {s.mgmt_root_if for s in servers}
    for s in servers:
        route = subprocess.run(["ip", "-4", "route", "get", s.address], capture_output=True, text=True).stdout
        assert not any(f"dev {i} " in route for i in mgmt), f"root routes {s.address} to a server: {route}"
        p = subprocess.run(["ping", "-c1", "-W1", s.address], capture_output=True, text=True)
        assert p.returncode != 0, f"the root namespace reached {s.address}: {p.stdout}"
        # and the servers know no way out but their own two links
        routes = s.run(["ip", "-4", "route"]).stdout
        assert "default" not in routes and set(l.split(" dev ")[1].split()[0] for l in routes.splitlines()) == \
            {"ul0", "mgmt0"}, routes


@dataclass
class Made:
    """What a harness made, noted while it was up."""

    inits: list[int]
    pidns: list[str]
    ifs: list[str]
    tmp: Path


def assert_nothing_left(made: Made, listening_before: set[str]) -> None:
    for pid in made.inits:
        assert not Path(f"/proc/{pid}").exists(), f"server init {pid} still exists"
    for link in made.pidns:
        assert processes_in_pidns(link) == [], f"processes left in {link}"
    for name in made.ifs:
        assert subprocess.run(["ip", "link", "show", "dev", name], capture_output=True).returncode != 0, \
            f"interface {name} left"
    assert not made.tmp.exists(), f"{made.tmp} left"
    assert str(made.tmp) not in Path("/proc/self/mountinfo").read_text()
    assert servers_mod._ssh_processes(made.tmp / "ssh_config") == []
    assert listeners() - listening_before == set()


def test_teardown_leaves_nothing():
    before = listeners()
    with two_servers(f"{TAG}t") as (s1, s2):
        made = Made([s1.pid, s2.pid], [os.readlink(f"/proc/{s.pid}/ns/pid") for s in (s1, s2)],
                    [s1.mgmt_root_if, s2.mgmt_root_if], s1.ssh_config.parent)
        # a control master and a session still running when the servers go
        master = subprocess.run(["ssh", "-F", str(s1.ssh_config), "-M", "-S", str(made.tmp / "cm"), "-f", "-N",
                                 "s1"], stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                stderr=subprocess.DEVNULL, timeout=30)
        assert master.returncode == 0
        session = subprocess.Popen(s2.ssh_argv("sleep 60"), stdin=subprocess.DEVNULL)
        deadline = time.monotonic() + 10
        while len(servers_mod._ssh_processes(s1.ssh_config)) < 2 and time.monotonic() < deadline:
            time.sleep(0.05)
        clients = servers_mod._ssh_processes(s1.ssh_config)
        assert session.pid in clients and len(clients) == 2, clients
        assert len(processes_in_pidns(made.pidns[1])) > 4  # init, OVS's four, sshd and the session
    session.wait(timeout=10)
    assert_nothing_left(made, before)


def test_a_set_up_failing_midway_leaves_nothing(monkeypatch):
    before = listeners()
    made: list[Made] = []

    def failing_sshd(h, n):
        made.append(Made(list(h.inits), [os.readlink(f"/proc/{p}/ns/pid") for p in h.inits], list(h.created_ifs),
                         h.tmp))
        assert len(h.inits) == 2 and len(h.created_ifs) == 2  # the servers were up, OVS included
        raise RuntimeError("sshd refused to start (on purpose)")

    monkeypatch.setattr(servers_mod, "_start_sshd", failing_sshd)
    with pytest.raises(RuntimeError, match="on purpose"):
        with two_servers(f"{TAG}f"):
            pass
    assert made, "set-up did not get as far as sshd"
    assert_nothing_left(made[0], before)
