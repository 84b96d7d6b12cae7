"""What the aggregator knows of every node, link and GPU between ticks, and the registry that finds it.

State is kept per component (one ``LinkState`` per NIC port, one ``GpuState`` per GPU, one
``NodeState`` per node), created once and found by dict lookup.  Counter evidence is stored as
sparse events ``(ts, kind, value, sub)`` in a per-component deque, ``kind`` a ``LinkEvent`` or
``GpuEvent``: the ingest stage (ingest.py) appends them, the detectors (detectors.py) read them.
The registry also keeps the ``active`` sets: the components with recent events or unhealthy
state, the only ones a tick visits.

Adding an event kind: a member of ``LinkEvent`` or ``GpuEvent`` here, a route that emits it in
ingest.py, and the detector that sums it in detectors.py.
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass, field
from enum import IntEnum

from .. import components as comp
from ..components import Component
from ..topology import Topology
from .job_gpus import JobGpus


class LinkEvent(IntEnum):
    """What a link's event says (an int enum: detectors sum events per kind into lists by it)."""

    ERR = 0  # PMA symbol / receive errors: a bad cable, transceiver or port
    RECOV = 1  # link_error_recovery
    DOWNED = 2  # link_downed
    PHY = 3  # PHY-layer CRC / symbol errors (ethtool)
    RETRY = 4  # RDMA transport retries and sequence errors
    STORM = 5  # PFC pause storm events
    CNP = 6  # CNPs sent or handled, ECN-marked packets
    XWAIT = 7  # IB transmit wait
    PAUSE_TX = 8  # PFC pause time emitted (sub: priority, or 8 + traffic class from XOFF frames)
    PAUSE_RX = 9  # PFC pause time received (sub: as PAUSE_TX)


#: a pause event's sub for a traffic class (ice counts the priorities of a class together): 8 + the
#: class, apart from the priorities 0..7
TRAFFIC_CLASS_SUB = 8


class GpuEvent(IntEnum):
    NVLINK_ERR = 0  # NVLink replay / CRC errors (sub: NVLink index)
    NVLINK_RECOVERY = 1  # NVLink recoveries (sub: NVLink index)
    XID = 2  # a fatal XID (sub: the XID code)


# A counter event: (sample time, LinkEvent or GpuEvent, value, sub: priority, NVLink index or XID; else 0)
Event = tuple[float, int, float, int]

ACTIVE_STATES = (4, 5)  # ACTIVE, ACTIVE_DEFER
LINK_UP_PHYS = 5


class LinkState:
    __slots__ = ("id", "node", "device", "port", "netdev", "rail", "unit", "leaf", "nic", "gpu",
                 "exp_gbps", "exp_width", "state", "phys", "rate_bps", "width", "ev", "down_since",
                 "trans", "degraded_since", "evidence_since", "evidence_last", "labels", "seen_up",
                 "xoff_full_rate")

    def __init__(self, node: str, device: str, port: str, netdev: str, rail: int | None, unit: int | None,
                 leaf: str, gpu: int, exp_gbps: float | None, exp_width: int | None, cluster: str) -> None:
        """``leaf``: the name of the leaf the topology says this port is cabled to ("" for none)."""
        self.id: Component = comp.link(node, device, port, rail, leaf)
        self.node, self.device, self.port, self.netdev = node, device, port, netdev
        self.rail, self.unit, self.gpu = rail, unit, gpu
        self.leaf: Component | None = comp.leaf(leaf, rail) if leaf else None
        self.nic: Component = comp.nic(node, device, rail, leaf)
        self.exp_gbps, self.exp_width = exp_gbps, exp_width
        self.state: int | None = None
        self.phys: int | None = None
        self.rate_bps: float | None = None
        self.width: int | None = None
        self.ev: deque[Event] = deque()
        self.down_since: float | None = None
        self.trans: deque[float] = deque()  # sample times of up -> down transitions
        self.degraded_since: float | None = None
        self.evidence_since: float | None = None  # start of the current run of fold-able evidence
        self.evidence_last = 0.0
        self.seen_up = False
        # XOFF frames/s of a port paused throughout (frames-only drivers: the agent's per-driver gauge)
        self.xoff_full_rate: float | None = None
        self.labels = self.id.labels(cluster)

    def is_down(self) -> bool:
        if self.state is not None and self.state not in ACTIVE_STATES:
            return True
        return self.phys is not None and self.phys != LINK_UP_PHYS

    def note_state(self, ts: float) -> bool:
        """A state reading at ``ts`` (the host end's from its agent, an uplink's from the switch sweep):
        when the link went down, a transition if it had been up; True while it is down."""
        down = self.is_down()
        if down and self.down_since is None:
            self.down_since = ts
            if self.seen_up:
                self.trans.append(ts)
        elif not down:
            self.down_since = None
            if self.state is not None:
                self.seen_up = True
        return down

    def is_degraded(self, ratio: float) -> tuple[bool, str]:
        if self.is_down() or self.state is None:
            return False, ""
        why = []
        if self.exp_gbps and self.rate_bps is not None and self.rate_bps * 8 / 1e9 < self.exp_gbps * ratio:
            why.append(f"rate {self.rate_bps * 8 / 1e9:g} Gb/s < expected {self.exp_gbps:g}")
        if self.exp_width and self.width is not None and 0 < self.width < self.exp_width:
            why.append(f"width {self.width}X < expected {self.exp_width}X")
        return bool(why), "; ".join(why)


