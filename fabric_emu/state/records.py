"""Run records: what a run created, so `fabric-emu clean` can remove exactly that.

Before a run creates anything it writes a record naming the bridges and interfaces it is about
to create; as processes start, their pid and kernel start time are added. Cleanup works from
these records alone (never from broad name patterns), and a pid is only signalled when its
start time still matches, so a recycled pid is never killed.
"""

from __future__ import annotations

import fcntl
import json
import os
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

STATE_DIR = Path(os.environ.get("FABRIC_EMU_STATE_DIR", "/var/lib/fabric-emu"))
RUNS_DIR = STATE_DIR / "runs"
LOCK_PATH = STATE_DIR / "run.lock"
OVS_OWNER_KEY = "fabric_emu_run"  # external_ids key on every bridge a run creates


def write_atomic(path: Path, text: str) -> None:
    """Write a file so readers see either the old or the complete new content."""
    tmp = path.with_name(f".{path.name}.tmp{os.getpid()}")
    with open(tmp, "w") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def proc_start_time(pid: int) -> int | None:
    """The kernel start time of a process (clock ticks since boot), or None if it is gone."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    # The command name may hold spaces and parentheses: split after the last ')'.
    return int(stat.rsplit(")", 1)[1].split()[19])


@dataclass
class ProcessRef:
    pid: int
    start_time: int
    role: str

    @classmethod
    def of(cls, pid: int, role: str) -> "ProcessRef | None":
        st = proc_start_time(pid)
        return cls(pid, st, role) if st is not None else None

    def alive(self) -> bool:
        return proc_start_time(self.pid) == self.start_time


@dataclass
class RunRecord:
    run_id: str
    pid: int
    pid_start_time: int
    created: float
    interfaces: list[str] = field(default_factory=list)  # root-namespace link ends
    processes: list[ProcessRef] = field(default_factory=list)
    paths: list[str] = field(default_factory=list)  # temporary files and folders
    controller_url: str = ""  # the running fabric's REST API (`fabric-emu lb` talks to it)
    live_path: str = ""  # its live manifest (fabric_emu.live.manifest: `fabric-emu top` reads it)
    metrics_url: str = ""  # its Prometheus exporter, on loopback

    @property
    def path(self) -> Path:
        return RUNS_DIR / f"{self.run_id}.json"

    @classmethod
    def new(cls, run_id: str) -> "RunRecord":
        me = os.getpid()
        return cls(run_id, me, proc_start_time(me) or 0, time.time())

    def save(self) -> None:
        RUNS_DIR.mkdir(parents=True, exist_ok=True)
        write_atomic(self.path, json.dumps(asdict(self), indent=1))

    def new_workdir(self, prefix: str = "fabric-emu-") -> Path:
        """The run's temporary folder, named in the record (saved) before it is created: a kill
        at any moment leaves no folder that no record names (the run id makes the name unique)."""
        path = Path(tempfile.gettempdir()) / f"{prefix}{self.run_id}"
        self.paths.append(str(path))
        self.save()
        path.mkdir(mode=0o700)
        return path

    def add_process(self, pid: int, role: str) -> None:
        self.add_processes([(pid, role)])

    def add_processes(self, processes: list[tuple[int, str]]) -> None:
        """Record processes (pid, role) with one save: each save is an fsync."""
        refs = [ref for pid, role in processes if (ref := ProcessRef.of(pid, role)) is not None]
        if refs:
            self.processes += refs
            self.save()

    def owner_alive(self) -> bool:
        return proc_start_time(self.pid) == self.pid_start_time

    @classmethod
    def load(cls, path: Path) -> "RunRecord":
        d = json.loads(path.read_text())
        d["processes"] = [ProcessRef(**p) for p in d.get("processes", [])]
        # Keys of other fabric-emu versions are ignored, so their runs stay cleanable.
        return cls(**{k: v for k, v in d.items() if k in cls.__dataclass_fields__})


def all_records() -> list[RunRecord]:
    if not RUNS_DIR.is_dir():
        return []
    out = []
    for p in sorted(RUNS_DIR.glob("*.json")):
        try:
            out.append(RunRecord.load(p))
        except (ValueError, TypeError, KeyError, OSError):
            continue
    return out


def live_records() -> list[RunRecord]:
    """The records of runs still running (their owner alive): one at most, by the run lock."""
    return [r for r in all_records() if r.owner_alive()]


class RunLock:
    """One fabric at a time: Mininet node names and OVS bridges are machine-wide."""

    def __init__(self) -> None:
        self._fd: int | None = None

    def acquire(self) -> bool:
        STATE_DIR.mkdir(parents=True, exist_ok=True)
        fd = os.open(LOCK_PATH, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            return False
        self._fd = fd
        return True

    def release(self) -> None:
        if self._fd is not None:
            fcntl.flock(self._fd, fcntl.LOCK_UN)
            os.close(self._fd)
            self._fd = None

    @staticmethod
    def held_by_other() -> bool:
        lock = RunLock()
        if lock.acquire():
            lock.release()
            return False
        return True
