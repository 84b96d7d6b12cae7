"""The simulated switch side: every switch port's PMA counters and state, the switch-side faults, their
job effect, and the sweep the ``ib_switches`` source would serve (DESIGN.md "The switch side of the
fabric", "Simulator").

Ports (``switch_layout``): the leaf end of every host cable and both ends of every uplink.  A host
cable's switch end mirrors its host end (its state, its link_downed; the leaf transmits what the host
receives) and counts its own errors while a ``flaky_cable`` is on that cable (a bad cable corrupts both
directions).  An uplink carries its share of its leaf's traffic that leaves the leaf (``CROSS_SHARE``),
split over the leaf's uplinks that are up.

Faults: ``uplink_flaky`` (symbol and receive errors at both ends, the uplink carrying less),
``uplink_down`` (both ends down, link_downed counted once on each), ``spine_degraded`` (every uplink of
the spine flaky), ``switch_congestion`` (transmit wait on one switch port, no errors).  Each fault draws
from its own RNG, so none changes another's draws or the host side's.

Job effect (``leaf_factor``): a job whose traffic crosses an uplink loses that uplink's share of its
leaf's uplink bandwidth; a job crosses every uplink of a leaf where it has nodes when it also has nodes
under another leaf of that rail (``sim.job``).

``snapshot`` is the sweep as the real sweeper's ``SweepSnapshot``: the agent-side code that turns a sweep
into series (``sources.ib_switches.source.sweep_readings``) is the one the real source runs."""

from __future__ import annotations

import hashlib
import random
from typing import TYPE_CHECKING, Protocol

import numpy as np

from ..sources.ib_switches.fabric_map import Cable, Switch
from ..sources.ib_switches.parse import PortSample, PortState
from ..sources.ib_switches.sweeper import SweepSnapshot, SwitchReading
from .faults import CounterRule, evidence
from .hw import NRAILS, K
from .scenario import Fault, Scenario, switch_fault_port
from .switch_layout import SwitchLayout

if TYPE_CHECKING:
    from .link_state import Links
    from .nic_counters import NicCounters


class HostSide(Protocol):
    """What the switch side reads of the hosts' state (sim/cluster.py's ClusterState): named here, not
    imported, so the cluster, its fault state and the switches stay a one-way chain."""

    n: int
    names: list[str]
    index: dict[str, int]
    counters: NicCounters
    links: Links

    def node_guid(self, node: int, dev: int) -> str: ...

# error counters a simulated switch PMA shows (the host agent's names; sources/ib_switches/parse.py)
ERRORS = ("symbol_error", "port_rcv_errors", "link_error_recovery", "link_downed", "port_xmit_discards",
          "port_rcv_remote_physical_errors")
XMIT_DATA, RCV_DATA, XMIT_WAIT = len(ERRORS), len(ERRORS) + 1, len(ERRORS) + 2
NCOUNTERS = len(ERRORS) + 3
E = {name: i for i, name in enumerate(ERRORS)}
CROSS_SHARE = 0.5  # share of a leaf's host traffic that leaves it through its uplinks (a job over units)
LEAF, SPINE = 0, 1  # the two ends of an uplink

# what each switch-side fault does per affected switch port and second (sim.faults' rule format)
_FLAKY = (
    CounterRule("symbol_error", 20, 200),
    CounterRule("port_rcv_errors", 0.5, 5),
    CounterRule("link_error_recovery", 0.1, how="events"),
)
SWITCH_RULES: dict[str, tuple[CounterRule, ...]] = {
    "uplink_flaky": _FLAKY,
    "spine_degraded": _FLAKY,
    "flaky_cable": _FLAKY,  # the switch end of a host cable
    "switch_congestion": (CounterRule("xmit_wait", 2e5, 4e5),),  # ticks/s waiting for credits, no errors
}
# an uplink's share of its leaf's uplink bandwidth while a fault is on it: max(floor, 1 + slope * magnitude)
_CARRIES = {"uplink_flaky": (-0.25, 0.3), "spine_degraded": (-0.25, 0.3), "switch_congestion": (-0.5, 0.2)}