class GpuState:
    __slots__ = ("id", "node", "index", "nvl_down", "ev", "throttle", "up", "labels")

    def __init__(self, gpu: Component, cluster: str) -> None:
        """``gpu``: as the topology hands it out (with its NIC's rail and leaf where it has one)."""
        self.id = gpu
        self.node, self.index = gpu.node, gpu.gpu if gpu.gpu is not None else -1
        self.nvl_down: dict[int, float] = {}  # link -> since
        self.ev: deque[Event] = deque()
        self.throttle: set[str] = set()
        self.up: bool = True
        self.labels = gpu.labels(cluster)

    def nvlink(self, index: int) -> Component:
        g = self.id
        return comp.nvlink(g.node, self.index, index, g.rail, g.leaf)


@dataclass
class NodeState:
    name: str
    unit: int | None
    boot_id: str = ""
    last_seq: int = -1
    last_ts: float = -math.inf
    # when the aggregator last heard from it, on the cluster clock (ClusterClock.receipt): its liveness,
    # judged on the aggregator's time, not on its own sample times (a clock 250 s fast went down unseen)
    last_heard: float = -math.inf
    interval: float = 1.0  # the poll cadence: windows, lateness, holds and the agents-down silence scale with it
    announced_interval: float = 0.0  # the cadence the node's hello gave (0: none): a batch never lowers below it
    connected: bool = False
    ever_seen: bool = False
    grace_batches: int = 0  # error deltas ignored for this many batches (after a reboot)
    links: dict[tuple[str, str], LinkState | None] = field(default_factory=dict)
    by_netdev: dict[str, LinkState] = field(default_factory=dict)
    by_device: dict[str, LinkState] = field(default_factory=dict)
    gpus: dict[str, GpuState] = field(default_factory=dict)
    config_fail: dict[str, dict[str, float]] = field(default_factory=dict)  # device -> check -> since
    rank_keys: set[str] = field(default_factory=set)


def build_link_state(topo: Topology, node: str, device: str, port: str, netdev: str,
                     hello_rail: str | None, cluster: str) -> LinkState | None:
    """A LinkState for a rail NIC port; None for a NIC on no rail (frontend)."""
    if node not in topo.nodes:
        # A node the topology does not know (its real hostname, say): still monitored at link level,
        # but without rail or leaf labels: a rail we cannot place on a leaf would scope Alertmanager's
        # rail-wide inhibitions to a guess (DESIGN "Topology from the fabric").  ``rail`` is kept off
        # the identity and its labels, not off the state: config drift still knows a rail NIC from a
        # frontend one.
        link = LinkState(node, device, str(port), netdev, None, None, "", -1, None, None, cluster)
        link.rail = int(hello_rail) if hello_rail and hello_rail.isdigit() else None
        return link
    spec = topo.nic(node, device)
    unit = topo.nodes[node].unit
    if spec is not None:
        rail = spec.rail
        gpu = spec.gpu
        exp_gbps, exp_width = spec.rate_gbps, spec.width
    elif hello_rail:
        try:
            rail = int(hello_rail)
        except ValueError:
            return None
        gpu, exp_gbps, exp_width = rail, None, None
    elif hello_rail == "":
        # a NIC on no rail (frontend), announced in the hello: state and PFC only, no leaf
        return LinkState(node, device, str(port), netdev, None, unit, "", -1, None, None, cluster)
    else:
        return None
    if spec is not None:
        leaf = topo.leaf_of_nic(node, device) or ""  # the NIC's own leaf: a fat tree's is no rail's
    else:
        leaf = topo.guess_leaf(node, rail) or ""
    return LinkState(node, device, str(port), netdev, rail, unit, leaf, gpu, exp_gbps, exp_width, cluster)


