"""Scenario files (DESIGN.md "Scenario files"): cluster, duration, faults, and their ground truth.

```yaml
cluster: {nodes: 64, layout: ib, nodes_per_unit: 16, seed: 7}
duration: 600          # simulated seconds
faults:
  - {kind: flaky_cable, node: node-017, rail: 3, start: 120, end: 300}
  - {kind: leaf_degraded, unit: 1, rail: 5, start: 200, end: 400}
  - {kind: slow_gpu, node: node-040, gpu: 2, start: 100, end: 500}
  - {kind: counter_reset, node: node-003, start: 250}
```

Loaded with ``configload.build`` into frozen dataclasses; every error names the
file and the key path (``scn.yaml: faults[1].node: node-999 is not in a 64-node
cluster``).  A fault is active for ``start <= t < end`` (``end`` omitted: until
the scenario ends).  Optional keys: ``magnitude`` (kind-specific severity, see
``MAGNITUDE``), ``priority`` (PFC/ECN priority; only the RoCE priority 3 is
simulated), ``period`` (link_flap: seconds per down+up cycle), ``degrade``
(link_degraded: ``width`` halves the lanes, ``speed`` steps NDR down to HDR), ``fails_at``
(cable_degrading, required: when the degrading cable starts to flap; from ``start`` to ``fails_at`` its
pre-FEC BER rises on one lane and its RX power on that lane falls; ``magnitude`` scales the power loss),
``optics`` (leaf_degraded: ``true`` makes the optics of every port of the leaf drift as a dying cable's
do while the leaf is degraded, one lane's BER climbing and its RX power falling, as a switch whose
cooling fails ages all its transceivers together: those trends are the leaf's evidence, never a
FabricCableDegrading per link).

The fabric (DESIGN "Topology from the fabric"): rail-optimized by default (leaves ``leaf-u<unit>-r<rail>``);
``cluster: {fabric: fat_tree, nodes_per_leaf: N}`` puts every NIC of N nodes on one leaf ``leaf-u<k>``
(no rails); ``cluster: {topology: FILE}`` takes the nodes and their leaves from a topology file (a
version-2 one, as ``fabricmon topology import`` writes; relative to the scenario file).  A leaf fault
names its leaf there: ``{kind: leaf_degraded, leaf: leaf-a3}`` (``unit`` + ``rail`` stays valid on a
rail-optimized cluster).  The simulator injects a leaf fault on whole (node, NIC) grids: every NIC index
the leaf carries on every node it carries.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field, replace
from pathlib import Path

from ..configload import ConfigError, build, load_yaml_file
from ..topology import (
    Topology,
    generate_fat_tree,
    generate_topology,
    gpu_id,
    leaf_id,
    link_id,
    load_topology,
    nic_id,
    node_name,
    nvlink_id,
)
from .hw import FRONTEND, NGPU, NRAILS, NVLINKS
from .switch_layout import SwitchLayout, build_layout
from .workload import Decoy, JobDef, ResolvedJob, check_decoys, resolve_jobs

# kind -> (target, component_type, alertname)
#   target "link": node + rail (a NIC port), "leaf": unit + rail, "nvlink": node + gpu + link,
#   "gpu": node + gpu, "config": node (+ optional rail), "node": node only.
KINDS: dict[str, tuple[str, str | None, str | None]] = {
    "flaky_cable": ("link", "link", "FabricLinkErrors"),
    "link_down": ("link", "link", "FabricLinkDown"),
    "link_flap": ("link", "link", "FabricLinkFlapping"),
    "link_degraded": ("link", "link", "FabricLinkDegraded"),
    "pfc_storm": ("link", "link", "FabricPFCStorm"),
    "rdma_retransmits": ("link", "link", "RDMARetransmits"),
    "leaf_degraded": ("leaf", "leaf", "FabricLeafDegraded"),
    "ecn_congestion": ("leaf", "leaf", "FabricCongestion"),
    "nvlink_errors": ("nvlink", "nvlink", "NVLinkErrors"),
    "nvlink_down": ("nvlink", "nvlink", "NVLinkDown"),
    "slow_gpu": ("gpu", "gpu", "StragglerRank"),
    "config_drift": ("config", "config", "FabricConfigDrift"),
    "counter_reset": ("node", None, None),  # not a fault: must raise nothing
    "cable_degrading": ("link", "link", "FabricCableDegrading"),  # then FabricLinkFlapping from fails_at
    "rank_hang": ("gpu", "gpu", "JobHung"),  # that rank never enters its next collective; heartbeats go on
    # the switch side (cluster: {spines: N, uplinks_per_leaf: M}; sim/switches.py)
    "uplink_flaky": ("uplink", "uplink", "FabricLinkErrors"),  # {leaf, port} or {leaf, spine}
    "uplink_down": ("uplink", "uplink", "FabricLinkDown"),
    "spine_degraded": ("spine", "spine", "FabricSpineDegraded"),  # every uplink of {spine} counts errors
    "switch_congestion": ("switch_port", None, "FabricCongestion"),  # {leaf, port}: transmit wait, no errors
}
# the kinds that need the cluster's switch side (spines); random_scenario leaves them out (its seeds draw
# the scenarios they always drew)
SWITCH_KINDS = ("uplink_flaky", "uplink_down", "spine_degraded", "switch_congestion")

# Default magnitude per kind and what it means.
MAGNITUDE: dict[str, float] = {
    "flaky_cable": 1.0,       # error-rate multiplier; effective bandwidth 1 - 0.25 * magnitude (>= 0.3)
    "link_down": 1.0,         # unused
    "link_flap": 1.0,         # unused (see period)
    "link_degraded": 1.0,     # unused (see degrade)
    "pfc_storm": 0.85,        # share of each interval the slow receiver pauses its partner
    "rdma_retransmits": 1.0,  # retry-rate multiplier; bandwidth 1 - 0.15 * magnitude
    "leaf_degraded": 0.6,     # bandwidth factor of every port of the leaf
    "ecn_congestion": 0.8,    # bandwidth factor of every port of the leaf
    "nvlink_errors": 1.0,     # error-rate multiplier
    "nvlink_down": 1.0,       # unused
    "slow_gpu": 1.5,          # compute-time multiplier of the GPU
    "config_drift": 1.0,      # unused
    "counter_reset": 1.0,     # unused
    "cable_degrading": 1.0,   # RX power loss of the bad lane by fails_at: 4 dB x magnitude
    "rank_hang": 1.0,         # unused
    "uplink_flaky": 1.0,      # error-rate multiplier; the uplink carries 1 - 0.25 * magnitude (>= 0.3)
    "uplink_down": 1.0,       # unused
    "spine_degraded": 1.0,    # error-rate multiplier on every uplink of the spine, each as uplink_flaky
    "switch_congestion": 0.7,  # share of the port's transmit time it waits for credits
}

_OPTIONAL = ("node", "rail", "gpu", "link", "unit", "leaf", "end", "magnitude", "period", "degrade", "fails_at",
             "optics", "port", "spine")
# which optional keys a target takes (others are errors: a key that would fault nothing)
_TAKES = {
    "link": {"node", "rail", "end", "magnitude"},
    "leaf": {"unit", "rail", "leaf", "end", "magnitude"},
    "nvlink": {"node", "gpu", "link", "end", "magnitude"},
    "gpu": {"node", "gpu", "end", "magnitude"},
    "config": {"node", "rail", "end"},
    "node": {"node"},
    "uplink": {"leaf", "port", "spine", "end", "magnitude"},
    "spine": {"spine", "end", "magnitude"},
    "switch_port": {"leaf", "port", "end", "magnitude"},
}


FABRICS = ("rail_optimized", "fat_tree")


@dataclass(frozen=True)
class ClusterSpec:
    nodes: int = 64
    layout: str = "ib"
    nodes_per_unit: int = 16
    seed: int = 0
    fabric: str = "rail_optimized"  # | fat_tree (nodes_per_leaf nodes, every NIC, on one leaf)
    nodes_per_leaf: int | None = None
    topology: str | None = None  # a topology file: its nodes and leaves (nodes is its node count)
    spines: int | None = None  # the switch side: leaf uplinks to this many spines (sim/switch_layout.py)
    uplinks_per_leaf: int | None = None  # default: spines

    def validate(self, path: str, source: str) -> None:
        p = f"{path}." if path else ""
        if self.nodes < 1:
            raise ConfigError(f"{source}: {p}nodes: must be >= 1, got {self.nodes}")
        if self.nodes > 65536:
            raise ConfigError(f"{source}: {p}nodes: at most 65536 simulated nodes, got {self.nodes}")
        if self.layout not in ("ib", "roce"):
            raise ConfigError(f"{source}: {p}layout: must be ib or roce, got {self.layout!r}")
        if self.nodes_per_unit < 1:
            raise ConfigError(f"{source}: {p}nodes_per_unit: must be >= 1, got {self.nodes_per_unit}")
        if self.fabric not in FABRICS:
            raise ConfigError(f"{source}: {p}fabric: must be {' or '.join(FABRICS)}, got {self.fabric!r}")
        if self.fabric == "fat_tree" and self.nodes_per_leaf is None:
            raise ConfigError(f"{source}: {p}nodes_per_leaf: required with fabric: fat_tree (nodes on each leaf)")
        if self.nodes_per_leaf is not None:
            if self.fabric != "fat_tree":
                raise ConfigError(f"{source}: {p}nodes_per_leaf: only with fabric: fat_tree")
            if self.nodes_per_leaf < 1:
                raise ConfigError(f"{source}: {p}nodes_per_leaf: must be >= 1, got {self.nodes_per_leaf}")
        if self.topology is not None and self.fabric != "rail_optimized":
            raise ConfigError(f"{source}: {p}topology: the file says the fabric: give topology or fabric, not both")
        if self.uplinks_per_leaf is not None and self.spines is None:
            raise ConfigError(f"{source}: {p}uplinks_per_leaf: given without spines (the spines they reach)")
        if self.spines is not None and not 1 <= self.spines <= 64:
            raise ConfigError(f"{source}: {p}spines: must be 1..64, got {self.spines}")
        if self.uplinks_per_leaf is not None and not 1 <= self.uplinks_per_leaf <= 64:
            raise ConfigError(f"{source}: {p}uplinks_per_leaf: must be 1..64, got {self.uplinks_per_leaf}")
        if self.spines is not None and self.topology is None:
            hosts = self.nodes_per_unit if self.fabric == "rail_optimized" else 8 * (self.nodes_per_leaf or 0)
            if hosts + self.uplinks > 254:
                raise ConfigError(f"{source}: {p}uplinks_per_leaf: {hosts} host ports and {self.uplinks} uplinks "
                                  "do not fit a 254-port leaf")

    @property
    def uplinks(self) -> int:
        """Uplinks per leaf (0: no switch side simulated)."""
        if self.spines is None:
            return 0
        return self.uplinks_per_leaf if self.uplinks_per_leaf is not None else self.spines

    @property
    def units(self) -> int:
        return (self.nodes + self.nodes_per_unit - 1) // self.nodes_per_unit

    def node_names(self) -> list[str]:
        if self.topology is not None:
            return list(self.build_topology().nodes)
        return [node_name(i, self.nodes) for i in range(self.nodes)]

    def build_topology(self) -> Topology:
        """The cluster's topology as the aggregator gets it (a fresh object: the aggregator binds NICs).
        With ``spines``, every NIC's switch port and every leaf's spines are stated (switch_layout.cabled)."""
        topo = self._plain_topology()
        if self.spines is not None:
            from .switch_layout import cabled

            topo = cabled(topo, self.spines)
        return topo

    def _plain_topology(self) -> Topology:
        if self.topology is not None:
            return load_topology(self.topology)
        if self.fabric == "fat_tree":
            assert self.nodes_per_leaf is not None  # validate
            return generate_fat_tree(self.nodes, nodes_per_leaf=self.nodes_per_leaf, layout=self.layout,
                                     nics=NRAILS, gpus_per_node=NGPU, cluster="sim")
        return generate_topology(self.nodes, layout=self.layout, nodes_per_unit=self.nodes_per_unit, rails=NRAILS,
                                 gpus_per_node=NGPU, cluster="sim")

    def switch_layout(self) -> SwitchLayout | None:
        """Every switch port's cable (None without ``spines``); one per cluster spec."""
        if self.spines is None:
            return None
        key = (self.topology, self.fabric, self.nodes, self.nodes_per_leaf, self.nodes_per_unit, self.layout,
               self.spines, self.uplinks)
        lay = _LAYOUTS.get(key)
        if lay is None:
            topo = _topology_of(self)
            lay = _LAYOUTS[key] = build_layout(topo, list(topo.nodes), self.nodes_per_unit, self.spines,
                                               self.uplinks, generated=self.topology is None
                                               and self.fabric == "rail_optimized")
        return lay

    def leaf_targets(self, leaf: str) -> tuple[list[str], list[int]] | None:
        """The (nodes, NIC indexes) a fault on ``leaf`` touches: every simulated rail NIC (mlx5_0..7) the
        topology cables to it; None when the topology has no such leaf."""
        topo = _topology_of(self)
        nodes: list[str] = []
        devs: set[int] = set()
        for name, spec in topo.nodes.items():
            mine = {int(n.device[5:]) for n in spec.nics if n.device.startswith("mlx5_") and n.device[5:].isdigit()
                    and int(n.device[5:]) < NRAILS and topo.leaf_of_nic(name, n.device) == leaf}
            if mine:
                nodes.append(name)
                devs |= mine
        return (nodes, sorted(devs)) if nodes else None


