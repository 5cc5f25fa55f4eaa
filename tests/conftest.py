"""Shared test helpers: markers for root-only tests and small spec builders."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent


def run_benchmark(name: str, timeout_s: float, *args: str) -> subprocess.CompletedProcess:
    """benchmarks/NAME.py in its smoke mode (and args), run as the README says (from the
    repository, with this interpreter), with this tree's packages first on the path."""
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    return subprocess.run([sys.executable, str(REPO / "benchmarks" / f"{name}.py"), "--smoke", *args], cwd=REPO,
                          env=env, capture_output=True, text=True, timeout=timeout_s)


def pytest_sessionstart(session):
    """As root, first remove what earlier runs whose process is gone left behind (exactly what
    `fabric-emu clean` removes, from their records): a test run killed midway must not fail every
    'nothing left behind' check of the next one. What this run leaves is still caught."""
    if os.geteuid() != 0:
        return
    from fabric_emu.state.cleanup import clean_stale

    removed, _ = clean_stale()
    if removed:
        print(f"\nbefore the tests, fabric-emu clean removed what dead runs left: {', '.join(removed)}",
              file=sys.stderr)


def pytest_collection_modifyitems(config, items):
    """Skip root-marked tests cleanly when not root. As root they run, and fail if Open vSwitch
    is missing: a CI whose set-up broke must not pass by skipping everything."""
    if os.geteuid() == 0:
        return
    if os.environ.get("CI"):
        raise pytest.UsageError("CI must run the tests as root (integration tests need it)")
    skip = pytest.mark.skip(reason="needs root")
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
