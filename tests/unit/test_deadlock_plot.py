"""plots.plot_deadlock draws the persistent PFC deadlock cycles of a run's deadlocks.csv on its
fabric (plan.json, else experiment.yaml's topology, else the cycles' own switches), and nothing
when no cycle persisted."""

from __future__ import annotations

import json
from dataclasses import asdict
from pathlib import Path

import pytest

from fabric_emu.cc.deadlock import DeadlockTracker
from fabric_emu.results.folder import write_csv
from fabric_emu.results.plots import plot_deadlock, write_plots
from fabric_emu.spec.topology import TopologySpec
from fabric_emu.topo.plan import FabricPlan, Host, Link, Switch, build_plan

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
MS = 1e-3
CLOS = dict(name="t", kind="leaf-spine", spines=3, leaves=4, hosts_per_leaf=2)
# bytes bounce leaf -> spine -> leaf around 3 spines and 3 of the 4 leaves: six buffers
BOUNCE = [("spine1", "leaf3", "leaf1"), ("leaf1", "spine1", "spine2"), ("spine2", "leaf1", "leaf2"),
          ("leaf2", "spine2", "spine3"), ("spine3", "leaf2", "leaf3"), ("leaf3", "spine3", "spine1")]
RING = ["r1", "r2", "r3", "r4"]


def _deadlocks(d: Path, chain: list[tuple[str, str, str]], switches: list[str], ms_on: set[int],
               until_ms: int = 10, min_ms: float = 2) -> DeadlockTracker:
    tr = DeadlockTracker(min_duration_s=min_ms * MS)
    held = {k: 20_000 + 1_000 * i for i, k in enumerate(chain)}
    paused = {(x, z) for x, _, z in chain}
    for ms in range(1, until_ms + 1):
        tr.sample(ms * MS, *((held, paused, switches) if ms in ms_on else ({}, set(), switches)))
    tr.finish(until_ms * MS)
    write_csv(d / "deadlocks.csv", tr.rows())
    return tr


def _ring_chain() -> list[tuple[str, str, str]]:
    return [(x, RING[i - 1], RING[(i + 1) % 4]) for i, x in enumerate(RING)]


def _ring_plan() -> FabricPlan:
    """A kind the Clos layouts do not know: four switches in a ring, a host on each."""
    switches = [Switch(x, "leaf", i + 1, i + 1) for i, x in enumerate(RING)]
    hosts = [Host(f"h{i + 1}", i + 1, x, 1, f"10.0.{i + 1}.1", f"00:00:00:00:00:0{i + 1}", f"h{i + 1}-eth0")
             for i, x in enumerate(RING)]
    links = [Link(f"h{i + 1}", 0, x, 1, "host", 100, 1e9) for i, x in enumerate(RING)]
    links += [Link(x, 2, RING[(i + 1) % 4], 3, "fabric", 100, 1e9) for i, x in enumerate(RING)]
    return FabricPlan("ring", "ring", 100.0, 1500, 1_000_000, switches, hosts, links)


def _is_png(p: Path) -> bool:
    data = p.read_bytes()
    return data[:8] == PNG_MAGIC and len(data) > 5000


def test_bounce_on_a_clos_from_plan_json(tmp_path: Path):
    plan = build_plan(TopologySpec(**CLOS))
    (tmp_path / "plan.json").write_text(plan.to_json())
    _deadlocks(tmp_path, BOUNCE, [s.name for s in plan.switches], {2, 3, 4, 5, 6})
    out = tmp_path / "deadlock.png"
    assert plot_deadlock(tmp_path, out) and _is_png(out)


def test_from_experiment_yaml_and_in_write_plots(tmp_path: Path):
    (tmp_path / "experiment.yaml").write_text("name: x\ntopology: " + json.dumps({**CLOS, "dilation": "auto"}) + "\n")
    _deadlocks(tmp_path, BOUNCE, [f"spine{i}" for i in (1, 2, 3)] + [f"leaf{i}" for i in (1, 2, 3, 4)],
               {1, 2, 3, 6, 7, 8, 9, 10})  # formed twice, still there at the end
    assert [p.name for p in write_plots(tmp_path)] == ["deadlock.png"]
    assert _is_png(tmp_path / "plots" / "deadlock.png")


@pytest.mark.parametrize("with_plan", [True, False])
def test_ring_in_a_circle(tmp_path: Path, with_plan: bool):
    if with_plan:
        (tmp_path / "plan.json").write_text(json.dumps(_ring_plan().to_dict()))
    else:  # no fabric known: the cycle's own switches
        (tmp_path / "plan.json").write_text(json.dumps({"switches": [asdict(Switch("x", "leaf", 1, 1))]}))
    _deadlocks(tmp_path, _ring_chain(), RING, {3, 4, 5, 6, 7})
    out = tmp_path / "deadlock.png"
    assert plot_deadlock(tmp_path, out) and _is_png(out)


def test_nothing_drawn_without_a_persisted_cycle(tmp_path: Path):
    out = tmp_path / "deadlock.png"
    assert not plot_deadlock(tmp_path, out)  # no deadlocks.csv
    _deadlocks(tmp_path, _ring_chain(), RING, {4})  # a transient: one sample
    assert not plot_deadlock(tmp_path, out)
    write_csv(tmp_path / "deadlocks.csv", [])  # no cycle at all: an empty file
    assert not plot_deadlock(tmp_path, out)
    assert not out.exists() and write_plots(tmp_path) == []
