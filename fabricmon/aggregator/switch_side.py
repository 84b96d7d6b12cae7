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

Sharded (``shard.units``): the sweeper streams to every shard, and each keeps only the ports whose component
it owns: an uplink by its leaf's units, a host cable by its host's; the rest are counted
(``ports_elsewhere``).  ``FabricSpineDegraded`` then needs the leaves other shards hold: ``fold_spines``
counts their open bad-uplink alerts (remote_evidence.py reads them from Alertmanager) towards a spine that
has a bad uplink here.

Ethernet switches (``gnmi_switches``) name their ports (``Ethernet1/1``) and send no cable map: a port the
topology's ``leaf_port`` names is that host's cable.  Their interface errors (in_errors, fcs,
fec_uncorrectable) are link errors; discards, queue drops and ECN marks are congestion; per-priority PFC
frames are pause evidence seen from the switch end (the switch receiving pauses on a host cable is the host
emitting them), so ``FabricPFCStorm`` blames the port that emits pauses and receives none from either end;
PFC watchdog storms are storm events.  The PFC and ECN settings of each port go to ``switch_lossless``.

Both ends of a cable count a link going down or retraining (LinkDownedCounter, LinkErrorRecoveryCounter):
one end says it, an uplink's leaf end, a host cable's host while its agent streams.  Errors are each
end's own (each receiver counts what it receives) and add up.  Transmit wait on a switch port is
congestion evidence on its cable; FabricCongestion then names the port that waits (``name_waiting``).