_TOPOLOGIES: dict[tuple, Topology] = {}
_LAYOUTS: dict[tuple, SwitchLayout] = {}


def _topology_of(c: ClusterSpec) -> Topology:
    """One parsed topology per cluster spec (scenario validation and ground truth ask many times)."""
    key = (c.topology, c.fabric, c.nodes, c.nodes_per_leaf, c.nodes_per_unit, c.layout, c.spines)
    topo = _TOPOLOGIES.get(key)
    if topo is None:
        topo = _TOPOLOGIES[key] = c.build_topology()
    return topo


@dataclass(frozen=True)
class Fault:
    kind: str
    start: float = 0.0
    end: float | None = None
    node: str | None = None
    rail: int | None = None
    gpu: int | None = None
    link: int | None = None
    unit: int | None = None
    leaf: str | None = None  # leaf_degraded / ecn_congestion / the switch kinds: the leaf by its topology name
    port: int | None = None  # uplink_flaky, uplink_down, switch_congestion: the leaf's switch port
    spine: str | None = None  # spine_degraded; uplink_* instead of port: the leaf's (first) uplink to it
    magnitude: float | None = None
    priority: int = 3
    period: float | None = None  # link_flap: seconds per down+up cycle (default 6)
    degrade: str | None = None  # link_degraded: width (default) | speed
    fails_at: float | None = None  # cable_degrading: first flap (simulated seconds)
    optics: bool | None = None  # leaf_degraded: its ports' optics drift like a dying cable's while it lasts

    def validate(self, path: str, source: str) -> None:
        """Checks that need no cluster; Scenario.validate checks names and ranges against it."""
        def fail(key: str, problem: str) -> ConfigError:
            return ConfigError(f"{source}: {path}.{key}: {problem}" if path else f"{source}: {key}: {problem}")

        if self.kind not in KINDS:
            raise fail("kind", f"unknown fault kind {self.kind!r} (known: {', '.join(KINDS)})")
        target = KINDS[self.kind][0]
        takes = set(_TAKES[target])
        if self.kind == "link_flap":
            takes.add("period")
        if self.kind == "link_degraded":
            takes.add("degrade")
        if self.kind == "cable_degrading":
            takes.add("fails_at")
        if self.kind == "leaf_degraded":
            takes.add("optics")
        for key in _OPTIONAL:
            if getattr(self, key) is not None and key not in takes:
                raise fail(key, f"does not apply to {self.kind}")
        if target == "leaf" and self.leaf is not None:
            for key in ("unit", "rail"):
                if getattr(self, key) is not None:
                    raise fail(key, f"give leaf (a name) or unit and rail, not both (leaf {self.leaf!r})")
        required = {"link": ("node",) if self.kind == "pfc_storm" else ("node", "rail"),
                    "leaf": ("leaf",) if self.leaf is not None else ("unit", "rail"),
                    "nvlink": ("node", "gpu", "link"), "gpu": ("node", "gpu"),
                    "config": ("node",), "node": ("node",), "uplink": ("leaf",), "spine": ("spine",),
                    "switch_port": ("leaf", "port")}[target]
        for key in required:
            if getattr(self, key) is None:
                raise fail(key, f"required for {self.kind}")
        if target == "uplink" and (self.port is None) == (self.spine is None):
            raise fail("port", f"{self.kind} names its uplink by port or by spine (one of them), "
                               f"got {'both' if self.port is not None else 'neither'}")
        if self.port is not None and not 1 <= self.port <= 254:
            raise fail("port", f"switch ports are 1..254, got {self.port}")
        if self.start < 0:
            raise fail("start", f"must be >= 0, got {self.start}")
        if self.kind == "cable_degrading":
            if self.fails_at is None:
                raise fail("fails_at", "required for cable_degrading (when the cable starts to flap)")
            if not self.fails_at > self.start:
                raise fail("fails_at", f"must be after start ({self.start}), got {self.fails_at}")
            if self.end is not None and self.end <= self.fails_at:
                raise fail("end", f"must be after fails_at ({self.fails_at}), got {self.end}")
        if self.end is not None and self.end <= self.start:
            raise fail("end", f"must be after start ({self.start}), got {self.end}")
        if self.rail is not None and not 0 <= self.rail < NRAILS:
            raise fail("rail", f"rails are 0..{NRAILS - 1}, got {self.rail}")
        if self.gpu is not None and not 0 <= self.gpu < NGPU:
            raise fail("gpu", f"GPUs are 0..{NGPU - 1}, got {self.gpu}")
        if self.link is not None and not 0 <= self.link < NVLINKS:
            raise fail("link", f"NVLinks are 0..{NVLINKS - 1}, got {self.link}")
        if self.unit is not None and self.unit < 0:
            raise fail("unit", f"must be >= 0, got {self.unit}")
        if self.magnitude is not None and not self.magnitude > 0:
            raise fail("magnitude", f"must be > 0, got {self.magnitude}")
        if self.kind in ("leaf_degraded", "ecn_congestion", "pfc_storm", "switch_congestion") \
                and self.magnitude is not None and self.magnitude > 1:
            raise fail("magnitude", f"is a bandwidth/pause share for {self.kind}: must be <= 1, got {self.magnitude}")
        if self.priority != 3:
            raise fail("priority", f"only the RoCE priority 3 is simulated, got {self.priority}")
        if self.period is not None and self.period < 2:
            raise fail("period", f"must be >= 2 seconds, got {self.period}")
        if self.degrade is not None and self.degrade not in ("width", "speed"):
            raise fail("degrade", f"must be width or speed, got {self.degrade!r}")

    # -- the fields validate() requires of the kinds that read them: typed, never None ---------------
    @property
    def the_node(self) -> str:
        if self.node is None:
            raise ValueError(f"fault {self.kind}: node is required")
        return self.node

    @property
    def the_rail(self) -> int:
        if self.rail is None:
            raise ValueError(f"fault {self.kind}: rail is required")
        return self.rail

    @property
    def the_gpu(self) -> int:
        if self.gpu is None:
            raise ValueError(f"fault {self.kind}: gpu is required")
        return self.gpu

    @property
    def the_link(self) -> int:
        if self.link is None:
            raise ValueError(f"fault {self.kind}: link is required")
        return self.link

    @property
    def the_unit(self) -> int:
        if self.unit is None:
            raise ValueError(f"fault {self.kind}: unit is required")
        return self.unit

    @property
    def the_fails_at(self) -> float:
        if self.fails_at is None:
            raise ValueError(f"fault {self.kind}: fails_at is required")
        return self.fails_at

    # -- derived ---------------------------------------------------------------------------
    @property
    def mag(self) -> float:
        return self.magnitude if self.magnitude is not None else MAGNITUDE[self.kind]

    def active(self, t: float) -> bool:
        return self.start <= t and (self.end is None or t < self.end)

    @property
    def device_index(self) -> int | None:
        """The faulted NIC (0..7 rail NICs, 8 the frontend), None for non-NIC kinds or all-NIC drift."""
        if KINDS[self.kind][0] != "link" and self.kind != "config_drift":
            return None
        if self.rail is None:
            return FRONTEND if self.kind == "pfc_storm" else None
        return self.rail


