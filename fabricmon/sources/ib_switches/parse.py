"""Pure parsers of what infiniband-diags 44.0 prints (fixtures captured against ibsim:
tests/fixtures/ib_switches/README.md).

``perfquery`` (infiniband-diags/perfquery.c, ``dump_perfcounters``): one block per port, a header
``# Port counters: Lid 2 port 3 (CapMask: 0x1300)`` or ``# Port extended counters: ...`` then
``Field:....value`` lines (libibmad ``mad_dump_fields``; names from libibmad/fields.c).  With ``-l`` and
port 255 one block per port 1..N; with ``-a`` one block for port 255, the sum over all ports
(AllPortSelect).  The extended block (``-x``) carries the 64-bit data counters, and the 64-bit error
counters too where the PMA sets IsAddlPortCountersExtendedSupported in CapMask2 (same field names).

``smpquery portinfo`` (libibmad PortInfo dump): ``LinkState:.......Active``, ``PhysLinkState:....LinkUp``.

``iblinkinfo --switches-only --line`` (infiniband-diags/iblinkinfo.c ``print_port``, line mode): one line per
switch port, from the PortInfo its own discovery walk read just now (``--load-cache`` would print a cache's
old states instead: ``ibnd_load_fabric`` queries nothing)::

    0x00000c42b0000000 "        MF0;leaf-00:MQM9700/U1"      2    3[  ] ==( 4X   2.5 Gbps Active/  LinkUp)==>  ...
    0x00000c42b0000000 "        MF0;leaf-00:MQM9700/U1"      2    4[  ] ==(        Down/ Polling)==>  [  ] "" ( )
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from ..infiniband import PMA_ERROR_WIDTHS

# libibmad field name -> the host agent's counter name (sysfs file names; DESIGN.md "Metric conventions")
ERROR_FIELDS: dict[str, str] = {
    "SymbolErrorCounter": "symbol_error",
    "LinkErrorRecoveryCounter": "link_error_recovery",
    "LinkDownedCounter": "link_downed",
    "PortRcvErrors": "port_rcv_errors",
    "PortRcvRemotePhysicalErrors": "port_rcv_remote_physical_errors",
    "PortRcvSwitchRelayErrors": "port_rcv_switch_relay_errors",
    "PortXmitDiscards": "port_xmit_discards",
    "PortXmitConstraintErrors": "port_xmit_constraint_errors",
    "PortRcvConstraintErrors": "port_rcv_constraint_errors",
    "LocalLinkIntegrityErrors": "local_link_integrity_errors",
    "ExcessiveBufferOverrunErrors": "excessive_buffer_overrun_errors",
    "VL15Dropped": "VL15_dropped",
}
# Data counters of the basic PortCounters: 32 bits, saturating (IBTA 16.1.3.5).
BASIC_DATA_WIDTH = 32
BASIC_XMIT_WAIT_WIDTH = 32

_HEADER = re.compile(r"^# Port (extended )?counters: Lid (\d+) port (\d+)")
_FIELD = re.compile(r"^(\w+):\.+\s*(\S+)\s*$")
_LINK_STATE = re.compile(r"^LinkState:\.+\s*(\w+)", re.M)
_PHYS_STATE = re.compile(r"^PhysLinkState:\.+\s*(\w+)", re.M)
_NUMBER = re.compile(r"^(0x[0-9a-fA-F]+|\d+)$")


class ParseError(ValueError):
    pass


@dataclass
class PortCounters:
    """One block of perfquery output: a port's (or AllPortSelect's) counters as printed."""

    lid: int
    port: int
    extended: bool
    values: dict[str, int] = field(default_factory=dict)  # libibmad field name -> value

    def errors(self) -> dict[str, tuple[int, int]]:
        """counter name -> (value, width): 64 bits in an extended block, the IBTA width otherwise."""
        out: dict[str, tuple[int, int]] = {}
        for fname, name in ERROR_FIELDS.items():
            if fname in self.values:
                out[name] = (self.values[fname], 64 if self.extended else PMA_ERROR_WIDTHS[name])
        return out


def parse_perfquery(text: str) -> list[PortCounters]:
    """Every block of one perfquery run, in order.  A line that is neither a header nor a field is an error
    (this parser must notice when the tool's format changes)."""
    blocks: list[PortCounters] = []
    current: PortCounters | None = None
    for number, raw in enumerate(text.splitlines(), 1):
        line = raw.strip()
        if not line:
            continue
        h = _HEADER.match(line)
        if h:
            current = PortCounters(int(h.group(2)), int(h.group(3)), bool(h.group(1)))
            blocks.append(current)
            continue
        f = _FIELD.match(line)
        if f is None or current is None:
            raise ParseError(f"perfquery line {number}: not a counter line: {line[:80]!r}")
        value = f.group(2)
        if _NUMBER.match(value):
            current.values[f.group(1)] = int(value, 0)
    if not blocks:
        raise ParseError("perfquery printed no counters")
    return blocks


@dataclass(frozen=True)
class PortState:
    link: str  # Down | Initialize | Armed | Active | ActDefer
    physical: str  # LinkUp | Polling | Disabled | ...

    @property
    def up(self) -> bool:
        return self.link == "Active"


def parse_portinfo(text: str) -> PortState:
    link, phys = _LINK_STATE.search(text), _PHYS_STATE.search(text)
    if link is None or phys is None:
        raise ParseError("smpquery portinfo printed no LinkState/PhysLinkState")
    return PortState(link.group(1), phys.group(1))


# node GUID, quoted description, LID, port[ext] ==( [width speed] LinkState/ PhysLinkState)==>
_LINK_LINE = re.compile(r'^0x([0-9a-fA-F]+)\s+"[^"]*"\s+\d+\s+(\d+)\[[^\]]*\]\s+==\((.*?)(\w+)/\s*(\w+)\)==>')


def parse_iblinkinfo(text: str) -> dict[int, dict[int, PortState]]:
    """Every switch port's state from one ``iblinkinfo --switches-only --line`` run: switch node GUID ->
    port -> state.  A line of another shape is an error (this parser must notice a format change)."""
    out: dict[int, dict[int, PortState]] = {}
    for number, raw in enumerate(text.splitlines(), 1):
        line = raw.strip()
        if not line:
            continue
        m = _LINK_LINE.match(line)
        if m is None:
            raise ParseError(f"iblinkinfo line {number}: not a link line: {line[:80]!r}")
        out.setdefault(int(m.group(1), 16), {})[int(m.group(2))] = PortState(m.group(4), m.group(5))
    if not out:
        raise ParseError("iblinkinfo printed no switch ports")
    return out


# What the tools print on stderr when a MAD got no answer (libibmad mad_rpc ``_do_madrpc failed``, the
# errno 110 of umad_recv), as against a refused or malformed query.
_NO_ANSWER = ("_do_madrpc failed", "Connection timed out", "timeout")


def failure_kind(stderr: str) -> str:
    """``timeout`` when the tool says a MAD went unanswered, ``error`` otherwise."""
    return "timeout" if any(s in stderr for s in _NO_ANSWER) else "error"


Value = tuple[int, int]  # (raw value, width in bits)


@dataclass(frozen=True)
class PortSample:
    """One switch port's counters as the sweep exports them: error counters by host name, data in 4-byte
    words (``PortXmitData``/``PortRcvData``), transmit wait ticks; each with the width it saturates at."""

    errors: dict[str, Value]
    xmit_data: Value | None
    rcv_data: Value | None
    xmit_wait: Value | None


def _field(block: PortCounters | None, name: str, width: int) -> Value | None:
    if block is None or name not in block.values:
        return None
    return block.values[name], width


def port_sample(extended: PortCounters | None, basic: PortCounters | None) -> PortSample:
    """Prefer the 64-bit extended counters; the basic PortCounters give what they lack (error counters
    where the PMA has no 64-bit ones, and PortXmitWait)."""
    errors = dict(basic.errors()) if basic is not None else {}
    if extended is not None:
        errors.update(extended.errors())
    wait = _field(extended, "PortXmitWait", 64) or _field(basic, "PortXmitWait", BASIC_XMIT_WAIT_WIDTH)
    return PortSample(
        errors,
        _field(extended, "PortXmitData", 64) or _field(basic, "PortXmitData", BASIC_DATA_WIDTH),
        _field(extended, "PortRcvData", 64) or _field(basic, "PortRcvData", BASIC_DATA_WIDTH),
        wait,
    )
