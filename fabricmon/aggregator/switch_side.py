"""Switch-side evidence at the aggregator (DESIGN.md "The switch side of the fabric").

A node listed in ``auth.switch_sources`` streams the ``ib_switches`` sweep: every switch port's PMA
counters, its PortInfo state and the far end of its cable (``fabricmon_switch_port_info``).  From any
other node those series are ignored and counted (a stream otherwise speaks only for its own node).

Each switch port's evidence goes to the component its cable is:

- a leaf-to-spine cable is an ``uplink`` (``<leaf>/p<port>``, labels ``leaf``, ``spine``, ``spine_port``,
  no ``node``), whichever end counts the errors; its state (``fabricmon_switch_port_up``) makes it up or
  down.  Uplinks are ``LinkState``s judged by the link detectors (``evaluate_link``: the same
  FabricLinkDown / Flapping / Errors / Congestion), and never fold into a leaf;
- the leaf end of a host cable is more evidence on that host's link (``node/device/port``, found by the
  topology's ``leaf_port``), so one cable is one incident whichever end counts, and a host whose agent
  does not run still gets its cable's incident.

Both ends of a cable count a link going down or retraining (LinkDownedCounter, LinkErrorRecoveryCounter):
one end says it, an uplink's leaf end, a host cable's host while its agent streams.  Errors are each
end's own (each receiver counts what it receives) and add up.  Transmit wait on a switch port is
congestion evidence on its cable; FabricCongestion then names the port that waits (``name_waiting``).

A leaf is a switch the topology lists as one, or one whose ports reach hosts.  Evidence arrives at the
sweep's cadence, not the poll's: ``interval`` (measured from the sweeps' ends) widens the windows of the
components fed only from here, as a node's poll interval widens its own."""

from __future__ import annotations

from ..batch import NodeBatch
from ..components import Component, Kind, spine, uplink
from ..topology import Topology
from .config import DetectionSettings
from .incidents import Finding, Relation
from .ingest import PMA_ERRORS
from .state import Event, LinkEvent, LinkState, Registry, build_link_state

ERRORS = "fabricmon_switch_port_errors_total"
XMIT_WAIT = "fabricmon_switch_port_transmit_wait_total"
PORT_UP = "fabricmon_switch_port_up"
PORT_INFO = "fabricmon_switch_port_info"
SWEEP_SECONDS = "fabricmon_switch_sweep_seconds"
DELTA_FAMILIES = frozenset({ERRORS, XMIT_WAIT})
GAUGE_FAMILIES = frozenset({PORT_UP, PORT_INFO, SWEEP_SECONDS})
FAMILIES = DELTA_FAMILIES | GAUGE_FAMILIES
INTERVAL_RANGE = (1.0, 600.0)
SPINE_DEGRADED = "FabricSpineDegraded"
CONGESTION = "FabricCongestion"
# what makes an uplink bad for the spine fold (congestion is not a broken cable)
BAD_UPLINK = frozenset({"FabricLinkDown", "FabricLinkFlapping", "FabricLinkErrors", "FabricLinkDegraded"})

# events both ends of a cable count once each for one happening (a link going down, a retraining)
_ONE_END = frozenset({int(LinkEvent.DOWNED), int(LinkEvent.RECOV)})
# PortInfo as the host detectors read it: ACTIVE/LinkUp, DOWN/Polling
_UP, _DOWN = (4, 5), (1, 2)


def _event_of(counter: str) -> int | None:
    if counter in PMA_ERRORS:
        return LinkEvent.ERR
    if counter == "link_error_recovery":
        return LinkEvent.RECOV
    if counter == "link_downed":
        return LinkEvent.DOWNED
    return None


