"""NVML source: GPUs, their NVLinks, XID events, ECC, PCIe replays and throttle reasons.

Three layers:

* ``NvmlBackend`` (a Protocol) returns plain dataclasses and raises only the
  backend-neutral errors below, so the source cannot tell a real GPU from the
  fake file, and a fake lost GPU fails exactly like a real one.
* ``PynvmlBackend`` talks to libnvidia-ml through ``nvidia-ml-py`` (``import
  pynvml``); ``FakeNvmlBackend`` reads the fake NVML file of DESIGN.md
  "Contract" (JSON or YAML) that the fixture tool and the simulator write.
* ``NvmlSource`` turns ``GpuReading``s into ``Reading``s.  Every NVML call runs
  on one private daemon thread: NVML calls can hang (a GPU falling off the bus),
  and a hung call on that thread neither blocks the poller's pool, nor
  ``close()``, nor interpreter exit, and is never called a second time while
  it is still stuck.
"""

from __future__ import annotations

import concurrent.futures as cf
import ctypes
import json
import queue
import threading
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType
from typing import Any, Protocol, TypeVar

import structlog

from ..model import Labels, Reading, ReadingMemo, Semantics, SourceResult, reading
from .bounds import Rejected, RejectCounts, check_gauge, counter_value, read_bounded, screen_readings
from .errorlog import ErrorLog
from .inventory import Inventory

log = structlog.get_logger("fabricmon.nvml")

T = TypeVar("T")

# nvmlClocksEventReason* / nvmlClocksThrottleReason* bits, by the name exported
# in the ``reason`` label.  Every reason is exported (0 or 1) so that a rule can
# tell "not throttled" from "not reported".
THROTTLE_REASONS: tuple[tuple[str, int], ...] = (
    ("GpuIdle", 0x1),
    ("ApplicationsClocksSetting", 0x2),
    ("SwPowerCap", 0x4),
    ("HwSlowdown", 0x8),
    ("SyncBoost", 0x10),
    ("SwThermalSlowdown", 0x20),
    ("HwThermalSlowdown", 0x40),
    ("HwPowerBrakeSlowdown", 0x80),
    ("DisplayClockSetting", 0x100),
)

NVLINK_ERROR_TYPES: tuple[str, ...] = ("replay", "recovery", "crc_flit", "crc_data")


# --------------------------------------------------------------------------- errors


class NvmlError(Exception):
    """Base of the backend-neutral NVML errors."""


class NvmlLibraryMissing(NvmlError):
    """No NVML here (library or driver absent, no fake file): the source is absent, not failing."""


class NvmlCallError(NvmlError):
    """One NVML call failed; ``code`` is the NVML return code when known."""

    def __init__(self, message: str, code: int | None = None) -> None:
        super().__init__(message)
        self.code = code


class NvmlNotSupported(NvmlCallError):
    """The GPU or driver does not support this query: skip that series, it is not an error."""


class GpuLost(NvmlCallError):
    """NVML_ERROR_GPU_IS_LOST (or the GPU vanished from the fake file)."""

    def __init__(self, index: int, message: str = "GPU is lost") -> None:
        super().__init__(f"gpu {index}: {message}")
        self.index = index


# --------------------------------------------------------------------------- data


@dataclass(slots=True)
class LinkReading:
    """One NVLink.  ``None`` means "not supported here": that series is skipped."""

    state: bool
    tx_kib: int | None = None  # cumulative data KiB (NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX)
    rx_kib: int | None = None
    replay: int | None = None
    recovery: int | None = None
    crc_flit: int | None = None
    crc_data: int | None = None
    remote_pci_bus_id: str | None = None

    def error_counts(self) -> dict[str, int | None]:
        return {"replay": self.replay, "recovery": self.recovery,
                "crc_flit": self.crc_flit, "crc_data": self.crc_data}


@dataclass(slots=True)
class GpuReading:
    index: int
    uuid: str
    name: str
    pci_bus_id: str
    utilization: float | None = None  # percent, 0-100, as NVML reports it
    throttle_reasons: int | None = None  # bitmask of THROTTLE_REASONS
    xid_counts: dict[int, int] = field(default_factory=dict)  # cumulative per XID code
    ecc_corrected: int | None = None
    ecc_uncorrected: int | None = None
    pcie_replay: int | None = None
    links: list[LinkReading] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)  # per-series failures (one series lost, not the GPU)
    rejected: list[str] = field(default_factory=list)  # reasons of values refused by bounds (also in problems)


