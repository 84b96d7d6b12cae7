"""The cluster model the aggregator localizes against: node, GPU, NIC, rail, leaf, spine.

Rail-optimized layout: NIC i of every node sits on rail i beside GPU i; the
nodes of one scalable unit share one leaf switch per rail; leaves connect to
every spine.  Component ids follow DESIGN.md ("Component ids") everywhere.

Three file forms load into the same ``Topology``: ``generate:`` (the layout above,
leaves named ``leaf-u<unit>-r<rail>``), version 1 (an explicit ``nodes:`` list with
units and rails) and version 2 (``version: 2``, written by ``fabricmon topology
import``: every NIC names its leaf, ``rail`` may be null on a fat tree, ``leaves:``
lists each leaf's spines; DESIGN.md "Topology from the fabric").

The topology hands out the aggregator's typed identities (``components.Component``): ``link``,
``nic``, ``gpu``, ``leaf``, ``path_of_gpu`` carry the rail and the leaf's *name* with them (built
from ``leaf_of`` / ``leaf_of_nic``): the unit is a topology attribute, never part of an identity.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from itertools import pairwise
from pathlib import Path

import yaml

from . import components as comp
from .components import SWITCH_PORT_NAME, Component, Kind
from .configload import ConfigError, build, load_yaml_file
from .textcheck import node_name_problem
from .topology_binding import AgentBinding
from .topology_index import TopologyIndex
from .topology_shape import FabricShape
from .topology_spec import (
    COMPONENT_TYPES,
    MAX_GPUS_PER_NODE,
    MAX_NICS_PER_NODE,
    MAX_NODES,
    MAX_RATE_GBPS,
    NicSpec,
    NodeSpec,
    canonical_guid,
    gpu_id,
    leaf_id,
    link_id,
    natural_key,
    nic_id,
    node_name,
    nvlink_id,
    rail_id,
    spine_id,
)

# what callers import from here; the specs and id spellings live in topology_spec.py
__all__ = [
    "COMPONENT_TYPES", "MAX_GPUS_PER_NODE", "MAX_NICS_PER_NODE", "MAX_NODES", "MAX_RATE_GBPS", "GenerateSpec",
    "LeafFileV2", "NicFileV2", "NicSpec", "NodeFileV2", "NodeSpec", "SwitchFileV2", "Topology", "TopologyFile",
    "TopologyFileV2", "canonical_guid", "generate_fat_tree", "generate_topology", "gpu_id", "leaf_id", "link_id",
    "load_topology", "natural_key", "nic_id", "node_name", "nvlink_id", "rail_id", "rail_nics", "spine_id",
    "topology_dict", "topology_file_fields", "topology_from_mapping", "topology_from_v2",
]

# GPU paths kept per NIC-map version (``Topology.path_of_gpu``): 4,096 nodes of 8 GPUs with room to spare
_PATHS_KEPT = 65536


@dataclass(frozen=True)
class GenerateSpec:
    nodes: int
    gpus_per_node: int = 8
    rails: int = 8

    def validate(self, path: str, source: str) -> None:
        if not 1 <= self.nodes <= MAX_NODES:
            raise ConfigError(f"{source}: {path}.nodes: must be in [1, {MAX_NODES}], got {self.nodes}")
        if not 1 <= self.gpus_per_node <= MAX_GPUS_PER_NODE:
            raise ConfigError(f"{source}: {path}.gpus_per_node: must be in [1, {MAX_GPUS_PER_NODE}], "
                              f"got {self.gpus_per_node}")
        if not 1 <= self.rails <= MAX_NICS_PER_NODE:
            raise ConfigError(f"{source}: {path}.rails: must be in [1, {MAX_NICS_PER_NODE}], got {self.rails}")


@dataclass(frozen=True)
class TopologyFile:
    version: int = 1
    cluster: str = "default"
    layout: str = "ib"
    nodes_per_unit: int = 16
    spines: int = 4
    rate_gbps: float = 400.0
    generate: GenerateSpec | None = None
    nodes: tuple[NodeSpec, ...] = ()

    def validate(self, path: str, source: str) -> None:
        if self.layout not in ("ib", "roce"):
            raise ConfigError(f"{source}: layout: must be ib or roce, got {self.layout!r}")
        if self.nodes_per_unit < 1:
            raise ConfigError(f"{source}: nodes_per_unit: must be >= 1, got {self.nodes_per_unit}")
        if self.spines < 1:
            raise ConfigError(f"{source}: spines: must be >= 1, got {self.spines}")
        if self.generate is None and not self.nodes:
            raise ConfigError(f"{source}: nodes: give a node list or a generate: section")
        if self.generate is not None and self.nodes:
            raise ConfigError(f"{source}: generate: give a node list or a generate: section, not both "
                              f"(the generated cluster would silently replace the {len(self.nodes)} nodes listed)")
        if len(self.nodes) > MAX_NODES:
            raise ConfigError(f"{source}: nodes: {len(self.nodes)} nodes, at most {MAX_NODES}")
        if not 0 < self.rate_gbps <= MAX_RATE_GBPS:
            raise ConfigError(f"{source}: rate_gbps: must be in (0, {MAX_RATE_GBPS:g}], got {self.rate_gbps}")
        seen: set[str] = set()
        for i, n in enumerate(self.nodes):
            if n.name in seen:
                raise ConfigError(f"{source}: nodes[{i}].name: duplicate node {n.name!r}")
            seen.add(n.name)


@dataclass
class Topology:
    cluster: str
    layout: str
    nodes_per_unit: int
    spines: int
    nodes: dict[str, NodeSpec]
    # version 2 (imported): named leaves and their spines; generated and version-1 topologies keep the
    # defaults and name leaves leaf-u<unit>-r<rail>
    version: int = 1
    rail_optimized: bool = True
    leaf_spines: dict[str, tuple[str, ...]] = field(default_factory=dict)
    switches: dict[str, str] = field(default_factory=dict)  # version 2: switch name -> "0x..." GUID
    # the NIC maps (topology_index.py) and what the agents' hellos bound (topology_binding.py)
    index: TopologyIndex = field(init=False, repr=False, compare=False)
    binding: AgentBinding = field(init=False, repr=False, compare=False)
    shape: FabricShape = field(init=False, repr=False, compare=False)  # rails, units, leaves, spines

    def __post_init__(self) -> None:
        self.index = TopologyIndex()
        for n in self.nodes.values():
            self.index.add(n)
        self.binding = AgentBinding(self, self.index)
        self.shape = FabricShape(self)

    # --- lookups ---
    def unit_of(self, node: str) -> int:
        return self.nodes[node].unit

    def nic(self, node: str, device: str) -> NicSpec | None:
        return self.index.nic_by_dev.get((node, device))

    def nic_for_gpu(self, node: str, gpu: int) -> NicSpec | None:
        return self.index.nic_by_gpu.get((node, gpu))

    def leaf_of(self, node: str, rail: int | None) -> str:
        """The leaf a node's NIC on ``rail`` is cabled to: its imported name, else ``leaf-u<unit>-r<rail>``.
        On a fat tree (rail None) the leaf of the node's first NIC (``leaf-u<unit>`` if none is named)."""
        named = self.index.leaf_by_rail.get((node, rail))
        if named is not None:
            return named
        unit = self.nodes[node].unit
        return leaf_id(unit, rail) if rail is not None else f"leaf-u{unit}"

    def guess_leaf(self, node: str, rail: int | None) -> str | None:
        """The leaf of a port the topology does not list, by its rail from the agent's hello: the generated
        ``leaf-u<unit>-r<rail>``, or in an imported topology the leaf the node's NIC on that rail uses;
        None where neither says (an imported fabric names no leaf it was not shown)."""
        if rail is None:
            return None
        if self.version >= 2:
            return self.index.leaf_by_rail.get((node, rail))
        return self.leaf_of(node, rail)

    def leaf_of_nic(self, node: str, device: str) -> str | None:
        nic = self.nic(node, device)
        if nic is None:
            return None
        return nic.leaf if nic.leaf is not None else (leaf_id(self.nodes[node].unit, nic.rail)
                                                      if nic.rail is not None else None)

    def nic_on_leaf_port(self, leaf: str, port: int | str) -> tuple[str, NicSpec] | None:
        """The host NIC whose cable ends on ``leaf``'s ``port`` (version-2 files with ``leaf_port``: a number,
        or an Ethernet switch's port name)."""
        return self.index.by_leaf_port.get((leaf, str(port)))

    def nic_by_guid(self, node_guid: str) -> tuple[str, NicSpec] | None:
        """(node, NIC) of a CA node GUID, in any spelling ``canonical_guid`` reads."""
        key = canonical_guid(node_guid)
        return self.index.by_guid.get(key) if key is not None else None

    # --- typed identities (components.py) ---
    def _leaf_name(self, node: str, nic: NicSpec) -> str:
        """The leaf ``nic`` is cabled to: its own name where the topology names it, else ``leaf_of``."""
        return nic.leaf if nic.leaf is not None else self.leaf_of(node, nic.rail)

    def leaf(self, node: str, rail: int | None) -> Component:
        return comp.leaf(self.leaf_of(node, rail), rail)

    def leaf_for(self, node: str, nic: NicSpec) -> Component:
        """The leaf ``nic`` is cabled to, as the topology says (a fat tree's leaf is no rail's)."""
        return comp.leaf(self._leaf_name(node, nic), nic.rail)

    def link(self, node: str, nic: NicSpec) -> Component:
        return comp.link(node, nic.device, nic.port, nic.rail, self._leaf_name(node, nic))

    def nic_component(self, node: str, nic: NicSpec) -> Component:
        return comp.nic(node, nic.device, nic.rail, self._leaf_name(node, nic))

    def gpu(self, node: str, index: int) -> Component:
        """``node/gpuN`` with the rail and leaf of its NIC, where the node has one for it."""
        nic = self.nic_for_gpu(node, index) if node in self.nodes else None
        if nic is None:
            return comp.gpu(node, index)
        return comp.gpu(node, index, nic.rail, self._leaf_name(node, nic))

    def path_of_gpu(self, node: str, gpu: int) -> dict[Kind, Component]:
        """Every component a rank on (node, gpu) depends on, by kind (no rail on a fat tree).  Kept per
        version of the NIC maps (topology_index.py): every detection tick asks it for every slow rank.
        Read-only: the same dict is returned until a hello binds or pairs NICs."""
        paths = self.index.paths
        got = paths.get((node, gpu))
        if got is None:
            if len(paths) >= _PATHS_KEPT:  # GPU indexes come from the agents: bounded whatever they send
                paths.clear()
            got = paths[(node, gpu)] = self._path_of_gpu(node, gpu)
        return got

    def _path_of_gpu(self, node: str, gpu: int) -> dict[Kind, Component]:
        out = {Kind.NODE: comp.node(node), Kind.GPU: self.gpu(node, gpu)}
        nic = self.nic_for_gpu(node, gpu)
        if nic is not None:
            leaf = self._leaf_name(node, nic)
            out[Kind.NIC] = self.nic_component(node, nic)
            out[Kind.LINK] = self.link(node, nic)
            if nic.rail is not None:
                out[Kind.RAIL] = comp.rail(nic.rail)
            out[Kind.LEAF] = comp.leaf(leaf, nic.rail)
        return out

    def labels_of_link(self, node: str, device: str) -> dict[str, str]:
        nic = self.nic(node, device)
        if nic is None:
            return {"node": node}
        out = {"node": node}
        if nic.rail is not None:
            out["rail"] = str(nic.rail)
        out["leaf"] = nic.leaf if nic.leaf is not None else self.leaf_of(node, nic.rail)
        return out

    def write_yaml(self, path: str | Path) -> None:
        """The topology as a file ``load_topology`` reads back (``topology_dict``), written atomically."""
        from .atomic import atomic_write_text

        atomic_write_text(path, yaml.safe_dump(topology_dict(self), sort_keys=False))


