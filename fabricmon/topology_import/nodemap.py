"""OpenSM's node-name-map (opensm.conf ``node_name_map_name``; ibnetdiscover ``--node-name-map``).

One entry a line: a GUID, then the name in double quotes (``0x0002c9020046c588 "leaf-a3"``); ``#`` starts
a comment; blank lines are ignored.  rdma-core's ``nodenamemap.c`` reads the same shape (the name may
also be unquoted, up to the end of the line).  Pure: text in, mapping out.
"""

from __future__ import annotations

import re

_ENTRY = re.compile(r'^(0x[0-9a-fA-F]{1,16}|[0-9a-fA-F]{1,16})\s+(?:"([^"]*)"|(\S.*?))\s*(?:#.*)?$')


class NodeMapError(ValueError):
    def __init__(self, line: int, problem: str) -> None:
        super().__init__(f"line {line}: {problem}")
        self.line = line


def parse_node_name_map(text: str) -> dict[int, str]:
    text = text.removeprefix("\ufeff")
    out: dict[int, str] = {}
    for number, raw in enumerate(text.splitlines(), 1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        m = _ENTRY.match(line)
        if m is None:
            raise NodeMapError(number, f'expected GUID "name", got {line[:80]!r}')
        name = m.group(2) if m.group(2) is not None else m.group(3)
        guid = int(m.group(1), 16)
        if guid in out and out[guid] != name:
            raise NodeMapError(number, f"GUID {m.group(1)} mapped twice ({out[guid]!r} and {name!r})")
        out[guid] = name
    return out
