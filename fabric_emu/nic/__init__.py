"""Host agent: one process per host that plays the RDMA NIC and runs the workload.

Run inside the host's network namespace as `python -m fabric_emu.nic CONFIG.json`;
the config format is AgentConfig (fabric_emu.nic.config), the process protocol is in
fabric_emu.nic.main.
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