class NvmlBackend(Protocol):
    """What ``NvmlSource`` needs from NVML.  Raises only ``NvmlError`` subclasses.

    Calls come from one thread, in the order init, (begin_poll, device_count,
    read_gpu*)*, shutdown.
    """

    def init(self) -> None: ...

    def shutdown(self) -> None: ...

    def begin_poll(self) -> None:
        """Once per poll, before the reads: drain XID events / re-read the fake file."""
        ...

    def device_count(self) -> int: ...

    def read_gpu(self, index: int) -> GpuReading: ...


# --------------------------------------------------------------------------- real backend


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


@dataclass(slots=True)
class _GpuStatic:
    """What does not change while the driver is loaded: fetched once per GPU."""

    handle: Any
    uuid: str
    name: str
    pci_bus_id: str
    link_count: int
    # Field requests of the per-poll batch and what each one means:
    # ("tx"|"rx", link) or ("err", link, type) or ("pcie_replay",)
    fields: list[tuple[int, int] | int] = field(default_factory=list)
    meanings: list[tuple] = field(default_factory=list)
    # (link, type) pairs read through nvmlDeviceGetNvLinkErrorCounter instead
    # (links without an _L<n> field id, or whose field was not supported).
    counter_calls: set[tuple[int, str]] = field(default_factory=set)
    unsupported: set[str] = field(default_factory=set)  # calls answered NotSupported: not asked again
    remote: dict[int, str] = field(default_factory=dict)  # link -> remote PCI bus id (static while up)


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
        for link in range(link_count):
            st.fields += [(nv.NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX, link),
                          (nv.NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_RX, link)]
            st.meanings += [("tx", link), ("rx", link)]
            for etype, stem in self._ERR_FIELD_NAMES.items():
                # Per-link error field ids exist for links 0..11 only (_L0.._L11);
                # H100 has 18 links, so the rest use the per-link counter call.
                fid = getattr(nv, f"NVML_FI_DEV_NVLINK_{stem}_ERROR_COUNT_L{link}", None)
                if fid is None:
                    st.counter_calls.add((link, etype))
                else:
                    st.fields.append(fid)
                    st.meanings.append(("err", link, etype))
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
        if st.fields:
            values = self._call(index, nv.nvmlDeviceGetFieldValues, h, st.fields)
            for meaning, fv in zip(st.meanings, values):
                ret = fv.nvmlReturn
                if ret == nv.NVML_ERROR_GPU_IS_LOST:
                    raise GpuLost(index)
                if ret != nv.NVML_SUCCESS:
                    if meaning[0] == "err":
                        # Not via the field (e.g. a newer driver dropped the _L
                        # ids): try the per-link call; it may be unsupported too.
                        st.counter_calls.add((meaning[1], meaning[2]))
                    elif ret != nv.NVML_ERROR_NOT_SUPPORTED:
                        problems.append(f"field {meaning}: NVML return {ret}")
                    continue
                value = int(self._field_value(fv))
                kind = meaning[0]
                if kind == "tx":
                    g.links[meaning[1]].tx_kib = value
                elif kind == "rx":
                    g.links[meaning[1]].rx_kib = value
                elif kind == "err":
                    setattr(g.links[meaning[1]], meaning[2], value)
                else:
                    g.pcie_replay = value
            # Fields that failed once are not asked in the batch again.
            if st.counter_calls:
                keep = [(f, m) for f, m in zip(st.fields, st.meanings)
                        if not (m[0] == "err" and (m[1], m[2]) in st.counter_calls)]
                st.fields = [f for f, _ in keep]
                st.meanings = [m for _, m in keep]

        for link, etype in sorted(st.counter_calls):
            counter = getattr(nv, self._ERR_COUNTER_NAMES[etype])
            value = self._optional(st, f"nvlink_error/{link}/{etype}", index, problems,
                                   nv.nvmlDeviceGetNvLinkErrorCounter, h, link, counter)
            if value is not None:
                setattr(g.links[link], etype, int(value))

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
        if index in self._handle_index.values():
            g.xid_counts = dict(self._xids.get(index, {}))
        return g


# --------------------------------------------------------------------------- fake backend


# Bounds on the fake NVML file: NVML numbers devices with an unsigned int but no
# node has more than a few dozen GPUs; NVML_NVLINK_MAX_LINKS is 18 (64 leaves room).
_FAKE_MAX_GPUS = 256
_FAKE_MAX_LINKS = 64
_FAKE_MAX_XIDS = 256
_FAKE_MAX_TEXT = 256  # uuid, name, pci bus id: label values
_FAKE_MAX_BYTES = 16 << 20
_KIB_WIDTH = 54  # KiB counters are exported x1024 as bytes: keep the product within u64


