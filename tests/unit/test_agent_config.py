import json

import pytest

from fabric_emu.nic.config import AgentConfig, ConfigError, RankInfo, WorkloadConfig


def config(**over) -> dict:
    base = AgentConfig(
        host="h1", ip="10.0.1.1", rate_bps=50e6, roce_mtu=4096,
        ranks=(RankInfo(name="h1", ip="10.0.1.1", index=0), RankInfo(name="h2", ip="10.0.1.2", index=1)),
        rank=0, workload=WorkloadConfig(size=1000, iterations=1, qps_per_peer=2), seed=1,
        stats_path="/tmp/x.json", timeout_s=10.0)
    return {**json.loads(base.to_json()), **over}


def test_round_trip():
    text = json.dumps(config())
    cfg = AgentConfig.from_json(text)
    assert cfg.ranks[1].ip == "10.0.1.2" and cfg.workload.qps_per_peer == 2
    assert AgentConfig.from_json(cfg.to_json()) == cfg


@pytest.mark.parametrize("over,field", [
    ({"roce_mtu": 4000}, "roce_mtu"),
    ({"ip": "10.0.1.300"}, "ip"),
    ({"rank": 5}, "rank"),
    ({"host": "h2"}, "rank"),
    ({"bogus": 1}, "bogus"),
    ({"rate_bps": 0}, "rate_bps"),
])
def test_bad_config_names_the_field(over, field):
    with pytest.raises(ConfigError) as exc:
        AgentConfig.from_json(json.dumps(config(**over)))
    assert str(exc.value).startswith(field)
    assert "\n" not in str(exc.value)
