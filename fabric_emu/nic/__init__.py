"""The emulated RDMA NICs: a few NIC engine processes serve every host's NIC of a run.

Each engine (`python -m fabric_emu.nic ENGINE.json`, started by fabric_emu.nic.launch) runs
one event loop over its hosts: their queue pairs (host_nic), RC transport (transport), DCQCN
(fabric_emu.cc.dcqcn) and the workload drivers (drivers/). Every host still has its own
config, AgentConfig (fabric_emu.nic.config), and writes its own stats file (results
folder's agents/); the process protocol is in fabric_emu.nic.main.
"""

from fabric_emu.nic.config import (
    AgentConfig,
    FlowConfig,
    FlowsConfig,
    RankInfo,
    RingConfig,
    WorkloadConfig,
)

__all__ = ["AgentConfig", "FlowConfig", "FlowsConfig", "RankInfo", "RingConfig", "WorkloadConfig"]
