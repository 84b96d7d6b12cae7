"""pynvml with only the library's entry points replaced, and readers of the series it yields."""

from __future__ import annotations

from collections import defaultdict
from types import SimpleNamespace
from typing import Any

import pynvml
from prometheus_client.parser import text_string_to_metric_families

from fabricmon.agent.exporter import exposition
from fabricmon.model import Snapshot
from fabricmon.sources.inventory import Inventory


def no_inventory() -> Inventory:
    return Inventory(sysfs_root="")


def series(snap: Snapshot) -> dict[tuple[str, frozenset], float]:
    """Exposition parsed back: (sample name, labels without node) -> value."""
    out: dict[tuple[str, frozenset], float] = {}
    for fam in text_string_to_metric_families(exposition(snap).decode()):
        for s in fam.samples:
            if s.name.endswith("_created"):
                continue
            labels = {k: v for k, v in s.labels.items() if k != "node"}
            out[(s.name, frozenset(labels.items()))] = s.value
    return out


def val(ser: dict, metric: str, /, **labels: str) -> float:
    return ser[(metric, frozenset(labels.items()))]


def source_status(snap: Snapshot, name: str = "nvml"):
    return next(s for s in snap.sources if s.source == name)


_NS = pynvml.NVML_ERROR_NOT_SUPPORTED
_MIG_HANDLE = 0x100000  # MIG device handles: _MIG_HANDLE + (gpu << 8) + slot


