"""Pure parsing of NCCL Inspector's Prometheus mode (``NCCL_INSPECTOR_PROM_DUMP=1``), NCCL 2.30.

What the writer emits (NVIDIA/nccl ``plugins/profiler/inspector/inspector_prom.cc`` v2.30, format
``v5.1`` = profiler interface 5, minor 1; its README "Current Metric Format Examples"):

* one file per GPU, ``<dump dir>/nccl_inspector_metrics_<CUDA device UUID>.prom``, truncated and
  rewritten in place at every dump (at least every 30 s in this mode), holding only the last window;
  a GPU without new operations in a window keeps its previous file; the file is unlinked at exit;
* per (comm_name, nranks, n_nodes, collective, message-size bucket, algo_proto) of that window, two
  lines, ``nccl_bus_bandwidth_gbs{...} <geometric mean>`` and
  ``nccl_collective_exec_time_microseconds{...} <arithmetic mean>`` (``%.6g``); Send/Recv the same
  under ``nccl_p2p_bus_bandwidth_gbs`` / ``nccl_p2p_exec_time_microseconds`` with ``p2p_operation``;
* no ``# HELP``/``# TYPE``, no timestamps, no count of operations, no rank, no communicator id;
  label values are not escaped (a quote in a comm name breaks the line).

So this mode can give a window's bandwidth per collective, never counts, sums or per-rank timing.

NCCL 2.29's prom mode wrote one sampled collective per communicator per dump, labelled with
``coll_sn`` and a timestamp: those lines are refused (``unknown_metric``), not read.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass

from .nccl_records import (
    MAX_BUSBW_GBS,
    MAX_COMM_NAME,
    MAX_EXEC_US,
    MAX_LINE,
    MAX_NAME,
    P2P_DIRECTIONS,
    NcclRecordError,
    check_name,
    check_rank,
)

__all__ = ["PROM_FILE_PREFIX", "PromSample", "parse_prom_line", "uuid_of_file"]

PROM_FILE_PREFIX = "nccl_inspector_metrics_"
# metric name -> (measure, kind); the label that names the operation is "collective" or "p2p_operation"
PROM_METRICS: dict[str, tuple[str, str]] = {
    "nccl_bus_bandwidth_gbs": ("busbw_gbs", "coll"),
    "nccl_collective_exec_time_microseconds": ("exec_us", "coll"),
    "nccl_p2p_bus_bandwidth_gbs": ("busbw_gbs", "p2p"),
    "nccl_p2p_exec_time_microseconds": ("exec_us", "p2p"),
}
_LIMITS = {"busbw_gbs": MAX_BUSBW_GBS, "exec_us": MAX_EXEC_US}
# The exposition-format line the writer prints: name{k="v",...} value.  Values never contain a
# quote or a backslash (the writer does not escape them, so one in a comm name is a broken line).
_LINE = re.compile(r'([a-zA-Z_:][a-zA-Z0-9_:]*)\{((?:[a-zA-Z_][a-zA-Z0-9_]*="[^"\\]*",?)*)\}[ \t]+(\S+)[ \t]*')
_LABEL = re.compile(r'([a-zA-Z_][a-zA-Z0-9_]*)="([^"\\]*)"')
_UUID = re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}")


@dataclass(frozen=True, slots=True)
class PromSample:
    """One line: a window's mean of one measure for one bucket of one communicator."""

    measure: str  # "busbw_gbs" (geometric mean) | "exec_us" (arithmetic mean)
    op: str  # collective name (AllReduce, ...) or, for p2p, "Send" / "Recv"
    comm_name: str
    nranks: int
    n_nodes: int
    value: float


def uuid_of_file(name: str) -> str | None:
    """``GPU-<uuid>`` (NVML's form, so it joins fabricmon_gpu_info) from the writer's file name, else None."""
    if not (name.startswith(PROM_FILE_PREFIX) and name.endswith(".prom")):
        return None
    uuid = name[len(PROM_FILE_PREFIX):-len(".prom")]
    return f"GPU-{uuid}" if _UUID.fullmatch(uuid) else None


def _count(v: str | None, field: str) -> int:
    if v is None:
        raise NcclRecordError("missing_field", f"{field}: required")
    if not v.isdigit():
        raise NcclRecordError("bad_type", f"{field}: expected an integer")
    return int(check_rank(int(v), field))


def parse_prom_line(line: bytes) -> PromSample | None:
    """One line of a prom-mode file; None for a blank or comment line.  Raises NcclRecordError."""
    if len(line) > MAX_LINE:
        raise NcclRecordError("too_long", f"line over {MAX_LINE} bytes")
    try:
        text = bytes(line).decode("utf-8").strip()
    except UnicodeDecodeError as exc:
        raise NcclRecordError("not_utf8", f"not UTF-8 at byte {exc.start}") from None
    if not text or text.startswith("#"):
        return None
    m = _LINE.fullmatch(text)
    if m is None:
        raise NcclRecordError("not_prom", "not a name{labels} value line")
    name, body, raw = m.groups()
    spec = PROM_METRICS.get(name)
    labels = dict(_LABEL.findall(body))
    if spec is None or "coll_sn" in labels:
        raise NcclRecordError("unknown_metric", f"{name[:60]}: not an NCCL 2.30 Inspector metric"
                              + (" (2.29 per-collective format)" if "coll_sn" in labels else ""))
    measure, kind = spec
    op_label = "collective" if kind == "coll" else "p2p_operation"
    op = labels.get(op_label)
    if op is None:
        raise NcclRecordError("missing_field", f"{name}.{op_label}: required")
    if kind == "p2p" and op not in P2P_DIRECTIONS:
        raise NcclRecordError("bad_string", f"{name}.p2p_operation: expected Send or Recv")
    op = check_name(op, f"{name}.{op_label}", MAX_NAME)
    comm_name = labels.get("comm_name")
    if comm_name is None:
        raise NcclRecordError("missing_field", f"{name}.comm_name: required")
    comm_name = check_name(comm_name, f"{name}.comm_name", MAX_COMM_NAME)
    nranks = _count(labels.get("nranks"), f"{name}.nranks")
    n_nodes = _count(labels.get("n_nodes"), f"{name}.n_nodes")
    try:
        value = float(raw)
    except ValueError:
        raise NcclRecordError("bad_type", f"{name}: value {raw[:40]!r} is not a number") from None
    if math.isnan(value) or not 0.0 <= value <= _LIMITS[measure]:
        raise NcclRecordError("out_of_range", f"{name}: must be in [0, {_LIMITS[measure]:g}], got {raw[:40]}")
    return PromSample(measure, op, comm_name, nranks, n_nodes, value)
