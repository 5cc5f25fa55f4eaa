"""A NIC engine started over ssh ends with its session (fabric_emu.nic.main.end_with_parent):
here a parent process starts a child that asks for it, and is killed; the child must get the
SIGTERM that sets its StopFlag, at once, not run on."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

CHILD = """
import sys, time
from fabric_emu.nic.main import StopFlag, end_with_parent
stop = StopFlag()
end_with_parent()
print("ready", flush=True)
t = time.monotonic()
while not stop and time.monotonic() - t < 30:
    time.sleep(0.01)
open(sys.argv[1], "w").write(f"{stop.signal} {time.monotonic() - t:.2f}")
"""

PARENT = """
import subprocess, sys, time
child = subprocess.Popen([sys.executable, "-c", sys.argv[1], sys.argv[2]], stdout=subprocess.PIPE, text=True)
child.stdout.readline()
print(child.pid, flush=True)
time.sleep(60)
"""


def test_an_engine_asked_to_end_with_its_parent_is_signalled_when_the_parent_dies(tmp_path: Path) -> None:
    out = tmp_path / "child"
    root = Path(__file__).resolve().parents[2]
    parent = subprocess.Popen([sys.executable, "-c", PARENT, CHILD, str(out)], stdout=subprocess.PIPE, text=True,
                              cwd=root, env={**os.environ, "PYTHONPATH": str(root)})
    child_pid = None
    try:
        child_pid = int(parent.stdout.readline())
        parent.kill()
        parent.wait()
        t = time.monotonic()
        while not out.exists() and time.monotonic() - t < 10:
            time.sleep(0.05)
        sig, ran = out.read_text().split()
        assert int(sig) == signal.SIGTERM and float(ran) < 5, (sig, ran)
    finally:
        parent.kill()
        if child_pid is not None and not out.exists():  # it outlived its parent: end it
            os.kill(child_pid, signal.SIGKILL)
