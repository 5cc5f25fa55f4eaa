"""Iteration timing and nccl-tests bandwidths from agent timestamps."""

import pytest

from fabric_emu.results.jobs import bandwidths, iteration_times


def test_iterations_end_when_the_last_rank_finishes():
    agents = {
        "h1": {"iterations": [{"start": 10.0, "end": 12.0}, {"start": 12.0, "end": 14.5}]},
        "h2": {"iterations": [{"start": 10.1, "end": 12.4}, {"start": 12.4, "end": 14.0}]},
    }
    its = iteration_times(agents)
    assert [round(i["time_s"], 3) for i in its] == [2.4, 2.1]  # 12.4-10.0, 14.5-12.4
    assert its[0]["start"] == 10.0 and its[-1]["end"] == 14.5


def test_unfinished_iteration_is_not_counted():
    agents = {"h1": {"iterations": [{"start": 0.0, "end": 1.0}, {"start": 1.0, "end": None}]},
              "h2": {"iterations": [{"start": 0.0, "end": 1.1}, {"start": 1.1, "end": 2.0}]}}
    assert len(iteration_times(agents)) == 1


def test_nccl_tests_bandwidths_in_both_worlds():
    # 8 ranks, 8 MB in 2.3 s at dilation 2000: algbw = 8e6*8/2.3 b/s, busbw = algbw * 2*7/8.
    bw = bandwidths(8_000_000, 2.3, 8, 2000)
    assert bw["algbw_emulated_gbps"] == pytest.approx(8e6 * 8 / 2.3 / 1e9)
    assert bw["busbw_emulated_gbps"] == pytest.approx(bw["algbw_emulated_gbps"] * 1.75)
    assert bw["busbw_gbps"] == pytest.approx(bw["busbw_emulated_gbps"] * 2000)


def test_ecmp_load_counts_queue_pairs_per_leaf_uplink():
    from fabric_emu.spec.topology import TopologySpec
    from fabric_emu.topo.plan import build_plan
    from fabric_emu.results.transport import ecmp_load

    plan = build_plan(TopologySpec(name="t", kind="leaf-spine", spines=2, leaves=2, hosts_per_leaf=2))
    agents = {  # h1, h2 on leaf1; h3 on leaf2
        "h1": {"send_qps": [{"uplink": "spine1"}, {"uplink": "spine1"}]},
        "h2": {"send_qps": [{"uplink": "spine2"}, {"uplink": ""}]},  # "" = stays on the leaf
        "h3": {"send_qps": [{"uplink": "spine1"}]},
    }
    assert ecmp_load(plan, agents) == {"crossing_qps": 4, "uplinks_used": 3,
                                       "max_qps_per_uplink": 2, "shared_uplinks": 1}
    assert ecmp_load(plan, {"h1": {"send_qps": [{"uplink": ""}]}}) is None
