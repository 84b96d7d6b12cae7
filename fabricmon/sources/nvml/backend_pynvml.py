"""The real NVML backend: libnvidia-ml through nvidia-ml-py (``import pynvml``)."""

from __future__ import annotations

import ctypes
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from types import ModuleType
from typing import Any, TypeVar

import structlog

from .backend import (
    NO_PATH,
    NVLINK5_ERROR_TYPES,
    TRAFFIC_PATHS,
    GpuLost,
    GpuReading,
    LinkReading,
    NvmlCallError,
    NvmlError,
    NvmlLibraryMissing,
    NvmlNotSupported,
)

log = structlog.get_logger("fabricmon.nvml")

T = TypeVar("T")

def _pci_bus_id(pci: Any) -> str:
    bus = getattr(pci, "busId", None) or getattr(pci, "busIdLegacy", "")
    return bus.decode() if isinstance(bus, bytes) else str(bus)


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def _handle_key(handle: Any) -> Any:
    """A hashable identity for an nvmlDevice_t: ctypes pointers hash by object, not by address,
    and an event's ``device`` is a new pointer object to the same device."""
    try:
        return ctypes.cast(handle, ctypes.c_void_p).value
    except (TypeError, ctypes.ArgumentError):
        return handle


# NVLink counter field ids by path, as pynvml (nvidia-ml-py 13.615) names them; every one is asked
# with scopeId = link (nvml.h, NVML API 13 as NVIDIA/go-nvml gen/nvml/nvml.h carries it: "Link ID
# needs to be specified in the scopeId field in nvmlFieldValue_t"; it also marks the DL replay,
# recovery and CRC counters "unsupported for Blackwell+. Please use NVML_FI_DEV_NVLINK_COUNT_LINK_RECOVERY_*").
# Units from nvml.h: THROUGHPUT_DATA_* count KiB of data payload ("NVLink TX Data throughput in KiB",
# the counters `nvidia-smi nvlink -gt d` shows); COUNT_XMIT/RCV_BYTES count bytes ("Total Tx bytes on
# the link in NVLink5"); the COUNT error fields count packets or events.  All unsigned long long.
_TRAFFIC_FIELDS: dict[str, tuple[str, str]] = {  # path -> (tx, rx)
    "throughput_fields": ("NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX", "NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_RX"),
    "count_fields": ("NVML_FI_DEV_NVLINK_COUNT_XMIT_BYTES", "NVML_FI_DEV_NVLINK_COUNT_RCV_BYTES"),
}
# NVLINK5_ERROR_TYPES -> field (ids 206-221): the link-health subset NVIDIA's DCGM reads for NVLink5
# (DCGM_FI_DEV_NVLINK_RECOVERY_*, RX_PACKET_MALFORMED, RX_PACKET_DROPPED, INTEGRITY_ERROR, RX_ERROR;
# NVIDIA/DCGM dcgmlib/src/DcgmCMUtils.cpp NvmlFieldRequiresNvLinkAggregate lists the COUNT fields),
# plus the symbol and effective error counts behind its NVLink5 BER fields.  Not read: packet
# counts (traffic is in bytes), the deprecated VL15/RAW_BER ids, the BER encodings, FEC histograms.
_NVLINK5_ERROR_FIELDS: dict[str, str] = {
    "recovery": "NVML_FI_DEV_NVLINK_COUNT_LINK_RECOVERY_EVENTS",
    "recovery_failed": "NVML_FI_DEV_NVLINK_COUNT_LINK_RECOVERY_FAILED_EVENTS",
    "rx_errors": "NVML_FI_DEV_NVLINK_COUNT_RCV_ERRORS",
    "rx_malformed": "NVML_FI_DEV_NVLINK_COUNT_MALFORMED_PACKET_ERRORS",
    "rx_buffer_overrun": "NVML_FI_DEV_NVLINK_COUNT_BUFFER_OVERRUN_ERRORS",
    "local_link_integrity": "NVML_FI_DEV_NVLINK_COUNT_LOCAL_LINK_INTEGRITY_ERRORS",
    "effective": "NVML_FI_DEV_NVLINK_COUNT_EFFECTIVE_ERRORS",
    "symbol": "NVML_FI_DEV_NVLINK_COUNT_SYMBOL_ERRORS",
}
assert tuple(_NVLINK5_ERROR_FIELDS) == NVLINK5_ERROR_TYPES


