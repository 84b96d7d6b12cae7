"""Parse ``lldpctl -f json`` and ``lldpctl -f json0`` output (lldpd): one neighbor per local interface.

lldpd writes two JSON shapes (src/lib/json-writer / lldpctl's ``-f json`` vs ``-f json0``):
``json`` keys objects by name and collapses one-element lists (``"interface": {"eth0": {...}}`` for one
interface, ``"interface": [{"eth0": {...}}, {"eth1": {...}}]`` for several; ``"chassis": {"leaf-r1":
{...}}``), while ``json0`` always writes lists and puts the name inside (``"interface": [{"name":
"eth0", ...}]``, ``"chassis": [{"name": [{"value": "leaf-r1"}], ...}]``).  Pure: parsed JSON in.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


class LldpParseError(ValueError):
    pass


@dataclass(frozen=True)
class LldpNeighbor:
    interface: str  # the local netdev (ens3f0np0)
    chassis_name: str | None  # the neighbor's system name (leaf-r1), None when it sends none
    chassis_id: str | None  # usually a MAC
    port_id: str | None
    port_descr: str | None
    # From the chassis' enabled capabilities: True for Bridge or Router (a switch), False when it
    # advertises capabilities but neither (a Station: a host), None when it advertises none.
    is_switch: bool | None = None


SWITCH_CAPABILITIES = frozenset({"Bridge", "Router"})


def _is_switch(chassis: dict) -> bool | None:
    caps = [c for c in _as_list(chassis.get("capability")) if isinstance(c, dict)]
    if not caps:
        return None
    return any(c.get("enabled") in (True, "on", "true") and c.get("type") in SWITCH_CAPABILITIES for c in caps)


def _as_list(value: Any) -> list:
    if value is None:
        return []
    return value if isinstance(value, list) else [value]


def _value(node: Any) -> str | None:
    """json0 wraps scalars as [{"value": x}]; json gives x or {"type":..., "value": x}."""
    for item in _as_list(node):
        if isinstance(item, dict):
            if "value" in item:
                return str(item["value"])
        elif item is not None:
            return str(item)
    return None


def _named(entries: Any) -> list[tuple[str | None, dict]]:
    """(name, body) pairs from either shape: {"eth0": {...}}, [{"eth0": {...}}], [{"name": "eth0", ...}]."""
    out: list[tuple[str | None, dict]] = []
    for item in _as_list(entries):
        if not isinstance(item, dict):
            raise LldpParseError(f"expected an object, got {type(item).__name__}")
        if "name" in item and not isinstance(item.get("name"), dict):
            out.append((_value(item["name"]), item))
        elif "id" in item or "descr" in item or "via" in item or "port" in item:
            out.append((None, item))  # json: a chassis without a name is its body directly
        else:
            for key, body in item.items():
                if not isinstance(body, dict):
                    raise LldpParseError(f"{key}: expected an object, got {type(body).__name__}")
                out.append((key, body))
    return out


def parse_lldpctl_json(doc: Any) -> list[LldpNeighbor]:
    """Neighbors of one node's ``lldpctl -f json|json0`` output; an empty ``lldp`` (no neighbor yet) is []."""
    if not isinstance(doc, dict) or "lldp" not in doc:
        raise LldpParseError('no top-level "lldp" key: is this lldpctl -f json output?')
    out: list[LldpNeighbor] = []
    for lldp in _as_list(doc["lldp"]):
        if not lldp:
            continue
        if not isinstance(lldp, dict):
            raise LldpParseError(f"lldp: expected an object, got {type(lldp).__name__}")
        for ifname, body in _named(lldp.get("interface")):
            if not ifname:
                raise LldpParseError("an interface without a name")
            chassis = _named(body.get("chassis"))
            cname, cbody = chassis[0] if chassis else (None, {})
            port = _as_list(body.get("port"))
            pbody = port[0] if port and isinstance(port[0], dict) else {}
            out.append(LldpNeighbor(
                interface=ifname,
                chassis_name=cname,
                chassis_id=_value(cbody.get("id")),
                port_id=_value(pbody.get("id")),
                port_descr=_value(pbody.get("descr")),
                is_switch=_is_switch(cbody),
            ))
    return out
