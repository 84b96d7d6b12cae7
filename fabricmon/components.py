"""One typed identity for every component the aggregator judges, from the topology to the alert.

A ``Component`` is a frozen value: its identity is ``(kind, id)``, ``id`` the DESIGN.md spelling
(``node-017/mlx5_3/1``, ``node-017/gpu2``, ``leaf-u1-r3``, ...), and it carries typed fields (node,
device, port, GPU index, NVLink index, rail, leaf name, job) so nobody parses the id back.  Fields
other than ``kind`` and ``id`` are context the topology handed out (which rail and leaf a NIC sits
on): they never take part in equality or hashing, so a Component parsed at an input edge (HTTP
query, scenario file) equals the one the topology handed out.

Leaves and spines are *names* handed out by the topology (``Topology.leaf``): ``leaf-u0-r3`` for a
generated rail-optimized cluster, whatever a topology file names them otherwise (``leaf-a3``).  The
scalable unit is a topology attribute and never part of an identity.

Strings appear only where the aggregator speaks to the outside: ``str(component)`` (the id) and
``component.labels(cluster)`` (the alert labels) for Alertmanager, HTTP and logs.  Ids are parsed
only at input edges, one function per input: today the topology file (``topology.py``) and the scenario
file (``sim/scenario.py``) name nodes, devices, rails and units as fields, so nothing parses an id;
no HTTP endpoint takes a component parameter.

Adding a kind: a member of ``Kind`` (its value is the ``component_type`` label), a constructor below
that renders its id, and (if it has a parent that shares its evidence, like a link's NIC)
``Component.parent``.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from .compat import StrEnum


class Kind(StrEnum):
    """DESIGN.md's component_type: the value is the label."""

    LINK = "link"
    NIC = "nic"
    GPU = "gpu"
    NVLINK = "nvlink"
    NODE = "node"
    RAIL = "rail"
    LEAF = "leaf"
    SPINE = "spine"
    UPLINK = "uplink"  # a switch-to-switch cable, named by its leaf end: leaf-a3/p17
    CONFIG = "config"
    JOB = "job"


# the kinds a network fault lives on (what compute stragglers are never blamed on)
NETWORK_KINDS = frozenset({Kind.LINK, Kind.NIC, Kind.LEAF, Kind.RAIL, Kind.SPINE, Kind.UPLINK, Kind.CONFIG})


@dataclass(frozen=True, slots=True, eq=False)
class Component:
    kind: Kind
    id: str
    node: str = field(default="", compare=False)
    device: str = field(default="", compare=False)
    port: str = field(default="", compare=False)
    gpu: int | None = field(default=None, compare=False)
    link: int | None = field(default=None, compare=False)  # NVLink index
    rail: int | None = field(default=None, compare=False)
    leaf: str = field(default="", compare=False)  # the leaf's name, as the topology hands it out
    job: str = field(default="", compare=False)
    stage: int | None = field(default=None, compare=False)
    spine: str = field(default="", compare=False)  # an uplink's spine end: the spine's name ...
    spine_port: str = field(default="", compare=False)  # ... and its port

    def __str__(self) -> str:
        return self.id

    def __repr__(self) -> str:
        return f"Component({self.kind.value} {self.id!r})"

    # identity is (kind, id) only; written out because the generated versions hash the Enum member in
    # Python on every dict lookup
    def __eq__(self, other: object) -> bool:
        if self is other:
            return True
        if other.__class__ is not Component:
            return NotImplemented
        return self.id == other.id and self.kind is other.kind

    def __hash__(self) -> int:
        return hash(self.id)

    def __lt__(self, other: Component) -> bool:  # sorted() of components: by kind, then id
        return (self.kind.value, self.id) < (other.kind.value, other.id)

    @property
    def type(self) -> str:
        """The ``component_type`` label."""
        return self.kind.value

    def parent(self) -> Component | None:
        """The component this one's evidence also counts for: a link's NIC, an NVLink's GPU."""
        if self.kind is Kind.LINK:
            return nic(self.node, self.device, self.rail, self.leaf)
        if self.kind is Kind.NVLINK:
            return gpu(self.node, self.gpu or 0, self.rail, self.leaf)
        return None

    def labels(self, cluster: str = "") -> dict[str, str]:
        """The alert labels this component gives (DESIGN.md "Labels"), without alertname/severity."""
        lab: dict[str, str] = {}
        if self.node:
            lab["node"] = self.node
        if self.gpu is not None:
            lab["gpu"] = str(self.gpu)
        if self.rail is not None:
            lab["rail"] = str(self.rail)
        if self.leaf:
            lab["leaf"] = self.leaf
        if self.spine:
            lab["spine"] = self.spine
        if self.spine_port:
            lab["spine_port"] = self.spine_port
        if self.job:
            lab["hpc_job"] = self.job
        if cluster:
            lab["cluster"] = cluster
        return lab