A leaf is a switch the topology lists as one, or one whose ports reach hosts.  Evidence arrives at the
sweep's cadence, not the poll's: ``interval`` (measured from the sweeps' ends) widens the windows of the
components fed only from here, as a node's poll interval widens its own."""

from __future__ import annotations

from collections.abc import Iterable

from ..batch import NodeBatch
from ..components import Component, Kind, spine, uplink
from ..topology import Topology
from .config import DetectionSettings
from .incidents import Finding, Relation
from .ingest import PMA_ERRORS
from .remote_evidence import RemoteIncident, leaf_units
from .state import Event, LinkEvent, LinkState, Registry, build_link_state
from .switch_lossless import FAMILIES as LOSSLESS_FAMILIES
from .switch_lossless import SwitchLossless

ERRORS = "fabricmon_switch_port_errors_total"
XMIT_WAIT = "fabricmon_switch_port_transmit_wait_total"
PORT_UP = "fabricmon_switch_port_up"
PORT_INFO = "fabricmon_switch_port_info"
SWEEP_SECONDS = "fabricmon_switch_sweep_seconds"
# gNMI (Ethernet switches)
PFC_FRAMES = "fabricmon_switch_pfc_frames_total"
PFCWD_STORMS = "fabricmon_switch_pfc_watchdog_storms_total"
QUEUE_DROPS = "fabricmon_switch_queue_dropped_packets_total"
ECN_MARKED = "fabricmon_switch_ecn_marked_packets_total"
GNMI_INTERVAL = "fabricmon_switch_gnmi_sample_interval_seconds"
DELTA_FAMILIES = frozenset({ERRORS, XMIT_WAIT, PFC_FRAMES, PFCWD_STORMS, QUEUE_DROPS, ECN_MARKED})
GAUGE_FAMILIES = frozenset({PORT_UP, PORT_INFO, SWEEP_SECONDS, GNMI_INTERVAL}) | LOSSLESS_FAMILIES
FAMILIES = DELTA_FAMILIES | GAUGE_FAMILIES
INTERVAL_RANGE = (1.0, 600.0)
SPINE_DEGRADED = "FabricSpineDegraded"
CONGESTION = "FabricCongestion"
SWITCH_END = "switch_end"  # label of a host cable's alerts: its swept switch end, ``<switch>/p<port>``
# what makes an uplink bad for the spine fold (congestion is not a broken cable)
BAD_UPLINK = frozenset({"FabricLinkDown", "FabricLinkFlapping", "FabricLinkErrors", "FabricLinkDegraded"})

# events both ends of a cable count once each for one happening (a link going down, a retraining)
_ONE_END = frozenset({int(LinkEvent.DOWNED), int(LinkEvent.RECOV)})
# PortInfo as the host detectors read it: ACTIVE/LinkUp, DOWN/Polling
_UP, _DOWN = (4, 5), (1, 2)
# Ethernet interface counters (gnmi_switches): a bad cable or optic, or a dropping (congested) port
ETH_LINK_ERRORS = frozenset({"in_errors", "fcs", "fec_uncorrectable"})
ETH_DISCARDS = frozenset({"in_discards", "out_discards"})
# A drop on a lossless fabric weighs as this many ECN marks in the congestion evidence (CNP events): marks
# come by the thousand per second under load, a lossless queue should drop nothing at all
DROP_WEIGHT = 100.0
# XOFF frames a switch port sends per second while it holds its peer paused: it re-sends before the pause
# expires, about every half pause quantum (65535 quanta of 512 bit times are 84 us at 400 Gb/s, refreshed
# every ~42 us: ~24k/s).  Frames over this are the share of time paused, the evidence the PFC detector reads.
XOFF_FRAMES_PER_PAUSED_SECOND = 24_000.0
PAUSE_MIN_SHARE = {"tx": 0.05, "rx": 0.02}  # background pauses: as the host ingest skips them


def _event_of(counter: str) -> int | None:
    if counter in PMA_ERRORS or counter in ETH_LINK_ERRORS:
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
        # ports as their label spells them: "17" (InfiniBand) or "Ethernet1/1" (gNMI)
        self._cables: dict[tuple[str, str], tuple[str, str, str]] = {}  # (switch, port) -> (peer, port, type)
        self._with_hosts: set[str] = set()
        self._ends: dict[tuple[str, str], LinkState | None] = {}  # (switch, port) -> its cable's state
        self._uplinks: dict[tuple[str, str], LinkState] = {}  # (leaf, port) -> uplink state
        self.lossless = SwitchLossless()  # the PFC/ECN settings of Ethernet switch ports
        self._own_host_links: dict[tuple[str, str, str], LinkState] = {}  # host links of nodes with no agent
        # component -> (the switch port that waited last, at, ticks): FabricCongestion names the port
        self._waits: dict[Component, tuple[str, float, float]] = {}
        self._leaf_units: dict[str, frozenset[int]] | None = None  # sharded: leaf -> its units (topology)
        self._elsewhere: set[tuple[str, str]] = set()  # sharded: switch ports whose component another shard owns

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
            if g.family in LOSSLESS_FAMILIES:
                self.lossless.note(g.family, lab, g.value)
                continue
            if g.family == GNMI_INTERVAL:  # gNMI samples arrive every SAMPLE interval, whatever the poll's
                self.interval = min(max(g.value, INTERVAL_RANGE[0]), INTERVAL_RANGE[1])
                continue
            if g.family == SWEEP_SECONDS:
                if self._sweep_ts is not None and ts > self._sweep_ts:
                    self.interval = min(max(ts - self._sweep_ts, INTERVAL_RANGE[0]), INTERVAL_RANGE[1])
                self._sweep_ts = ts
                continue
            key = (lab.get("switch", ""), lab.get("port", ""))
            if g.family == PORT_INFO:
                cable = (lab.get("peer", ""), lab.get("peer_port", ""), lab.get("peer_type", ""))
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
            switch = lab.get("switch", "")
            link = self._end((switch, lab.get("port", "")))
            if link is None:
                continue
            ev = self._event(d.family, lab, d.delta, ts, link, switch)
            if ev is None:
                continue
            kind = ev[1]
            if kind == LinkEvent.XWAIT and d.delta < 0.2 * self.interval * self.settings.xmit_wait_rate_min:
                continue  # a port waits now and then: keep only what could matter (as the host ingest does)
            if kind in _ONE_END and self._other_end_says(link, switch, ts):
                continue
            if kind == LinkEvent.XWAIT:
                self._waits[link.id] = (f"{switch} port {lab.get('port', '')}", ts, d.delta)
            link.ev.append(ev)
            self.registry.active_links.add(link)
        for link in touched:
            self._state_changed(link, ts)

    def _event(self, family: str, lab: dict[str, str], delta: float, ts: float, link: LinkState,
               switch: str) -> Event | None:
        """The link event one switch-side counter delta is, or None (nothing the detectors read)."""
        if family == XMIT_WAIT:
            return (ts, int(LinkEvent.XWAIT), delta, 0)
        if family == ERRORS:
            counter = lab.get("counter", "")
            if counter in ETH_DISCARDS:
                return (ts, int(LinkEvent.CNP), delta * DROP_WEIGHT, 0)
            kind = _event_of(counter)
            return None if kind is None else (ts, int(kind), delta, 0)
        if family == QUEUE_DROPS:
            return (ts, int(LinkEvent.CNP), delta * DROP_WEIGHT, 0)
        if family == ECN_MARKED:
            return (ts, int(LinkEvent.CNP), delta, 0)
        if family == PFCWD_STORMS:
            return (ts, int(LinkEvent.STORM), delta, 0)
        if family == PFC_FRAMES:
            try:
                prio = int(lab.get("priority", ""))
            except ValueError:
                return None
            direction = lab.get("direction", "")
            if direction not in PAUSE_MIN_SHARE:
                return None
            # the link's own end is the host NIC (a host cable) or the leaf (an uplink): seen from the far
            # end, what the switch port receives is what the own end emits
            own_end = link.id.kind is Kind.UPLINK and link.id.leaf == switch
            tx = (direction == "tx") == own_end
            paused = delta / (link.xoff_full_rate or XOFF_FRAMES_PER_PAUSED_SECOND)
            if paused < PAUSE_MIN_SHARE["tx" if tx else "rx"] * self.interval:
                return None
            return (ts, int(LinkEvent.PAUSE_TX if tx else LinkEvent.PAUSE_RX), paused, prio)
        return None

    def lossless_findings(self, now: float) -> list[Finding]:
        """pfc_mismatch / ecn_mismatch between each host's RoCE priority and its switch port (switch_lossless)."""
        return self.lossless.findings(self.topology, self.settings, self.cluster, now)

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
            self._leaf_units = None
        return self._topology

    def _owns_leaf(self, leaf: str) -> bool:
        """Sharded: this shard owns the leaf's units (a leaf the topology does not place: no shard)."""
        units = self.registry.shard_units
        if units is None:
            return True
        if self._leaf_units is None:
            self._leaf_units = leaf_units(self.topology)
        return bool(self._leaf_units.get(leaf, frozenset()) & units)

    # ------------------------------------------------------------------ which component a port is
    def _is_leaf(self, switch: str) -> bool:
        return switch in self.topology.leaf_spines or switch in self._with_hosts or \
            switch in set(self.topology.shape.leaves())

    def _end(self, key: tuple[str, str]) -> LinkState | None:
        _ = self.topology  # after a topology reload, the resolved ends are worked out again
        if key in self._ends:
            return self._ends[key]
        link = self._resolve(key)
        self._elsewhere.discard(key)
        if link is not None and not self._owned(link):
            self._elsewhere.add(key)
            link = None  # another shard's: it gets the same stream and keeps this port
        self._ends[key] = link
        return link

    def _owned(self, link: LinkState) -> bool:
        if link.id.kind is Kind.UPLINK:
            return self._owns_leaf(link.id.leaf)
        return self.registry.owned(link.id.node)

    @staticmethod
    def _switch_end(link: LinkState | None, switch: str, port: str) -> LinkState | None:
        """``link`` labelled with its swept switch end: its alerts say which switch port, and FabricmonAgentDown
        of the host does not hide them (deploy/alertmanager: the switch end still sees the cable)."""
        end = f"{switch}/p{port.replace('/', '_')}"
        if link is not None and link.labels.get(SWITCH_END) != end:
            link.labels = {**link.labels, SWITCH_END: end}
        return link

    def _resolve(self, key: tuple[str, str]) -> LinkState | None:
        cable = self._cables.get(key)
        switch, port = key
        if cable is None:
            # no cable map (an Ethernet switch over gNMI): the topology's leaf_port names host cables
            on_port = self.topology.nic_on_leaf_port(switch, port)
            if on_port is None:
                return None
            return self._switch_end(self._host_link(on_port[0], on_port[1].device, str(on_port[1].port)), switch, port)
        peer, peer_port, peer_type = cable
        # gNMI's LLDP neighbours say "switch" only for switches the agent subscribes to ("unknown" otherwise):
        # the topology knows the hosts
        found = self.topology.nic_on_leaf_port(switch, port) if peer_type != "switch" else None
        if found is not None:
            node, nic = found
            return self._switch_end(self._host_link(node, nic.device, str(nic.port)), switch, port)
        if peer_type == "host" or (peer_type == "unknown" and peer in self.topology.nodes):
            return None  # a host cable the topology has no leaf_port for
        here, there = self._is_leaf(switch), self._is_leaf(peer)
        if here and not there:
            return self._uplink(switch, port, peer, peer_port)
        if there and not here:
            return self._uplink(peer, peer_port, switch, port)
        return None  # spine-to-core and leaf-to-leaf cables: not modelled yet

    def _uplink(self, leaf: str, port: str, spine: str, spine_port: str) -> LinkState:
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
    def fold_spines(self, findings: list[Finding],
                    remote: Iterable[RemoteIncident] = ()) -> tuple[list[Finding], list[Relation]]:
        """``FabricSpineDegraded`` (critical) when one spine's uplinks to at least max(2, leaf_fold_min_links)
        leaves are bad in the same tick; those uplink findings become its evidence (related to it), as a
        leaf's links are the leaf's.  Sharded, ``remote`` (the other shards' open alerts) adds the bad uplinks
        of leaves other shards own to a spine with a bad uplink here: the shards' summaries decide it.  One
        shard sends it, the one that owns the first (by name) of those leaves: two shards sending one alert
        would resolve it under each other.  The others keep their uplink alerts, which the spine's hides in
        Alertmanager (``equal: [cluster, spine]``); the deciding shard folds its own, so its summary never
        feeds a decision back to itself."""
        by_spine: dict[str, dict[str, list[Finding]]] = {}
        for f in findings:
            c = f.component
            if c.kind is Kind.UPLINK and c.spine and f.alertname in BAD_UPLINK and (f.fire or f.keep):
                by_spine.setdefault(c.spine, {}).setdefault(c.leaf, []).append(f)
        elsewhere: dict[str, set[str]] = {}  # spine -> leaves another shard alerts a bad uplink of
        for r in remote:
            c = r.component
            if c.kind is Kind.UPLINK and c.spine in by_spine and r.alertname in BAD_UPLINK \
                    and c.leaf not in by_spine[c.spine]:
                elsewhere.setdefault(c.spine, set()).add(c.leaf)
        need = max(2, self.settings.leaf_fold_min_links)
        out: list[Finding] = []
        relations: list[Relation] = []
        for name, leaves in sorted(by_spine.items()):
            far = elsewhere.get(name, set())
            if len(leaves) + len(far) < need or (far and min(far) < min(leaves)):
                continue  # not degraded, or the shard of its first bad leaf decides
            firing = sum(1 for fs in leaves.values() if any(f.fire for f in fs)) + len(far)
            sp = spine(name)
            uplinks = sorted({f.component.id for fs in leaves.values() for f in fs})
            labels = {**sp.labels(self.cluster), "spine": name}
            seen = f"uplinks of {name} to {len(leaves) + len(far)} leaves bad at once"
            if far:
                seen += f" ({len(far)} of them alerted by other shards: {', '.join(sorted(far)[:6])})"
            out.append(Finding(SPINE_DEGRADED, sp, labels,
                               [seen,
                                "uplinks: " + ", ".join(uplinks[:6]) + (f" (+{len(uplinks) - 6} more)"
                                                                       if len(uplinks) > 6 else "")],
                               fire=firing >= need, keep=True))
            relations.extend(Relation((f.alertname, f.component), (SPINE_DEGRADED, sp))
                             for fs in leaves.values() for f in fs)
        return out, relations

    def stats(self) -> dict[str, float]:
        return {"refused_batches": self.refused_batches, "uplinks": len(self._uplinks), "interval": self.interval,
                "ports_elsewhere": len(self._elsewhere)}
