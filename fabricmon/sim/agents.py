"""The real agent over a simulated node's tree: one small function, so the wiring lives in one place."""

from __future__ import annotations

from collections.abc import Callable

from ..config import (
    AgentConfig,
    EthtoolConfig,
    FabricConfigConfig,
    IbSwitchesConfig,
    InfinibandConfig,
    NvmlConfig,
    SourcesConfig,
    TransceiverConfig,
)
from .tree import NodeTree

# Deadlines are wall-clock: generous, because many simulated agents share one machine's CPUs.
SIM_SOURCE_TIMEOUT = 10.0


def sim_agent_config(tree: NodeTree, interval: float = 1.0, link_watch: float = 1.0,
                     switch_file: str | None = None) -> AgentConfig:
    """The AgentConfig a real ``fabricmon agent`` would run with over this tree; ``switch_file``: this node
    sweeps the switches, from the simulator's fake sweep file."""
    t = SIM_SOURCE_TIMEOUT
    switches = IbSwitchesConfig(enabled=True, backend=f"fake:{switch_file}") if switch_file else IbSwitchesConfig()
    return AgentConfig(
        sysfs_root=tree.sys, ethtool_dir=tree.ethtool_dir, node_name=tree.name, interval=interval,
        link_watch_interval=link_watch,
        nvml=f"fake:{tree.nvml_file}", listen="127.0.0.1:0",
        sources=SourcesConfig(infiniband=InfinibandConfig(timeout=t), ethtool=EthtoolConfig(timeout=t),
                              nvml=NvmlConfig(timeout=t), fabric_config=FabricConfigConfig(timeout=t),
                              transceiver=TransceiverConfig(enabled=True, interval=30.0), ib_switches=switches),
    )


def make_sim_agent(tree: NodeTree, clock: Callable[[], float], interval: float = 1.0, link_watch: float = 1.0,
                   switch_file: str | None = None):
    """An ``agent.runtime.Agent`` (``.poller``, ``.start_http()``, ``.stop()``) polling ``tree`` on the
    simulated clock.  The host source is left out by the runtime (the tree is not ``/sys``)."""
    from ..agent.runtime import build_agent

    # The tree lives on tmpfs and is written by this process: no read can block, so the sources
    # run inline (no deadline threads), which is most of a simulated poll's overhead.
    return build_agent(sim_agent_config(tree, interval, link_watch, switch_file), clock=clock, inline_sources=True)
