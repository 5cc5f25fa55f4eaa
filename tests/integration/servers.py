"""Two "servers" on this machine, for testing the fabric over several machines (issue 19)
honestly on one kernel: each server is its own network, mount and PID namespaces, with its own
ovsdb-server and ovs-vswitchd and its own sshd, so Mininet Cluster Edition (and anything else
that drives servers) reaches it through real ssh, as it would a real machine.

    root namespace (the head)              s1                          s2
      <tag>m1 10.211.1.1/30  ======  mgmt0 10.211.1.2/30
      <tag>m2 10.211.2.1/30  =====================================  mgmt0 10.211.2.2/30
                                        ul0 10.210.0.1/24  ======  ul0 10.210.0.2/24

(The management /30s are the lowest two 10.211.K.0/30 the root namespace does not use yet:
10.211.1 and 10.211.2 unless another harness of this process is up; harnesses of different
processes must not overlap, which the integration lock ensures.)

The underlay (ul0, the stand-in for the physical network between machines) joins the two
servers directly and is invisible from the root namespace. Management (mgmtN) carries ssh and,
through ssh tunnels, the OpenFlow control channel, so cutting the underlay leaves it alone.

Each server has private /run (so /run/openvswitch and /run/sshd), /etc/openvswitch (its
conf.db), /var/log (OVS logs, and the wtmp/lastlog sshd writes) and /var/lib/fabric-emu (its
run records, run lock and compile caches: a machine's own), all bind-mounted from the
harness's temporary folder, and a sysfs of its own (/sys/class/net lists its interfaces, not
the root namespace's) with a bpf file system of its own (/sys/fs/bpf: pins per server). The
rest of the file system is shared, as a cluster shares its software: the repository, the venv,
and /tmp (so whatever a test needs on a server goes there through ssh, not through /tmp). No UTS namespace: the
servers keep this machine's host name, which /etc/hosts resolves, so sudo on them prints no
"unable to resolve host".

Teardown kills each server's PID-namespace init (the kernel then kills everything in that
namespace; the network namespace, its veths and the mounts go with the last process), deletes
the root-side management veths if still there, and removes the temporary folder. If the test
process itself dies, the servers die with it (setpriv --pdeathsig on unshare, --kill-child on
its child); only the temporary folder would then be left in /tmp. (The death signal follows
the thread that started the servers: use two_servers from a thread that outlives them, as
pytest's main thread does.)
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from fabric_emu.kernel import rps

OVS_CTL = "/usr/share/openvswitch/scripts/ovs-ctl"
STATE_DIR = Path("/var/lib/fabric-emu")
SSHD = "/usr/sbin/sshd"
UNDERLAY_IF = "ul0"
MGMT_IF = "mgmt0"
SSH_PORT = 22
READY_TIMEOUT_S = 15.0

# PID 1 of a server: says it is running (its namespaces and /proc are in place once it runs),
# then reaps whatever is orphaned inside (daemons that detach, sshd's sessions) until killed.
INIT = """\
import os, time
os.write(1, b"ready\\n")
null = os.open("/dev/null", os.O_RDWR)
for fd in (0, 1, 2):
    os.dup2(null, fd)
while True:
    try:
        os.wait()
    except ChildProcessError:
        time.sleep(0.2)
"""


def underlay_address(n: int) -> str:
    """Server n's (1 or 2) address on the underlay."""
    return f"10.210.0.{n}"


def mgmt_addresses(k: int) -> tuple[str, str]:
    """Management subnet 10.211.k.0/30: the root (head) side and the server side."""
    return f"10.211.{k}.1", f"10.211.{k}.2"