@dataclass(frozen=True)
class GroundTruth:
    """What a detector should find for one fault (component ids of DESIGN.md)."""

    kind: str
    component_type: str | None
    component: str | None
    start: float
    end: float | None
    alertname: str | None
    node: str | None = None
    rail: int | None = None
    leaf: str | None = None
    gpu: int | None = None
    fails_at: float | None = None  # cable_degrading: the warning must come before this

    def to_dict(self) -> dict:
        out = {k: getattr(self, k) for k in ("kind", "component_type", "component", "alertname", "start", "end",
                                             "node", "rail", "leaf", "gpu")}
        if self.fails_at is not None:
            out["fails_at"] = self.fails_at
        return out


@dataclass(frozen=True)
class Scenario:
    cluster: ClusterSpec = field(default_factory=ClusterSpec)
    duration: float = 600.0
    faults: tuple[Fault, ...] = ()
    jobs: tuple[JobDef, ...] = ()  # without: one job "llm-7b" on every node (sim/workload.py)
    decoys: tuple[Decoy, ...] = ()
    # the simulated jobs' step time (compute, NVLink and gradient bytes) x this: a short scenario keeps
    # enough steps before its first fault for a cost baseline (default_scenario)
    step_scale: float = 1.0

    def validate(self, path: str, source: str) -> None:
        if not self.duration > 0:
            raise ConfigError(f"{source}: duration: must be > 0, got {self.duration}")
        if not 0.05 <= self.step_scale <= 10.0:
            raise ConfigError(f"{source}: step_scale: must be 0.05..10, got {self.step_scale}")
        if self.jobs or self.decoys:
            all_names = self.cluster.node_names()
            check_decoys(self.decoys, resolve_jobs(self.jobs, all_names, self.duration, source), all_names, source)
        names = set(self.cluster.node_names()) if self.cluster.nodes <= 100000 else set()
        n = self.cluster.nodes
        for i, f in enumerate(self.faults):
            p = f"faults[{i}]"
            if f.node is not None and f.node not in names:
                hint = f" (nodes are {node_name(0, n)}..{node_name(n - 1, n)})"
                raise ConfigError(f"{source}: {p}.node: {f.node} is not in a {n}-node cluster{hint}")
            c = self.cluster
            if f.unit is not None and (c.fabric != "rail_optimized" or c.topology is not None):
                leaves = _topology_of(c).shape.leaves()
                raise ConfigError(f"{source}: {p}.unit: this cluster's leaves are not unit x rail "
                                  f"({'a fat tree' if c.fabric == 'fat_tree' else 'from ' + str(c.topology)}): name "
                                  f"the leaf (leaf: {leaves[0] if leaves else 'NAME'})")
            if f.kind in SWITCH_KINDS:
                _check_switch_fault(f, c, f"{source}: {p}")
            elif f.leaf is not None and c.leaf_targets(f.leaf) is None:
                leaves = _topology_of(c).shape.leaves()
                few = ", ".join(leaves[:4]) + (f" ... ({len(leaves)} leaves)" if len(leaves) > 4 else "")
                raise ConfigError(f"{source}: {p}.leaf: {f.leaf!r} is not a leaf of this cluster with a simulated "
                                  f"NIC (mlx5_0..{NRAILS - 1}) on it (leaves: {few or 'none'})")
            if f.leaf is not None and f.kind not in SWITCH_KINDS:
                _check_grid(c, f.leaf, f"{source}: {p}.leaf")
            if f.unit is not None and f.unit >= self.cluster.units:
                raise ConfigError(f"{source}: {p}.unit: unit {f.unit} is not in a {n}-node cluster of "
                                  f"{self.cluster.units} unit(s) of {self.cluster.nodes_per_unit} nodes")
            if f.start >= self.duration:
                raise ConfigError(f"{source}: {p}.start: {f.start} is not before the end of the scenario "
                                  f"(duration {self.duration}): the fault would never happen")
            if self.cluster.layout == "ib":
                if f.kind == "config_drift":
                    raise ConfigError(f"{source}: {p}.kind: config_drift needs layout roce (IB rail NICs have "
                                      "no PFC/ECN profile)")
                if f.kind == "pfc_storm" and f.rail is not None:
                    raise ConfigError(f"{source}: {p}.rail: pfc_storm needs an Ethernet (RoCE) port; on layout ib "
                                      "omit rail to storm on the frontend NIC mlx5_8")
            elif f.kind == "pfc_storm" and f.rail is None:
                pass  # the frontend NIC is Ethernet in both layouts

    # -- Python API ----------------------------------------------------------------------------
    def with_fault(self, kind: str, **kw) -> Scenario:
        """A copy with one more fault, validated like a file entry."""
        fault = Fault(kind=kind, **kw)
        fault.validate(f"faults[{len(self.faults)}]", "<api>")
        scn = replace(self, faults=self.faults + (fault,))
        scn.validate("", "<api>")
        return scn

    def resolved_jobs(self) -> list[ResolvedJob]:
        return resolve_jobs(self.jobs, self.cluster.node_names(), self.duration, "<scenario>")

    def active_faults(self, t: float) -> list[Fault]:
        return [f for f in self.faults if f.active(t)]

    def unit_of(self, node: str) -> int:
        return self.node_index(node) // self.cluster.nodes_per_unit

    def node_index(self, node: str) -> int:
        return int(node.rsplit("-", 1)[1])

    def ground_truth(self) -> list[GroundTruth]:
        return [ground_truth(f, self.cluster) for f in self.faults]

    def to_dict(self) -> dict:
        out_faults = []
        for f in self.faults:
            d = {"kind": f.kind, "start": f.start}
            for key in _OPTIONAL:
                v = getattr(f, key)
                if v is not None:
                    d[key] = v
            if f.priority != 3:
                d["priority"] = f.priority
            out_faults.append(d)
        c = self.cluster
        cluster: dict = {"nodes": c.nodes, "layout": c.layout, "nodes_per_unit": c.nodes_per_unit, "seed": c.seed}
        if c.fabric != "rail_optimized":
            cluster.update(fabric=c.fabric, nodes_per_leaf=c.nodes_per_leaf)
        if c.topology is not None:
            cluster["topology"] = c.topology
        if c.spines is not None:
            cluster.update(spines=c.spines, uplinks_per_leaf=c.uplinks)
        out = {"cluster": cluster,
               "duration": self.duration, "faults": out_faults}
        if self.jobs:
            out["jobs"] = [{k: (list(v) if isinstance(v, tuple) else v) for k, v in vars(j).items() if v is not None}
                           for j in self.jobs]
        if self.decoys:
            out["decoys"] = [d.to_dict() for d in self.decoys]
        return out