def topology_dict(topo: Topology) -> dict:
    """``topo`` as the mapping of its file form: version 2 for an imported topology, else version 1 with its
    node list (a generated one written out as the nodes it generated)."""
    if topo.version >= 2:
        return _topology_dict_v2(topo)
    return {
        "cluster": topo.cluster,
        "layout": topo.layout,
        "nodes_per_unit": topo.nodes_per_unit,
        "spines": topo.spines,
        "nodes": [
            {"name": n.name, "unit": n.unit, "gpus": n.gpus,
             "nics": [{"device": c.device, "port": c.port, "rail": c.rail, "gpu": c.gpu,
                       "rate_gbps": c.rate_gbps, "width": c.width,
                       **({"leaf": c.leaf} if c.leaf is not None else {})}
                      for c in n.nics]}
            for n in topo.nodes.values()
        ],
    }


def _topology_dict_v2(topo: Topology) -> dict:
    def nic(c: NicSpec) -> dict:
        row: dict = {"device": c.device or None, "port": c.port}
        for key in ("node_guid", "interface"):
            if getattr(c, key) is not None:
                row[key] = getattr(c, key)
        row["leaf"] = c.leaf
        if c.leaf_port is not None:
            row["leaf_port"] = c.leaf_port
        row.update({"rail": c.rail, "gpu": c.gpu})
        return row

    return {
        "version": 2,
        "cluster": topo.cluster,
        "layout": topo.layout,
        "rail_optimized": topo.rail_optimized,
        "nodes": [{"name": n.name, "unit": n.unit, "gpus": n.gpus, "nics": [nic(c) for c in (*n.nics, *n.unbound)]}
                  for n in topo.nodes.values()],
        "leaves": {leaf: {"spines": list(sp)} for leaf, sp in topo.leaf_spines.items()},
        **({"switches": {name: {"guid": g} for name, g in topo.switches.items()}} if topo.switches else {}),
    }


