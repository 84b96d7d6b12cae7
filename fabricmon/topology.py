"""The cluster model the aggregator localizes against: node, GPU, NIC, rail, leaf, spine.

Rail-optimized layout: NIC i of every node sits on rail i beside GPU i; the
nodes of one scalable unit share one leaf switch per rail; leaves connect to
every spine.  Component ids follow DESIGN.md ("Component ids") everywhere.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import yaml

from .configload import ConfigError, build, load_yaml_file
from .textcheck import node_name_problem

# The largest cluster a topology may describe: a typo (nodes: 100000000) otherwise runs for minutes
# and gigabytes before anything says so.  Per node, bounds far above any real machine.
MAX_NODES = 65_536
MAX_GPUS_PER_NODE = 64
MAX_NICS_PER_NODE = 64
MAX_RATE_GBPS = 10_000.0

COMPONENT_TYPES = ("link", "nic", "gpu", "nvlink", "node", "rail", "leaf", "spine", "config")


def node_name(index: int, n_nodes: int) -> str:
    """``node-017``; more digits when the cluster needs them (``node-0017`` of 4,096)."""
    width = max(3, len(str(max(n_nodes - 1, 0))))
    return f"node-{index:0{width}d}"


def link_id(node: str, device: str, port: str | int = 1) -> str:
    return f"{node}/{device}/{port}"


def nic_id(node: str, device: str) -> str:
    return f"{node}/{device}"


def gpu_id(node: str, gpu: int) -> str:
    return f"{node}/gpu{gpu}"


def nvlink_id(node: str, gpu: int, link: int) -> str:
    return f"{node}/gpu{gpu}/nvlink{link}"


def leaf_id(unit: int, rail: int) -> str:
    return f"leaf-u{unit}-r{rail}"


def rail_id(rail: int) -> str:
    return f"rail{rail}"


def spine_id(index: int) -> str:
    return f"spine-{index}"


@dataclass(frozen=True)
class NicSpec:
    device: str
    rail: int
    gpu: int
    port: int = 1
    rate_gbps: float = 400.0
    width: int = 4

    def validate(self, path: str, source: str) -> None:
        for what, v in (("rail", self.rail), ("gpu", self.gpu), ("port", self.port)):
            if v < 0:
                raise ConfigError(f"{source}: {path}.{what}: must be >= 0, got {v}")
        if not 0 < self.rate_gbps <= MAX_RATE_GBPS:
            raise ConfigError(f"{source}: {path}.rate_gbps: must be in (0, {MAX_RATE_GBPS:g}], got {self.rate_gbps}")
        if self.width < 1:
            raise ConfigError(f"{source}: {path}.width: must be >= 1 lane, got {self.width}")


@dataclass(frozen=True)
class NodeSpec:
    name: str
    unit: int
    gpus: int = 8
    nics: tuple[NicSpec, ...] = ()

    def validate(self, path: str, source: str) -> None:
        why = node_name_problem(self.name)
        if why is not None:
            raise ConfigError(f"{source}: {path}.name: {why}")
        if self.unit < 0:
            raise ConfigError(f"{source}: {path}.unit: must be >= 0, got {self.unit}")
        if not 1 <= self.gpus <= MAX_GPUS_PER_NODE:
            raise ConfigError(f"{source}: {path}.gpus: must be in [1, {MAX_GPUS_PER_NODE}], got {self.gpus}")
        if len(self.nics) > MAX_NICS_PER_NODE:
            raise ConfigError(f"{source}: {path}.nics: {len(self.nics)} NICs, at most {MAX_NICS_PER_NODE}")
        devices: set[str] = set()
        for i, nic in enumerate(self.nics):
            if nic.device in devices:
                raise ConfigError(f"{source}: {path}.nics[{i}].device: duplicate NIC {nic.device!r} on {self.name}")
            devices.add(nic.device)
            if not 0 <= nic.gpu < self.gpus:
                raise ConfigError(f"{source}: {path}.nics[{i}].gpu: {nic.gpu} is not a GPU of {self.name} (0..{self.gpus - 1})")


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
    # derived indexes
    _nic_by_dev: dict[tuple[str, str], NicSpec] = field(default_factory=dict, repr=False)
    _nic_by_gpu: dict[tuple[str, int], NicSpec] = field(default_factory=dict, repr=False)

    def __post_init__(self) -> None:
        for n in self.nodes.values():
            for nic in n.nics:
                self._nic_by_dev[(n.name, nic.device)] = nic
                self._nic_by_gpu[(n.name, nic.gpu)] = nic

    # --- lookups ---
    def unit_of(self, node: str) -> int:
        return self.nodes[node].unit

    def nic(self, node: str, device: str) -> NicSpec | None:
        return self._nic_by_dev.get((node, device))

    def nic_for_gpu(self, node: str, gpu: int) -> NicSpec | None:
        return self._nic_by_gpu.get((node, gpu))

    def leaf_of(self, node: str, rail: int) -> str:
        return leaf_id(self.nodes[node].unit, rail)

    def rails(self) -> list[int]:
        return sorted({nic.rail for n in self.nodes.values() for nic in n.nics})

    def units(self) -> list[int]:
        return sorted({n.unit for n in self.nodes.values()})

    def nodes_in_unit(self, unit: int) -> list[str]:
        return [n.name for n in self.nodes.values() if n.unit == unit]

    def path_of_gpu(self, node: str, gpu: int) -> dict[str, str]:
        """Every component a rank on (node, gpu) depends on, by component type."""
        out = {"node": node, "gpu": gpu_id(node, gpu)}
        nic = self.nic_for_gpu(node, gpu)
        if nic is not None:
            out["nic"] = nic_id(node, nic.device)
            out["link"] = link_id(node, nic.device, nic.port)
            out["rail"] = rail_id(nic.rail)
            out["leaf"] = self.leaf_of(node, nic.rail)
        return out

    def labels_of_link(self, node: str, device: str) -> dict[str, str]:
        nic = self.nic(node, device)
        if nic is None:
            return {"node": node}
        return {"node": node, "rail": str(nic.rail), "leaf": self.leaf_of(node, nic.rail)}

    # --- serialization ---
    def to_dict(self) -> dict:
        return {
            "cluster": self.cluster,
            "layout": self.layout,
            "nodes_per_unit": self.nodes_per_unit,
            "spines": self.spines,
            "nodes": [
                {"name": n.name, "unit": n.unit, "gpus": n.gpus,
                 "nics": [{"device": c.device, "port": c.port, "rail": c.rail, "gpu": c.gpu,
                           "rate_gbps": c.rate_gbps, "width": c.width} for c in n.nics]}
                for n in self.nodes.values()
            ],
        }

    def write_yaml(self, path: str | Path) -> None:
        from .atomic import atomic_write_text

        atomic_write_text(path, yaml.safe_dump(self.to_dict(), sort_keys=False))


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


def load_topology(path: str | Path) -> Topology:
    data = load_yaml_file(path)
    tf = build(TopologyFile, data, "", str(path))
    if tf.generate is not None and not tf.nodes:
        g = tf.generate
        return generate_topology(
            g.nodes, layout=tf.layout, nodes_per_unit=tf.nodes_per_unit, gpus_per_node=g.gpus_per_node,
            rails=g.rails, spines=tf.spines, cluster=tf.cluster, rate_gbps=tf.rate_gbps,
        )
    nodes = {n.name: n for n in tf.nodes}
    return Topology(tf.cluster, tf.layout, tf.nodes_per_unit, tf.spines, nodes)
