"""In-memory mode: NodeHello + NodeBatch per node per interval, straight from ClusterState.

No tree is written and no sysfs is parsed, so the aggregator's benchmarks at
4,096 nodes are not file-system bound.  The batches are what the real agent
would stream for the same hardware state: the *catalog* of series (family,
labels in spec order, semantics, width, scale, reset group) is built once from
the sources' own pure classification functions (``infiniband.classify``,
``ethtool.classify_stat``, ``fabric_config.evaluate`` rules, the NVML readings
layout), and the per-interval deltas follow ``counters.CounterTracker`` rule
for rule (wrap unless the port's group was reset, reset on a decrease,
saturation flags), vectorized with numpy over every node at once.  Gauges are
streamed as the agent's stream client does: all of them in the first batch,
then only those that changed or reappeared.

``tests/sim/test_sim_inmemory.py`` checks, for a small cluster, that these batches
equal what the real pipeline (Poller over the rendered tree, then the stream
client's gauge filter) produces for the same state transitions.
"""

from __future__ import annotations

import gc
import uuid as _uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import cast

import numpy as np

from .. import __version__
from ..batch import DeltaColumns, NicHello, NodeBatch, NodeHello
from ..model import CounterDelta, Labels, Sample, Semantics, Snapshot
from ..rank_timing import JobLayout, RankTiming
from ..sources.ethtool import ETHTOOL_UNCLASSIFIED, ETHTOOL_UP, classify_stat, lookup_stat
from ..sources.infiniband import DATA_PER_NOMINAL
from ..sources.infiniband import UNCLASSIFIED as HW_UNCLASSIFIED
from ..sources.infiniband import classify as ib_classify
from ..sources.nvml.backend import ERROR_PATHS, NO_PATH, NVLINK_ERROR_TYPES, THROTTLE_REASONS, TRAFFIC_PATHS
from .cluster import ClusterState
from .hw import (
    DOWN_RATE,
    ETH_STATS,
    GPU_NAME,
    HW_CONG64,
    HW_LIFESPAN_MS,
    HW_PPCNT64,
    HW_Q32,
    HW_ROCE_ACCL32,
    LANE_DGBPS,
    NGPU,
    NVLINKS,
    PMA_ERR_WIDTH,
    PMA_TRAFFIC,
    SPEEDS,
    K,
    gpu_pci_bus_id,
)

_LANE = np.array([LANE_DGBPS[s] for s in SPEEDS], dtype=np.float64)
_CODING = np.array([DATA_PER_NOMINAL[s] for s in SPEEDS], dtype=np.float64)


@dataclass
class _Counter:
    family: str
    labels: Labels
    semantics: Semantics
    width: int
    scale: float  # CounterDelta.delta = float(delta) * scale
    group: str
    src: tuple  # ("C", counter index, device, transform, mult) | ("nvl", field, gpu, link, mult)


@dataclass
class _Gauge:
    family: str
    labels: Labels | None  # None: per-node labels from label_fn
    getter: tuple
    label_fn: Callable[[int], Labels] | None = None


