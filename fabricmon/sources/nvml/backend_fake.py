"""The fake NVML backend: a JSON or YAML file (DESIGN.md "Contract") written by the
fixture tool and the simulator, re-read every poll and checked like real NVML values."""

from __future__ import annotations

import builtins
import json
from collections import Counter
from pathlib import Path
from typing import Any

from ..bounds import Rejected, check_gauge, counter_value, read_bounded
from .backend import (
    ERROR_PATHS,
    NO_PATH,
    NVLINK5_ERROR_TYPES,
    TRAFFIC_PATHS,
    GpuLost,
    GpuReading,
    LinkReading,
    NvmlCallError,
    NvmlLibraryMissing,
)

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


# What a GPU entry's optional ``nvlink_counters`` says about NVML's NVLink paths: a mapping
# {traffic: <TRAFFIC_PATHS | none>, errors: <ERROR_PATHS | none>}, or one word: "legacy" (a Hopper:
# throughput fields and the legacy error counters, also the default), "nvlink5" (a Blackwell whose
# legacy calls answer NOT_SUPPORTED: throughput fields and the COUNT error fields) or "none".
_DEFAULT_PATHS = {"traffic": "throughput_fields", "errors": "legacy"}
_PATH_WORDS = {"legacy": _DEFAULT_PATHS, "nvlink5": {"traffic": "throughput_fields", "errors": "count_fields"},
               NO_PATH: {"traffic": NO_PATH, "errors": NO_PATH}}
_PATH_CHOICES = {"traffic": TRAFFIC_PATHS + (NO_PATH,), "errors": ERROR_PATHS + (NO_PATH,)}


def _nvlink_paths(c: _Checked, value: Any) -> dict[str, str]:
    if value is None:
        return dict(_DEFAULT_PATHS)
    if isinstance(value, str):
        if value in _PATH_WORDS:
            return dict(_PATH_WORDS[value])
        c.refuse("nvlink_counters", Rejected("malformed", f"nvlink_counters {value[:40]!r} is not one of "
                                             f"{', '.join(_PATH_WORDS)}"))
        return dict(_DEFAULT_PATHS)
    if not isinstance(value, dict):
        c.refuse("nvlink_counters", Rejected("malformed", f"nvlink_counters is a {type(value).__name__}"))
        return dict(_DEFAULT_PATHS)
    out = dict(_DEFAULT_PATHS)
    for group, choices in _PATH_CHOICES.items():
        v = value.get(group, out[group])
        if v in choices:
            out[group] = v
        else:
            c.refuse(f"nvlink_counters.{group}", Rejected("malformed", f"nvlink_counters.{group} {str(v)[:40]!r} "
                                                          f"is not one of {', '.join(choices)}"))
    return out


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

    def xid_counts(self, value: Any) -> dict[builtins.int, builtins.int]:  # (int: the method above)
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
            paths = _nvlink_paths(c, g.get("nvlink_counters"))
            traffic, errors = paths["traffic"], paths["errors"]
            links = []
            for j, lk in enumerate(raw_links):
                if not isinstance(lk, dict):
                    c.refuse(f"links[{j}]", Rejected("malformed", f"links[{j}] is not a mapping"))
                    lk = {}
                lr = LinkReading(
                    state=_link_state(c, lk.get("state", 0), j),
                    remote_pci_bus_id=c.text(lk.get("remote_pci_bus_id"), f"links[{j}].remote_pci_bus_id") or None,
                )
                # Only the keys of the GPU's paths are read, as NVML gives only what it supports.
                if traffic == "throughput_fields":
                    lr.tx_kib = c.int(lk.get("tx_kib"), f"links[{j}].tx_kib", _KIB_WIDTH)
                    lr.rx_kib = c.int(lk.get("rx_kib"), f"links[{j}].rx_kib", _KIB_WIDTH)
                elif traffic == "count_fields":
                    lr.tx_bytes = c.int(lk.get("tx_bytes"), f"links[{j}].tx_bytes")
                    lr.rx_bytes = c.int(lk.get("rx_bytes"), f"links[{j}].rx_bytes")
                if errors == "legacy":
                    for etype in ("replay", "recovery", "crc_flit", "crc_data"):
                        setattr(lr, etype, c.int(lk.get(etype), f"links[{j}].{etype}"))
                elif errors == "count_fields":
                    for etype in NVLINK5_ERROR_TYPES:
                        v = c.int(lk.get(etype), f"links[{j}].{etype}")
                        if v is not None:
                            lr.nvlink5_errors[etype] = v
                links.append(lr)
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
                traffic_path=traffic if links else None, errors_path=errors if links else None,
            )
        except (ValueError, TypeError, AttributeError) as exc:
            raise NvmlCallError(f"gpu {index}: bad entry in {self.path}: {exc}") from exc
