"""Write an ``Imported`` topology as the version-2 file of DESIGN.md "Topology from the fabric"."""

from __future__ import annotations

from typing import Any

import yaml

from .build import Imported

try:  # libyaml writes a 2,048-node file ten times faster than the pure-Python dumper
    _Dumper: Any = yaml.CSafeDumper
except AttributeError:  # pragma: no cover - PyYAML without libyaml
    _Dumper = yaml.SafeDumper


def to_document(imp: Imported, cluster: str) -> dict:
    nodes = []
    for host, nics in imp.nodes.items():
        rows = []
        for n in nics:
            row: dict[str, Any] = {"device": n.device, "port": n.port}
            if n.node_guid is not None:
                row["node_guid"] = f"0x{n.node_guid:016x}"
            if n.interface is not None:
                row["interface"] = n.interface
            row["leaf"] = n.leaf
            if n.leaf_port is not None:
                row["leaf_port"] = n.leaf_port
            row["rail"] = n.rail
            rows.append(row)
        nodes.append({"name": host, "nics": rows})
    doc: dict[str, Any] = {
        "version": 2,
        "cluster": cluster,
        "layout": imp.layout,
        "rail_optimized": imp.rail_optimized,
        "nodes": nodes,
        "leaves": {leaf: {"spines": spines} for leaf, spines in imp.leaves.items()},
    }
    if imp.switches:
        doc["switches"] = {name: {"guid": f"0x{guid:016x}"} for name, guid in imp.switches.items()}
    return doc


def render(imp: Imported, cluster: str, sources: list[str]) -> tuple[str, dict]:
    """The file's text and the document it holds."""
    head = ["# fabricmon topology, version 2: written by `fabricmon topology import`; re-import instead of",
            "# editing (`fabricmon topology diff OLD NEW` shows what changed).  From:"]
    head += [f"#   {s}" for s in sources]
    head += [f"# note: {line}" for line in imp.notes]
    doc = to_document(imp, cluster)
    body = yaml.dump(doc, Dumper=_Dumper, sort_keys=False, default_flow_style=None, width=200)
    return "\n".join(head) + "\n" + body, doc
