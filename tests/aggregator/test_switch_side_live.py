"""End to end on a simulated fabric: ibsim + opensm (tests/support/ibsimrig.py), the real agent with
``--ib-switches`` sweeping it through the real infiniband-diags and streaming to the real aggregator
(gRPC on 127.0.0.1), whose topology is ``fabricmon topology import`` of ibnetdiscover run on that fabric.
Faults injected on ibsim's console; alerts read back from the aggregator's /api/incidents."""

from __future__ import annotations

import datetime as dt
import time

import pytest

from fabricmon.cli import main
from support.agentrig import metric
from support.aggrig import Aggregator
from support.ibsimrig import IbSim, SweeperAgent, missing_tools, two_tier
from support.waiting import wait_until

pytestmark = [pytest.mark.integration,
              pytest.mark.skipif(bool(missing_tools()), reason=f"not installed: {missing_tools()}")]

SWEEPER = "node-000"  # ibsim attaches the tools to the first CA: node-000 sweeps; no other host runs an agent
HEALTH = 1.0


def _guid(fabric, name: str) -> int:
    return next(g for g, n in fabric.nodes.items() if n.kind == "switch" and f";{name}:" in n.description)


def _ts(text: str) -> float:
    return dt.datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()


def _climb(sim: IbSim, agent: SweeperAgent, guid: int, switch: str, port: int, agg: Aggregator, found,
           what: str, step: int = 300, timeout: float = 60.0) -> dict:
    """Raise the port's SymbolErrorCounter by ``step`` each time the agent has exported the last value, until
    the aggregator shows the incident ``found`` picks."""
    deadline = time.monotonic() + timeout
    value = int(metric(agent.metrics(), "fabricmon_switch_port_errors_total", switch=switch, port=str(port),
                       counter="symbol_error") or 0)
    while time.monotonic() < deadline:
        hit = next((i for i in agg.incidents("open") if found(i)), None)
        if hit is not None:
            return hit
        value = min(value + step, 65535)
        sim.performance_set(guid, port, "PortCounters.SymbolErrorCounter", value)
        wait_until(lambda want=value: metric(agent.metrics(), "fabricmon_switch_port_errors_total", switch=switch,
                                             port=str(port), counter="symbol_error") == want, 20.0,
                   f"{what}: value {value}")
    raise AssertionError(f"no incident for {what}: {agg.incidents('all')}")


def test_uplink_and_host_cable_incidents_from_the_switch_side(tmp_path):
    fabric = two_tier(2, 2, 2)
    with IbSim(fabric, tmp_path / "sim") as sim:
        ibnet = tmp_path / "fabric.ibnet"
        ibnet.write_text(sim.run("ibnetdiscover").stdout)
        topo = tmp_path / "topology.yaml"
        assert main(["topology", "import", "--ibnetdiscover", str(ibnet), "-o", str(topo)]) == 0
        agg = Aggregator(tmp_path, {"insecure": True, "switch_sources": [SWEEPER]}, topology=topo.read_text())
        try:
            with SweeperAgent(sim, tmp_path / "agent", health=HEALTH, full=HEALTH, node=SWEEPER,
                              aggregator=f"127.0.0.1:{agg.grpc}") as agent:
                wait_until(lambda: metric(agent.metrics(), "fabricmon_switch_port_up", switch="leaf-00",
                                          port="3") == 1, 60.0, "the first sweep")
                # symbol errors climbing on leaf-00's uplink to spine-00
                inc = _climb(sim, agent, _guid(fabric, "leaf-00"), "leaf-00", 3, agg,
                             lambda i: i["component"] == "leaf-00/p3", "uplink leaf-00/p3")
                assert (inc["alertname"], inc["component_type"]) == ("FabricLinkErrors", "uplink")
                assert inc["labels"]["spine"] == "spine-00" and inc["labels"]["spine_port"] == "1"
                assert "node" not in inc["labels"]
                # errors at the leaf end of node-003's cable; node-003 runs no agent
                inc = _climb(sim, agent, _guid(fabric, "leaf-01"), "leaf-01", 2, agg,
                             lambda i: i["component"] == "node-003/mlx5_0/1", "host cable of node-003")
                assert (inc["alertname"], inc["component_type"]) == ("FabricLinkErrors", "link")
                # leaf-00's uplink to spine-01 pulled: FabricLinkDown on it within two sweeps
                sweep_s = metric(agent.metrics(), "fabricmon_switch_sweep_seconds") or 0.0
                pulled_at = time.time()
                sim.unlink(_guid(fabric, "leaf-00"), 4)
                down = wait_until(lambda: next((i for i in agg.incidents("open") if i["component"] == "leaf-00/p4"),
                                               None), 60.0, "FabricLinkDown on leaf-00/p4")
                assert (down["alertname"], down["component_type"]) == ("FabricLinkDown", "uplink")
                assert "node" not in down["labels"]
                # sample time: the sweep that started after the pull (at most one health interval plus the
                # sweep in flight) and the agent's next poll (0.5 s) that carried it
                slowest = max(sweep_s, metric(agent.metrics(), "fabricmon_switch_sweep_seconds") or 0.0)
                assert _ts(down["first_seen"]) - pulled_at <= 2 * (HEALTH + slowest) + 1.0
                kinds = {(i["component_type"], i["component"]) for i in agg.incidents("all")}
                assert {k for k, _ in kinds} <= {"uplink", "link"}, kinds  # no node, NIC, GPU or rail incident
        finally:
            agg.close()
