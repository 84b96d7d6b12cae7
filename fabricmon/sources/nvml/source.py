"""The "nvml" source: backend readings as ``Reading``s, every call on the NVML worker thread."""

from __future__ import annotations

import concurrent.futures as cf
import threading

import structlog

from ...config import NvmlConfig
from ...model import Labels, Reading, ReadingMemo, Semantics, SourceResult, reading
from ..bounds import RejectCounts, screen_readings
from ..errorlog import ErrorLog
from ..inventory import Inventory
from ..registry import SourceContext, SourceSpec
from .backend import (
    ALL_NVLINK_ERROR_TYPES,
    ERROR_PATHS,
    NO_PATH,
    NVLINK_ERROR_TYPES,
    THROTTLE_REASONS,
    TRAFFIC_PATHS,
    GpuLost,
    GpuReading,
    NvmlBackend,
    NvmlError,
    NvmlLibraryMissing,
)
from .worker import NvmlWorker
from .xid import fatal_count

log = structlog.get_logger("fabricmon.nvml")

class _GpuLabels:
    """Label tuples of one GPU's series, built once (per GPU identity), not per poll."""

    __slots__ = ("ident", "gpu", "group", "info", "throttle", "ecc", "links", "xid", "remote", "paths")

    def __init__(self, g: GpuReading) -> None:
        gpu = str(g.index)
        self.ident = (g.index, g.uuid, g.name, g.pci_bus_id)
        self.gpu: Labels = (("gpu", gpu),)
        self.group = f"gpu{g.index}"
        base = (("gpu", gpu), ("uuid", g.uuid), ("name", g.name), ("pci_bus_id", g.pci_bus_id))
        # fabricmon_gpu_info per value of its nvlink_counters label (the errors path, see nvlink_summary)
        self.info: dict[str, Labels] = {v: base + (("nvlink_counters", v),) for v in _SUMMARIES}
        # fabricmon_nvlink_nvml_path: (group, live-path candidates, ((path, labels), ...))
        self.paths = tuple((group, tuple((p, (("gpu", gpu), ("counters", group), ("path", p)))
                                         for p in order + (NO_PATH,)))
                           for group, order in (("traffic", TRAFFIC_PATHS), ("errors", ERROR_PATHS)))
        self.throttle = tuple((bit, (("gpu", gpu), ("reason", reason))) for reason, bit in THROTTLE_REASONS)
        self.ecc = {t: (("gpu", gpu), ("type", t)) for t in ("corrected", "uncorrected")}
        # per link: (link labels, ((error type, labels), ...))
        self.links: list[tuple[Labels, tuple[tuple[str, Labels], ...]]] = []
        self.xid: dict[int, Labels] = {}
        self.remote: dict[tuple[int, str], Labels] = {}

    def link(self, j: int) -> tuple[Labels, tuple[tuple[str, Labels], ...]]:
        links = self.links
        while len(links) <= j:
            lab = (self.gpu[0], ("link", str(len(links))))
            links.append((lab, tuple((t, lab + (("type", t),)) for t in ALL_NVLINK_ERROR_TYPES)))
        return links[j]


_GAUGE = Semantics.GAUGE
_MONO = Semantics.MONOTONIC
_SUMMARIES = ("count_fields", "legacy", NO_PATH, "unknown", "no_links")
_N_LEGACY = len(NVLINK_ERROR_TYPES)


def nvlink_summary(g: GpuReading) -> str:
    """The ``nvlink_counters`` label of fabricmon_gpu_info: the path the NVLink error counters are
    read through (count_fields on NVLink5, legacy before), "none" when neither answers, "unknown"
    until NVML has answered, "no_links" for a GPU without NVLink (nothing to read)."""
    if not g.links:
        return "no_links"
    return g.errors_path or "unknown"