class Registry:
    """Every node's, link's and GPU's state, created on first sight (topology, hello or batch)."""

    def __init__(self, topology: Topology, cluster: str, shard_units: frozenset[int] | None) -> None:
        self.topology = topology
        self.cluster = cluster
        self.shard_units = shard_units
        self.nodes: dict[str, NodeState] = {}
        self.links_by_leaf: dict[Component, list[LinkState]] = {}
        self.active_links: set[LinkState] = set()
        self.active_gpus: set[GpuState] = set()
        self.config_nodes: set[str] = set()
        self.job_gpus = JobGpus()  # the schedulers' job -> GPU map, for incidents' impact
        for name, spec in topology.nodes.items():
            if shard_units is not None and spec.unit not in shard_units:
                continue
            ns = self.node(name)
            for nic in spec.nics:
                self.link(ns, nic.device, str(nic.port), None)

    def owned(self, node: str) -> bool:
        """A replica owns its units' nodes, and any node the topology does not know that streams to
        it: agents that find no unit dial ``shard.unknown_owner``, and one whose Kubernetes label names
        a unit this topology lacks lands on that unit's owner.  Dropping either would blind it."""
        if self.shard_units is None:
            return True
        spec = self.topology.nodes.get(node)
        return spec is None or spec.unit in self.shard_units

    def node(self, name: str) -> NodeState:
        ns = self.nodes.get(name)
        if ns is None:
            spec = self.topology.nodes.get(name)
            ns = NodeState(name, spec.unit if spec is not None else None)
            self.nodes[name] = ns
        return ns

    def link(self, ns: NodeState, device: str, port: str, hello_rail: str | None,
             netdev: str = "") -> LinkState | None:
        """The port's state; None (remembered) for a port on no rail that no hello announced."""
        link = ns.links.get((device, port), _MISSING)
        if link is not _MISSING:
            return link  # type: ignore[return-value]  # not _MISSING: a LinkState or None
        link = build_link_state(self.topology, ns.name, device, port, netdev, hello_rail, self.cluster)
        ns.links[(device, port)] = link
        if link is not None:
            ns.by_device.setdefault(device, link)
            if netdev:
                ns.by_netdev[netdev] = link
            if link.leaf is not None:
                self.links_by_leaf.setdefault(link.leaf, []).append(link)
        return link

    def drop_node(self, name: str) -> None:
        """Forget a node and every link and GPU state of it (a topology reload removed it)."""
        ns = self.nodes.pop(name, None)
        self.config_nodes.discard(name)
        if ns is None:
            return
        links = {id(link) for link in ns.links.values() if link is not None}
        for leaf, lst in list(self.links_by_leaf.items()):
            kept = [link for link in lst if id(link) not in links]
            if kept:
                lst[:] = kept
            else:
                del self.links_by_leaf[leaf]
        # in place: the ingest stage, the folder and the engine hold these very sets
        self.active_links.difference_update([link for link in self.active_links if id(link) in links])
        gpus = {id(g) for g in ns.gpus.values()}
        self.active_gpus.difference_update([g for g in self.active_gpus if id(g) in gpus])

    def recable(self, name: str) -> None:
        """A reload moved a node's NICs to another leaf (a switch renamed, RMA): its links, NICs and GPUs
        carry the leaf the new topology says, and are filed under it; their counters and state stay."""
        ns = self.nodes.get(name)
        if ns is None:
            return
        topo = self.topology
        for link in ns.links.values():
            if link is None or name not in topo.nodes:
                continue
            leaf = topo.leaf_of_nic(name, link.device) or ""
            old = link.leaf
            if (old.id if old is not None else "") == leaf:
                continue
            if old is not None and old in self.links_by_leaf:
                lst = self.links_by_leaf[old]
                lst[:] = [x for x in lst if x is not link]
                if not lst:
                    del self.links_by_leaf[old]
            link.id = comp.link(name, link.device, link.port, link.rail, leaf)
            link.leaf = comp.leaf(leaf, link.rail) if leaf else None
            link.nic = comp.nic(name, link.device, link.rail, leaf)
            link.labels = link.id.labels(self.cluster)
            if link.leaf is not None:
                self.links_by_leaf.setdefault(link.leaf, []).append(link)
        for g in ns.gpus.values():
            if g.index >= 0:
                g.id = topo.gpu(name, g.index)
                g.labels = g.id.labels(self.cluster)

    def announce(self, ns: NodeState, device: str, port: str, hello_rail: str, netdev: str) -> LinkState | None:
        """A port as the node's hello announces it (its rail, "" for none, and its netdev)."""
        if ns.links.get((device, port), _MISSING) is None:
            # seen in a batch before its hello, remembered as on no rail: the hello decides again
            del ns.links[(device, port)]
        link = self.link(ns, device, port, hello_rail, netdev)
        if link is None:
            return None
        if link.rail is None and hello_rail.isdigit() and ns.name not in self.topology.nodes:
            link.rail = int(hello_rail)  # an unknown node's link seen in a batch before the hello
        if netdev:
            link.netdev = netdev
            ns.by_netdev[netdev] = link
        return link

    def gpu(self, ns: NodeState, gpu: str) -> GpuState | None:
        """The GPU's state by its ``gpu`` label; None when the label is no index."""
        g = ns.gpus.get(gpu)
        if g is None:
            try:
                idx = int(gpu)
            except ValueError:
                return None
            g = ns.gpus[gpu] = GpuState(self.topology.gpu(ns.name, idx), self.cluster)
        return g


_MISSING = object()
