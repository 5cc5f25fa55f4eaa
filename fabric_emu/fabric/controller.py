"""Start, watch and stop the os-ken controller process (python -m controller).

The controller runs in its own session so a Ctrl-C in the orchestrator's terminal reaches the
orchestrator only, which then stops the controller in order; it logs to <workdir>/controller.log.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections import deque
from dataclasses import dataclass
from pathlib import Path

LISTEN_HOST = "127.0.0.1"


def free_tcp_port(host: str = LISTEN_HOST) -> int:
    """A port the kernel just called free (another process could still take it; rarely does)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def _tail(path: Path, n: int = 20) -> str:
    try:
        with path.open(errors="replace") as f:
            return "".join(deque(f, maxlen=n))
    except FileNotFoundError:
        return "(no log)"


@dataclass
class ControllerProcess:
    proc: subprocess.Popen
    port: int
    ready_file: Path
    log_file: Path
    rest_port: int = 0  # the REST API's (controller/rest.py), on LISTEN_HOST; 0: none
    cmd: tuple[str, ...] = ()  # how it was started: respawn() starts the same again

    @property
    def rest_url(self) -> str:
        return f"http://{LISTEN_HOST}:{self.rest_port}/lb"

    @property
    def pid(self) -> int:
        return self.proc.pid

    @property
    def target(self) -> str:
        """What a switch's controller setting should be (ovs-vsctl set-controller BR TARGET)."""
        return f"tcp:{LISTEN_HOST}:{self.port}"

    def wait_listening(self, timeout: float = 120.0) -> None:
        """Return once the OpenFlow port accepts connections, so switches connect at once.
        A controller that dies meanwhile fails at once; one still booting gets two minutes: in a
        lab VM under software emulation its imports alone took 55-60 s (30 s was too little)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            self._raise_if_dead()
            try:
                with socket.create_connection((LISTEN_HOST, self.port), timeout=0.5):
                    return
            except OSError:
                time.sleep(0.05)
        raise RuntimeError(f"controller did not listen on {self.target} within {timeout:.0f}s")

    def _raise_if_dead(self) -> None:
        if self.proc.poll() is not None:
            raise RuntimeError(f"controller exited with status {self.proc.returncode}; "
                               f"last lines of {self.log_file}:\n{_tail(self.log_file)}")

    def wait_ready(self, timeout: float = 30.0) -> bool:
        """True once every planned switch is programmed; False on timeout; raises if it died."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.ready_file.exists():
                return True
            self._raise_if_dead()
            time.sleep(0.1)
        return self.ready_file.exists()

    def kill(self) -> None:
        """SIGKILL, as a crash: no goodbye to the switches (they see the TCP connection drop)."""
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait()

    def respawn(self) -> None:
        """Start the same command again (same OpenFlow and REST ports, so switches and REST
        clients find it where they did) once the old process is gone; wait_ready follows."""
        if self.proc.poll() is None:
            raise RuntimeError(f"the controller (pid {self.pid}) is still running")
        self.ready_file.unlink(missing_ok=True)
        self.proc = _spawn(list(self.cmd), self.log_file)

    def ready_info(self) -> dict:
        """The ready file's content (dpids, time, and each switch's warm start); {} if none."""
        try:
            return json.loads(self.ready_file.read_text())
        except (FileNotFoundError, ValueError):
            return {}

    def stop(self, timeout: float = 5.0) -> None:
        """SIGTERM, then SIGKILL if it does not exit in time; only this pid, never a pattern."""
        if self.proc.poll() is not None:
            return
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


def start_controller(plan_path: str | os.PathLike, workdir: str | os.PathLike,
                     port: int | None = None, lb_mode: str = "ecmp",
                     spray_entropies: int | None = None, rest: bool = True,
                     dlb: tuple[str, int, int] | None = None) -> ControllerProcess:
    """Start the controller for a plan JSON and return at once; wait_ready once switches exist.
    dlb: (the run's BPF pin folder, flowlet gap ns, quality window ns, wall clock) for the DLB
    stage's table; rest: serve the REST API on a free loopback port."""
    workdir = Path(workdir)
    workdir.mkdir(parents=True, exist_ok=True)
    port = port or free_tcp_port()
    ready_file = workdir / "controller.ready"
    ready_file.unlink(missing_ok=True)  # a stale file would claim readiness
    log_file = workdir / "controller.log"
    cmd = [sys.executable, "-m", "controller", "--plan", str(Path(plan_path).resolve()),
           "--ready-file", str(ready_file.resolve()), "--ofp-port", str(port),
           "--listen", LISTEN_HOST, "--lb-mode", lb_mode]
    if dlb is not None:
        cmd += ["--bpf-pins", dlb[0], "--dlb-inactivity-ns", str(dlb[1]), "--dlb-window-ns", str(dlb[2])]
    rest_port = free_tcp_port() if rest else 0
    if rest_port:
        cmd += ["--rest-port", str(rest_port)]
    if spray_entropies is not None:
        cmd += ["--spray-entropies", str(spray_entropies)]
    return ControllerProcess(_spawn(cmd, log_file), port, ready_file, log_file, rest_port, tuple(cmd))


def _spawn(cmd: list[str], log_file: Path) -> subprocess.Popen:
    with log_file.open("ab") as log:
        return subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                                start_new_session=True)