def _gpu_readings(g: GpuReading, labels: _GpuLabels | None = None, memo: ReadingMemo | None = None) -> list[Reading]:
    """The Readings of one GPU.  ``labels`` and ``memo`` (kept by the source across
    polls) make a poll whose values did not change return the same objects."""
    if labels is None or labels.ident != (g.index, g.uuid, g.name, g.pci_bus_id):
        labels = _GpuLabels(g)
    if memo is None:
        memo = ReadingMemo()
    mk = memo.get
    grp = labels.group
    gl = labels.gpu
    out: list[Reading] = [mk("fabricmon_gpu_info", labels.info[nvlink_summary(g)], 1.0),
                          mk("fabricmon_gpu_up", gl, 1.0)]
    add = out.append
    if g.utilization is not None:
        add(mk("fabricmon_gpu_utilization_ratio", gl, min(max(g.utilization / 100.0, 0.0), 1.0)))
    if g.throttle_reasons is not None:
        tr = g.throttle_reasons
        for bit, lab in labels.throttle:
            add(mk("fabricmon_gpu_throttle_reason", lab, 1.0 if tr & bit else 0.0))
    # One series per GPU from its first reading at 0, so the first fatal XID is an increase()
    # and a Prometheus restart sees no new series to page on.
    add(mk("fabricmon_gpu_xid_fatal_errors_total", gl, fatal_count(g.xid_counts), _MONO, 64, grp))
    for xid, count in sorted(g.xid_counts.items()):
        xlab = labels.xid.get(xid)
        if xlab is None:
            xlab = labels.xid[xid] = (gl[0], ("xid", str(xid)))
        add(mk("fabricmon_gpu_xid_errors_total", xlab, count, _MONO, 64, grp))
    for etype, value in (("corrected", g.ecc_corrected), ("uncorrected", g.ecc_uncorrected)):
        if value is not None:
            add(mk("fabricmon_gpu_ecc_errors_total", labels.ecc[etype], value, _MONO, 64, grp))
    if g.pcie_replay is not None:
        add(mk("fabricmon_gpu_pcie_replay_total", gl, g.pcie_replay, _MONO, 64, grp))
    if g.links:
        # Which path each NVLink counter group is read through, every candidate 0 or 1, so a GPU
        # whose counters NVML does not support says so (path="none") instead of going silent.
        for group, paths in labels.paths:
            live = g.traffic_path if group == "traffic" else g.errors_path
            for path, plab in paths:
                add(mk("fabricmon_nvlink_nvml_path", plab, 1.0 if path == live else 0.0))
    link_labels = labels.link
    for j, lk in enumerate(g.links):
        ll, errs = link_labels(j)
        add(mk("fabricmon_nvlink_up", ll, 1.0 if lk.state else 0.0))
        remote = lk.remote_pci_bus_id
        if remote:
            rl = labels.remote.get((j, remote))
            if rl is None:
                rl = labels.remote[(j, remote)] = ll + (("remote_pci_bus_id", remote),)
            add(mk("fabricmon_nvlink_remote_info", rl, 1.0))
        # NVML throughput fields count KiB; export bytes (base units).  The NVLink5 COUNT fields
        # count bytes already.  A GPU has one traffic path, so at most one of each pair is set.
        tx = lk.tx_kib * 1024 if lk.tx_kib is not None else lk.tx_bytes
        rx = lk.rx_kib * 1024 if lk.rx_kib is not None else lk.rx_bytes
        if tx is not None:
            add(mk("fabricmon_nvlink_transmit_bytes_total", ll, tx, _MONO, 64, grp))
        if rx is not None:
            add(mk("fabricmon_nvlink_receive_bytes_total", ll, rx, _MONO, 64, grp))
        # the legacy four lead ALL_NVLINK_ERROR_TYPES, in NVLINK_ERROR_TYPES' order
        legacy = (lk.replay, lk.recovery, lk.crc_flit, lk.crc_data)
        for (_etype, elab), value in zip(errs[:_N_LEGACY], legacy, strict=True):
            if value is not None:
                add(mk("fabricmon_nvlink_errors_total", elab, value, _MONO, 64, grp))
        if lk.nvlink5_errors:
            n5 = lk.nvlink5_errors
            for etype, elab in errs:
                n5v = n5.get(etype)
                if n5v is not None:
                    add(mk("fabricmon_nvlink_errors_total", elab, n5v, _MONO, 64, grp))
    return out


