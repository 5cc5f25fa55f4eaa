"""The benchmarks that build fabrics or namespaces still run: each one's smoke mode (tiny
settings) exits 0 and prints its ratio lines, the figures measured against a baseline in the
same run. Numbers are not judged: one tiny round on a shared machine says nothing."""

from __future__ import annotations

import re

import pytest

from tests.conftest import run_benchmark

pytestmark = [pytest.mark.root, pytest.mark.slow]

NUMBER = r"\d+\.\d+"
# benchmark: (lines its output must have, as regular expressions; seconds it may take)
EXPECTED: dict[str, tuple[list[str], float]] = {
    "port_path": ([rf"machine_us_per_pkt: .* ratio ports/fifo = {NUMBER}$",
                   rf"ovs_us_per_pkt: .* ratio ports/fifo = {NUMBER}$"], 120),
    "nic_cpu": ([rf"foundation / engine CPU per packet: {NUMBER}x$"], 300),
    "startup": ([rf"^ratio +{NUMBER} +{NUMBER}$"], 300),
    "scale": ([r"status ok$", rf"NICs ready: .*\({NUMBER}x the bring-up\)"], 300),
    "dilation": ([rf"^ +2000 +50\.0 +ok +{NUMBER} +{NUMBER} "], 300),
    "lb_modes": ([rf"^  {mode} +mean .* cut vs ECMP .* vs alone {NUMBER}x  ok 1/1"
                  for mode in ("ecmp", "spray", "dlb")], 400),
    "program_driver": ([rf"ratio program/ring driver: NIC per packet {NUMBER}$"], 300),
    "pause_load --probe": ([rf"^  {side:10s} slowest pause max +{NUMBER} ms  median +{NUMBER} ms  runs <= 1 ms [01]/1 "
                            for side in ("earlier", "this tree")]
                           + [r"^ +most consecutive runs within 1 ms with no frame past the headroom: [01] of 1$"]
                           + [r"^ +late pauses by CPU: every CPU held \d+; one CPU held, another free \d+; no CPU held \d+$"],
                           300),
    "versus": ([rf"ratios this/earlier: OVS per packet {NUMBER}, NIC per packet {NUMBER}$"], 300),
    "versus --scale-up": ([rf"NIC CPU per fabric packet / earlier: this tree {NUMBER}, "
                           rf"this tree \+ scale-up {NUMBER}$"], 400),
    "machines": ([rf"^ratios split/whole: bring-up {NUMBER}, CPU per packet {NUMBER}, busbw {NUMBER}$"], 400),
    "wakeups": ([r"^  as is +cpu0: \d+ wake-ups, late > 0\.5 ms \d+", r"^  busy +cpu0: \d+ wake-ups",
                 r"^  busy +first CPU awake: \d+ deadlines, late > 0\.5 ms \d+, > 1 ms \d+",
                 r"^ratio busy/as is, share of wake-ups past 1 ms: "], 60),
    "wire_cost": ([rf"the wire adds -?{NUMBER} us per packet; ratio wired/plain = {NUMBER}$"], 60),
    "orphan_cost": ([rf"^ratio with/without: softirq {NUMBER}, all CPU {NUMBER}$"], 60),
    # Here only the userspace datapath (no openvswitch module); the lab VM has both.
    "datapaths": ([rf"^quickstart: both, per switch packet \(us\) +{NUMBER}",
                   r"^lowest trusted quickstart dilation +(\d+|none)"], 300),
}


@pytest.mark.parametrize("name", EXPECTED)
def test_smoke_mode_prints_its_ratios(name: str):
    lines, timeout_s = EXPECTED[name]
    bench, *options = name.split()  # "versus --scale-up": a benchmark and its options
    done = run_benchmark(bench, timeout_s, *options)
    assert done.returncode == 0, done.stdout + done.stderr
    for line in lines:
        assert re.search(line, done.stdout, re.M), f"no line matching {line!r} in:\n{done.stdout}"
