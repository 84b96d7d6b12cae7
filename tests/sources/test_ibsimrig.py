"""The ibsim + opensm rig itself (tests/support/ibsimrig.py): the real infiniband-diags read what ibsim's
console sets, and a pulled cable is Down in PortInfo until it is relinked."""

from __future__ import annotations

import re

import pytest

from support.ibsimrig import IbSim, missing_tools, two_tier
from support.waiting import wait_until

pytestmark = [pytest.mark.integration,
              pytest.mark.skipif(bool(missing_tools()), reason=f"not installed: {missing_tools()}")]


def _lid(sim: IbSim, guid: int) -> int:
    out = sim.run("ibnetdiscover").stdout
    m = re.search(rf'^Switch\s+\d+\s+"S-{guid:016x}".*\blid (\d+)', out, re.M)
    assert m, out
    return int(m.group(1))


def test_console_counters_and_cable_pull_reach_the_real_tools(tmp_path):
    fabric = two_tier(2, 2, 2)
    leaf0 = next(g for g, n in fabric.nodes.items() if n.description.startswith("MF0;leaf-00"))
    with IbSim(fabric, tmp_path) as sim:
        lid = _lid(sim, leaf0)
        assert lid > 0  # opensm assigned LIDs
        sim.performance_set(leaf0, 3, "PortCounters.SymbolErrorCounter", 1234)
        out = sim.run("perfquery", str(lid), "3").stdout
        assert re.search(r"^SymbolErrorCounter:\.+1234$", out, re.M), out
        assert sim.port_state(lid, 3) == "Active"
        sim.unlink(leaf0, 3)
        assert sim.port_state(lid, 3) == "Down"
        sim.relink(leaf0, 3)
        # ibsim brings the port up to Initialize; opensm's next sweep makes it Active again
        assert wait_until(lambda: sim.port_state(lid, 3) == "Active", 15.0), sim.port_state(lid, 3)
    assert sim._sim is None and sim._sm is None
