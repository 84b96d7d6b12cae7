"""The naming rules of DESIGN.md "Topology from the fabric": hosts and devices from CA descriptions,
switch names from switch descriptions.  Pure functions over strings; the vendor knowledge is in
``defaults``."""

from __future__ import annotations

import re
from dataclasses import dataclass
from enum import Enum

from .defaults import (
    AGGREGATION_NODE_DESCRIPTIONS,
    FIRMWARE_DEFAULT_CA_DESCRIPTIONS,
    PLACEHOLDER_HOSTS,
    RDMA_DEVICE_PREFIXES,
    SWITCH_DESCRIPTION_PREFIXES,
    VENDOR_DEFAULT_SWITCH_DESCRIPTIONS,
)

_SPACES = re.compile(r"\s+")


def collapse(text: str) -> str:
    """Whitespace collapsed: firmware pads descriptions (``ConnectX7   Mellanox``)."""
    return _SPACES.sub(" ", text).strip()


_FW_DEFAULTS = frozenset(collapse(d).casefold() for d in FIRMWARE_DEFAULT_CA_DESCRIPTIONS)
_AGGREGATION = frozenset(collapse(d).casefold() for d in AGGREGATION_NODE_DESCRIPTIONS)
_SWITCH_DEFAULTS = frozenset(collapse(d).casefold() for d in VENDOR_DEFAULT_SWITCH_DESCRIPTIONS)


def component_safe(name: str) -> str:
    """A name used inside a component id (``node/device/port``) may not contain ``/``."""
    return name.replace("/", "_")


def is_device_name(word: str) -> bool:
    """``mlx5_3``, ``bnxt_re0``, ``irdma1``: a known RDMA driver prefix followed by a decimal index."""
    for prefix in RDMA_DEVICE_PREFIXES:
        if word.startswith(prefix) and len(word) > len(prefix) and word[len(prefix):].isdigit():
            return True
    return False


def short_host(word: str) -> str:
    """Domain stripped (``gpu-a17-03.cluster.example`` is ``gpu-a17-03``); an IPv4 address stays whole."""
    if word.replace(".", "").isdigit():
        return word
    return word.split(".", 1)[0]


class CaKind(Enum):
    HOST = "host"
    FIRMWARE_DEFAULT = "firmware default"
    AGGREGATION = "aggregation node"
    BAD_NAME = "a name the node name rule refuses"


@dataclass(frozen=True)
class CaName:
    kind: CaKind
    host: str | None = None
    device: str | None = None  # set only when the second word has a device's shape
    label: str | None = None  # the second word as written (device or HCA-1), for ordering NICs


def ca_name(description: str, *, keep_domain: bool = False) -> CaName:
    """What a CA's NodeDescription says: a host and maybe its device, a firmware default, or a SHARP node."""
    text = collapse(description)
    folded = text.casefold()
    if folded in _AGGREGATION:
        return CaName(CaKind.AGGREGATION)
    if not text or folded in _FW_DEFAULTS:
        return CaName(CaKind.FIRMWARE_DEFAULT)
    words = text.split(" ")
    first = words[0]
    if first.casefold() in PLACEHOLDER_HOSTS:
        return CaName(CaKind.FIRMWARE_DEFAULT)
    host = component_safe(first if keep_domain else short_host(first))
    second = words[1] if len(words) > 1 else None
    device = second if second is not None and is_device_name(second) else None
    return CaName(CaKind.HOST, host=host, device=device, label=second)


def switch_name(description: str, guid: int) -> tuple[str, bool]:
    """The switch's name and whether it came from the description (False: the vendor default or empty,
    named ``switch-<guid>``).  ``MF0;leaf-a3:MQM9700/U1`` is ``leaf-a3``; a director's line card
    ``MF0;core-1:CS7520/L05/U1`` keeps its slot: ``core-1_L05``."""
    text = collapse(description)
    if not text or text.casefold() in _SWITCH_DEFAULTS:
        return f"switch-{guid:016x}", False
    for prefix in SWITCH_DESCRIPTION_PREFIXES:
        text = text.removeprefix(prefix)
    name, colon, model = text.partition(":")
    if colon:
        parts = model.split("/")[1:]  # drop the model
        if parts and parts[-1][:1] == "U" and parts[-1][1:].isdigit():
            parts = parts[:-1]  # the unit of a fixed switch
        name = "/".join([name, *parts])
    name = component_safe(name.strip())
    if not name:
        return f"switch-{guid:016x}", False
    return name, True
