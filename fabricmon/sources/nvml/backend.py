"""What the NVML source needs from NVML: readings as plain dataclasses, and the only
errors a backend may raise, so real and fake backends fail alike."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol

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
# The error types of the NVLink5 (Blackwell) per-link COUNT fields, in export order (backend_pynvml
# maps each to its NVML_FI_DEV_NVLINK_COUNT_* field id).  "recovery" is the same event as the legacy
# DL recovery counter: nvml.h says NVML_FI_DEV_NVLINK_ERROR_DL_* are "unsupported for Blackwell+.
# Please use NVML_FI_DEV_NVLINK_COUNT_LINK_RECOVERY_*".
NVLINK5_ERROR_TYPES: tuple[str, ...] = (
    "recovery", "recovery_failed", "rx_errors", "rx_malformed", "rx_buffer_overrun", "local_link_integrity",
    "effective", "symbol",
)
ALL_NVLINK_ERROR_TYPES: tuple[str, ...] = NVLINK_ERROR_TYPES + tuple(
    t for t in NVLINK5_ERROR_TYPES if t not in NVLINK_ERROR_TYPES)

# Which NVML path a GPU's NVLink counters are read through, per counter group, in order of
# preference; "none" when NVML answers NOT_SUPPORTED on every path (said in a metric, never silent).
#   throughput_fields  NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX/RX, KiB of data payload, scopeId = link
#   count_fields       NVML_FI_DEV_NVLINK_COUNT_* (NVLink5), bytes / event counts, scopeId = link
#   legacy             NVML_FI_DEV_NVLINK_<type>_ERROR_COUNT_L<n> and nvmlDeviceGetNvLinkErrorCounter
TRAFFIC_PATHS: tuple[str, ...] = ("throughput_fields", "count_fields")
ERROR_PATHS: tuple[str, ...] = ("count_fields", "legacy")
NO_PATH = "none"


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
    tx_bytes: int | None = None  # cumulative bytes (NVML_FI_DEV_NVLINK_COUNT_XMIT_BYTES, NVLink5)
    rx_bytes: int | None = None
    nvlink5_errors: dict[str, int] = field(default_factory=dict)  # NVLINK5_ERROR_TYPES -> count

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
    # The live path of each NVLink counter group (TRAFFIC_PATHS / ERROR_PATHS / NO_PATH);
    # None while not yet known (a transient NVML error hid the answer) or without links.
    traffic_path: str | None = None
    errors_path: str | None = None
    # With MIG on, the UUIDs of its MIG devices ("MIG-<uuid>", what `nvidia-smi -L` lists under the GPU and
    # the NVIDIA device plugin hands a pod under the mig strategies): a pod holding one holds this GPU
    mig_uuids: tuple[str, ...] = ()


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
