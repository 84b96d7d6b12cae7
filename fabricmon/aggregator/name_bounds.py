"""Per-node bounds on the names a node may introduce at the aggregator.

Every device, port, GPU, NVLink and interface name a node streams becomes state
at the aggregator (link and GPU state, indexes, detector windows) that lives as
long as the process.  A node holding its own valid credential could grow that
without bound with new names (measured: about 14 MiB per 100,000 names), so each
node may introduce at most ``DEFAULT_LIMITS`` of each kind; a series that would
add one more is refused when it is defined (once per connection, never per
sample), its values are not ingested, and the refusal is counted by kind
(``fabricmon_ingest_names_refused_total{kind}``) and logged once per node and kind.

The defaults sit far above real nodes, the new driver families included: an
8-GPU node has 8-18 RDMA devices (ConnectX, plus BlueField and a frontend NIC),
an AWS p5 node 32 EFA devices (``rdmap*``), Broadcom ``bnxt_re`` and Intel
``irdma`` one device per port; 18 NVLinks per GPU on H100, SR-IOV VFs and VLANs
add interfaces.  Names once admitted stay admitted (a node that swapped one HCA
keeps its old name counted), so the limits leave room for churn too.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace

import structlog

from ..batch import NodeHello
from ..model import Labels

log = structlog.get_logger("fabricmon.name_bounds")

# kind -> how many distinct names one node may introduce
DEFAULT_LIMITS: dict[str, int] = {
    "device": 128,      # RDMA devices (mlx5_*, bnxt_re*, irdma*, rdmap* (EFA), hfi1_*)
    "port": 512,        # (device, port) pairs
    "gpu": 64,          # GPU indexes
    "link": 2048,       # (gpu, NVLink) pairs: 64 x 18 = 1,152 with room
    "interface": 1024,  # netdevs: rail NICs, frontend, bonds, VLANs, VFs
}
KINDS = tuple(DEFAULT_LIMITS)


class NameBounds:
    """The names each node introduced so far, bounded per kind."""

    def __init__(self, limits: dict[str, int] | None = None) -> None:
        self.limits = dict(DEFAULT_LIMITS, **(limits or {}))
        self._seen: dict[str, dict[str, set[object]]] = {}
        self.refused: dict[str, int] = dict.fromkeys(KINDS, 0)
        self._logged: set[tuple[str, str]] = set()

    def _names(self, labels: Labels) -> list[tuple[str, object]]:
        d = dict(labels)
        out: list[tuple[str, object]] = []
        dev = d.get("device")
        if dev is not None:
            out.append(("device", dev))
            if "port" in d:
                out.append(("port", (dev, d["port"])))
        gpu = d.get("gpu")
        if gpu is not None:
            out.append(("gpu", gpu))
            if "link" in d:
                out.append(("link", (gpu, d["link"])))
        if "interface" in d:
            out.append(("interface", d["interface"]))
        return out

    def _admit(self, node: str, names: list[tuple[str, object]]) -> bool:
        seen = self._seen.get(node)
        if seen is None:
            seen = self._seen[node] = {k: set() for k in KINDS}
        new = [(k, v) for k, v in names if v not in seen[k]]
        if not new:
            return True
        for kind, _ in new:
            if len(seen[kind]) + sum(1 for k, _ in new if k == kind) > self.limits[kind]:
                self.refused[kind] += 1
                if (node, kind) not in self._logged:
                    self._logged.add((node, kind))
                    log.warning("node_names_over_limit", node=node, kind=kind, limit=self.limits[kind],
                                metric="fabricmon_ingest_names_refused_total",
                                detail="series introducing further names are not ingested")
                return False
        for kind, v in new:
            seen[kind].add(v)
        return True

    def admitter(self, node: str) -> Callable[[tuple[str, Labels]], bool]:
        """For ``SeriesDecoder(admit=...)``: True when the series' names fit ``node``'s bounds."""
        return lambda key: self._admit(node, self._names(key[1]))

    def hello(self, h: NodeHello) -> NodeHello:
        """``h`` with the NICs that would pass a bound left out (counted)."""
        keep = tuple(n for n in h.nics if self._admit(h.node, self._names(
            (("device", n.device), ("port", str(n.port))) + ((("interface", n.netdev),) if n.netdev else ()))))
        return h if len(keep) == len(h.nics) else replace(h, nics=keep)