def switch_guid(name: str) -> int:
    """A stable switch GUID from its name (Mellanox OUI 0x0002c9, as ibsim's fabrics show)."""
    low = int.from_bytes(hashlib.sha256(name.encode()).digest()[:5], "big")
    return (0x0002C9 << 40) | low


class SimSwitches:
    def __init__(self, scenario: Scenario, cluster: HostSide, layout: SwitchLayout) -> None:
        self.scenario = scenario
        self.layout = layout
        self.cluster = cluster
        lay = layout
        nu, nh = len(lay.uplinks), len(lay.host_ports)
        seed = scenario.cluster.seed
        ident = np.random.default_rng([seed, 11])
        self.rng = np.random.default_rng([seed, 12])  # traffic noise of the switch side
        self.up = np.ones(nu, dtype=bool)
        self.uc = np.zeros((NCOUNTERS, nu, 2), dtype=np.int64)
        self.hc = np.zeros((NCOUNTERS, nh), dtype=np.int64)  # switch end of each host cable
        # a believable history: data counters of weeks, a few old link errors
        self.uc[XMIT_DATA] = ident.integers(1 << 40, 1 << 46, size=(nu, 2))
        self.uc[RCV_DATA] = ident.integers(1 << 40, 1 << 46, size=(nu, 2))
        self.uc[XMIT_WAIT] = ident.integers(0, 1 << 30, size=(nu, 2))
        self.uc[E["link_downed"]] = ident.integers(0, 2, size=(nu, 1))  # both ends saw the same downs
        self.hc[XMIT_WAIT] = ident.integers(0, 1 << 30, size=nh)
        self.hp_node = np.array([h.node for h in lay.host_ports], dtype=np.int64)
        self.hp_dev = np.array([h.dev for h in lay.host_ports], dtype=np.int64)
        self._leaf_ix = {leaf: i for i, leaf in enumerate(lay.leaves)}
        self.hp_leaf = np.array([self._leaf_ix[h.leaf] for h in lay.host_ports], dtype=np.int64)
        self.up_leaf = np.array([self._leaf_ix[u.leaf] for u in lay.uplinks], dtype=np.int64)
        # the leaf of each (node, rail NIC), -1 for none: which hosts share a leaf (a job's crossing)
        self.leaf_index = np.full((cluster.n, NRAILS), -1, dtype=np.int64)
        self.leaf_index[self.hp_node, self.hp_dev] = self.hp_leaf
        self._host_data0 = self._host_data()
        self._frng = {i: random.Random(f"fabricmon-switch-fault:{seed}:{i}") for i, f in enumerate(scenario.faults)}
        self._uplink_of = {i: self._fault_uplinks(f) for i, f in enumerate(scenario.faults)}
        self._host_of = {i: self._fault_hosts(f) for i, f in enumerate(scenario.faults)}
        self._switches = self._switch_map()
        self.sweeps = 0

    # ------------------------------------------------------------------ what each fault touches
    def _fault_uplinks(self, f: Fault) -> list[int]:
        lay = self.layout
        if f.kind == "spine_degraded":
            return [u.index for u in lay.by_spine.get(f.spine or "", ())]
        if f.kind in ("uplink_flaky", "uplink_down", "switch_congestion"):
            at = switch_fault_port(f, self.scenario.cluster)
            u = lay.uplink_at(*at) if at is not None else None
            return [u.index] if u is not None else []
        return []

    def _fault_hosts(self, f: Fault) -> list[int]:
        """Host switch ports (indexes into layout.host_ports) a fault puts switch-side evidence on."""
        lay = self.layout
        if f.kind == "switch_congestion":
            at = switch_fault_port(f, self.scenario.cluster)
            hp = lay.host_by_port.get(at) if at is not None else None
            return [lay.host_ports.index(hp)] if hp is not None else []
        if f.kind == "flaky_cable" and f.node is not None and f.rail is not None:
            ni = self.cluster.index[f.node]
            return [k for k, h in enumerate(lay.host_ports) if h.node == ni and h.dev == f.rail]
        return []

    # ------------------------------------------------------------------ state and job effect
    def uplink_up(self, t: float) -> np.ndarray:
        want = np.ones(len(self.layout.uplinks), dtype=bool)
        for i, f in enumerate(self.scenario.faults):
            if f.kind == "uplink_down" and f.active(t):
                want[self._uplink_of[i]] = False
        return want

    def leaf_factor(self, t: float) -> np.ndarray:
        """(nodes, rails): the share of its leaf's uplink bandwidth each rail NIC's traffic keeps when it
        crosses the uplinks (1 = all of it): every uplink of the leaf carries 1/M, a down one none, a
        faulted one less."""
        carries = np.where(self.uplink_up(t), 1.0, 0.0)
        for i, f in enumerate(self.scenario.faults):
            rule = _CARRIES.get(f.kind)
            if rule is not None and f.active(t):
                slope, floor = rule
                idx = self._uplink_of[i]
                carries[idx] = np.minimum(carries[idx], max(floor, 1.0 + slope * f.mag))
        per_leaf = np.zeros(len(self.layout.leaves))
        count = np.zeros(len(self.layout.leaves))
        np.add.at(per_leaf, self.up_leaf, carries)
        np.add.at(count, self.up_leaf, 1.0)
        share = np.where(count > 0, per_leaf / np.maximum(count, 1.0), 1.0)
        out = np.ones((self.cluster.n, NRAILS))
        out[self.hp_node, self.hp_dev] = share[self.hp_leaf]
        return out

    # ------------------------------------------------------------------ time
    def _host_data(self) -> np.ndarray:
        C = self.cluster.counters.C
        return C[K["pma:port_xmit_data"]][self.hp_node, self.hp_dev].copy()

    def advance(self, dt: float, t_new: float) -> None:
        """dt seconds of uplink traffic and fault evidence, after the host side advanced to ``t_new``."""
        want = self.uplink_up(t_new)
        going_down = self.up & ~want
        self.uc[E["link_downed"]] += going_down[:, None]
        self.up = want
        # what the hosts sent in dt (4-byte words), per leaf, leaves through its uplinks that are up
        now = self._host_data()
        sent = np.maximum(now - self._host_data0, 0)
        self._host_data0 = now
        per_leaf = np.zeros(len(self.layout.leaves))
        np.add.at(per_leaf, self.hp_leaf, sent.astype(np.float64))
        ups = np.zeros(len(self.layout.leaves))
        np.add.at(ups, self.up_leaf, want.astype(np.float64))
        per_uplink = np.where(want, CROSS_SHARE * per_leaf[self.up_leaf] / np.maximum(ups[self.up_leaf], 1.0), 0.0)
        noise = self.rng.uniform(0.95, 1.05, size=(len(want), 2))
        words = (per_uplink[:, None] * noise).astype(np.int64)
        self.uc[XMIT_DATA] += words
        self.uc[RCV_DATA] += words[:, ::-1]  # what one end sends the other receives
        # background transmit wait: a busy port waits now and then (as a host port does, sim.cluster)
        self.uc[XMIT_WAIT] += (dt * 1e3 * self.rng.uniform(0, 1, size=(len(want), 2)) * want[:, None]).astype(np.int64)
        self.hc[XMIT_WAIT] += (dt * 1e3 * self.rng.uniform(0, 1, size=len(self.hp_node))).astype(np.int64)
        for i, f in enumerate(self.scenario.faults):
            rules = SWITCH_RULES.get(f.kind)
            if rules is None or not f.active(t_new):
                continue
            r, since = self._frng[i], t_new - f.start
            for u in self._uplink_of[i]:
                if not self.up[u]:
                    continue
                ends = (LEAF,) if f.kind == "switch_congestion" else (LEAF, SPINE)
                for end in ends:
                    for name, v, _ in evidence(rules, r, dt, since, f.mag, False):
                        self.uc[self._row(name), u, end] += v
            for h in self._host_of[i]:
                if not self.cluster.links.up[self.hp_node[h], self.hp_dev[h]]:
                    continue
                for name, v, _ in evidence(rules, r, dt, since, f.mag, False):
                    self.hc[self._row(name), h] += v

    @staticmethod
    def _row(name: str) -> int:
        return XMIT_WAIT if name == "xmit_wait" else E[name]

    # ------------------------------------------------------------------ the sweep
    def _switch_map(self) -> dict[str, Switch]:
        lay = self.layout
        c = self.cluster
        names = list(lay.leaves) + list(lay.spines)
        out = {name: Switch(name, switch_guid(name), 0x1000 + i, 0) for i, name in enumerate(names)}
        for h in lay.host_ports:
            guid = int(c.node_guid(h.node, h.dev).replace(":", ""), 16)
            out[h.leaf].cables[h.port] = Cable(c.names[h.node], 1, "host", guid)
        for u in lay.uplinks:
            out[u.leaf].cables[u.port] = Cable(u.spine, u.spine_port, "switch", out[u.spine].guid)
            out[u.spine].cables[u.spine_port] = Cable(u.leaf, u.port, "switch", out[u.leaf].guid)
        for sw in out.values():
            sw.nports = max(sw.cables, default=0)
        return out

    def snapshot(self, ended_at: float, seconds: float) -> SweepSnapshot:
        """The sweep the real sweeper would hold now: every switch reachable, every cabled port's state and
        64-bit counters (an extended PortCounters block: 64-bit error counters too)."""
        self.sweeps += 1
        c = self.cluster
        ports: dict[str, dict[int, PortSample]] = {name: {} for name in self._switches}
        states: dict[str, dict[int, PortState]] = {name: {} for name in self._switches}
        up_state, down_state = PortState("Active", "LinkUp"), PortState("Down", "Polling")
        C = c.counters.C
        h_rcv = C[K["pma:port_rcv_data"]][self.hp_node, self.hp_dev]
        h_xmit = C[K["pma:port_xmit_data"]][self.hp_node, self.hp_dev]
        h_downed = C[K["pma:link_downed"]][self.hp_node, self.hp_dev]
        h_up = c.links.up[self.hp_node, self.hp_dev]
        hc = self.hc.T.tolist()
        for k, h in enumerate(self.layout.host_ports):
            row = hc[k]
            errors = {name: (row[j], 64) for j, name in enumerate(ERRORS)}
            errors["link_downed"] = (int(h_downed[k]), 64)  # one cable: the host end's downs are this end's
            # the leaf transmits what the host receives and receives what it sends
            ports[h.leaf][h.port] = PortSample(errors, (int(h_rcv[k]), 64), (int(h_xmit[k]), 64), (row[XMIT_WAIT], 64))
            states[h.leaf][h.port] = up_state if h_up[k] else down_state
        uc = self.uc.transpose(1, 2, 0).tolist()  # [uplink][end][counter]
        for u in self.layout.uplinks:
            st = up_state if self.up[u.index] else down_state
            for end, (sw, port) in ((LEAF, (u.leaf, u.port)), (SPINE, (u.spine, u.spine_port))):
                row = uc[u.index][end]
                ports[sw][port] = PortSample({name: (row[j], 64) for j, name in enumerate(ERRORS)},
                                             (row[XMIT_DATA], 64), (row[RCV_DATA], 64), (row[XMIT_WAIT], 64))
                states[sw][port] = st
        readings = [SwitchReading(sw, True, ports[name], states[name]) for name, sw in sorted(self._switches.items())]
        return SweepSnapshot(ended_at, seconds, readings)