# ---------------------------------------------------------------------------- constructors
def link(node: str, device: str, port: str | int = 1, rail: int | None = None, leaf: str = "") -> Component:
    port = str(port)
    return Component(Kind.LINK, f"{node}/{device}/{port}", node=node, device=device, port=port, rail=rail,
                     leaf=leaf)


def nic(node: str, device: str, rail: int | None = None, leaf: str = "") -> Component:
    return Component(Kind.NIC, f"{node}/{device}", node=node, device=device, rail=rail, leaf=leaf)


def gpu(node: str, index: int, rail: int | None = None, leaf: str = "") -> Component:
    return Component(Kind.GPU, f"{node}/gpu{index}", node=node, gpu=index, rail=rail, leaf=leaf)


def nvlink(node: str, gpu_index: int, index: int, rail: int | None = None, leaf: str = "") -> Component:
    return Component(Kind.NVLINK, f"{node}/gpu{gpu_index}/nvlink{index}", node=node, gpu=gpu_index, link=index,
                     rail=rail, leaf=leaf)


def node(name: str) -> Component:
    return Component(Kind.NODE, name, node=name)


def rail(index: int) -> Component:
    return Component(Kind.RAIL, f"rail{index}", rail=index)


def leaf(name: str, rail_index: int | None = None) -> Component:
    """A leaf switch by the name the topology gave it; ``rail_index`` its rail in a rail-optimized fabric."""
    return Component(Kind.LEAF, name, rail=rail_index, leaf=name)


def spine(name: str) -> Component:
    return Component(Kind.SPINE, name)


# A switch port as an Ethernet switch names it (Ethernet1/1, swp12, Eth1/1/2) or an InfiniBand port number.
SWITCH_PORT_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_./:-]{0,63}")


def port_part(port: int | str) -> str:
    """A switch port inside a component id: ``/`` separates an id's parts, so ``Ethernet1/1`` is ``Ethernet1_1``."""
    return str(port).replace("/", "_")


def uplink(leaf_name: str, port: int | str, spine_name: str = "", spine_port: int | str = "") -> Component:
    """A leaf-to-spine cable, named by its leaf end (``leaf-a3/p17``, ``leaf-a3/pEthernet1_1``); no node: no
    host owns it.  The ``port`` label keeps the switch's own name."""
    return Component(Kind.UPLINK, f"{leaf_name}/p{port_part(port)}", port=str(port), leaf=leaf_name,
                     spine=spine_name, spine_port=str(spine_port))


def config(node_name: str, device: str = "", rail: int | None = None, leaf: str = "") -> Component:
    """Lossless-config drift: on one NIC (``node/dev``), or on the node when all its rail NICs drift."""
    cid = f"{node_name}/{device}" if device else node_name
    return Component(Kind.CONFIG, cid, node=node_name, device=device, rail=rail, leaf=leaf)


def job(name: str, stage: int | None = None) -> Component:
    """A software finding about a whole job, or one pipeline stage of it."""
    cid = name if stage is None else f"{name}/stage{stage}"
    return Component(Kind.JOB, cid, job=name, stage=stage)