def _load_fake(path: Path, text: str | None = None) -> dict:
    if text is None:
        text = path.read_text()
    if path.suffix in (".yaml", ".yml"):
        import yaml

        data = yaml.safe_load(text)
    else:
        data = json.loads(text)
    if not isinstance(data, dict) or not isinstance(data.get("gpus"), list):
        raise ValueError("expected a mapping with a 'gpus' list")
    return data


def _link_state(c: _Checked, value: Any, j: int) -> bool:
    if isinstance(value, bool):
        return value
    return bool(c.int(value, f"links[{j}].state", 8))


class _Checked:
    """Bounds-checks the values of one fake GPU entry; a refused value costs its own series only."""

    def __init__(self, index: int) -> None:
        self.index = index
        self.problems: list[str] = []
        self.rejected: list[str] = []

    def refuse(self, where: str, exc: Rejected) -> None:
        self.problems.append(f"{where}: {exc}")
        self.rejected.append(exc.reason)

    def int(self, value: Any, where: str, width: int = 64) -> int | None:
        """A counter or bitmask: decimal or "0x" text, an int or an integral float, within ``width`` bits."""
        if value is None:
            return None
        try:
            return counter_value(value, width, where)
        except Rejected as exc:
            self.refuse(where, exc)
            return None

    def gauge(self, value: Any, lo: float, hi: float, where: str) -> float | None:
        if value is None:
            return None
        try:
            return check_gauge(value, lo, hi, where)
        except Rejected as exc:
            self.refuse(where, exc)
            return None

    def text(self, value: Any, where: str) -> str:
        text = "" if value is None else str(value) if isinstance(value, (str, int)) else None
        if text is None:
            self.refuse(where, Rejected("malformed", f"{where} is a {type(value).__name__}, not text"))
            return ""
        if len(text) > _FAKE_MAX_TEXT:
            self.refuse(where, Rejected("too_long", f"{where} has {len(text)} characters"))
            return ""
        return text

    def xid_counts(self, value: Any) -> dict[int, int]:
        """``xid`` is the list of XID codes seen so far (one entry per event), or a {code: count} mapping."""
        if not value:
            return {}
        counts: Counter[int] = Counter()
        if isinstance(value, dict):
            items = [(k, v) for k, v in value.items()]
        elif isinstance(value, list):
            items = [(it.get("xid"), it.get("count", 1)) if isinstance(it, dict) else (it, 1) for it in value]
        else:
            self.refuse("xid", Rejected("malformed", f"xid is a {type(value).__name__}"))
            return {}
        for code, n in items:
            c = self.int(code, "xid code", 16)
            k = self.int(n, f"xid {code} count")
            if c is not None and k is not None:
                counts[c] += k
        if len(counts) > _FAKE_MAX_XIDS:
            self.refuse("xid", Rejected("too_long", f"{len(counts)} distinct XID codes"))
            return {}
        return {c: min(k, (1 << 64) - 1) for c, k in counts.items()}


