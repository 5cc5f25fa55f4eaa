"""Shared test helpers: markers for root-only tests and small spec builders."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent


def ovs_running() -> bool:
    if shutil.which("ovs-vsctl") is None:
        return False
    return subprocess.run(["ovs-vsctl", "--timeout=3", "show"], capture_output=True).returncode == 0


def pytest_collection_modifyitems(config, items):
    """Skip root-marked tests cleanly when not root or when Open vSwitch is not running."""
    reason = None
    if os.geteuid() != 0:
        reason = "needs root"
    elif not ovs_running():
        reason = "needs a running Open vSwitch (scripts/setup.sh starts it)"
    if reason:
        skip = pytest.mark.skip(reason=reason)
        for item in items:
            if "root" in item.keywords:
                item.add_marker(skip)


TOPO = """\
name: t
kind: leaf-spine
spines: 2
leaves: 4
hosts_per_leaf: 2
"""

EXPERIMENT = """\
name: e
topology: topo.yaml
workload: {type: allreduce, size: 1MB}
"""


@pytest.fixture
def spec_dir(tmp_path: Path) -> Path:
    """A folder with a valid topology.yaml and experiment.yaml to modify per test."""
    (tmp_path / "topo.yaml").write_text(TOPO)
    (tmp_path / "exp.yaml").write_text(EXPERIMENT)
    return tmp_path