class NvmlSource:
    """The "nvml" source over any ``NvmlBackend``.

    Nothing happens in the constructor: the backend is initialised lazily in
    the NVML worker thread at the first poll.  ``auto`` mode without a driver
    makes the source absent (``present=False``) for good: a node without GPUs
    is not a failing collector.
    """

    name = "nvml"
    # poll() never blocks longer than ``call_deadline``: every NVML call runs on
    # the private worker thread.  The poller may therefore run it inline.
    self_bounded = True

    def __init__(self, backend: NvmlBackend, timeout: float = 2.0, call_deadline: float | None = None) -> None:
        self.backend = backend
        self.timeout = timeout
        # Our own wait ends a little before the poller's deadline, so the
        # message names the hung NVML call; the poller's deadline is the backstop.
        self.call_deadline = call_deadline if call_deadline is not None else timeout * 0.8
        self._worker: NvmlWorker | None = None
        self._inflight: cf.Future | None = None
        self._initialized = False  # touched only by the worker thread
        self._absent = False
        self._closed = False
        self._shutdown_done: cf.Future | None = None
        self._lock = threading.Lock()
        # Worker-thread only: per-GPU label tuples and the last poll's Readings.
        self._labels: dict[int, _GpuLabels] = {}
        self._memo = ReadingMemo()
        self._rejects = RejectCounts(self.name)
        self._errlog = ErrorLog(self.name)
        self._uuids: dict[str, int] | None = None  # GPU UUID -> index at the last poll; None: not read yet

    def gpu_uuids(self) -> dict[str, int] | None:
        """NVML's GPU and MIG device UUIDs -> GPU indexes (the ``jobs`` source maps a device plugin's ids with it);
        None until NVML has answered once, {} without NVML."""
        return {} if self._absent else self._uuids

    # -- what runs on the NVML thread

    def _collect(self) -> SourceResult:
        res = SourceResult(self.name)
        if self._closed:
            res.up = False
            return res
        if not self._initialized:
            try:
                self.backend.init()
            except NvmlLibraryMissing as exc:
                self._absent = True
                log.info("nvml_absent", reason=str(exc))  # once: absent is final
                res.present = False
                return res
            except NvmlError as exc:
                res.up = False
                res.error(f"nvml: init failed: {exc}")  # retried at the next poll
                return res
            self._initialized = True
        try:
            self.backend.begin_poll()
            count = self.backend.device_count()
        except NvmlError as exc:
            res.up = False
            res.error(f"nvml: {exc}")
            return res
        gpus: dict[int, dict] = {}
        memo = self._memo
        memo.begin()
        for index in range(count):
            try:
                g = self.backend.read_gpu(index)
            except NvmlError as exc:
                # GpuLost or a failed read: this GPU is down, the others still count.
                res.readings.append(reading("fabricmon_gpu_up", 0.0, gpu=str(index)))
                res.error(f"nvml: {exc}" if isinstance(exc, GpuLost) else f"nvml: gpu {index}: {exc}")
                gpus[index] = {"up": False, "lost": isinstance(exc, GpuLost)}
                continue
            lab = self._labels.get(index)
            if lab is None or lab.ident != (g.index, g.uuid, g.name, g.pci_bus_id):
                lab = self._labels[index] = _GpuLabels(g)
            res.readings.extend(_gpu_readings(g, lab, memo))
            for problem in g.problems:
                res.error(f"nvml: gpu {index}: {problem}")
            for reason in g.rejected:
                self._rejects.add(reason)
            gpus[index] = {
                "up": True,
                "uuid": g.uuid,
                "pci_bus_id": g.pci_bus_id,
                "throttle_reasons": g.throttle_reasons,
                "links_down": [j for j, lk in enumerate(g.links) if not lk.state],
                "nvlink_counters": nvlink_summary(g),
                "mig_uuids": list(g.mig_uuids),
            }
        res.readings.append(memo.get("fabricmon_devices_discovered", (("kind", "gpu"),), len(gpus)))
        memo.commit()
        # The last guard for any backend (a NaN double field from the driver):
        # the tracker would raise on a non-finite counter and lose the snapshot.
        problems: list[str] = []
        res.readings = screen_readings(res.readings, self._rejects, problems)
        for problem in problems:
            res.error(f"nvml: {problem}")
        res.readings.extend(self._rejects.readings())
        res.facts["gpus"] = gpus
        # a GPU that fell off the bus keeps its UUID: the pod holding it still holds it
        kept = {u: i for u, i in (self._uuids or {}).items() if i in gpus and not gpus[i]["up"]}
        # a MIG device's UUID names its parent GPU: a pod holding a MIG slice holds (part of) that GPU
        self._uuids = kept | {u: i for i, g in gpus.items() for u in (g.get("uuid"), *g.get("mig_uuids", ())) if u}
        if res.messages:  # per GPU (or per fake file), rate-limited: the subject is what follows "nvml: "
            self._errlog.report(m.removeprefix("nvml: ") for m in res.messages)
        return res

    def _shutdown(self) -> None:
        if self._initialized:
            self._initialized = False
            try:
                self.backend.shutdown()
            except NvmlError as exc:
                log.info("nvml_shutdown_failed", error=str(exc))

    # -- Source protocol

    def poll(self, inventory: Inventory) -> SourceResult:
        if self._absent:
            return SourceResult(self.name, present=False)
        with self._lock:
            if self._closed:
                return SourceResult(self.name, up=False)
            if self._inflight is not None and not self._inflight.done():
                res = SourceResult(self.name, up=False)
                res.error("nvml: previous NVML call still running (hung); not starting another")
                return res
            if self._worker is None:
                self._worker = NvmlWorker()
            fut = self._worker.submit(self._collect)
            self._inflight = fut
        try:
            res = fut.result(timeout=self.call_deadline)
        except cf.TimeoutError:
            log.warning("nvml_call_hung", deadline=self.call_deadline)
            res = SourceResult(self.name, up=False)
            res.error(f"nvml: NVML call exceeded {self.call_deadline:.2f}s")
            return res
        if self._absent:  # final: the idle worker thread has nothing left to do
            with self._lock:
                if self._worker is not None:
                    self._worker.stop()
                    self._worker = None
        return res

    def close(self, wait: float = 0.0) -> bool:
        """Queue the NVML shutdown on the worker; wait for it at most ``wait`` seconds.

        By default it never waits: a hung call keeps its daemon thread, which shuts
        NVML down if it ever returns.  Returns True when the shutdown has run (or
        there was nothing to shut down), so a caller that must know can wait on it.
        """
        with self._lock:
            if not self._closed:
                self._closed = True
                worker = self._worker
                self._shutdown_done = worker.submit(self._shutdown) if worker is not None else None
                if worker is not None:
                    worker.stop()
            done = self._shutdown_done
        if done is None:
            return True
        try:
            done.result(timeout=max(0.0, wait))
        except cf.TimeoutError:
            return False
        except Exception:  # the shutdown's own failure is logged by _shutdown
            pass
        return True


def make_nvml_source(mode: str, config: NvmlConfig | None = None) -> NvmlSource | None:
    """The source for the agent's ``nvml`` mode (auto | off | fake:FILE); None when off."""
    timeout = (config or NvmlConfig()).timeout
    if mode == "off":
        return None
    # the backend's module only (the fake one reads a fixture; the real one loads pynvml and ctypes)
    if mode.startswith("fake:"):
        from .backend_fake import FakeNvmlBackend

        return NvmlSource(FakeNvmlBackend(mode[5:]), timeout=timeout)
    from .backend_pynvml import PynvmlBackend

    return NvmlSource(PynvmlBackend(), timeout=timeout)


def _build(config: NvmlConfig, context: SourceContext) -> NvmlSource | None:
    return make_nvml_source(context.nvml, config)


SOURCE = SourceSpec("nvml", NvmlConfig, _build)