def _check_switch_fault(f: Fault, c: ClusterSpec, where: str) -> None:
    """A switch-side fault names a leaf, uplink, spine or switch port this cluster's switch side has."""
    lay = c.switch_layout()
    if lay is None:
        raise ConfigError(f"{where}.kind: {f.kind} needs the switch side: cluster: {{spines: N, uplinks_per_leaf: M}}")
    if f.spine is not None and f.spine not in lay.by_spine:
        raise ConfigError(f"{where}.spine: {f.spine!r} is not a spine of this cluster (spines: "
                          f"{', '.join(lay.spines[:6])}{' ...' if len(lay.spines) > 6 else ''})")
    if f.leaf is None:
        return
    if f.leaf not in lay.by_leaf:
        few = ", ".join(lay.leaves[:4]) + (f" ... ({len(lay.leaves)} leaves)" if len(lay.leaves) > 4 else "")
        raise ConfigError(f"{where}.leaf: {f.leaf!r} is not a leaf of this cluster (leaves: {few or 'none'})")
    ups = ", ".join(str(u.port) for u in lay.by_leaf[f.leaf])
    if f.spine is not None and lay.uplink_to(f.leaf, f.spine) is None:
        raise ConfigError(f"{where}.spine: {f.leaf} has no uplink to {f.spine} (its uplinks reach "
                          f"{', '.join(sorted({u.spine for u in lay.by_leaf[f.leaf]}))})")
    if f.port is None:
        return
    if f.kind == "switch_congestion":
        if lay.uplink_at(f.leaf, f.port) is None and (f.leaf, f.port) not in lay.host_by_port:
            raise ConfigError(f"{where}.port: {f.leaf} port {f.port} is not cabled (hosts on "
                              f"1..{max(p for (lf, p) in lay.host_by_port if lf == f.leaf)}, uplinks {ups})")
    elif lay.uplink_at(f.leaf, f.port) is None:
        raise ConfigError(f"{where}.port: {f.leaf} port {f.port} is not an uplink (its uplinks: {ups})")


