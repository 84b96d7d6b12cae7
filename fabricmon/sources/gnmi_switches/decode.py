"""gNMI notifications to points: pure (protobuf messages in, values out), one decoder per profile.

A point's labels follow the metric spec's order after ``switch`` (the store adds it).  What is not
modelled (a counter no rule names) is skipped; what is modelled but unreadable (a counter that is not a
non-negative integer, JSON that does not parse, a row without its port) is *malformed*: counted, with
the first few reasons kept for the log, and the rest of the notification still counts."""

from __future__ import annotations

import json
import math
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from ...metrics import SPECS
from ...proto import gnmi_pb2
from . import profiles as pr

MAX_NOTES = 5
_U64 = (1 << 64) - 1


@dataclass(frozen=True, slots=True)
class Point:
    family: str
    labels: tuple[tuple[str, str], ...]  # without switch, in spec order
    value: int | float  # counters stay integers (64-bit exact)
    kind: str  # profiles.COUNTER | GAUGE
    port: str  # the reset group: a port's counters are cleared together


@dataclass
class Decoded:
    points: list[Point] = field(default_factory=list)
    pfc_enable: dict[str, frozenset[int]] = field(default_factory=dict)  # port -> PFC-enabled priorities
    queue_wred: dict[tuple[str, int], str] = field(default_factory=dict)  # (port, queue) -> WRED profile
    wred_ecn: dict[str, str] = field(default_factory=dict)  # WRED profile -> its ecn mode
    lldp: dict[str, dict[str, str]] = field(default_factory=dict)  # port -> peer, peer_port, peer_port_descr
    malformed: int = 0
    notes: list[str] = field(default_factory=list)
    accepted: int = 0  # leaves or rows that made points or facts

    def bad(self, why: str) -> None:
        self.malformed += 1
        if len(self.notes) < MAX_NOTES:
            self.notes.append(why)


# ------------------------------------------------------------------ paths
def _split_path(text: str) -> list[str]:
    """``/a/b[k=x/y]/c`` -> ["a", "b[k=x/y]", "c"]: a ``/`` inside a key value does not split."""
    out: list[str] = []
    cur: list[str] = []
    depth = 0
    for ch in text.strip("/"):
        if ch == "[":
            depth += 1
        elif ch == "]":
            depth = max(0, depth - 1)
        if ch == "/" and depth == 0:
            out.append("".join(cur))
            cur = []
            continue
        cur.append(ch)
    if cur:
        out.append("".join(cur))
    return [p for p in out if p]


def parse_path(text: str, origin: str = "", target: str = "") -> gnmi_pb2.Path:
    """A gNMI Path from its string form (gNMI path conventions: ``/elem[key=value]/...``)."""
    path = gnmi_pb2.Path(origin=origin, target=target)
    for part in _split_path(text):
        name, _, rest = part.partition("[")
        elem = path.elem.add(name=name)
        while rest:
            kv, _, rest = rest.partition("]")
            k, _, v = kv.partition("=")
            elem.key[k] = v
            rest = rest[1:] if rest.startswith("[") else rest
    return path


def path_text(path: gnmi_pb2.Path) -> str:
    return "/" + "/".join(e.name + "".join(f"[{k}={v}]" for k, v in sorted(e.key.items())) for e in path.elem)


# ------------------------------------------------------------------ values
def scalar(val: gnmi_pb2.TypedValue) -> Any:
    """The value of a TypedValue: a number, a string, a bool, or parsed JSON (raises ValueError)."""
    which = val.WhichOneof("value")
    if which in ("uint_val", "int_val", "double_val", "float_val", "bool_val", "string_val", "ascii_val"):
        return getattr(val, which)
    if which == "decimal_val":
        return val.decimal_val.digits / (10 ** val.decimal_val.precision)
    if which in ("json_ietf_val", "json_val"):
        return json.loads(getattr(val, which))
    raise ValueError(f"unsupported value type {which}")


def _counter(v: Any) -> int | None:
    """A counter as RFC 7951 writes uint64 (a string) or as a number: a non-negative integer, else None."""
    if isinstance(v, bool):
        return None
    if isinstance(v, int):
        return v if 0 <= v <= _U64 else None
    if isinstance(v, str) and v.isdigit() and len(v) <= 20:
        n = int(v)
        return n if n <= _U64 else None
    if isinstance(v, float) and v.is_integer() and 0 <= v <= _U64:
        return int(v)
    return None


def _gauge(v: Any) -> float | None:
    if isinstance(v, bool):
        return None
    if isinstance(v, (int, float)):
        f = float(v)
    elif isinstance(v, str):
        try:
            f = float(v)
        except ValueError:
            return None
    else:
        return None
    return f if math.isfinite(f) else None