class SwitchSide:
    def __init__(self, topology: Topology, settings: DetectionSettings, cluster: str, registry: Registry) -> None:
        self._topology = topology
        self.settings = settings
        self.cluster = cluster
        self.registry = registry
        self.sources: frozenset[str] = frozenset()  # auth.switch_sources (service.build_engine sets it)
        self.refused_batches = 0  # batches with switch-side series from a node not listed
        self.interval = 1.0
        self._sweep_ts: float | None = None
        self._cables: dict[tuple[str, int], tuple[str, int, str]] = {}  # (switch, port) -> (peer, port, type)
        self._with_hosts: set[str] = set()
        self._ends: dict[tuple[str, int], LinkState | None] = {}  # (switch, port) -> its cable's state
        self._uplinks: dict[tuple[str, int], LinkState] = {}  # (leaf, port) -> uplink state
        self._own_host_links: dict[tuple[str, str, str], LinkState] = {}  # host links of nodes with no agent
        # component -> (the switch port that waited last, at, ticks): FabricCongestion names the port
        self._waits: dict[Component, tuple[str, float, float]] = {}

    # ------------------------------------------------------------------ trust
    def carries(self, batch: NodeBatch) -> bool:
        """True when ``batch`` has switch-side series and its node may speak for switches; a batch with them
        from any other node is counted and its switch-side series are ignored."""
        if not any(d.family in DELTA_FAMILIES for d in batch.deltas) and \
                not any(g.family in GAUGE_FAMILIES for g in batch.gauges):
            return False
        if batch.node in self.sources:
            return True
        self.refused_batches += 1
        return False

    # ------------------------------------------------------------------ ingest
    def ingest(self, batch: NodeBatch) -> None:
        ts = batch.ts
        touched: set[LinkState] = set()
        for g in batch.gauges:
            if g.family not in GAUGE_FAMILIES:
                continue
            lab = dict(g.labels)
            if g.family == SWEEP_SECONDS:
                if self._sweep_ts is not None and ts > self._sweep_ts:
                    self.interval = min(max(ts - self._sweep_ts, INTERVAL_RANGE[0]), INTERVAL_RANGE[1])
                self._sweep_ts = ts
                continue
            key = (lab.get("switch", ""), int(lab.get("port", "0") or 0))
            if g.family == PORT_INFO:
                cable = (lab.get("peer", ""), int(lab.get("peer_port", "0") or 0), lab.get("peer_type", ""))
                if self._cables.get(key) != cable:
                    self._cables[key] = cable
                    if cable[2] == "host":
                        self._with_hosts.add(key[0])
                    self._ends.clear()  # re-resolved on next use: a leaf may have become known
                continue
            link = self._end(key)
            if link is None or link.id.kind is not Kind.UPLINK:
                continue  # a host cable's state is its host agent's to report
            link.state, link.phys = _UP if g.value >= 1 else _DOWN
            touched.add(link)
        for d in batch.deltas:
            if d.reset or not d.delta or d.family not in DELTA_FAMILIES:
                continue
            lab = dict(d.labels)
            kind = LinkEvent.XWAIT if d.family == XMIT_WAIT else _event_of(lab.get("counter", ""))
            if kind is None:
                continue
            if kind == LinkEvent.XWAIT and d.delta < 0.2 * self.interval * self.settings.xmit_wait_rate_min:
                continue  # a port waits now and then: keep only what could matter (as the host ingest does)
            switch = lab.get("switch", "")
            link = self._end((switch, int(lab.get("port", "0") or 0)))
            if link is None:
                continue
            if kind in _ONE_END and self._other_end_says(link, switch, ts):
                continue
            if kind == LinkEvent.XWAIT:
                self._waits[link.id] = (f"{switch} port {lab.get('port', '')}", ts, d.delta)
            ev: Event = (ts, int(kind), d.delta, 0)
            link.ev.append(ev)
            self.registry.active_links.add(link)
        for link in touched:
            self._state_changed(link, ts)

    def _other_end_says(self, link: LinkState, switch: str, ts: float) -> bool:
        """A link going down or retraining is counted by both ends of its cable (LinkDownedCounter and
        LinkErrorRecoveryCounter at each end count the same event): one end says it.  An uplink's leaf end
        (as it says the state); a host cable's host, while its agent streams (else the switch end is all
        there is)."""
        if link.id.kind is Kind.UPLINK:
            return switch != link.id.leaf
        ns = self.registry.nodes.get(link.node)
        return ns is not None and ts - ns.last_heard <= 3 * max(ns.interval, self.interval)

    def _state_changed(self, link: LinkState, ts: float) -> None:
        down = link.note_state(ts)  # as the ingest stage does for a host port's state
        if down or link.trans:
            self.registry.active_links.add(link)

    @property
    def topology(self) -> Topology:
        """The registry's (a topology reload swaps it there): what ports resolve to is worked out again."""
        if self.registry.topology is not self._topology:
            self._topology = self.registry.topology
            self._ends.clear()
        return self._topology

    # ------------------------------------------------------------------ which component a port is
    def _is_leaf(self, switch: str) -> bool:
        return switch in self.topology.leaf_spines or switch in self._with_hosts or \
            switch in set(self.topology.leaves())

    def _end(self, key: tuple[str, int]) -> LinkState | None:
        _ = self.topology  # after a topology reload, the resolved ends are worked out again
        if key in self._ends:
            return self._ends[key]
        link = self._resolve(key)
        self._ends[key] = link
        return link

    def _resolve(self, key: tuple[str, int]) -> LinkState | None:
        cable = self._cables.get(key)
        if cable is None:
            return None
        switch, port = key
        peer, peer_port, peer_type = cable
        if peer_type == "host":
            found = self.topology.nic_on_leaf_port(switch, port)
            if found is None:
                return None
            node, nic = found
            return self._host_link(node, nic.device, str(nic.port))
        here, there = self._is_leaf(switch), self._is_leaf(peer)
        if here and not there:
            return self._uplink(switch, port, peer, peer_port)
        if there and not here:
            return self._uplink(peer, peer_port, switch, port)
        return None  # spine-to-core and leaf-to-leaf cables: not modelled yet

    def _uplink(self, leaf: str, port: int, spine: str, spine_port: int) -> LinkState:
        link = self._uplinks.get((leaf, port))
        if link is None:
            link = LinkState("", "", str(port), "", None, None, "", -1, None, None, self.cluster)
            link.id = uplink(leaf, port, spine, spine_port)
            link.labels = link.id.labels(self.cluster)
            link.leaf = None  # an uplink never folds into its leaf (FabricSpineDegraded is the spine's)
            link.nic = link.id
            self._uplinks[(leaf, port)] = link
        return link

    def _host_link(self, node: str, device: str, port: str) -> LinkState | None:
        ns = self.registry.nodes.get(node)
        if ns is not None:  # the host's agent is (or was) connected: its own link state
            return self.registry.link(ns, device, port, None)
        key = (node, device, port)
        link = self._own_host_links.get(key)
        if link is None:
            link = build_link_state(self.topology, node, device, port, "", None, self.cluster)
            if link is None:
                return None
            link.leaf = None  # evidence from the switch end alone does not fold a leaf
            self._own_host_links[key] = link
        return link

    def name_waiting(self, findings: list[Finding], now: float) -> None:
        """FabricCongestion on a cable whose switch port waited names that port: the port that waits is
        where the congestion is (its receiver is slow or its downstream backs up), whichever end the
        cable's component is named by."""
        horizon = now - 3 * self.interval
        for f in findings:
            if f.alertname != CONGESTION or not (f.fire or f.keep):
                continue
            wait = self._waits.get(f.component)
            if wait is None or wait[1] < horizon:
                continue
            line = f"transmit wait at switch port {wait[0]}: {wait[2] / self.interval:.0f} ticks/s"
            if line not in f.evidence:
                f.evidence.append(line)
        for c in [c for c, w in self._waits.items() if w[1] < horizon]:
            del self._waits[c]

    def uplink_states(self) -> list[LinkState]:
        return list(self._uplinks.values())

    # ------------------------------------------------------------------ the spine fold
    def fold_spines(self, findings: list[Finding]) -> tuple[list[Finding], list[Relation]]:
        """``FabricSpineDegraded`` (critical) when one spine's uplinks to at least max(2, leaf_fold_min_links)
        leaves are bad in the same tick; those uplink findings become its evidence (related to it), as a
        leaf's links are the leaf's."""
        by_spine: dict[str, dict[str, list[Finding]]] = {}
        for f in findings:
            c = f.component
            if c.kind is Kind.UPLINK and c.spine and f.alertname in BAD_UPLINK and (f.fire or f.keep):
                by_spine.setdefault(c.spine, {}).setdefault(c.leaf, []).append(f)
        need = max(2, self.settings.leaf_fold_min_links)
        out: list[Finding] = []
        relations: list[Relation] = []
        for name, leaves in sorted(by_spine.items()):
            if len(leaves) < need:
                continue
            firing = sum(1 for fs in leaves.values() if any(f.fire for f in fs))
            sp = spine(name)
            uplinks = sorted({f.component.id for fs in leaves.values() for f in fs})
            labels = {**sp.labels(self.cluster), "spine": name}
            out.append(Finding(SPINE_DEGRADED, sp, labels,
                               [f"uplinks of {name} to {len(leaves)} leaves bad at once",
                                "uplinks: " + ", ".join(uplinks[:6]) + (f" (+{len(uplinks) - 6} more)"
                                                                       if len(uplinks) > 6 else "")],
                               fire=firing >= need, keep=True))
            relations.extend(Relation((f.alertname, f.component), (SPINE_DEGRADED, sp))
                             for fs in leaves.values() for f in fs)
        return out, relations

    def stats(self) -> dict[str, float]:
        return {"refused_batches": self.refused_batches, "uplinks": len(self._uplinks), "interval": self.interval}