class Catalog:
    """Every series one simulated node's agent exports (identical for all nodes of a layout)."""

    def __init__(self, cluster: ClusterState, optics: bool = True) -> None:
        self.cluster = cluster
        self.counters: list[_Counter] = []
        self.gauges: list[_Gauge] = []
        for d in cluster.devs:
            self._ib_port(d)
        if optics:  # the agent's transceiver source (sources.transceiver.enabled, as sim.agents runs it)
            for d in cluster.devs:
                if d.rail is not None:
                    self._transceiver(d)
        for d in cluster.devs:
            if d.ethernet:
                self._ethtool(d)
        for d in cluster.devs:
            if d.rail is not None:
                self._fabric_config(d)
        for g in range(NGPU):
            self._gpu(g)
        self._discovered()

    # -- fabricmon_devices_discovered (infiniband, ethtool and nvml sources) ----------------
    def _discovered(self) -> None:
        devs = self.cluster.devs
        eth = sum(1 for d in devs if d.ethernet)
        for kind, n in (("rdma_device", len(devs)), ("ib_port", len(devs) - eth), ("roce_port", eth),
                        ("roce_netdev", eth), ("netdev", eth), ("gpu", NGPU)):
            self.gauges.append(_Gauge("fabricmon_devices_discovered", (("kind", kind),), ("const", float(n))))
        # infiniband source: the ports the agent config expects (default: at least one); pci source
        self.gauges.append(_Gauge("fabricmon_devices_expected", (("kind", "rdma_port"),), ("const", 1.0)))
        self.gauges.append(_Gauge("fabricmon_pci_nvidia_gpus", (), ("const", float(NGPU))))
        # the tree puts rail NIC i and GPU i under one PCIe switch (hw.pci_device_path): rails from PCI affinity
        self.gauges.append(_Gauge("fabricmon_rail_assignment_info",
                                  (("source", "pci_affinity"), ("pci_affinity", "paired")), ("const", 1.0)))

    # -- infiniband source ----------------------------------------------------------------
    def _ib_port(self, d) -> None:
        c = self.cluster
        dp: Labels = (("device", d.name), ("port", "1"))
        key = f"{d.name}/1"
        G = self.gauges
        G.append(_Gauge("fabricmon_ib_port_state", dp, ("state", d.index)))
        G.append(_Gauge("fabricmon_ib_port_physical_state", dp, ("phys", d.index)))
        G.append(_Gauge("fabricmon_ib_port_rate_bytes_per_second", dp, ("rate_Bps", d.index)))
        G.append(_Gauge("fabricmon_ib_port_data_rate_bytes_per_second", dp, ("data_Bps", d.index)))
        G.append(_Gauge("fabricmon_ib_port_width_lanes", dp, ("width", d.index)))
        rail = "" if d.rail is None else str(d.rail)
        iface = d.ifname if d.ethernet else ""  # discovery names the netdev of RoCE ports only (GID table)

        def info_labels(n: int, d=d, rail=rail, iface=iface) -> Labels:
            return dp + (("rail", rail), ("link_layer", d.link_layer), ("interface", iface),
                         ("hca_type", d.hca_type), ("fw_ver", d.fw_ver), ("node_guid", c.node_guid(n, d.index)),
                         ("board_id", d.board_id))

        G.append(_Gauge("fabricmon_ib_port_info", None, ("const", 1.0), info_labels))
        G.append(_Gauge("fabricmon_ib_port_up", dp, ("const", 1.0)))
        files = [("counters", n, "pma:" + n) for n in sorted(PMA_TRAFFIC + tuple(PMA_ERR_WIDTH))]
        hw = HW_Q32 + ((HW_ROCE_ACCL32 + HW_CONG64 + HW_PPCNT64) if d.ethernet else ())
        files += [("hw_counters", n, "hw:" + n) for n in sorted(hw + ("lifespan",))]
        for subdir, name, kname in files:
            plan = ib_classify(subdir, name)
            labels = dp + (("counter", plan.counter),)
            for family, labelled in plan.families:
                lab = labels if labelled else dp
                if plan.semantics is Semantics.GAUGE:  # lifespan (ms): value raw * scale
                    G.append(_Gauge(family, lab, ("const", HW_LIFESPAN_MS * plan.scale)))
                    continue
                if name in PMA_ERR_WIDTH and name != "port_xmit_wait":
                    xform = ("sat", PMA_ERR_WIDTH[name])
                elif name in HW_Q32 or name in HW_ROCE_ACCL32:
                    xform = ("mask", 32)
                elif name == "port_xmit_wait":
                    xform = ("sat", 32)
                else:
                    xform = ("mask", 64)
                self.counters.append(_Counter(family, lab, plan.semantics, plan.width, 1.0, key,
                                              ("C", K[kname], d.index, xform, int(plan.scale))))
                if plan.semantics is Semantics.SATURATING:
                    G.append(_Gauge("fabricmon_ib_port_error_saturated", lab, ("sat", len(self.counters) - 1)))
        unknown = sum(1 for subdir, name, _ in files
                      if subdir == "hw_counters" and ib_classify(subdir, name).unclassified)
        G.append(_Gauge(HW_UNCLASSIFIED, (("device", d.name),), ("const", unknown)))

    # -- transceiver source ------------------------------------------------------------------
    def _transceiver(self, d) -> None:
        from .link_optics import OPTIC_LANES

        dp: Labels = (("device", d.name), ("port", "1"))
        G = self.gauges
        G.append(_Gauge("fabricmon_transceiver_temperature_celsius", dp, ("optic", "temp", d.index, 0)))
        G.append(_Gauge("fabricmon_transceiver_supply_voltage_volts", dp, ("const", 33000 * 1e-4)))
        G.append(_Gauge("fabricmon_transceiver_reading_age_seconds", dp, ("const", 0.0)))
        for lane in range(OPTIC_LANES):
            lab = dp + (("lane", str(lane)),)
            for fam, kind in (("fabricmon_transceiver_rx_power_watts", "rx"),
                              ("fabricmon_transceiver_tx_power_watts", "tx"),
                              ("fabricmon_transceiver_tx_bias_amperes", "bias")):
                G.append(_Gauge(fam, lab, ("optic", kind, d.index, lane)))

    # -- ethtool source ---------------------------------------------------------------------
    def _ethtool(self, d) -> None:
        for name in ETH_STATS:
            cls = classify_stat(name, ())
            if cls is None:
                continue
            labels = (("interface", d.ifname), *cls.labels)
            if cls.semantics is Semantics.GAUGE:
                self.gauges.append(_Gauge(cls.family, labels, ("eth_gauge", K["eth:" + name], d.index, cls.scale)))
            else:
                self.counters.append(_Counter(cls.family, labels, cls.semantics, cls.width, cls.scale, d.ifname,
                                              ("C", K["eth:" + name], d.index, ("mask", cls.width), 1)))
        self.gauges.append(_Gauge(ETHTOOL_UP, (("interface", d.ifname),), ("const", 1.0)))
        unknown = sum(1 for name in ETH_STATS if lookup_stat(name) is None)
        self.gauges.append(_Gauge(ETHTOOL_UNCLASSIFIED, (("interface", d.ifname), ("driver", "unknown")),
                                  ("const", unknown)))

    # -- fabric_config source -------------------------------------------------------------------
    def _fabric_config(self, d) -> None:
        iface = d.ifname if d.ethernet else ""
        # Ethernet ports get no width check: mlx5 prints their lane mode in IB terms.
        checks = ("pfc", "trust", "ecn_np", "ecn_rp", "mtu", "rate") if d.ethernet else ("rate", "width")
        for check in checks:
            self.gauges.append(_Gauge("fabricmon_fabric_config_ok",
                                      (("device", d.name), ("interface", iface), ("check", check), ("port", "1")),
                                      ("cfg", check, d.index)))

    # -- nvml source ------------------------------------------------------------------------------
    def _gpu(self, g: int) -> None:
        c = self.cluster
        gpu = str(g)
        grp = f"gpu{g}"
        G = self.gauges
        G.append(_Gauge("fabricmon_gpu_info", None, ("const", 1.0),
                        lambda n: (("gpu", str(g)), ("uuid", c.gpus.uuid(n, g)), ("name", GPU_NAME),
                                        ("pci_bus_id", gpu_pci_bus_id(g)), ("nvlink_counters", "legacy"))))
        G.append(_Gauge("fabricmon_gpu_up", (("gpu", gpu),), ("const", 1.0)))
        G.append(_Gauge("fabricmon_gpu_utilization_ratio", (("gpu", gpu),), ("util", g)))
        for reason, bit in THROTTLE_REASONS:
            G.append(_Gauge("fabricmon_gpu_throttle_reason", (("gpu", gpu), ("reason", reason)), ("throttle", g, bit)))
        # The simulated H100s are read on the legacy path, like the fake NVML file's default.
        for group, live, order in (("traffic", "throughput_fields", TRAFFIC_PATHS), ("errors", "legacy", ERROR_PATHS)):
            for path in order + (NO_PATH,):
                G.append(_Gauge("fabricmon_nvlink_nvml_path", (("gpu", gpu), ("counters", group), ("path", path)),
                                ("const", 1.0 if path == live else 0.0)))
        mono = Semantics.MONOTONIC
        for j in range(NVLINKS):
            link = str(j)
            G.append(_Gauge("fabricmon_nvlink_up", (("gpu", gpu), ("link", link)), ("nvl_up", g, j)))
            self.counters.append(_Counter("fabricmon_nvlink_transmit_bytes_total", (("gpu", gpu), ("link", link)),
                                          mono, 64, 1.0, grp, ("nvl", 0, g, j, 1024)))
            self.counters.append(_Counter("fabricmon_nvlink_receive_bytes_total", (("gpu", gpu), ("link", link)),
                                          mono, 64, 1.0, grp, ("nvl", 1, g, j, 1024)))
            for fi, etype in enumerate(NVLINK_ERROR_TYPES, start=2):
                self.counters.append(_Counter("fabricmon_nvlink_errors_total",
                                              (("gpu", gpu), ("link", link), ("type", etype)),
                                              mono, 64, 1.0, grp, ("nvl", fi, g, j, 1)))