@dataclass(slots=True)
class _Tally:
    """How the fields (or calls) of one path answered this poll."""

    ok: int = 0
    not_supported: int = 0
    other: int = 0  # any other failure: a transient error may hide support, so no verdict yet


def _verdict(order: tuple[str, ...], tallies: dict[str, _Tally]) -> str | None:
    """The first path in ``order`` that answered; NO_PATH when every path answered NOT_SUPPORTED
    (or was not asked: nvidia-ml-py too old to name its fields); None while a failure hides it."""
    for path in order:
        t = tallies.get(path)
        if t is None or (t.ok == 0 and t.other == 0):
            continue  # not supported here: the next path
        return path if t.ok else None
    return NO_PATH


@dataclass(slots=True)
class _GpuStatic:
    """What does not change while the driver is loaded: fetched once per GPU."""

    handle: Any
    uuid: str
    name: str
    pci_bus_id: str
    link_count: int
    # Field requests of the per-poll batch and what each one means:
    # ("traffic", path, link, "tx"|"rx") or ("err", path, link, type) or ("pcie_replay",)
    fields: list[tuple[int, int] | int] = field(default_factory=list)
    meanings: list[tuple] = field(default_factory=list)
    # (link, type) pairs read through nvmlDeviceGetNvLinkErrorCounter on the legacy path
    # (links without an _L<n> field id, or whose field was not supported).
    counter_calls: set[tuple[int, str]] = field(default_factory=set)
    unsupported: set[str] = field(default_factory=set)  # calls answered NotSupported: not asked again
    remote: dict[int, str] = field(default_factory=dict)  # link -> remote PCI bus id (static while up)
    # The live path per counter group once NVML has answered, then sticky while the driver stays
    # loaded: one series never switches between two different counters (reset-safe); None until then.
    traffic_path: str | None = None
    errors_path: str | None = None


def _first_ok(order: tuple[str, ...], tallies: dict[tuple[str, str], _Tally], group: str) -> str | None:
    """The first path of ``group`` that gave values this poll."""
    for path in order:
        t = tallies.get((group, path))
        if t is not None and t.ok:
            return path
    return None