class FakeNvmlBackend:
    """The fake NVML file as a backend, re-read at every poll (the simulator rewrites it atomically).

    A GPU entry with ``"lost": true``, or one that disappeared from the file,
    raises ``GpuLost`` like NVML_ERROR_GPU_IS_LOST.  The device count, as with
    NVML, covers every GPU seen since init, so a vanished one is reported lost
    rather than silently dropped.
    """

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self._gpus: dict[int, dict] = {}
        self._count = 0
        # The file's last content and the GpuReadings built from it: a file that
        # did not change is neither parsed nor converted again.
        self._text: str | None = None
        self._parsed: dict[int, GpuReading] = {}

    def init(self) -> None:
        if not self.path.exists():
            raise NvmlLibraryMissing(f"fake NVML file {self.path} does not exist")
        self._reload()

    def shutdown(self) -> None:
        self._gpus = {}
        self._text = None
        self._parsed = {}

    def begin_poll(self) -> None:
        self._reload()

    def _reload(self) -> None:
        try:
            text = read_bounded(str(self.path), _FAKE_MAX_BYTES).decode("utf-8", "replace")
            if text == self._text:
                return  # same content (compared, not mtime: writes within one clock tick are common)
            data = _load_fake(self.path, text)
            gpus: dict[int, dict] = {}
            for g in data["gpus"]:
                if not isinstance(g, dict):
                    raise ValueError(f"a gpus entry is a {type(g).__name__}, not a mapping")
                # The index sizes the device count, and so the loop over GPUs: bounded.
                index = counter_value(g.get("index"), 64, "gpu index")
                if index >= _FAKE_MAX_GPUS:
                    raise Rejected("out_of_range", f"gpu index {index} beyond {_FAKE_MAX_GPUS - 1}")
                if index in gpus:
                    raise Rejected("malformed", f"gpu index {index} appears twice")
                gpus[index] = g
        except (OSError, ValueError, KeyError, TypeError, RecursionError) as exc:  # Rejected is a ValueError
            self._text = None
            raise NvmlCallError(f"fake NVML file {self.path}: {exc}") from exc
        self._gpus = gpus
        self._text = text
        self._parsed = {}
        if gpus:
            self._count = max(self._count, max(gpus) + 1)

    def device_count(self) -> int:
        return self._count

    def read_gpu(self, index: int) -> GpuReading:
        g = self._gpus.get(index)
        if g is None:
            raise GpuLost(index, "GPU is lost (missing from the fake NVML file)")
        if g.get("lost"):
            raise GpuLost(index)
        hit = self._parsed.get(index)
        if hit is not None:
            return hit
        self._parsed[index] = parsed = self._parse_gpu(index, g)
        return parsed

    def _parse_gpu(self, index: int, g: dict) -> GpuReading:
        """One GPU entry.  A value that is not a number within its range (NaN, 1e400,
        -5, 2^70, "lots") is refused and counted, and costs its own series only."""
        c = _Checked(index)
        try:
            ecc = g.get("ecc") or {}
            raw_links = g.get("links") or []
            if not isinstance(raw_links, list):
                raise TypeError(f"links is a {type(raw_links).__name__}, not a list")
            if len(raw_links) > _FAKE_MAX_LINKS:
                c.refuse("links", Rejected("too_long", f"{len(raw_links)} links, at most {_FAKE_MAX_LINKS}"))
                raw_links = raw_links[:_FAKE_MAX_LINKS]
            links = []
            for j, lk in enumerate(raw_links):
                if not isinstance(lk, dict):
                    c.refuse(f"links[{j}]", Rejected("malformed", f"links[{j}] is not a mapping"))
                    lk = {}
                links.append(LinkReading(
                    state=_link_state(c, lk.get("state", 0), j),
                    tx_kib=c.int(lk.get("tx_kib"), f"links[{j}].tx_kib", _KIB_WIDTH),
                    rx_kib=c.int(lk.get("rx_kib"), f"links[{j}].rx_kib", _KIB_WIDTH),
                    replay=c.int(lk.get("replay"), f"links[{j}].replay"),
                    recovery=c.int(lk.get("recovery"), f"links[{j}].recovery"),
                    crc_flit=c.int(lk.get("crc_flit"), f"links[{j}].crc_flit"),
                    crc_data=c.int(lk.get("crc_data"), f"links[{j}].crc_data"),
                    remote_pci_bus_id=c.text(lk.get("remote_pci_bus_id"), f"links[{j}].remote_pci_bus_id") or None,
                ))
            return GpuReading(
                index=index, uuid=c.text(g.get("uuid"), "uuid"), name=c.text(g.get("name"), "name"),
                pci_bus_id=c.text(g.get("pci_bus_id"), "pci_bus_id"),
                utilization=c.gauge(g.get("utilization"), 0.0, 100.0, "utilization"),
                throttle_reasons=c.int(g.get("throttle_reasons"), "throttle_reasons"),
                xid_counts=c.xid_counts(g.get("xid")),
                ecc_corrected=c.int(ecc.get("corrected", g.get("ecc_corrected")), "ecc_corrected"),
                ecc_uncorrected=c.int(ecc.get("uncorrected", g.get("ecc_uncorrected")), "ecc_uncorrected"),
                pcie_replay=c.int(g.get("pcie_replay"), "pcie_replay"),
                links=links, problems=c.problems, rejected=c.rejected,
            )
        except (ValueError, TypeError, AttributeError) as exc:
            raise NvmlCallError(f"gpu {index}: bad entry in {self.path}: {exc}") from exc


# --------------------------------------------------------------------------- NVML worker thread


