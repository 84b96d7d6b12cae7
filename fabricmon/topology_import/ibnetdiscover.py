"""Parse ``ibnetdiscover``'s topology text (infiniband-diags ``out_topology()``) into nodes and links.

What real files carry besides the records is tolerated: a UTF-8 byte-order mark, CRLF line ends, ``#``
comment lines, a pasted shell prompt with the command (``[root@head ~]# ibnetdiscover``,
``user@head:~$ ibnetdiscover > fabric.txt``), ``ibwarn:`` lines from the simulator or the tool, the
``-g`` grouping headers.  Anything else is an error naming the line.  Pure: text in, records out.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass, field

NODE_TYPES = {"Switch": "switch", "Ca": "ca", "Rt": "router"}


class IbnetParseError(ValueError):
    """``str()`` is ``line N: problem``; the caller prefixes the file."""

    def __init__(self, line: int, problem: str) -> None:
        super().__init__(f"line {line}: {problem}")
        self.line = line
        self.problem = problem


@dataclass
class IbPort:
    port: int
    peer_guid: int
    peer_port: int
    port_guid: int | None = None  # CA and router ports print theirs: [1](2c903000d7aad)
    peer_description: str | None = None
    speed: str | None = None  # "4xNDR"


@dataclass
class IbNode:
    kind: str  # switch | ca | router
    guid: int
    nports: int
    description: str
    line: int
    sysimgguid: int | None = None
    ports: dict[int, IbPort] = field(default_factory=dict)
    lid: int | None = None  # a switch's port-0 LID (``base port 0 lid 2``): 0 before a subnet manager ran


@dataclass
class IbFabric:
    nodes: dict[int, IbNode] = field(default_factory=dict)
    # Peers seen only on link lines (a file cut after the switches): their description from the link.
    link_descriptions: dict[int, str] = field(default_factory=dict)
    link_kinds: dict[int, str] = field(default_factory=dict)
    lines: int = 0


# The grammar, one pattern per record kind (ibnetdiscover.c out_switch/out_ca/out_switch_port/out_ca_port).
_HEADER = re.compile(r'^(Switch|Ca|Rt)\s+(\d+)\s+"([SHR])-([0-9a-fA-F]+)"\s*(?:#\s*(.*))?$')
_SWITCH_PORT = re.compile(
    r'^\[(\d+)\](?:\[ext \d+\])?\s+"([SHR])-([0-9a-fA-F]+)"\[(\d+)\](?:\(([0-9a-fA-F]+)\))?\s*(?:#\s*(.*))?$')
_CA_PORT = re.compile(
    r'^\[(\d+)\]\(([0-9a-fA-F]+)\)\s+"([SHR])-([0-9a-fA-F]+)"\[(\d+)\](?:\(([0-9a-fA-F]+)\))?\s*(?:#\s*(.*))?$')
_KEYVAL = re.compile(r"^(vendid|devid|sysimgguid|switchguid|caguid|rtguid)=(0x[0-9a-fA-F]+)")
_HEADER_LID = re.compile(r"\bport 0 lid (\d+)\b")
_QUOTED_HEADER = re.compile(r'^"(.*)"(?:\s+(?:base|enhanced) port \d+.*)?$')
_QUOTED_SWITCH_LINK = re.compile(r'^"(.*)"\s+lid\s+\d+\s*(\S*)')
_QUOTED_CA_LINK = re.compile(r'^lid\s+\d+\s+lmc\s+\d+\s+"(.*)"\s+lid\s+\d+\s*(\S*)')
# Lines that are not records and not errors: prompts, tool chatter, the grouping headers (-g).
_IGNORED = (
    # [^\s@:]*[@:] stops at the first @ or ':' (a later one matches nothing the first does not), so the
    # \S* after it backtracks once per character: linear, where \S*[@:]\S* was quadratic (issue 35)
    re.compile(r"^[^\s@:]*[@:]\S*\s*[$#%>]\s"),  # user@host:~$ cmd, [root@head ~]# cmd (after the bracket)
    re.compile(r"^\[[^\]\d][^\]]*\][$#%>]\s?"),  # [root@head ~]# cmd
    re.compile(r"^[$#%>]\s+\S*ibnetdiscover"),  # $ ibnetdiscover
    re.compile(r"^[^\s@:]*[@:]\S*\s*[$#%>]\s*$"),  # a bare prompt at the end of a paste
    re.compile(r"^(ibwarn|ibnetdiscover|ibdebug|src/\S+):"),  # diagnostics on stderr pasted in
    re.compile(r"^(Non-Chassis Nodes|Chassis \d+|Switch Chassis|Spine|Line)\b"),
    re.compile(r"^(sudo\s+)?\S*ibnetdiscover(\s.*)?$"),  # the command itself, pasted without a prompt
)

# Outputs of the neighbouring tools, which an operator may hand over by mistake: a hint names them.
_OTHER_TOOLS = (
    (re.compile(r"^(SW|CA|RT)\s+\d+\s+\d+\s+0x[0-9a-fA-F]+\s"), "`ibnetdiscover -p` (ports report)"),
    (re.compile(r"^(Switch|Ca|Router)\s*:\s*0x[0-9a-fA-F]+ ports \d+"), "`ibnodes`/`ibswitches`/`ibhosts`"),
    (re.compile(r"^(CA|Switch):\s"), "`iblinkinfo`"),
)

ProgressFn = Callable[[int], None]
# The longest line ibnetdiscover writes is a port line with two 64-byte NodeDescriptions (IB spec
# 14.2.5.2), about 250 characters; a longer one is not its output, and would only cost regex time.
MAX_LINE_CHARS = 4096


def _not_topology(number: int, line: str) -> IbnetParseError:
    for pattern, tool in _OTHER_TOOLS:
        if pattern.match(line):
            return IbnetParseError(number, f"this is {tool} output; give plain `ibnetdiscover` output")
    return IbnetParseError(number, f"not ibnetdiscover topology output: {line[:80]!r}")


def _guid(text: str) -> int:
    return int(text, 16)


def _description_of_header(rest: str | None) -> str:
    if not rest:
        return ""
    m = _QUOTED_HEADER.match(rest.strip())
    if m:
        return m.group(1)
    return rest.strip().strip('"')


def parse_ibnetdiscover(text: str, *, progress: ProgressFn | None = None, every: int = 50_000) -> IbFabric:
    """Records of one ``ibnetdiscover`` output.  ``progress(lines_done)`` is called every ``every`` lines."""
    text = text.removeprefix("\ufeff")
    fabric = IbFabric()
    current: IbNode | None = None
    pending: dict[str, int] = {}
    lines = text.splitlines()  # \r\n, \r and \n alike
    fabric.lines = len(lines)
    for number, raw in enumerate(lines, 1):
        if progress is not None and number % every == 0:
            progress(number)
        if len(raw) > MAX_LINE_CHARS:
            raise IbnetParseError(number, f"a line of {len(raw)} characters, at most {MAX_LINE_CHARS}: not "
                                          "ibnetdiscover output")
        line = raw.strip()
        if not line:
            current = None  # records end at a blank line
            continue
        if line.startswith("#"):
            continue
        kv = _KEYVAL.match(line)
        if kv:
            pending[kv.group(1)] = _guid(kv.group(2))
            current = None
            continue
        m = _HEADER.match(line)
        if m:
            kind = NODE_TYPES[m.group(1)]
            guid = _guid(m.group(4))
            expected = {"switch": "S", "ca": "H", "router": "R"}[kind]
            if m.group(3) != expected:
                raise IbnetParseError(number, f'{m.group(1)} record with a "{m.group(3)}-" id')
            if guid in fabric.nodes:
                raise IbnetParseError(number, f"node 0x{guid:016x} listed twice "
                                              f"(first at line {fabric.nodes[guid].line})")
            lid = _HEADER_LID.search(m.group(5) or "")
            current = IbNode(kind, guid, int(m.group(2)), _description_of_header(m.group(5)), number,
                             sysimgguid=pending.get("sysimgguid"), lid=int(lid.group(1)) if lid else None)
            fabric.nodes[guid] = current
            pending = {}
            continue
        if line.startswith("["):
            sw = _SWITCH_PORT.match(line)
            ca = None if sw else _CA_PORT.match(line)
            if sw is None and ca is None:
                if any(p.match(line) for p in _IGNORED):
                    continue
                raise IbnetParseError(number, f"not an ibnetdiscover port line: {line[:80]!r}")
            if current is None:
                raise IbnetParseError(number, "port line outside a Switch/Ca/Rt record")
            if sw is not None:
                port, ptype, pguid, pport, _pportguid, rest = (
                    int(sw.group(1)), sw.group(2), _guid(sw.group(3)), int(sw.group(4)), sw.group(5), sw.group(6))
                own_port_guid = None
                dm = _QUOTED_SWITCH_LINK.match(rest.strip()) if rest else None
            else:
                assert ca is not None
                port, own_port_guid, ptype, pguid, pport, rest = (
                    int(ca.group(1)), _guid(ca.group(2)), ca.group(3), _guid(ca.group(4)), int(ca.group(5)),
                                                                  ca.group(7))
                dm = _QUOTED_CA_LINK.match(rest.strip()) if rest else None
                if dm is None and rest:
                    dm = _QUOTED_SWITCH_LINK.match(rest.strip())
            if not 0 <= port <= 255 or not 0 <= pport <= 255:
                raise IbnetParseError(number, f"port number out of range 0..255 in {line[:80]!r}")
            if port in current.ports:
                raise IbnetParseError(number, f"port {port} of 0x{current.guid:016x} listed twice")
            peer_desc = dm.group(1) if dm else None
            speed = (dm.group(2) or None) if dm else None
            current.ports[port] = IbPort(port, pguid, pport, own_port_guid, peer_desc, speed)
            if peer_desc is not None:
                fabric.link_descriptions.setdefault(pguid, peer_desc)
            fabric.link_kinds.setdefault(pguid, {"S": "switch", "H": "ca", "R": "router"}[ptype])
            continue
        if any(p.match(line) for p in _IGNORED):
            continue
        raise _not_topology(number, line)
    if progress is not None:
        progress(len(lines))
    if not fabric.nodes:
        raise IbnetParseError(max(len(lines), 1), "no Switch or Ca records: is this ibnetdiscover's output?")
    return fabric