def _labels(family: str, given: dict[str, str]) -> tuple[tuple[str, str], ...] | None:
    names = SPECS[family].labels[1:]  # after switch
    if any(n not in given for n in names):
        return None
    return tuple((n, given[n]) for n in names)


def _point(out: Decoded, rule: pr.LeafRule, port: str, given: dict[str, str], raw: Any, where: str) -> None:
    labels = _labels(rule.family, {**given, "port": port, **dict(rule.extra)})
    if labels is None:
        out.bad(f"{where}: no {', '.join(SPECS[rule.family].labels[1:])} in the path")
        return
    value: int | float | None
    if rule.kind == pr.COUNTER:
        value = _counter(raw)
        kind = pr.COUNTER
    elif rule.kind == pr.STATE:
        value = 1.0 if str(raw).upper() == "UP" else 0.0 if isinstance(raw, str) else None
        kind = pr.GAUGE
    else:
        value = _gauge(raw)
        kind = pr.GAUGE
    if value is None:
        out.bad(f"{where}: not a {'counter' if rule.kind == pr.COUNTER else 'number'}: {str(raw)[:40]!r}")
        return
    out.points.append(Point(rule.family, labels, value, kind, port))
    out.accepted += 1


# ------------------------------------------------------------------ openconfig
def _strip(name: str) -> str:
    return name.rpartition(":")[2]  # RFC 7951 module prefix (openconfig-interfaces:in-errors)


def _leaves(prefix: tuple[str, ...], value: Any, depth: int = 0) -> Iterator[tuple[tuple[str, ...], Any]]:
    """(schema names, scalar) of every leaf under a JSON container (lists are not followed: a SAMPLE
    subscription of a list sends each entry under its own keyed path)."""
    if isinstance(value, dict):
        if depth >= 8:
            return
        for k, v in value.items():
            yield from _leaves(prefix + (_strip(str(k)),), v, depth + 1)
    elif not isinstance(value, list):
        yield prefix, value


def decode_openconfig(note: gnmi_pb2.Notification) -> Decoded:
    out = Decoded()
    base = list(note.prefix.elem)
    for upd in note.update:
        elems = base + list(upd.path.elem)
        names = tuple(_strip(e.name) for e in elems)
        keys = {f"{_strip(e.name)}.{k}": v for e in elems for k, v in e.key.items()}
        where = path_text(upd.path) if upd.path.elem else "/"
        try:
            value = scalar(upd.val)
        except ValueError as exc:
            out.bad(f"{where}: {exc}")
            continue
        port = next((keys[k] for k in pr.OPENCONFIG_PORT_KEYS if k in keys), None)
        given = {}
        if pr.OPENCONFIG_QUEUE_KEY in keys:
            given["queue"] = keys[pr.OPENCONFIG_QUEUE_KEY]
        if pr.OPENCONFIG_LANE_KEY in keys:
            given["lane"] = keys[pr.OPENCONFIG_LANE_KEY]
        for leaf_names, raw in _leaves(names, value):
            schema = "/".join(leaf_names)
            lldp = pr.OPENCONFIG_LLDP.get(schema)
            if lldp is not None:
                if port and isinstance(raw, str):
                    out.lldp.setdefault(port, {})[lldp] = raw
                    out.accepted += 1
                continue
            rule = pr.OPENCONFIG_LEAVES.get(schema)
            if rule is None:
                continue  # a leaf no family reads (in-pkts, carrier-transitions, ...)
            if not port:
                out.bad(f"{where}: no port key in the path")
                continue
            _point(out, rule, port, given, raw, where)
    return out


# ------------------------------------------------------------------ sonic
_ROW_SUFFIXES = ("Queues", "Pfcwd")


def _rows(names: list[str], value: Any) -> tuple[str, str, list[tuple[str, Any]]] | str:
    """(table, kind, [(row key, fields)]) of one SONiC update, or why it cannot be read."""
    if not names:
        return "no path"
    table = names[0]
    kind = names[2] if len(names) == 3 and names[2] in _ROW_SUFFIXES else ""
    concrete = len(names) >= 2 and "*" not in names[1]
    if len(names) == 3 and not kind:  # one field of one row: COUNTERS/Ethernet9/SAI_PORT_STAT_PFC_7_RX_PKTS
        return (table, "", [(names[1], {names[2]: value})]) if concrete else "a field path with a wildcard row"
    if len(names) > 3:
        return "path deeper than table/row/field"
    if not isinstance(value, dict):
        return f"expected a JSON object, got {type(value).__name__}"
    if len(names) == 2 and concrete:
        return table, "", [(names[1], value)]
    return table, kind, list(value.items())


def _port_queue(key: str) -> tuple[str, int] | None:
    port, sep, q = key.rpartition(":")
    return (port, int(q)) if sep and port and q.isdigit() and int(q) < 64 else None