@dataclass(frozen=True)
class Server:
    """One server: name (s1, s2), underlay address, management (ssh) address, the pid of its
    PID-namespace init as seen from the root namespace, and the head's ssh config for it."""

    name: str
    address: str
    ssh_address: str
    pid: int
    ssh_config: Path
    mgmt_root_if: str

    def run(self, cmd: list[str], **kw) -> subprocess.CompletedProcess:
        """cmd inside all of the server's namespaces (network, mount, PID), from the root
        namespace: no ssh involved. Output captured as text; check=False unless given."""
        opts = {"capture_output": True, "text": True, "check": False, **kw}
        return subprocess.run(["nsenter", "-t", str(self.pid), "-n", "-m", "-p", "--", *cmd], **opts)

    def ssh_argv(self, cmd: str) -> list[str]:
        """The ssh command line that runs cmd (a shell command line) on the server, for Popen."""
        return ["ssh", "-F", str(self.ssh_config), self.name, cmd]

    def ssh(self, cmd: str, **kw) -> subprocess.CompletedProcess:
        """cmd run on the server over real ssh (BatchMode, the harness's keys and known hosts)."""
        opts = {"capture_output": True, "text": True, "check": False, "timeout": 60, **kw}
        return subprocess.run(self.ssh_argv(cmd), **opts)


def _run(cmd: list[str], **kw) -> subprocess.CompletedProcess:
    """cmd in the root namespace; raises with its output when it fails."""
    p = subprocess.run(cmd, capture_output=True, text=True, **kw)
    if p.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} failed ({p.returncode}): {p.stdout}{p.stderr}".strip())
    return p


def _in(pid: int, cmd: list[str], *ns: str) -> subprocess.CompletedProcess:
    """cmd in the given namespaces (nsenter flags, e.g. "-n", "-m") of pid; raises on failure."""
    return _run(["nsenter", "-t", str(pid), *ns, "--", *cmd])


def _link_exists(ifname: str) -> bool:
    """Whether the root namespace has an interface called ifname."""
    return subprocess.run(["ip", "link", "show", "dev", ifname], capture_output=True).returncode == 0


def _wait(pred, timeout_s: float, what: str) -> None:
    """Poll pred until true; raise naming what did not happen."""
    deadline = time.monotonic() + timeout_s
    while not pred():
        if time.monotonic() > deadline:
            raise RuntimeError(f"timed out after {timeout_s:.0f} s waiting for {what}")
        time.sleep(0.05)


def _tcp_open(address: str, port: int) -> bool:
    """Whether something accepts TCP connections at address:port (from the root namespace)."""
    try:
        with socket.create_connection((address, port), timeout=0.5):
            return True
    except OSError:
        return False


def _check_modules() -> None:
    """ovs-ctl would, on a kernel with loadable modules but no openvswitch module loaded, load
    it and, failing that, try to unload the bridge module: machine-wide effects. Load it here as
    scripts/setup.sh does, and refuse if that fails (ovs-ctl would not start ovs-vswitchd)."""
    if not Path("/proc/modules").exists() or Path("/sys/module/openvswitch").exists():
        return
    if subprocess.run(["modprobe", "openvswitch"], capture_output=True).returncode != 0:
        raise RuntimeError("this kernel loads modules but has no openvswitch module: ovs-ctl cannot start "
                           "ovs-vswitchd in the servers")


def _top_mounts_under(top: str) -> list[tuple[str, str]]:
    """(mount point, type) of the outermost mounts below top in the root mount namespace
    (/sys/fs/cgroup, not its hierarchies: a recursive bind brings those)."""
    mounts = []
    for line in Path("/proc/self/mountinfo").read_text().splitlines():
        fields = line.split()
        mountpoint, fstype = fields[4], fields[fields.index("-") + 1]
        if mountpoint.startswith(top + "/"):
            mounts.append((mountpoint, fstype))
    points = {m for m, _ in mounts}
    outer = [(m, t) for m, t in mounts if not any(m.startswith(p + "/") for p in points)]
    return list(dict.fromkeys(outer))  # a point mounted over twice: once