class StubPynvml:
    """The few pynvml functions PynvmlBackend uses, with canned answers.

    Constants, the error class and the field-value struct are pynvml's own, so
    the backend sees exactly the types nvidia-ml-py gives it.  Canned NVML:
    2 GPUs with 14 NVLinks (links 12 and 13 have no _L<n> error field ids);
    CRC-data error fields are not supported at all (neither field nor call);
    gpu1 link 3 is inactive; gpu1 is thermally throttled; uncorrected ECC is
    not supported.
    """

    def __init__(self, gpus: int = 2, links: int = 14) -> None:
        for k in dir(pynvml):
            if k.startswith(("NVML_", "nvmlEventType", "nvmlClocks")):
                setattr(self, k, getattr(pynvml, k))
        self.NVMLError = pynvml.NVMLError
        self.gpus, self.links = gpus, links
        self.calls: dict[str, int] = defaultdict(int)
        self.field_calls: list[tuple[int, list]] = []
        self.pending_xids: list[tuple[int, int]] = []
        self.lost: set[int] = set()
        self.registered: list[int] = []
        self.mig: dict[int, list[str | None]] = {}
        # field id -> (kind, link) for the per-link error fields
        self.err_fields: dict[int, tuple[str, int]] = {}
        for kind in ("REPLAY", "RECOVERY", "CRC_FLIT", "CRC_DATA"):
            for n in range(12):
                self.err_fields[getattr(pynvml, f"NVML_FI_DEV_NVLINK_{kind}_ERROR_COUNT_L{n}")] = (kind, n)

    def _count(self, name: str) -> None:
        self.calls[name] += 1

    def _idx(self, handle: int) -> int:
        i = handle - 0x1000
        if i in self.lost:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_GPU_IS_LOST)
        return i

    @staticmethod
    def err_value(gpu: int, link: int, kind: str) -> int:
        return {"REPLAY": 10, "RECOVERY": 1, "CRC_FLIT": 100, "CRC_DATA": 5}[kind] * (link + 1) + gpu

    def nvmlInit(self) -> None:
        self._count("nvmlInit")

    def nvmlShutdown(self) -> None:
        self._count("nvmlShutdown")

    def nvmlDeviceGetCount(self) -> int:
        return self.gpus

    def nvmlDeviceGetHandleByIndex(self, i: int) -> int:
        return 0x1000 + i

    def nvmlDeviceGetUUID(self, h: int) -> str:
        if h >= _MIG_HANDLE:
            return self.mig[(h - _MIG_HANDLE) >> 8][h & 0xFF] or ""
        return f"GPU-stub-{self._idx(h)}"

    # MIG: ``self.mig[gpu]`` lists the UUIDs of its MIG device slots (None: an empty slot); a GPU not in it
    # has MIG off (NVML answers DISABLE on an H100 without MIG instances)
    def nvmlDeviceGetMigMode(self, h: int) -> tuple[int, int]:
        on = pynvml.NVML_DEVICE_MIG_ENABLE if self._idx(h) in self.mig else pynvml.NVML_DEVICE_MIG_DISABLE
        return on, on

    def nvmlDeviceGetMaxMigDeviceCount(self, h: int) -> int:
        return 7

    def nvmlDeviceGetMigDeviceHandleByIndex(self, h: int, j: int) -> int:
        slots = self.mig.get(self._idx(h), [])
        if j >= len(slots) or slots[j] is None:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_FOUND)
        return _MIG_HANDLE + (self._idx(h) << 8) + j

    def nvmlDeviceGetName(self, h: int) -> str:
        return "NVIDIA H100 80GB HBM3"

    def nvmlDeviceGetPciInfo(self, h: int) -> Any:
        return SimpleNamespace(busId=f"00000000:{0x1B + self._idx(h):02X}:00.0")

    def nvmlDeviceGetFieldValues(self, h: int, field_ids: list) -> list:
        gpu = self._idx(h)
        self.field_calls.append((gpu, list(field_ids)))
        out = (pynvml.c_nvmlFieldValue_t * len(field_ids))()
        for fv, req in zip(out, field_ids, strict=True):
            fid, scope = req if isinstance(req, tuple) else (req, 0)
            fv.fieldId, fv.scopeId = fid, scope
            fv.valueType = pynvml.NVML_VALUE_TYPE_UNSIGNED_LONG_LONG
            fv.nvmlReturn = pynvml.NVML_SUCCESS
            if fid == pynvml.NVML_FI_DEV_NVLINK_LINK_COUNT:
                fv.valueType = pynvml.NVML_VALUE_TYPE_UNSIGNED_INT
                fv.value.uiVal = self.links
            elif fid == pynvml.NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX:
                fv.value.ullVal = 1_000_000 * (gpu + 1) + scope
            elif fid == pynvml.NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_RX:
                fv.value.ullVal = 2_000_000 * (gpu + 1) + scope
            elif fid == pynvml.NVML_FI_DEV_PCIE_REPLAY_COUNTER:
                fv.value.ullVal = 3 + gpu
            elif fid in self.err_fields:
                kind, link = self.err_fields[fid]
                if kind == "CRC_DATA":
                    fv.nvmlReturn = _NS
                else:
                    fv.value.ullVal = self.err_value(gpu, link, kind)
            else:
                fv.nvmlReturn = _NS
        return list(out)

    def nvmlDeviceGetNvLinkErrorCounter(self, h: int, link: int, counter: int) -> int:
        self._count("nvmlDeviceGetNvLinkErrorCounter")
        gpu = self._idx(h)
        kind = {pynvml.NVML_NVLINK_ERROR_DL_REPLAY: "REPLAY", pynvml.NVML_NVLINK_ERROR_DL_RECOVERY: "RECOVERY",
                pynvml.NVML_NVLINK_ERROR_DL_CRC_FLIT: "CRC_FLIT"}.get(counter)
        if kind is None:
            raise pynvml.NVMLError(_NS)
        return self.err_value(gpu, link, kind)

    def nvmlDeviceGetNvLinkState(self, h: int, link: int) -> int:
        self._count("nvmlDeviceGetNvLinkState")
        gpu = self._idx(h)
        return pynvml.NVML_FEATURE_DISABLED if (gpu, link) == (1, 3) else pynvml.NVML_FEATURE_ENABLED

    def nvmlDeviceGetNvLinkRemotePciInfo(self, h: int, link: int) -> Any:
        self._count("nvmlDeviceGetNvLinkRemotePciInfo")
        self._idx(h)
        return SimpleNamespace(busId=f"00000000:{0xC0 + link % 4:02X}:00.0".encode())  # NVSwitch

    def nvmlDeviceGetUtilizationRates(self, h: int) -> Any:
        return SimpleNamespace(gpu=40 + self._idx(h), memory=10)

    def nvmlDeviceGetCurrentClocksEventReasons(self, h: int) -> int:
        return 0x60 if self._idx(h) == 1 else 0

    def nvmlDeviceGetTotalEccErrors(self, h: int, error_type: int, counter_type: int) -> int:
        self._count("nvmlDeviceGetTotalEccErrors")
        gpu = self._idx(h)
        assert counter_type == pynvml.NVML_AGGREGATE_ECC
        if error_type == pynvml.NVML_MEMORY_ERROR_TYPE_UNCORRECTED:
            raise pynvml.NVMLError(_NS)
        return 7 + gpu

    def nvmlDeviceGetPcieReplayCounter(self, h: int) -> int:
        raise AssertionError("PCIe replays come from the batched field, not a separate call")

    def nvmlEventSetCreate(self) -> str:
        return "event-set"

    def nvmlEventSetFree(self, es: str) -> None:
        self._count("nvmlEventSetFree")

    def nvmlDeviceRegisterEvents(self, h: int, types: int, es: str) -> None:
        assert types == pynvml.nvmlEventTypeXidCriticalError and es == "event-set"
        self.registered.append(self._idx(h))

    def nvmlEventSetWait_v2(self, es: str, timeout_ms: int) -> Any:
        assert timeout_ms == 0  # draining must never block a poll
        # Only GPUs registered on the set deliver events, as in NVML.
        self.pending_xids = [(g, x) for g, x in self.pending_xids if g in self.registered]
        if not self.pending_xids:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_TIMEOUT)
        gpu, xid = self.pending_xids.pop(0)
        return SimpleNamespace(device=0x1000 + gpu, eventType=pynvml.nvmlEventTypeXidCriticalError, eventData=xid)