def _check_grid(c: ClusterSpec, leaf: str, where: str) -> None:
    """The simulator injects a leaf fault on nodes x NIC indexes: the leaf must carry that whole grid."""
    found = c.leaf_targets(leaf)
    assert found is not None
    topo = _topology_of(c)
    nodes, devs = found
    for name in nodes:
        for d in devs:
            if topo.leaf_of_nic(name, f"mlx5_{d}") != leaf:
                raise ConfigError(f"{where}: {leaf} carries mlx5_{d} of some of its nodes but not of {name}: the "
                                  f"simulator faults a leaf's nodes x NICs as a whole grid")


def _leaf_of(cluster: ClusterSpec, node: str, rail: int | None) -> str | None:
    """The leaf the cluster's topology cables ``node``'s rail NIC ``rail`` to (fat tree: no rail, a leaf)."""
    if rail is None:
        return None
    if cluster.fabric == "rail_optimized" and cluster.topology is None:
        return leaf_id(int(node.rsplit("-", 1)[1]) // cluster.nodes_per_unit, rail)
    return _topology_of(cluster).leaf_of_nic(node, f"mlx5_{rail}")


def _rail_label(cluster: ClusterSpec, node: str, rail: int | None) -> int | None:
    """The rail label the aggregator gives (none where the topology has no rail: a fat tree)."""
    if rail is None or (cluster.fabric == "rail_optimized" and cluster.topology is None):
        return rail
    nic = _topology_of(cluster).nic(node, f"mlx5_{rail}")
    return nic.rail if nic is not None else None


def ground_truth(f: Fault, cluster: ClusterSpec) -> GroundTruth:
    target, ctype, alert = KINDS[f.kind]
    end = f.end
    if f.kind in SWITCH_KINDS:
        return _switch_truth(f, cluster)
    if ctype is None:
        return GroundTruth(f.kind, None, None, f.start, end, None, node=f.node)
    if target == "leaf":
        if f.leaf is not None:
            nodes, devs = cluster.leaf_targets(f.leaf) or ([], [])
            rails = {_rail_label(cluster, n, d) for n in nodes for d in devs}
            rail = rails.pop() if len(rails) == 1 else None
            return GroundTruth(f.kind, "leaf", f.leaf, f.start, end, alert, rail=rail, leaf=f.leaf)
        leaf = leaf_id(f.the_unit, f.the_rail)
        return GroundTruth(f.kind, "leaf", leaf, f.start, end, alert, rail=f.rail, leaf=leaf)
    assert f.node is not None  # Fault.validate: every other target names its node
    if target == "link":
        dev = f.device_index
        rail = dev if dev is not None and dev != FRONTEND else None
        return GroundTruth(f.kind, "link", link_id(f.node, f"mlx5_{dev}", 1), f.start, end, alert, node=f.node,
                           rail=_rail_label(cluster, f.node, rail), leaf=_leaf_of(cluster, f.node, rail),
                           fails_at=f.fails_at)
    if target == "config":
        comp = nic_id(f.node, f"mlx5_{f.rail}") if f.rail is not None else f.node
        return GroundTruth(f.kind, "config", comp, f.start, end, alert, node=f.node,
                           rail=_rail_label(cluster, f.node, f.rail), leaf=_leaf_of(cluster, f.node, f.rail))
    if target == "nvlink":
        return GroundTruth(f.kind, "nvlink", nvlink_id(f.node, f.the_gpu, f.the_link), f.start, end, alert,
                           node=f.node, gpu=f.gpu)
    return GroundTruth(f.kind, "gpu", gpu_id(f.node, f.the_gpu), f.start, end, alert, node=f.node, gpu=f.gpu)


def switch_fault_port(f: Fault, cluster: ClusterSpec) -> tuple[str, int] | None:
    """The (leaf, port) an uplink or switch-port fault names (by port, or the leaf's first uplink to its spine)."""
    lay = cluster.switch_layout()
    if lay is None or f.leaf is None:
        return None
    if f.port is not None:
        return f.leaf, f.port
    u = lay.uplink_to(f.leaf, f.spine or "")
    return (u.leaf, u.port) if u is not None else None


def _switch_truth(f: Fault, cluster: ClusterSpec) -> GroundTruth:
    """The component a switch-side fault is: the uplink (``<leaf>/p<port>``), the spine, or for transmit
    wait on a host's switch port that host's link (one cable, one component)."""
    _, ctype, alert = KINDS[f.kind]
    if f.kind == "spine_degraded":
        return GroundTruth(f.kind, "spine", f.spine, f.start, f.end, alert)
    at = switch_fault_port(f, cluster)
    assert at is not None  # validated
    leaf, port = at
    lay = cluster.switch_layout()
    assert lay is not None
    host = lay.host_by_port.get((leaf, port))
    if host is not None:
        names = cluster.node_names()
        node = names[host.node]
        rail = _rail_label(cluster, node, host.dev)
        return GroundTruth(f.kind, "link", link_id(node, f"mlx5_{host.dev}", 1), f.start, f.end, alert, node=node,
                           rail=rail, leaf=leaf)
    return GroundTruth(f.kind, "uplink", f"{leaf}/p{port}", f.start, f.end, alert, leaf=leaf)


def scenario_from_dict(data: dict, source: str = "<scenario>") -> Scenario:
    return build(Scenario, data, "", source)


def load_scenario(path: str | Path) -> Scenario:
    data = load_yaml_file(path)
    cluster = data.get("cluster")
    if isinstance(cluster, dict) and isinstance(cluster.get("topology"), str):
        # the topology file: relative to the scenario file; its nodes are the cluster's
        topo_path = Path(cluster["topology"])
        if not topo_path.is_absolute():
            topo_path = Path(path).parent / topo_path
        if "nodes" in cluster:
            raise ConfigError(f"{path}: cluster.nodes: the topology file gives the nodes: leave nodes out")
        try:
            n = len(load_topology(topo_path).nodes)
        except ConfigError as exc:
            raise ConfigError(f"{path}: cluster.topology: {exc}") from None
        except OSError as exc:
            raise ConfigError(f"{path}: cluster.topology: cannot read {topo_path}: {exc.strerror or exc}") from None
        data = {**data, "cluster": {**cluster, "topology": str(topo_path), "nodes": n}}
    return scenario_from_dict(data, str(path))


def _round(x: float) -> float:
    return float(round(x, 3))


def default_scenario(nodes: int = 64, duration: float = 600.0, *, layout: str = "ib", nodes_per_unit: int = 16,
                     seed: int = 7) -> Scenario:
    """DESIGN "Demo default scenario": two jobs (three quarters of the nodes and the rest) and one
    software decoy (a slow dataloader on one node of the second job) throughout; quiet until 25%, a
    flaky cable 25%..60% on one node's rail 3, a leaf degradation 45%..80% (another unit when there are
    two or more), all clear after 80%."""
    cluster = ClusterSpec(nodes=nodes, layout=layout, nodes_per_unit=nodes_per_unit, seed=seed)
    flaky = min(17, nodes - 1)
    unit = flaky // nodes_per_unit
    leaf_unit = (unit + 1) % cluster.units if cluster.units >= 2 else 0
    faults = (
        Fault("flaky_cable", node=node_name(flaky, nodes), rail=3, start=_round(0.25 * duration),
              end=_round(0.60 * duration)),
        Fault("leaf_degraded", unit=leaf_unit, rail=5, start=_round(0.45 * duration), end=_round(0.80 * duration)),
    )
    jobs: tuple[JobDef, ...] = ()
    decoys: tuple[Decoy, ...] = ()
    big = (3 * nodes) // 4
    if nodes >= 8:  # the second job needs a few nodes of its own to have peers
        jobs = (JobDef("llm-70b", (0, big - 1)), JobDef("vlm-13b", (big, nodes - 1)))
        # 15% slower input pipeline on one host, counters clean: an info finding, never a page
        decoys = (Decoy("dataloader_slow", node=node_name(nodes - 2, nodes), magnitude=1.15),)
    # The cost baseline needs the job's clean steps before a fault (aggregator/cost.py: the last 20, at
    # least 10, ending two straggler windows of steps and the detection lead before the incident): at the
    # 1.66 s step a 60 s demo has 8 steps before its first fault at 25%.  Shorter steps there (the rule
    # for real jobs unchanged): >= 40 steps in the first quarter, the default step from 270 s up; at
    # least a third of a second (a shorter scenario is a test, not a demo: its rank lines stay few).
    scale = round(min(1.0, max(duration / 270.0, 0.2)), 3)
    scn = Scenario(cluster, float(duration), faults, jobs, decoys, step_scale=scale)
    scn.validate("", "<default>")
    return scn


def random_scenario(seed: int, nodes: int = 64, duration: float = 300.0, *, layout: str | None = None,
                    nodes_per_unit: int = 16, max_faults: int = 2, p_none: float = 0.15) -> Scenario:
    """A random scenario for the detection benchmark: usually 1-2 faults of random kinds at random
    components and times, sometimes none (p_none); the ground truth is ``scenario.ground_truth()``."""
    rng = random.Random(seed)
    layout = layout or rng.choice(("ib", "roce"))
    cluster = ClusterSpec(nodes=nodes, layout=layout, nodes_per_unit=nodes_per_unit, seed=seed)
    # cable_degrading needs minutes of trend before its warning (benchmarks/bench_cable_lead.py runs it);
    # rank_hang needs a job on its node (bench_detection's workload scenarios)
    kinds = [k for k in KINDS
             if not (layout == "ib" and k == "config_drift") and k not in ("cable_degrading", "rank_hang")
             and k not in SWITCH_KINDS]
    count = 0 if rng.random() < p_none else rng.randint(1, max_faults)
    faults = []
    for _ in range(count):
        kind = rng.choice(kinds)
        node = node_name(rng.randrange(nodes), nodes)
        start = _round(rng.uniform(0.1, 0.6) * duration)
        end = _round(min(duration, start + rng.uniform(0.15, 0.35) * duration))
        target = KINDS[kind][0]
        kw: dict = {"start": start}
        if target != "node":
            kw["end"] = end
        if target == "link":
            kw["node"] = node
            if not (kind == "pfc_storm" and layout == "ib"):
                kw["rail"] = rng.randrange(NRAILS)
        elif target == "leaf":
            kw.update(unit=rng.randrange(cluster.units), rail=rng.randrange(NRAILS))
        elif target == "nvlink":
            kw.update(node=node, gpu=rng.randrange(NGPU), link=rng.randrange(NVLINKS))
        elif target == "gpu":
            kw.update(node=node, gpu=rng.randrange(NGPU))
        elif target == "config":
            kw["node"] = node
            if rng.random() < 0.7:
                kw["rail"] = rng.randrange(NRAILS)
        else:
            kw["node"] = node
        faults.append(Fault(kind, **kw))
    scn = Scenario(cluster, float(duration), tuple(faults))
    scn.validate("", f"<random seed {seed}>")
    for i, f in enumerate(scn.faults):
        f.validate(f"faults[{i}]", f"<random seed {seed}>")
    return scn