def _ssh_processes(config: Path) -> list[int]:
    """Pids of ssh clients started with -F config (control masters and tunnels included: a
    master keeps its command line): the harness's own path, so nobody else's."""
    pids = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            argv = (entry / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if argv and os.path.basename(argv[0].decode(errors="replace")) == "ssh":
            args = [a.decode(errors="replace") for a in argv]
            if str(config) in args or f"-F{config}" in args:
                pids.append(int(entry.name))
    return pids


def _children(pid: int) -> list[int]:
    """pid's child processes."""
    try:
        return [int(c) for c in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]
    except OSError:
        return []


class _Harness:
    """The state two_servers builds, kept so teardown can undo exactly what was done so far."""

    def __init__(self, tag: str, underlay_mtu: int) -> None:
        if not re.fullmatch(r"[A-Za-z0-9]+", tag):
            raise ValueError(f"tag {tag!r}: letters and digits only")
        self.tag = tag
        self.underlay_mtu = underlay_mtu
        self.mgmt_ifs = [f"{tag}m{n}" for n in (1, 2)]
        for name in self.mgmt_ifs:
            if len(name) > 15:
                raise ValueError(f"interface name {name!r} is longer than 15 characters (shorten the tag)")
        self.tmp: Path | None = None
        self.procs: list[subprocess.Popen] = []
        self.inits: list[int] = []
        self.created_ifs: list[str] = []
        self.mgmt_nets: list[int] = []  # k of 10.211.k.0/30, per server

    # -- set-up --

    def start(self) -> tuple[Server, Server]:
        _check_modules()
        self._check_free()
        self.tmp = Path(tempfile.mkdtemp(prefix=f"{self.tag}-"))
        client_key = self._keygen(self.tmp / "id_ed25519", "head")
        (self.tmp / "authorized_keys").write_text(Path(f"{client_key}.pub").read_text())
        for n in (1, 2):
            self._start_init(n)
        self._underlay()
        for n in (1, 2):
            self._mgmt(n)
        ssh_config = self._ssh_config(client_key)
        servers = tuple(Server(f"s{n}", underlay_address(n), self.ssh_address(n), self.inits[n - 1],
                               ssh_config, self.mgmt_ifs[n - 1]) for n in (1, 2))
        self._start_ovs(servers)
        for n in (1, 2):
            _start_sshd(self, n)
        for s in servers:
            _wait(lambda s=s: _tcp_open(s.ssh_address, SSH_PORT), READY_TIMEOUT_S, f"{s.name}'s sshd")
        checks = [subprocess.Popen(s.ssh_argv("true"), stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                   stderr=subprocess.STDOUT, text=True) for s in servers]
        for s, p in zip(servers, checks):
            out, _ = p.communicate(timeout=READY_TIMEOUT_S)
            if p.returncode != 0:
                raise RuntimeError(f"ssh -F {ssh_config} {s.name} true failed ({p.returncode}): {out}")
        return servers  # type: ignore[return-value]

    def _check_free(self) -> None:
        """Refuse, touching nothing, if the interface names are taken (teardown must only
        remove what this harness made), and pick the two lowest management subnets that no
        root-namespace address or route uses yet."""
        for name in self.mgmt_ifs:
            if _link_exists(name):
                raise RuntimeError(f"interface {name} already exists")
        addrs = _run(["ip", "-4", "-o", "addr", "show"]).stdout
        routes = _run(["ip", "-4", "route", "show"]).stdout
        used = {int(m) for m in re.findall(r"\b10\.211\.(\d+)\.", addrs + routes)}
        self.mgmt_nets = [k for k in range(1, 255) if k not in used][:2]
        if len(self.mgmt_nets) < 2:
            raise RuntimeError("no two free management subnets in 10.211.0.0/16")

    def ssh_address(self, n: int) -> str:
        """Server n's management (ssh) address."""
        return mgmt_addresses(self.mgmt_nets[n - 1])[1]

    def server_dir(self, n: int) -> Path:
        assert self.tmp is not None
        return self.tmp / f"s{n}"

    @staticmethod
    def _keygen(path: Path, comment: str) -> Path:
        _run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", comment, "-f", str(path)])
        return path

    def _start_init(self, n: int) -> None:
        """Server n's namespaces and init, then its private state folders mounted, lo up."""
        d = self.server_dir(n)
        for sub in ("run/openvswitch", "run/sshd", "run/lock", "etc-openvswitch", "log/openvswitch", "state"):
            (d / sub).mkdir(parents=True)
        os.chmod(d / "run/lock", 0o1777)
        # setpriv: if this process dies, unshare is killed, and --kill-child takes its child.
        proc = subprocess.Popen(
            ["setpriv", "--pdeathsig", "KILL", "--", "unshare", "--pid", "--fork", "--mount-proc", "--mount",
             "--net", "--propagation", "private", "--kill-child", "--", sys.executable, "-c", INIT],
            stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE, cwd="/")
        self.procs.append(proc)
        assert proc.stdout is not None
        line = proc.stdout.readline()  # the init writes it, or the pipe closes when unshare fails
        if line != b"ready\n":
            proc.kill()
            _, err = proc.communicate(timeout=10)
            raise RuntimeError(f"server s{n}'s init did not start: {err.decode(errors='replace')}")
        kids = _children(proc.pid)
        if len(kids) != 1:
            raise RuntimeError(f"unshare {proc.pid} has children {kids}, expected its init")
        init = kids[0]
        self.inits.append(init)
        nspid = Path(f"/proc/{init}/status").read_text().split("NSpid:")[1].split("\n")[0].split()
        if nspid != [str(init), "1"]:
            raise RuntimeError(f"server s{n}'s init {init} has NSpid {nspid}, expected [{init}, 1]")
        STATE_DIR.mkdir(parents=True, exist_ok=True)  # the mount point (scripts/setup.sh makes it)
        binds = [(d / "run", "/run"), (d / "etc-openvswitch", "/etc/openvswitch"), (d / "log", "/var/log"),
                 (d / "state", str(STATE_DIR))]
        if not os.path.islink("/var/run"):
            binds.append((d / "run", "/var/run"))
        for src, dst in binds:
            _in(init, ["mount", "--no-mtab", "--bind", str(src), dst], "-m")  # no utab line in root's /run
        self._private_sysfs(n)
        _in(init, ["ip", "link", "set", "lo", "up"], "-n")

    def _private_sysfs(self, n: int) -> None:
        """A sysfs of server n's own over /sys: sysfs shows the network namespace of whoever
        mounted it, so without this /sys/class/net in a server would list the root namespace's
        interfaces (and not its ul0, mgmt0 or switch ports). Mounted aside first, given the
        root's mounts under /sys again (cgroups, debugfs, ...) but a bpf file system of its own
        (pins per machine, as on separate machines), then moved over /sys."""
        init, stage = self.inits[n - 1], self.server_dir(n) / "sys"
        stage.mkdir()
        _in(init, ["mount", "--no-mtab", "-t", "sysfs", "sysfs", str(stage)], "-n", "-m")
        for mountpoint, fstype in _top_mounts_under("/sys"):
            target = str(stage) + mountpoint[len("/sys"):]
            if fstype == "bpf":
                _in(init, ["mount", "--no-mtab", "-t", "bpf", "bpf", target], "-m")
            else:
                _in(init, ["mount", "--no-mtab", "--rbind", mountpoint, target], "-m")
        _in(init, ["mount", "--no-mtab", "--move", str(stage), "/sys"], "-m")

    def _underlay(self) -> None:
        """ul0 in s1 and ul0 in s2, one veth pair created straight in the two namespaces."""
        p1, p2 = self.inits
        _run(["ip", "link", "add", "name", UNDERLAY_IF, "netns", str(p1), "mtu", str(self.underlay_mtu),
              "type", "veth", "peer", "name", UNDERLAY_IF, "netns", str(p2), "mtu", str(self.underlay_mtu)])
        for n, pid in ((1, p1), (2, p2)):
            _in(pid, ["ip", "addr", "add", f"{underlay_address(n)}/24", "dev", UNDERLAY_IF], "-n")
            _in(pid, ["ip", "link", "set", UNDERLAY_IF, "mtu", str(self.underlay_mtu), "up"], "-n")
            # As a NIC's receive-side scaling keeps a flow on one queue: a veth hands each frame to
            # the backlog of the CPU that sent it, and two backlogs can reorder a flow (kernel/rps.py)
            _in(pid, ["sh", "-c", f"for q in /sys/class/net/{UNDERLAY_IF}/queues/rx-*; do "
                      f"echo {rps.all_cpus_mask()} > $q/rps_cpus; done"], "-n", "-m")

    def _mgmt(self, n: int) -> None:
        """<tag>mN in the root namespace to mgmt0 in server n, a /30 between them."""
        root_if, pid = self.mgmt_ifs[n - 1], self.inits[n - 1]
        head, server = mgmt_addresses(self.mgmt_nets[n - 1])
        _run(["ip", "link", "add", "name", root_if, "type", "veth", "peer", "name", MGMT_IF, "netns", str(pid)])
        self.created_ifs.append(root_if)
        _run(["ip", "addr", "add", f"{head}/30", "dev", root_if])
        _run(["ip", "link", "set", root_if, "up"])
        _in(pid, ["ip", "addr", "add", f"{server}/30", "dev", MGMT_IF], "-n")
        _in(pid, ["ip", "link", "set", MGMT_IF, "up"], "-n")

    def _ssh_config(self, client_key: Path) -> Path:
        """The head's ssh config (one Host entry per server, by name and by address) and known
        hosts pre-filled with host keys generated now, so StrictHostKeyChecking holds."""
        assert self.tmp is not None
        entries, known = [], []
        for n in (1, 2):
            host_key = self._keygen(self.server_dir(n) / "ssh_host_ed25519_key", f"s{n}")
            kind, blob = Path(f"{host_key}.pub").read_text().split()[:2]
            address = self.ssh_address(n)
            known.append(f"s{n},{address} {kind} {blob}\n")
            entries.append(
                f"Host s{n} {address}\n"
                f"  HostName {address}\n"
                "  User root\n"
                f"  IdentityFile {client_key}\n"
                "  IdentitiesOnly yes\n"
                f"  UserKnownHostsFile {self.tmp / 'known_hosts'}\n"
                "  GlobalKnownHostsFile /dev/null\n"
                "  StrictHostKeyChecking yes\n"
                "  UpdateHostKeys no\n"
                "  BatchMode yes\n"
                "  LogLevel ERROR\n"
                "  ConnectTimeout 5\n"
                # a server gone (teardown) ends its clients within 15 s, tunnels included
                "  ServerAliveInterval 5\n"
                "  ServerAliveCountMax 3\n"
                # an ssh -R tunnel whose port cannot be bound fails rather than runs without it
                "  ExitOnForwardFailure yes\n")
        (self.tmp / "known_hosts").write_text("".join(known))
        config = self.tmp / "ssh_config"
        config.write_text("".join(entries))
        return config

    def _start_ovs(self, servers: tuple[Server, ...]) -> None:
        """Each server's ovsdb-server and ovs-vswitchd, as ovs-ctl starts them on a machine
        (userspace only where the kernel has no openvswitch module), both servers at once."""
        starts = [subprocess.Popen(["nsenter", "-t", str(s.pid), "-n", "-m", "-p", "--", OVS_CTL, "start",
                                    "--system-id=random"],
                                   stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                   text=True) for s in servers]
        for s, p in zip(servers, starts):
            out, _ = p.communicate(timeout=60)
            if p.returncode != 0:
                raise RuntimeError(f"ovs-ctl start on {s.name} failed ({p.returncode}): {out}")
        for s in servers:
            _wait(lambda s=s: s.run(["ovs-vsctl", "--timeout=5", "show"]).returncode == 0, READY_TIMEOUT_S,
                  f"ovs-vsctl show on {s.name}")

    # -- teardown --

    def teardown(self) -> list[str]:
        """Undo everything, whatever stage set-up reached; returns what could not be undone.
        First the head's ssh clients that use this harness's ssh config (control masters, -R
        tunnels, sessions: SIGTERM, then SIGKILL after 2 s), then each server's init (SIGKILL:
        the kernel kills the rest of its PID namespace, and the network and mount namespaces
        go with their last process), then the root ends of the management veths, by name, if
        the kernel has not removed them with their peers within 5 s, then the folder."""
        problems: list[str] = []
        if self.tmp is not None:
            config = self.tmp / "ssh_config"
            pids = _ssh_processes(config)
            for pid in pids:
                _signal(pid, signal.SIGTERM)
            deadline = time.monotonic() + 2
            while pids and time.monotonic() < deadline:
                pids = [p for p in pids if _alive(p)]
                time.sleep(0.05)
            for pid in pids:
                _signal(pid, signal.SIGKILL)
        for proc, init in zip(self.procs, self.inits + [None] * len(self.procs)):
            # The init only while it is still unshare's child (its pid cannot have been reused).
            if init is not None and init in _children(proc.pid):
                _signal(init, signal.SIGKILL)
            else:
                proc.kill()
            try:
                proc.communicate(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.communicate(timeout=10)
            if init is not None and Path(f"/proc/{init}").exists():
                problems.append(f"server init {init} still exists")
        # The root ends go with their namespaces, asynchronously; delete any left by name.
        deadline = time.monotonic() + 5
        while any(_link_exists(i) for i in self.created_ifs) and time.monotonic() < deadline:
            time.sleep(0.05)
        for name in self.created_ifs:
            if _link_exists(name):
                subprocess.run(["ip", "link", "del", "dev", name], capture_output=True)
                if _link_exists(name):
                    problems.append(f"interface {name} still exists")
        if self.tmp is not None:
            shutil.rmtree(self.tmp, ignore_errors=True)
            if self.tmp.exists():
                problems.append(f"{self.tmp} still exists")
        return problems


def _alive(pid: int) -> bool:
    """Whether pid runs (a zombie, exited but not yet reaped by its parent, does not)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return False


def _signal(pid: int, sig: int) -> None:
    """Send sig to pid, which may have exited meanwhile."""
    try:
        os.kill(pid, sig)
    except ProcessLookupError:
        pass


def _start_sshd(h: _Harness, n: int) -> None:
    """Server n's sshd: listening on its management address only, its own host key, root
    let in by the harness's client key only (never /root/.ssh), state in the temporary folder.
    A module-level function so a test can make set-up fail here."""
    d = h.server_dir(n)
    assert h.tmp is not None
    config = d / "sshd_config"
    config.write_text(
        f"ListenAddress {h.ssh_address(n)}:{SSH_PORT}\n"
        f"HostKey {d / 'ssh_host_ed25519_key'}\n"
        f"AuthorizedKeysFile {h.tmp / 'authorized_keys'}\n"
        f"PidFile {d / 'sshd.pid'}\n"
        "PermitRootLogin prohibit-password\n"
        "PubkeyAuthentication yes\n"
        "PasswordAuthentication no\n"
        "KbdInteractiveAuthentication no\n"
        "UsePAM no\n"
        "StrictModes no\n"
        "UseDNS no\n"
        "PrintMotd no\n"
        "PrintLastLog no\n"
        "X11Forwarding no\n"
        "AllowTcpForwarding yes\n"
        # Mininet Cluster Edition opens one ssh connection per node, many at once
        "MaxStartups 200:30:400\n"
        "MaxSessions 200\n"
        "ClientAliveInterval 5\n"
        "ClientAliveCountMax 3\n"
        "Subsystem sftp internal-sftp\n")
    # sshd detaches; its daemon is then reaped by the server's init.
    _in(h.inits[n - 1], [SSHD, "-f", str(config)], "-n", "-m", "-p")


@contextmanager
def two_servers(tag: str, underlay_mtu: int = 9000) -> Iterator[tuple[Server, Server]]:
    """Servers s1 and s2 (see the module's docstring), torn down on exit, also when set-up
    fails midway. Names come from tag (letters and digits, at most 13): f"fesv{os.getpid() % 100000}"."""
    h = _Harness(tag, underlay_mtu)
    try:
        servers = h.start()
        yield servers
    except BaseException:
        h.teardown()  # what it could not undo matters less than why set-up or the test failed
        raise
    problems = h.teardown()
    if problems:
        raise RuntimeError(f"two_servers({tag!r}) left: {'; '.join(problems)}")
