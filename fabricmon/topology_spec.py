"""A topology's parts as values: the NIC and node specs, their bounds, and the spelling of component ids
(DESIGN.md "Component ids").

``topology.py`` builds the ``Topology`` from these and re-exports them (callers import them from there);
they live apart so the topology's helpers (topology_index.py, topology_binding.py, topology_shape.py) can
read them without importing the ``Topology`` that holds the helpers.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from .configload import ConfigError
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


def canonical_guid(text: str) -> str | None:
    """A node GUID as ``0x`` and 16 hex digits, from ``0xb8cef60300a1b2c3`` (ibnetdiscover, topology files)
    or ``b8ce:f603:00a1:b2c3`` (sysfs ``node_guid``, the agent's label) or 16 bare hex digits; else None."""
    t = text.strip().lower()
    if ":" in t:
        parts = t.split(":")
        if len(parts) != 4 or not all(len(p) == 4 for p in parts):
            return None
        t = "".join(parts)
    elif t.startswith("0x"):
        t = t[2:]
    elif len(t) != 16:  # bare hex only at full width: a netdev like "eth0" is no GUID
        return None
    if not t or len(t) > 16 or any(c not in "0123456789abcdef" for c in t):
        return None
    return f"0x{int(t, 16):016x}"


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
    rail: int | None  # None: not rail-optimized (a fat tree), version-2 files only
    gpu: int
    port: int = 1
    rate_gbps: float = 400.0
    width: int = 4
    # Version 2 (imported) only; None in generated and version-1 topologies:
    leaf: str | None = None  # the leaf switch's name, replacing leaf-u<unit>-r<rail>
    node_guid: str | None = None  # "0x..." as fabricmon_ib_port_info's node_guid label
    interface: str | None = None  # the netdev (LLDP imports)
    # the leaf's port at the cable's other end: a number (ibnetdiscover) or an Ethernet switch's port name (LLDP)
    leaf_port: int | str | None = None

    def validate(self, path: str, source: str) -> None:
        for what, v in (("rail", self.rail), ("gpu", self.gpu), ("port", self.port)):
            if v is not None and v < 0:  # rail: None on a fat tree (version 2)
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
    # Version 2: NICs whose RDMA device the import could not name (a "gpu-a17-03 HCA-1" description,
    # an LLDP netdev), known by node_guid or interface until the agent's inventory names the device
    # (AgentBinding.bind_devices); ``device`` is "" until then.  Not in ``nics``, so no component id is
    # built from them.
    unbound: tuple[NicSpec, ...] = ()

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
                raise ConfigError(f"{source}: {path}.nics[{i}].gpu: {nic.gpu} is not a GPU of {self.name} "
                                  f"(0..{self.gpus - 1})")


def natural_key(text: str) -> tuple:
    """Sort key reading digit runs as numbers: ``leaf-2`` before ``leaf-10``."""
    return tuple(int(p) if p.isdigit() else p for p in re.split(r"(\d+)", text))
