"""Example hostnames left in a config (the shipped examples name ``*.example.internal``).

A config that still points at ``fabricmon-aggregator.example.internal`` passes every type check, and
the daemon then retries a name that never resolves.  ``check-config`` warns about each one (it does
not fail: a test config may mean it).  Pure: a loaded YAML tree in, (field, host) pairs out.
"""

from __future__ import annotations

import re
from collections.abc import Iterator

# RFC 2606 / RFC 6761 names reserved for examples, and the examples' own example.internal.
# A name ends where no label follows (a trailing dot before a non-name character is allowed).
_END = r"(?![A-Za-z0-9-]|\.[A-Za-z0-9])"
EXAMPLE_HOST = re.compile(
    r"(?<![A-Za-z0-9.-])(?:[A-Za-z0-9-]{1,63}\.){0,8}example\.(?:internal|com|net|org)" + _END
    + r"|(?<![A-Za-z0-9.-])(?:[A-Za-z0-9-]{1,63}\.){1,8}example" + _END,
    re.IGNORECASE)
_MAX_DEPTH = 64  # a config is a few levels deep; YAML anchors cannot make it recurse forever


def example_hosts(data: object, field: str = "", depth: int = 0) -> Iterator[tuple[str, str]]:
    """Each (dotted field, hostname) whose value names a reserved example host."""
    if depth > _MAX_DEPTH:
        return
    if isinstance(data, dict):
        for k, v in data.items():
            yield from example_hosts(v, f"{field}.{k}" if field else str(k), depth + 1)
    elif isinstance(data, list):
        for i, v in enumerate(data):
            yield from example_hosts(v, f"{field}[{i}]", depth + 1)
    elif isinstance(data, str):
        for m in EXAMPLE_HOST.finditer(data):
            yield field, m.group(0)