class BatchBuilder:
    """Turns successive ClusterState read-outs into one NodeBatch per node (vectorized)."""

    def __init__(self, cluster: ClusterState, interval_seconds: float = 1.0, *, optics: bool = True) -> None:
        self.cluster = cluster
        self.interval_seconds = interval_seconds
        self.catalog = cat = Catalog(cluster, optics)
        cs = cat.counters
        self.c_family = [x.family for x in cs]
        self.c_labels = [x.labels for x in cs]
        self.c_keys = [(x.family, x.labels) for x in cs]  # each series' (family, labels), made once
        self.c_scale = np.array([x.scale for x in cs])
        self.c_wrap = np.array([x.semantics is Semantics.WRAPPING for x in cs])
        self.c_mono = np.array([x.semantics is Semantics.MONOTONIC for x in cs])
        self.c_satur = np.array([x.semantics is Semantics.SATURATING for x in cs])
        self.c_width = np.array([x.width for x in cs])
        self.c_satlim = np.array([(1 << x.width) - 1 if x.semantics is Semantics.SATURATING else -1 for x in cs],
                                 dtype=np.int64)
        self.c_wrapmod = np.array([(1 << x.width) if x.semantics is Semantics.WRAPPING else 0 for x in cs],
                                  dtype=np.int64)
        groups = sorted({x.group for x in cs})
        gid = {g: i for i, g in enumerate(groups)}
        self.c_group = np.array([gid[x.group] for x in cs])
        self.n_groups = len(groups)
        # gather plans
        crow = [i for i, x in enumerate(cs) if x.src[0] == "C"]
        nrow = [i for i, x in enumerate(cs) if x.src[0] == "nvl"]
        self._crow = np.array(crow, dtype=np.int64)
        self._nrow = np.array(nrow, dtype=np.int64)
        self._ck = np.array([cs[i].src[1] for i in crow], dtype=np.int64)
        self._cd = np.array([cs[i].src[2] for i in crow], dtype=np.int64)
        self._c_sat = np.array([(1 << cs[i].src[3][1]) - 1 if cs[i].src[3][0] == "sat" else -1 for i in crow],
                               dtype=np.int64)
        self._c_mask32 = np.array([cs[i].src[3] == ("mask", 32) for i in crow])
        self._c_mult = np.array([cs[i].src[4] for i in crow], dtype=np.int64)
        self._nf = np.array([cs[i].src[1] for i in nrow], dtype=np.int64)
        self._ng = np.array([cs[i].src[2] for i in nrow], dtype=np.int64)
        self._nl = np.array([cs[i].src[3] for i in nrow], dtype=np.int64)
        self._n_mult = np.array([cs[i].src[4] for i in nrow], dtype=np.int64)
        self._prev_raw: np.ndarray | None = None
        self._prev_g: np.ndarray | None = None
        self._prev_p: np.ndarray | None = None
        # per node: a node's link watch may emit a batch off the cadence (``build(nodes=...)``)
        self._prev_ts: np.ndarray | None = None
        self._seqs: np.ndarray | None = None
        self.seq = 0  # builds so far
        self._onehot: np.ndarray | None = None  # (groups, series): each series' counter group

    # ------------------------------------------------------------------ read-out
    def raw_counters(self) -> np.ndarray:
        """(series, nodes) raw values as the sources read them (after width transforms and scaling)."""
        c = self.cluster
        out = np.empty((len(self.c_family), c.n), dtype=np.int64)
        v = c.counters.C[self._ck, :, self._cd]  # (rows, nodes)
        sat = self._c_sat >= 0
        v = np.where(sat[:, None], np.minimum(v, np.where(sat, self._c_sat, 0)[:, None]), v)
        v = np.where(self._c_mask32[:, None], v & 0xFFFFFFFF, v)
        out[self._crow] = v * self._c_mult[:, None]
        out[self._nrow] = c.gpus.nvl[self._nf, :, self._ng, self._nl] * self._n_mult[:, None]
        return out

    def gauges(self, raw: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(values, present) of every gauge row, each (rows, nodes)."""
        c = self.cluster
        links, gpus, optics = c.links, c.gpus, c.optics
        n = c.n
        gs = self.catalog.gauges
        vals = np.zeros((len(gs), n))
        pres = np.ones((len(gs), n), dtype=bool)
        gbps = _LANE[links.speed] * links.lanes / 10
        for i, gg in enumerate(gs):
            kind = gg.getter[0]
            if kind == "const":
                vals[i] = gg.getter[1]
            elif kind == "state":
                vals[i] = np.where(links.up[:, gg.getter[1]], 4, 1)
            elif kind == "phys":
                d = c.devs[gg.getter[1]]
                vals[i] = np.where(links.up[:, d.index], 5, 2 if d.link_layer == "InfiniBand" else 3)
            elif kind in ("rate_Bps", "data_Bps"):
                d = c.devs[gg.getter[1]]
                lanes, speed = DOWN_RATE[d.link_layer]
                down = LANE_DGBPS[speed] * lanes / 10
                vals[i] = np.where(links.up[:, d.index], gbps[:, d.index], down) * 1e9 / 8
                if kind == "data_Bps" and not d.ethernet:  # the agent's data_rate_gbps: less IB line coding
                    coding = np.where(links.up[:, d.index], _CODING[links.speed[:, d.index]], DATA_PER_NOMINAL[speed])
                    vals[i] = vals[i] * coding
            elif kind == "width":
                d = c.devs[gg.getter[1]]
                vals[i] = np.where(links.up[:, d.index], links.lanes[:, d.index], DOWN_RATE[d.link_layer][0])
            elif kind == "eth_gauge":
                _, k, dev, scale = gg.getter
                vals[i] = c.counters.C[k, :, dev] * scale
            elif kind == "cfg":
                _, check, dev = gg.getter
                if check == "pfc":
                    want = np.zeros(8, dtype=bool)
                    want[3] = True
                    vals[i] = (links.pfc[:, dev, :] == want).all(axis=1)
                elif check == "ecn_np":
                    vals[i] = links.ecn_np[:, dev, 3]
                elif check == "ecn_rp":
                    vals[i] = links.ecn_rp[:, dev, 3]
                elif check in ("trust", "mtu"):
                    vals[i] = 1.0  # the simulator never drifts these (compute NICs: trust dscp, MTU 9000)
                elif check == "rate":
                    vals[i] = np.abs(gbps[:, dev] - 400.0) < 1e-6
                    pres[i] = links.up[:, dev]  # checked on ACTIVE ports only
                elif check == "width":
                    vals[i] = links.lanes[:, dev] == 4
                    pres[i] = links.up[:, dev]
            elif kind == "util":
                vals[i] = np.clip(gpus.util[:, gg.getter[1]] / 100.0, 0.0, 1.0)
            elif kind == "optic":
                _, what, dev, lane = gg.getter
                if what == "temp":
                    vals[i] = np.round(optics.temp_c[:, dev] * 256) / 256  # SFF-8636 resolution
                elif what == "bias":
                    vals[i] = np.round(optics.bias_ma[:, dev, lane] * 500) * 2e-6
                else:
                    dbm = (optics.rx_dbm if what == "rx" else optics.tx_dbm)[:, dev, lane]
                    vals[i] = np.round(10 ** (dbm / 10) * 1e4) * 1e-7  # 0.1 uW steps
            elif kind == "throttle":
                _, g, bit = gg.getter
                vals[i] = (gpus.throttle[:, g] & bit) != 0
            elif kind == "nvl_up":
                _, g, j = gg.getter
                vals[i] = gpus.nvl_up[:, g, j]
            elif kind == "sat":
                row = gg.getter[1]
                vals[i] = raw[row] >= self.c_satlim[row]
            else:  # pragma: no cover - catalog and getters are built together
                raise AssertionError(kind)
        return vals, pres

    # ------------------------------------------------------------------ batches
    def hellos(self) -> list[NodeHello]:
        c = self.cluster
        links = c.links
        out = []
        for n in range(c.n):
            nics = tuple(NicHello(device=d.name, port="1", rail="" if d.rail is None else str(d.rail),
                                  link_layer=d.link_layer, netdev=d.ifname if d.ethernet else "",
                                  rate_gbps=float(_LANE[links.speed[n, d.index]] * links.lanes[n, d.index] / 10)
                                  if links.up[n, d.index] else DOWN_RATE[d.link_layer][0] *
                                  LANE_DGBPS[DOWN_RATE[d.link_layer][1]] / 10,
                                  width=int(links.lanes[n, d.index]) if links.up[n, d.index]
                                  else DOWN_RATE[d.link_layer][0],
                                  gpu=-1)
                         for d in c.devs)
            out.append(NodeHello(node=c.names[n], agent_version=__version__, interval_seconds=self.interval_seconds,
                                 nics=nics, gpus=NGPU, boot_id=str(_uuid.UUID(int=int(c.boot_id[n]) << 64 | n))))
        return out

    def build(self, ranks: dict[str, list[RankTiming]] | None = None,
              layouts: tuple[JobLayout, ...] = (), nodes: list[int] | None = None) -> list[NodeBatch]:
        """One NodeBatch per node (or for ``nodes`` only: the others' next batch carries their deltas since
        their own previous one) for the cluster's current state."""
        # Millions of small objects: the cyclic GC would rescan them all again and again while they
        # are built (none of them can form a cycle), so it pauses for the duration.
        was = gc.isenabled()
        gc.disable()
        try:
            return list(self._build(ranks, layouts, nodes))
        finally:
            if was:
                gc.enable()

    def stream(self, ranks: dict[str, list[RankTiming]] | None = None,
               layouts: tuple[JobLayout, ...] = (), nodes: list[int] | None = None) -> Iterator[NodeBatch]:
        """``build()``'s batches, in its order, each node's made only when the consumer asks for it (the
        read-out and the builder's state advance at once, on this call).  A consumer that delivers each
        batch before asking for the next holds one node's objects at a time: at 4,096 nodes
        ``build()`` holds about 1.6 million deltas until the last batch is made, long enough for the
        cyclic GC to carry them all into its older generations and rescan them there, a quarter of
        the in-memory demo's step; streamed, they die young."""
        return self._build(ranks, layouts, nodes)

    def _build(self, ranks, layouts, nodes) -> Iterator[NodeBatch]:
        c = self.cluster
        ts = c.ts()
        raw = self.raw_counters()
        gvals, gpres = self.gauges(raw)
        old = self._prev_raw
        first = old is None
        if first and nodes is not None:
            raise ValueError("the first build is of every node (their baseline)")
        self.seq += 1
        delta: np.ndarray | None = None  # with sat and rst: None on the first read (no deltas yet)
        sat: np.ndarray | None = None
        rst: np.ndarray | None = None
        if old is None:
            emit = np.zeros(raw.shape, dtype=bool)
        else:
            dec = raw < old
            if dec.any():
                # a group whose 64-bit monotonic counters went backwards was reset (driver reload)
                dm = (dec & self.c_mono[:, None]).astype(np.float32)
                onehot = self._onehot
                if onehot is None:
                    onehot = self._onehot = np.zeros((self.n_groups, raw.shape[0]), dtype=np.float32)
                    onehot[self.c_group, np.arange(raw.shape[0])] = 1
                greset = (onehot @ dm) > 0  # (groups, nodes)
                row_reset = greset[self.c_group]  # (series, nodes)
                wrap = dec & self.c_wrap[:, None] & ~row_reset
                rst = dec & ~wrap
                delta = np.where(~dec, raw - old, np.where(wrap, raw + self.c_wrapmod[:, None] - old, raw))
            else:
                rst = dec
                delta = raw - old
            sat = self.c_satur[:, None] & (raw >= self.c_satlim[:, None])
            emit = (delta != 0) | sat | rst
        prev_p = self._prev_p
        gchanged = gpres if prev_p is None else gpres & (~prev_p | (gvals != self._prev_g))
        node_list = list(range(c.n)) if nodes is None else list(nodes)
        sel = np.asarray(node_list, dtype=np.int64)
        if self._prev_ts is None or self._seqs is None:
            intervals = [0.0] * len(node_list)
            self._prev_ts, self._seqs = np.full(c.n, ts), np.ones(c.n, dtype=np.int64)
        else:
            intervals = (ts - self._prev_ts[sel]).tolist()
            self._prev_ts[sel] = ts
            self._seqs[sel] += 1
        seqs = self._seqs[sel].tolist()
        if nodes is None:
            self._prev_raw, self._prev_g, self._prev_p = raw, gvals, gpres
        else:  # only these nodes polled: the others keep their baseline
            prev_raw, prev_g = self._prev_raw, self._prev_g
            assert prev_raw is not None and prev_g is not None and prev_p is not None
            prev_raw[:, sel] = raw[:, sel]
            prev_g[:, sel] = gvals[:, sel]
            prev_p[:, sel] = gpres[:, sel]

        ranks = ranks or {}
        # every emitted delta's values at once, ordered by node then series (the agent's reading order);
        # the delta objects per node, as its batch is made
        bounds = [0] * (len(node_list) + 1)
        rrl: list[int] = []
        dl: list[float] = []
        sl: list[bool] = []
        rl: list[bool] = []
        cols = slice(None) if nodes is None else sel  # every node: a view, not a gathered copy
        if delta is not None and sat is not None and rst is not None:
            e = np.ascontiguousarray(emit[:, cols].T)  # (nodes, series)
            flat = np.flatnonzero(e)
            if flat.size:
                ns = e.shape[1]
                nn, rr = np.divmod(flat, ns)
                # only the emitted entries are read out (and scaled: float(delta) * scale, as the row's)
                at = (rr, nn if nodes is None else sel[nn])
                dl = (delta[at].astype(np.float64) * self.c_scale[rr]).tolist()
                sl = sat[at].tolist()
                rl = rst[at].tolist()
                bounds = np.searchsorted(nn, np.arange(len(node_list) + 1)).tolist()
                rrl = rr.tolist()
        g = np.ascontiguousarray(gchanged[:, cols].T)
        gv_t = np.ascontiguousarray(gvals[:, cols].T)
        lays = tuple(layouts) if first else ()
        return self._batches(node_list, bounds, (rrl, dl, sl, rl), (g, gv_t), ranks, seqs, intervals, ts, lays)

    def _batches(self, node_list: list[int], bounds: list[int], emitted: tuple[list, list, list, list],
                 changed: tuple[np.ndarray, np.ndarray], ranks: dict[str, list[RankTiming]], seqs: list[int],
                 intervals: list[float], ts: float, layouts: tuple[JobLayout, ...]) -> Iterator[NodeBatch]:
        """Each node's batch from the read-out ``_build`` made: its deltas (rows ``bounds[j]:bounds[j+1]``
        of ``emitted``) and its changed gauges."""
        names = self.cluster.names
        gs = self.catalog.gauges
        gfam = [g.family for g in gs]
        glab = [g.labels for g in gs]
        # label_fn is set wherever labels is None
        gfn = [cast(Callable[[int], Labels], g.label_fn) for g in gs]
        rrl, dl, sl, rl = emitted
        g, gv_t = changed
        key = self.c_keys.__getitem__
        for j, n in enumerate(node_list):
            a, b = bounds[j], bounds[j + 1]
            # columns: the stream encoder reads them as they are; read any other way they are the
            # CounterDelta tuple they describe (batch.DeltaColumns)
            deltas = cast(tuple[CounterDelta, ...], DeltaColumns(list(map(key, rrl[a:b])), dl[a:b], sl[a:b],
                                                                 rl[a:b])) if a != b else ()
            grows = np.flatnonzero(g[j])
            gv = gv_t[j, grows].tolist()
            gauges = [Sample(gfam[r], lb if (lb := glab[r]) is not None else gfn[r](n), v)
                      for r, v in zip(grows.tolist(), gv, strict=True)]
            name = names[n]
            yield NodeBatch(node=name, seq=seqs[j], ts=ts, interval_seconds=intervals[j], deltas=deltas,
                            gauges=tuple(gauges), ranks=tuple(ranks.get(name, ())), layouts=layouts)


class GaugeFilter:
    """The stream client's rule for gauges (``agent/stream_batches.py``): every gauge in the first batch, then
    those that changed or reappeared.  Used to turn a real Snapshot into the batch it would stream."""

    def __init__(self) -> None:
        self.base: dict | None = None

    def __call__(self, samples) -> list[Sample]:
        from ..agent.stream_batches import changed_gauges

        out, self.base = changed_gauges(samples, self.base)
        return out


def batch_from_snapshot(snap: Snapshot, gauge_filter: GaugeFilter, seq: int,
                        ranks: tuple[RankTiming, ...] = ()) -> NodeBatch:
    """The NodeBatch the stream client would send for a real agent's snapshot."""
    return NodeBatch(node=snap.node, seq=seq, ts=snap.ts, interval_seconds=snap.interval_seconds,
                     deltas=tuple(snap.deltas), gauges=tuple(gauge_filter(snap.samples)), ranks=tuple(ranks))