def _numbers(spec: str) -> list[int] | None:
    """``3,4`` or ``0-2,5`` (CONFIG_DB lists and ranges) -> [..]; None when not that."""
    out: list[int] = []
    for part in (p.strip() for p in spec.split(",")):
        if not part:
            continue
        lo, sep, hi = part.partition("-")
        if not lo.isdigit() or (sep and not hi.isdigit()):
            return None
        a, b = int(lo), int(hi) if sep else int(lo)
        if b < a or b > 63:
            return None
        out.extend(range(a, b + 1))
    return out


def _profile_name(ref: str) -> str:
    """``[WRED_PROFILE|AZURE_LOSSLESS]`` (older CONFIG_DB references) or ``AZURE_LOSSLESS``."""
    ref = ref.strip()
    if ref.startswith("[") and ref.endswith("]"):
        ref = ref[1:-1].rpartition("|")[2]
    return ref


def _sonic_row(out: Decoded, db: str, table: str, kind: str, key: str, fields: Any, where: str) -> None:
    if not isinstance(fields, dict):
        out.bad(f"{where}: row {key[:40]!r} is not an object")
        return
    if db == "COUNTERS_DB" and table == "COUNTERS" and not kind:
        for name, raw in fields.items():
            rule = pr.SONIC_PORT_FIELDS.get(name)
            if rule is not None:
                _point(out, rule, key, {}, raw, f"{where} {name}")
                continue
            m = pr.SONIC_PFC_FIELD.fullmatch(name)
            if m:
                _point(out, pr.LeafRule(pr.PFC, pr.COUNTER), key,
                       {"priority": m.group(1), "direction": m.group(2).lower()}, raw, f"{where} {name}")
    elif db == "COUNTERS_DB" and table == "COUNTERS":
        pq = _port_queue(key)
        if pq is None:
            out.bad(f"{where}: row {key[:40]!r} is not <port>:<queue>")
            return
        port, q = pq
        table_fields = pr.SONIC_QUEUE_FIELDS if kind == "Queues" else pr.SONIC_PFCWD_FIELDS
        for name, raw in fields.items():
            rule = table_fields.get(name)
            if rule is not None:
                _point(out, rule, port, {"queue": str(q), "priority": str(q)}, raw, f"{where} {name}")
    elif db == "APPL_DB" and table == "PORT_TABLE":
        if pr.SONIC_OPER_STATUS in fields:
            _point(out, pr.LeafRule(pr.PORT_UP, pr.STATE), key, {}, fields[pr.SONIC_OPER_STATUS], where)
    elif db == "APPL_DB" and table == "LLDP_ENTRY_TABLE":
        far = {part: str(fields[f]) for f, part in pr.SONIC_LLDP.items() if isinstance(fields.get(f), str)}
        if far:
            out.lldp.setdefault(key, {}).update(far)
            out.accepted += 1
    elif db == "CONFIG_DB" and table == "PORT_QOS_MAP":
        prios = _numbers(str(fields.get("pfc_enable", "")))
        if prios is None or any(p > 7 for p in prios):
            out.bad(f"{where}: {key[:40]!r} pfc_enable is not a list of priorities 0..7")
            return
        for port in key.split(","):
            out.pfc_enable[port.strip()] = frozenset(prios)
        out.accepted += 1
    elif db == "CONFIG_DB" and table == "QUEUE":
        ports, sep, queues = key.rpartition("|")
        qs = _numbers(queues) if sep else None
        if not qs:
            out.bad(f"{where}: row {key[:40]!r} is not <ports>|<queues>")
            return
        prof = _profile_name(str(fields.get("wred_profile", "")))
        for port in ports.split(","):
            for q in qs:
                out.queue_wred[(port.strip(), q)] = prof
        out.accepted += 1
    elif db == "CONFIG_DB" and table == "WRED_PROFILE":
        out.wred_ecn[key] = str(fields.get("ecn", ""))
        out.accepted += 1


def decode_sonic(note: gnmi_pb2.Notification, db: str) -> Decoded:
    out = Decoded()
    db = note.prefix.target or db
    base = [e.name for e in note.prefix.elem]
    for upd in note.update:
        names = base + [e.name for e in upd.path.elem]
        where = f"{db}/" + "/".join(names)
        try:
            value = scalar(upd.val)
        except ValueError as exc:
            out.bad(f"{where}: {exc}")
            continue
        rows = _rows(names, value)
        if isinstance(rows, str):
            out.bad(f"{where}: {rows}")
            continue
        table, kind, items = rows
        for key, fields in items:
            _sonic_row(out, db, table, kind, str(key), fields, where)
    return out


def decode(profile: str, note: gnmi_pb2.Notification, target: str) -> Decoded:
    return decode_sonic(note, target) if profile == "sonic" else decode_openconfig(note)