class PynvmlBackend:

    """The real NVML through nvidia-ml-py.

    ``module`` lets a test inject a stub with the same functions and
    constants; by default ``pynvml`` is imported lazily in ``init()`` (in the
    NVML worker thread), so constructing the backend never touches the driver.
    """

    _ERR_FIELD_NAMES = {  # pynvml constant stem per error type: NVML_FI_DEV_NVLINK_<stem>_ERROR_COUNT_L<n>
        "crc_flit": "CRC_FLIT", "crc_data": "CRC_DATA", "replay": "REPLAY", "recovery": "RECOVERY",
    }
    _ERR_COUNTER_NAMES = {  # nvmlDeviceGetNvLinkErrorCounter counter constants
        "replay": "NVML_NVLINK_ERROR_DL_REPLAY", "recovery": "NVML_NVLINK_ERROR_DL_RECOVERY",
        "crc_flit": "NVML_NVLINK_ERROR_DL_CRC_FLIT", "crc_data": "NVML_NVLINK_ERROR_DL_CRC_DATA",
    }

    def __init__(self, module: ModuleType | Any | None = None, xid_drain_limit: int = 4096) -> None:
        self._nv: Any = module
        self._count = 0
        self._static: dict[int, _GpuStatic] = {}
        self._event_set: Any = None
        self._handle_index: dict[Any, int] = {}
        self._xids: dict[int, Counter[int]] = {}
        self._xid_drain_limit = xid_drain_limit
        self._initialized = False

    # -- error mapping

    def _map(self, exc: Exception, index: int | None) -> NvmlError:
        nv = self._nv
        code = getattr(exc, "value", None)
        if code in (getattr(nv, "NVML_ERROR_LIBRARY_NOT_FOUND", -1), getattr(nv, "NVML_ERROR_DRIVER_NOT_LOADED", -1)):
            return NvmlLibraryMissing(str(exc))
        if code == getattr(nv, "NVML_ERROR_GPU_IS_LOST", -1) and index is not None:
            return GpuLost(index, str(exc))
        if code in (getattr(nv, "NVML_ERROR_NOT_SUPPORTED", -1), getattr(nv, "NVML_ERROR_FUNCTION_NOT_FOUND", -1)):
            # FUNCTION_NOT_FOUND: the installed driver predates the call; for
            # the series that is the same as the GPU not supporting it.
            return NvmlNotSupported(str(exc), code)
        prefix = f"gpu {index}: " if index is not None else ""
        return NvmlCallError(f"{prefix}{type(exc).__name__}: {exc}", code)

    def _call(self, index: int | None, fn: Callable[..., T], *args: Any) -> T:
        try:
            return fn(*args)
        except self._nv.NVMLError as exc:
            raise self._map(exc, index) from exc

    # -- lifecycle

    def init(self) -> None:
        if self._nv is None:
            try:
                import pynvml  # nvidia-ml-py
            except ImportError as exc:
                raise NvmlLibraryMissing(f"pynvml not importable: {exc}") from exc
            self._nv = pynvml
        nv = self._nv
        self._call(None, nv.nvmlInit)
        self._initialized = True
        try:
            self._count = int(self._call(None, nv.nvmlDeviceGetCount))
        except NvmlError:
            self.shutdown()  # nvmlInit is reference counted: the retry must not leak one
            raise
        self._static.clear()
        self._handle_index.clear()
        # XID events: one set for all GPUs, drained without waiting at every poll.
        try:
            self._event_set = self._call(None, nv.nvmlEventSetCreate)
        except NvmlCallError as exc:
            log.info("nvml_xid_events_unavailable", error=str(exc))
            self._event_set = None

    def shutdown(self) -> None:
        if not self._initialized:
            return
        nv = self._nv
        self._initialized = False
        if self._event_set is not None:
            try:
                nv.nvmlEventSetFree(self._event_set)
            except nv.NVMLError:
                pass  # shutting down anyway
            self._event_set = None
        try:
            nv.nvmlShutdown()
        except nv.NVMLError as exc:
            log.info("nvml_shutdown_failed", error=str(exc))

    def device_count(self) -> int:
        return self._count

    # -- per poll

    def begin_poll(self) -> None:
        # Register every GPU for XID events before draining, so the events of
        # the first poll are attributed; a GPU failing here fails again, with
        # its own error, in read_gpu.
        for index in range(self._count):
            if index not in self._static:
                try:
                    self._gpu_static(index)
                except NvmlCallError:
                    pass
        self._drain_xids()

    def _drain_xids(self) -> None:
        if self._event_set is None:
            return
        nv = self._nv
        wait = getattr(nv, "nvmlEventSetWait_v2", None) or nv.nvmlEventSetWait
        # Bounded: an XID storm must not turn one poll into an endless loop;
        # what is left stays queued in the driver for the next poll.
        for _ in range(self._xid_drain_limit):
            try:
                data = wait(self._event_set, 0)  # 0 ms: never block the poll
            except nv.NVMLError as exc:
                if getattr(exc, "value", None) == nv.NVML_ERROR_TIMEOUT:
                    return  # queue empty
                raise self._map(exc, None) from exc
            idx = self._handle_index.get(_handle_key(data.device))
            if idx is not None and data.eventType & nv.nvmlEventTypeXidCriticalError:
                self._xids.setdefault(idx, Counter())[int(data.eventData)] += 1

    def _gpu_static(self, index: int) -> _GpuStatic:
        st = self._static.get(index)
        if st is not None:
            return st
        nv = self._nv
        handle = self._call(index, nv.nvmlDeviceGetHandleByIndex, index)
        uuid = _text(self._call(index, nv.nvmlDeviceGetUUID, handle))
        name = _text(self._call(index, nv.nvmlDeviceGetName, handle))
        pci = _pci_bus_id(self._call(index, nv.nvmlDeviceGetPciInfo, handle))
        # The link count comes from the field, not NVML_NVLINK_MAX_LINKS: the
        # static maximum (36) would ask for links this GPU does not have.
        link_count = 0
        try:
            (fv,) = self._call(index, nv.nvmlDeviceGetFieldValues, handle, [nv.NVML_FI_DEV_NVLINK_LINK_COUNT])
            if fv.nvmlReturn == nv.NVML_SUCCESS:
                link_count = int(self._field_value(fv))
        except NvmlNotSupported:
            pass  # a PCIe GPU without NVLink
        st = _GpuStatic(handle, uuid, name, pci, link_count)
        # The first batch asks every path of every link at once; what answers decides each group's
        # path (read_gpu), and from then on the batch holds only the live path's fields.
        for link in range(link_count):
            for path, names in _TRAFFIC_FIELDS.items():
                tx, rx = (getattr(nv, n, None) for n in names)
                if tx is None or rx is None:
                    continue  # nvidia-ml-py predates these fields: that path is not there
                st.fields += [(tx, link), (rx, link)]
                st.meanings += [("traffic", path, link, "tx"), ("traffic", path, link, "rx")]
            for etype, fname in _NVLINK5_ERROR_FIELDS.items():
                fid = getattr(nv, fname, None)
                if fid is not None:
                    st.fields.append((fid, link))
                    st.meanings.append(("err", "count_fields", link, etype))
            for etype, stem in self._ERR_FIELD_NAMES.items():
                # Per-link error field ids exist for links 0..11 only (_L0.._L11);
                # H100 has 18 links, so the rest use the per-link counter call.
                fid = getattr(nv, f"NVML_FI_DEV_NVLINK_{stem}_ERROR_COUNT_L{link}", None)
                if fid is None:
                    st.counter_calls.add((link, etype))
                else:
                    st.fields.append(fid)
                    st.meanings.append(("err", "legacy", link, etype))
        if hasattr(nv, "NVML_FI_DEV_PCIE_REPLAY_COUNTER"):
            st.fields.append(nv.NVML_FI_DEV_PCIE_REPLAY_COUNTER)
            st.meanings.append(("pcie_replay",))
        if self._event_set is not None:
            try:
                self._call(index, nv.nvmlDeviceRegisterEvents, handle, nv.nvmlEventTypeXidCriticalError,
                           self._event_set)
                self._handle_index[_handle_key(handle)] = index
            except GpuLost:
                raise
            except NvmlCallError as exc:  # NotSupported, or NoPermission when not root
                log.info("nvml_xid_events_unavailable", gpu=index, error=str(exc))
        self._static[index] = st
        return st

    def _field_value(self, fv: Any) -> float:
        nv = self._nv
        vt = fv.valueType
        v = fv.value
        if vt == nv.NVML_VALUE_TYPE_DOUBLE:
            return float(v.dVal)
        if vt == nv.NVML_VALUE_TYPE_UNSIGNED_INT:
            return int(v.uiVal)
        if vt == nv.NVML_VALUE_TYPE_UNSIGNED_LONG:
            return int(v.ulVal)
        if vt == nv.NVML_VALUE_TYPE_SIGNED_LONG_LONG:
            return int(v.sllVal)
        if vt == getattr(nv, "NVML_VALUE_TYPE_SIGNED_INT", -1):
            return int(v.siVal)
        if vt == getattr(nv, "NVML_VALUE_TYPE_UNSIGNED_SHORT", -1):
            return int(v.usVal)
        return int(v.ullVal)

    def _optional(self, st: _GpuStatic, key: str, index: int, problems: list[str],
                  fn: Callable[..., T], *args: Any) -> T | None:
        """One call whose failure costs only its own series.  NotSupported is remembered, not retried."""
        if key in st.unsupported:
            return None
        try:
            return self._call(index, fn, *args)
        except NvmlNotSupported:
            st.unsupported.add(key)
            return None
        except GpuLost:
            raise
        except NvmlCallError as exc:
            problems.append(f"{key}: {exc}")
            return None

    def _legacy_counter_calls(self, st: _GpuStatic, index: int, g: GpuReading, problems: list[str],
                              tally: _Tally) -> None:
        """The legacy error counters without a working field id, one nvmlDeviceGetNvLinkErrorCounter each."""
        nv = self._nv
        for link, etype in sorted(st.counter_calls):
            key = f"nvlink_error/{link}/{etype}"
            if key in st.unsupported:
                tally.not_supported += 1
                continue
            counter = getattr(nv, self._ERR_COUNTER_NAMES[etype])
            value = self._optional(st, key, index, problems,
                                   nv.nvmlDeviceGetNvLinkErrorCounter, st.handle, link, counter)
            if value is not None:
                tally.ok += 1
                setattr(g.links[link], etype, int(value))
            elif key in st.unsupported:
                tally.not_supported += 1
            else:
                tally.other += 1

    @staticmethod
    def _prune_fields(st: _GpuStatic) -> None:
        """Once a group's path is known the batch keeps only that path's fields, and never a legacy
        error field that failed once (its per-link call replaces it)."""
        def keep(m: tuple) -> bool:
            if m[0] == "traffic":
                return st.traffic_path is None or m[1] == st.traffic_path
            if m[0] == "err":
                if m[1] == "legacy" and (m[2], m[3]) in st.counter_calls:
                    return False
                return st.errors_path is None or m[1] == st.errors_path
            return True

        if st.errors_path not in (None, "legacy"):
            st.counter_calls.clear()  # NVLink5 counters, or none: the legacy calls are never made
        pairs = [(f, m) for f, m in zip(st.fields, st.meanings, strict=True) if keep(m)]
        if len(pairs) != len(st.fields):
            st.fields = [f for f, _ in pairs]
            st.meanings = [m for _, m in pairs]

    def read_gpu(self, index: int) -> GpuReading:
        nv = self._nv
        st = self._gpu_static(index)
        h = st.handle
        problems: list[str] = []
        g = GpuReading(index, st.uuid, st.name, st.pci_bus_id, problems=problems)
        g.links = [LinkReading(state=False) for _ in range(st.link_count)]

        # ONE batched call for every counter field of this GPU (throughput and
        # error counters of all links, PCIe replays): per-link calls would cost
        # 18 links x 8 GPUs x N round trips into the driver every poll.
        tallies: dict[tuple[str, str], _Tally] = {}  # (group, path) -> how its fields answered
        got: list[tuple[tuple, int]] = []
        if st.fields:
            values = self._call(index, nv.nvmlDeviceGetFieldValues, h, st.fields)
            for meaning, fv in zip(st.meanings, values, strict=True):  # one value per field asked
                ret = fv.nvmlReturn
                if ret == nv.NVML_ERROR_GPU_IS_LOST:
                    raise GpuLost(index)
                kind = meaning[0]
                t = tallies.setdefault((kind, meaning[1]), _Tally()) if kind != "pcie_replay" else None
                if ret != nv.NVML_SUCCESS:
                    if kind == "err" and meaning[1] == "legacy":
                        # Not via the field (e.g. a newer driver dropped the _L
                        # ids): try the per-link call; it may be unsupported too.
                        st.counter_calls.add((meaning[2], meaning[3]))
                    elif ret in (nv.NVML_ERROR_NOT_SUPPORTED, nv.NVML_ERROR_INVALID_ARGUMENT):
                        # INVALID_ARGUMENT: a driver older than the field id (its nvml.h ends at
                        # NVML_FI_MAX 173 or 200, before the NVLink5 COUNT ids 201+) cannot know it;
                        # for the verdict that is "not supported here", not a failure.  (Which of
                        # the two codes such a driver gives is not documented: both are taken.)
                        if t is not None:
                            t.not_supported += 1
                    else:
                        if t is not None:
                            t.other += 1
                        problems.append(f"field {meaning}: NVML return {ret}")
                    continue
                if t is not None:
                    t.ok += 1
                got.append((meaning, int(self._field_value(fv))))

        traffic = st.traffic_path
        if traffic is None and st.link_count:
            traffic = st.traffic_path = _verdict(
                TRAFFIC_PATHS, {p: t for (k, p), t in tallies.items() if k == "traffic"})
        errors = st.errors_path
        if errors is None and st.link_count:
            count = tallies.get(("err", "count_fields"))
            if count is not None and (count.ok or count.other):
                errors = st.errors_path = "count_fields" if count.ok else None
            else:  # the NVLink5 COUNT fields are not supported: the legacy path, field ids then calls
                legacy = tallies.setdefault(("err", "legacy"), _Tally())
                self._legacy_counter_calls(st, index, g, problems, legacy)
                errors = st.errors_path = _verdict(("legacy",), {"legacy": legacy})
        elif errors == "legacy":
            self._legacy_counter_calls(st, index, g, problems, _Tally())

        # While a group's path is still unknown, the first path that gave values this poll is shown.
        shown_traffic = traffic or _first_ok(TRAFFIC_PATHS, tallies, "traffic")
        for meaning, value in got:
            kind = meaning[0]
            if kind == "traffic":
                _, path, link, direction = meaning
                if path == shown_traffic:
                    # KiB from the throughput fields, bytes from the COUNT fields: kept apart,
                    # the source converts (NVML's units, never guessed).
                    setattr(g.links[link], f"{direction}_kib" if path == "throughput_fields"
                            else f"{direction}_bytes", value)
            elif kind == "err":
                _, path, link, etype = meaning
                if path == "legacy" and errors in (None, "legacy"):
                    setattr(g.links[link], etype, value)
                elif path == "count_fields" and errors == "count_fields":
                    g.links[link].nvlink5_errors[etype] = value
            else:
                g.pcie_replay = value
        g.traffic_path, g.errors_path = traffic, errors
        self._prune_fields(st)

        for link, lr in enumerate(g.links):
            state = self._optional(st, f"nvlink_state/{link}", index, problems, nv.nvmlDeviceGetNvLinkState, h, link)
            lr.state = bool(state == nv.NVML_FEATURE_ENABLED) if state is not None else False
            if lr.state:
                if link not in st.remote:  # static while the link stays up
                    pci = self._optional(st, f"nvlink_remote/{link}", index, problems,
                                         nv.nvmlDeviceGetNvLinkRemotePciInfo, h, link)
                    if pci is not None:
                        st.remote[link] = _pci_bus_id(pci)
                lr.remote_pci_bus_id = st.remote.get(link)
            else:
                st.remote.pop(link, None)  # re-read when it comes back: it may be re-cabled

        util = self._optional(st, "utilization", index, problems, nv.nvmlDeviceGetUtilizationRates, h)
        if util is not None:
            g.utilization = float(util.gpu)
        # ClocksEventReasons is the current name; drivers before 535 only have
        # the older ClocksThrottleReasons (same bits).
        for fname in ("nvmlDeviceGetCurrentClocksEventReasons", "nvmlDeviceGetCurrentClocksThrottleReasons"):
            fn = getattr(nv, fname, None)
            if fn is None:
                continue
            reasons = self._optional(st, fname, index, problems, fn, h)
            if reasons is not None:
                g.throttle_reasons = int(reasons)
                break
            if fname not in st.unsupported:
                break  # a real failure, already counted: do not ask twice
        # Aggregate (lifetime) counts: volatile ones restart at every driver reload.
        g.ecc_corrected = self._optional(st, "ecc_corrected", index, problems, nv.nvmlDeviceGetTotalEccErrors, h,
                                         nv.NVML_MEMORY_ERROR_TYPE_CORRECTED, nv.NVML_AGGREGATE_ECC)
        g.ecc_uncorrected = self._optional(st, "ecc_uncorrected", index, problems, nv.nvmlDeviceGetTotalEccErrors,
                                           h, nv.NVML_MEMORY_ERROR_TYPE_UNCORRECTED, nv.NVML_AGGREGATE_ECC)
        if g.pcie_replay is None and "pcie_replay" not in st.unsupported and not any(
                m[0] == "pcie_replay" for m in st.meanings):
            g.pcie_replay = self._optional(st, "pcie_replay", index, problems, nv.nvmlDeviceGetPcieReplayCounter, h)
        g.mig_uuids = self._mig_uuids(st, index, problems)
        if index in self._handle_index.values():
            g.xid_counts = dict(self._xids.get(index, {}))
        return g

    def _mig_uuids(self, st: _GpuStatic, index: int, problems: list[str]) -> tuple[str, ...]:
        """The UUIDs of the GPU's MIG devices while MIG is on (one call a poll when it is off; none on a GPU
        or driver without MIG): instances are made and destroyed while the driver stays loaded."""
        nv = self._nv
        mode = self._optional(st, "mig_mode", index, problems, nv.nvmlDeviceGetMigMode, st.handle)
        if mode is None or mode[0] != nv.NVML_DEVICE_MIG_ENABLE:
            return ()
        count = self._optional(st, "mig_count", index, problems, nv.nvmlDeviceGetMaxMigDeviceCount, st.handle) or 0
        out = []
        for j in range(min(int(count), 64)):  # 7 on an A100/H100
            try:
                mig = nv.nvmlDeviceGetMigDeviceHandleByIndex(st.handle, j)
                out.append(_text(nv.nvmlDeviceGetUUID(mig)))
            except nv.NVMLError as exc:
                if getattr(exc, "value", None) != nv.NVML_ERROR_NOT_FOUND:  # NOT_FOUND: no instance in the slot
                    problems.append(f"mig device {j}: {type(exc).__name__}: {exc}")
        return tuple(out)