class _NvmlWorker:
    """One daemon thread that makes every NVML call, one job at a time.

    Daemon, so a call hung in the driver never blocks interpreter exit; one
    job at a time, so a hung call is never joined by a second one.
    """

    def __init__(self) -> None:
        self._jobs: queue.SimpleQueue[tuple[Callable[[], Any], cf.Future] | None] = queue.SimpleQueue()
        self._thread = threading.Thread(target=self._run, name="nvml", daemon=True)
        self._thread.start()

    def submit(self, fn: Callable[[], T]) -> cf.Future:
        fut: cf.Future = cf.Future()
        self._jobs.put((fn, fut))
        return fut

    def stop(self) -> None:
        self._jobs.put(None)  # after the current job (even a hung one) finishes

    def _run(self) -> None:
        while True:
            job = self._jobs.get()
            if job is None:
                return
            fn, fut = job
            if not fut.set_running_or_notify_cancel():
                continue
            try:
                fut.set_result(fn())
            except BaseException as exc:  # handed to the waiting poll
                fut.set_exception(exc)


# --------------------------------------------------------------------------- source


class _GpuLabels:
    """Label tuples of one GPU's series, built once (per GPU identity), not per poll."""

    __slots__ = ("ident", "gpu", "group", "info", "throttle", "ecc", "links", "xid", "remote")

    def __init__(self, g: GpuReading) -> None:
        gpu = str(g.index)
        self.ident = (g.index, g.uuid, g.name, g.pci_bus_id)
        self.gpu: Labels = (("gpu", gpu),)
        self.group = f"gpu{g.index}"
        self.info: Labels = (("gpu", gpu), ("uuid", g.uuid), ("name", g.name), ("pci_bus_id", g.pci_bus_id))
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
            links.append((lab, tuple((t, lab + (("type", t),)) for t in NVLINK_ERROR_TYPES)))
        return links[j]


_GAUGE = Semantics.GAUGE
_MONO = Semantics.MONOTONIC


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
    out: list[Reading] = [mk("fabricmon_gpu_info", labels.info, 1.0), mk("fabricmon_gpu_up", gl, 1.0)]
    add = out.append
    if g.utilization is not None:
        add(mk("fabricmon_gpu_utilization_ratio", gl, min(max(g.utilization / 100.0, 0.0), 1.0)))
    if g.throttle_reasons is not None:
        tr = g.throttle_reasons
        for bit, lab in labels.throttle:
            add(mk("fabricmon_gpu_throttle_reason", lab, 1.0 if tr & bit else 0.0))
    for xid, count in sorted(g.xid_counts.items()):
        lab = labels.xid.get(xid)
        if lab is None:
            lab = labels.xid[xid] = (gl[0], ("xid", str(xid)))
        add(mk("fabricmon_gpu_xid_errors_total", lab, count, _MONO, 64, grp))
    for etype, value in (("corrected", g.ecc_corrected), ("uncorrected", g.ecc_uncorrected)):
        if value is not None:
            add(mk("fabricmon_gpu_ecc_errors_total", labels.ecc[etype], value, _MONO, 64, grp))
    if g.pcie_replay is not None:
        add(mk("fabricmon_gpu_pcie_replay_total", gl, g.pcie_replay, _MONO, 64, grp))
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
        # NVML throughput fields count KiB; export bytes (base units).
        if lk.tx_kib is not None:
            add(mk("fabricmon_nvlink_transmit_bytes_total", ll, lk.tx_kib * 1024, _MONO, 64, grp))
        if lk.rx_kib is not None:
            add(mk("fabricmon_nvlink_receive_bytes_total", ll, lk.rx_kib * 1024, _MONO, 64, grp))
        for (etype, lab), value in zip(errs, (lk.replay, lk.recovery, lk.crc_flit, lk.crc_data)):
            if value is not None:
                add(mk("fabricmon_nvlink_errors_total", lab, value, _MONO, 64, grp))
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
        self._worker: _NvmlWorker | None = None
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
                self._worker = _NvmlWorker()
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


def make_nvml_source(cfg: Any) -> NvmlSource | None:
    """Build the source from an ``AgentConfig`` (``nvml``: auto | off | fake:FILE)."""
    mode: str = cfg.nvml
    timeout: float = cfg.sources.nvml.timeout
    if mode == "off":
        return None
    if mode.startswith("fake:"):
        return NvmlSource(FakeNvmlBackend(mode[5:]), timeout=timeout)
    return NvmlSource(PynvmlBackend(), timeout=timeout)


__all__ = [
    "FakeNvmlBackend", "GpuLost", "GpuReading", "LinkReading", "NvmlBackend", "NvmlCallError", "NvmlError",
    "NvmlLibraryMissing", "NvmlNotSupported", "NvmlSource", "PynvmlBackend", "THROTTLE_REASONS",
    "make_nvml_source",
]