def rail_nics(rails: int, gpus: int, rate_gbps: float = 400.0) -> tuple[NicSpec, ...]:
    return tuple(NicSpec(device=f"mlx5_{r}", rail=r, gpu=r % gpus, rate_gbps=rate_gbps) for r in range(rails))


def generate_topology(
    nodes: int,
    *,
    layout: str = "ib",
    nodes_per_unit: int = 16,
    gpus_per_node: int = 8,
    rails: int = 8,
    spines: int = 4,
    cluster: str = "sim",
    rate_gbps: float = 400.0,
) -> Topology:
    nics = rail_nics(rails, gpus_per_node, rate_gbps)
    specs = {}
    for i in range(nodes):
        name = node_name(i, nodes)
        specs[name] = NodeSpec(name=name, unit=i // nodes_per_unit, gpus=gpus_per_node, nics=nics)
    return Topology(cluster, layout, nodes_per_unit, spines, specs)


def generate_fat_tree(
    nodes: int,
    *,
    nodes_per_leaf: int,
    layout: str = "ib",
    gpus_per_node: int = 8,
    nics: int = 8,
    spines: int = 4,
    cluster: str = "sim",
    rate_gbps: float = 400.0,
) -> Topology:
    """A fat tree: every NIC of a node on one leaf, ``nodes_per_leaf`` nodes per leaf, each leaf on every
    spine; not rail-optimized (no rail labels).  Leaf k is ``leaf-u<k>`` (each leaf is its own leaf group)."""
    if nodes_per_leaf < 1:
        raise ValueError(f"nodes_per_leaf must be >= 1, got {nodes_per_leaf}")
    spine_names = tuple(spine_id(i) for i in range(spines))
    specs: dict[str, NodeSpec] = {}
    leaf_spines: dict[str, tuple[str, ...]] = {}
    for i in range(nodes):
        unit = i // nodes_per_leaf
        leaf = f"leaf-u{unit}"
        leaf_spines[leaf] = spine_names
        name = node_name(i, nodes)
        specs[name] = NodeSpec(name=name, unit=unit, gpus=gpus_per_node, nics=tuple(
            NicSpec(device=f"mlx5_{k}", rail=None, gpu=k % gpus_per_node, rate_gbps=rate_gbps, leaf=leaf)
            for k in range(nics)))
    return Topology(cluster, layout, nodes_per_leaf, spines, specs, version=2, rail_optimized=False,
                    leaf_spines=leaf_spines)


def load_topology(path: str | Path) -> Topology:
    return topology_from_mapping(load_yaml_file(path), path)


def topology_from_mapping(data: dict, path: str | Path) -> Topology:
    """A topology file's parsed YAML as a Topology (``path`` names the file in errors)."""
    version = data.get("version", 1)
    if version == 2:
        return topology_from_v2(build(TopologyFileV2, data, "", str(path)))
    if version != 1 or isinstance(version, bool):
        raise ConfigError(f"{path}: version: must be 1 or 2, got {version!r}")
    tf = build(TopologyFile, data, "", str(path))
    if tf.generate is not None and not tf.nodes:
        g = tf.generate
        return generate_topology(
            g.nodes, layout=tf.layout, nodes_per_unit=tf.nodes_per_unit, gpus_per_node=g.gpus_per_node,
            rails=g.rails, spines=tf.spines, cluster=tf.cluster, rate_gbps=tf.rate_gbps,
        )
    nodes = {n.name: n for n in tf.nodes}
    return Topology(tf.cluster, tf.layout, tf.nodes_per_unit, tf.spines, nodes)


# ------------------------------------------------------------------ version 2 (imported from the fabric)


@dataclass(frozen=True)
class NicFileV2:
    device: str | None = None
    port: int = 1
    node_guid: str | None = None
    interface: str | None = None
    leaf: str | None = None
    # the leaf's port at the cable's other end (switch-side evidence joins here): 1..255, or a port name
    leaf_port: int | str | None = None
    rail: int | None = None
    gpu: int | None = None  # default: the rail, else the NIC's place among the node's NICs
    rate_gbps: float = 400.0
    width: int = 4

    def validate(self, path: str, source: str) -> None:
        if not (self.device or self.node_guid or self.interface):
            raise ConfigError(f"{source}: {path}: give device, node_guid or interface")
        for key in ("device", "interface", "leaf"):  # parts of component ids: the node name rule
            value = getattr(self, key)
            if value is not None and (why := node_name_problem(value)) is not None:
                raise ConfigError(f"{source}: {path}.{key}: {why}, got {value[:80]!a}")
        if self.node_guid is not None:
            try:
                int(self.node_guid, 16)
            except ValueError:
                raise ConfigError(f"{source}: {path}.node_guid: not a hex GUID: {self.node_guid!r}") from None
        if self.rail is not None and self.rail < 0:
            raise ConfigError(f"{source}: {path}.rail: must be >= 0 or null, got {self.rail}")
        if not 0 <= self.port <= 255:
            raise ConfigError(f"{source}: {path}.port: must be 0..255, got {self.port}")
        if isinstance(self.leaf_port, int) and not 1 <= self.leaf_port <= 255:
            raise ConfigError(f"{source}: {path}.leaf_port: must be 1..255, got {self.leaf_port}")
        if isinstance(self.leaf_port, str) and not SWITCH_PORT_NAME.fullmatch(self.leaf_port):
            raise ConfigError(f"{source}: {path}.leaf_port: a port number or a switch port name "
                              f"(Ethernet1/1, swp12), got {self.leaf_port[:80]!a}")
        if self.leaf_port is not None and self.leaf is None:
            raise ConfigError(f"{source}: {path}.leaf_port: given without leaf")


@dataclass(frozen=True)
class NodeFileV2:
    name: str
    nics: tuple[NicFileV2, ...] = ()
    gpus: int = 8
    unit: int | None = None  # default: the leaf group (leaves sharing nodes) the node's NICs are on

    def validate(self, path: str, source: str) -> None:
        if (why := node_name_problem(self.name)) is not None:
            raise ConfigError(f"{source}: {path}.name: {why}, got {str(self.name)[:80]!a}")
        if self.gpus < 1:
            raise ConfigError(f"{source}: {path}.gpus: must be >= 1, got {self.gpus}")
        seen: dict[tuple, int] = {}
        for i, nic in enumerate(self.nics):
            key = (nic.device or nic.node_guid or nic.interface, nic.port)
            if key in seen:
                raise ConfigError(f"{source}: {path}.nics[{i}]: same NIC as nics[{seen[key]}] ({key[0]} port {key[1]})")
            seen[key] = i
            if nic.gpu is not None and not 0 <= nic.gpu < self.gpus:
                raise ConfigError(f"{source}: {path}.nics[{i}].gpu: {nic.gpu} is not a GPU of {self.name} "
                                  f"(0..{self.gpus - 1})")


@dataclass(frozen=True)
class LeafFileV2:
    spines: tuple[str, ...] = ()


@dataclass(frozen=True)
class SwitchFileV2:
    guid: str

    def validate(self, path: str, source: str) -> None:
        try:
            value = int(self.guid, 16)
        except ValueError:
            raise ConfigError(f"{source}: {path}.guid: not a hex GUID: {self.guid!r}") from None
        if not 0 < value < 1 << 64:
            raise ConfigError(f"{source}: {path}.guid: not a 64-bit GUID: {self.guid!r}")


@dataclass(frozen=True)
class TopologyFileV2:
    version: int
    cluster: str = "default"
    layout: str = "ib"
    rail_optimized: bool = False
    nodes: tuple[NodeFileV2, ...] = ()
    leaves: dict[str, LeafFileV2] = field(default_factory=dict)
    switches: dict[str, SwitchFileV2] = field(default_factory=dict)  # every switch's GUID (InfiniBand imports)

    def validate(self, path: str, source: str) -> None:
        if self.layout not in ("ib", "roce"):
            raise ConfigError(f"{source}: layout: must be ib or roce, got {self.layout!r}")
        if not self.nodes:
            raise ConfigError(f"{source}: nodes: a version-2 topology lists its nodes")
        names: dict[str, int] = {}
        guids: dict[tuple[str, int], str] = {}
        for i, n in enumerate(self.nodes):
            if n.name in names:
                raise ConfigError(f"{source}: nodes[{i}].name: duplicate node {n.name!r} (also nodes[{names[n.name]}])")
            names[n.name] = i
            for j, nic in enumerate(n.nics):
                where = f"nodes[{i}].nics[{j}]"
                if nic.node_guid is not None:
                    key = (f"{int(nic.node_guid, 16):016x}", nic.port)
                    if key in guids:
                        raise ConfigError(f"{source}: {where}.node_guid: {nic.node_guid} port {nic.port} is also "
                                          f"on {guids[key]}")
                    guids[key] = n.name
                if self.leaves and nic.leaf is not None and nic.leaf not in self.leaves:
                    raise ConfigError(f"{source}: {where}.leaf: {nic.leaf!r} is not under leaves:")
        for leaf, spec in self.leaves.items():
            shown = ascii(leaf[:80])[1:-1]  # escaped: the name may hold the controls it is refused for
            for where, name in ((f"leaves.{shown}", leaf),
                                *((f"leaves.{shown}.spines[{k}]", s) for k, s in enumerate(spec.spines))):
                if (why := node_name_problem(name)) is not None or not name.strip():
                    raise ConfigError(f"{source}: {where}: {why or 'must not be blank'}, got {name[:80]!a}")
        cable_ends: dict[tuple[str, str], str] = {}
        for i, n in enumerate(self.nodes):
            for j, nic in enumerate(n.nics):
                if nic.leaf is None or nic.leaf_port is None:
                    continue
                end = (nic.leaf, str(nic.leaf_port))
                if end in cable_ends:
                    raise ConfigError(f"{source}: nodes[{i}].nics[{j}].leaf_port: {nic.leaf} port {nic.leaf_port} "
                                      f"is also {cable_ends[end]}'s")
                cable_ends[end] = n.name
        for name in self.switches:
            if (why := node_name_problem(name)) is not None or not name.strip():
                raise ConfigError(f"{source}: switches.{ascii(name[:80])[1:-1]}: {why or 'must not be blank'}, "
                                  f"got {name[:80]!a}")


def topology_file_fields() -> set[str]:
    """Top-level keys any topology file form may use (check-config's kind detection)."""
    import dataclasses

    return {f.name for f in dataclasses.fields(TopologyFile)} | {f.name for f in dataclasses.fields(TopologyFileV2)}


def _leaf_groups(nodes: tuple[NodeFileV2, ...]) -> dict[str, int]:
    """Leaves that share a node form one group (a scalable unit of a rail-optimized fabric, one leaf of a
    fat tree); groups numbered in the order of their first leaf's name."""
    parent: dict[str, str] = {}

    def find(x: str) -> str:
        while parent.setdefault(x, x) != x:
            parent[x] = parent[parent[x]]
            x = parent[x]
        return x

    for n in nodes:
        leaves = [nic.leaf for nic in n.nics if nic.leaf is not None]
        for leaf in leaves:
            find(leaf)
        for a, b in pairwise(leaves):
            ra, rb = find(a), find(b)
            if ra != rb:
                parent[max(ra, rb)] = min(ra, rb)
    roots = sorted({find(x) for x in parent}, key=natural_key)
    index = {r: i for i, r in enumerate(roots)}
    return {leaf: index[find(leaf)] for leaf in parent}


def topology_from_v2(tf: TopologyFileV2) -> Topology:
    groups = _leaf_groups(tf.nodes)
    spare = max(groups.values(), default=-1) + 1  # nodes on no known leaf
    specs: dict[str, NodeSpec] = {}
    stated: set[tuple[str, str]] = set()
    for n in tf.nodes:
        # in a rail-optimized fabric a NIC on no rail (a storage or frontend port: rail null) serves no GPU
        # and takes no place in the name order
        railed = [i for i, f in enumerate(n.nics) if not tf.rail_optimized or f.rail is not None]
        ordered = sorted(railed, key=lambda i: (natural_key(n.nics[i].device or n.nics[i].interface
                                                         or n.nics[i].node_guid or ""), n.nics[i].port))
        place = {i: k for k, i in enumerate(ordered)}
        bound: list[NicSpec] = []
        unbound: list[NicSpec] = []
        for i, f in enumerate(n.nics):
            if f.gpu is not None:
                gpu = f.gpu
                stated.add((n.name, f.device or ""))
            else:
                # the stated fallback, until the agent's hello pairs them by PCI affinity (pair_gpus): name
                # order (a rail is a leaf group, not a GPU)
                gpu = place[i] % n.gpus if i in place else -1
            nic = NicSpec(device=f.device or "", rail=f.rail, gpu=gpu, port=f.port, rate_gbps=f.rate_gbps,
                          width=f.width, leaf=f.leaf, leaf_port=f.leaf_port,
                          node_guid=f"0x{int(f.node_guid, 16):016x}" if f.node_guid else None,
                          interface=f.interface)
            (bound if f.device else unbound).append(nic)
        first_leaf = next((f.leaf for f in n.nics if f.leaf is not None), None)
        unit = n.unit if n.unit is not None else (groups[first_leaf] if first_leaf is not None else spare)
        specs[n.name] = NodeSpec(name=n.name, unit=unit, gpus=n.gpus, nics=tuple(bound), unbound=tuple(unbound))
    per_unit: dict[int, int] = {}
    for spec in specs.values():
        per_unit[spec.unit] = per_unit.get(spec.unit, 0) + 1
    leaf_spines = {leaf: tuple(v.spines) for leaf, v in tf.leaves.items()}
    spines = len({s for v in leaf_spines.values() for s in v})
    topo = Topology(tf.cluster, tf.layout, max(per_unit.values(), default=1), spines, specs, version=2,
                    rail_optimized=tf.rail_optimized, leaf_spines=leaf_spines,
                    switches={name: f"0x{int(v.guid, 16):016x}" for name, v in tf.switches.items()})
    topo.binding.gpu_stated = stated
    return topo
