"""HTTP/1.1 responses built for the loop listener (``httploop``): status line, headers and body parts, no I/O.

The result is a list of buffers the loop hands to one ``sendmsg``: the head joined into one bytes,
then the body parts as they are (a pre-rendered /metrics is not copied).  Compression is per part:
gzip members concatenate into one valid stream (RFC 1952 2.2), so a cached ``Chunk``'s member is
reused as is and only the per-scrape parts are compressed.
"""

from __future__ import annotations

import struct
import time
import zlib
from collections.abc import Callable, Sequence
from email.utils import formatdate
from http import HTTPStatus

from .httpserve import Chunk

# A per-scrape part shorter than this (the snapshot_age line) goes out as a stored gzip member:
# setting up a deflate stream for 150 bytes costs more than it saves.
STORED_BELOW = 1024
# Bigger parts not cached as a Chunk (the agent's own counters, read at each scrape): compressed
# once per distinct text, the last few kept.
DEFLATED_KEEP = 8

_GZIP_HEADERS = b"\r\nContent-Encoding: gzip\r\nVary: Accept-Encoding"
# The reason phrase of every status, looked up once instead of an HTTPStatus per response.
_PHRASES = {s.value: s.phrase.encode() for s in HTTPStatus}


def stored_gzip(data: bytes) -> bytes:
    """``data`` as one gzip member (RFC 1952) of stored deflate blocks (RFC 1951 3.2.4): no compressor set up."""
    out = [b"\x1f\x8b\x08\x00\x00\x00\x00\x00\x00\xff"]
    for at in range(0, max(len(data), 1), 0xFFFF):
        block = data[at:at + 0xFFFF]
        out.append(struct.pack("<BHH", 1 if at + 0xFFFF >= len(data) else 0, len(block), len(block) ^ 0xFFFF))
        out.append(block)
    out.append(struct.pack("<II", zlib.crc32(data), len(data) & 0xFFFFFFFF))
    return b"".join(out)


class GzipMembers:
    """A body part as a gzip member: a Chunk's own cached one, small parts stored, the last few deflated kept."""

    def __init__(self, keep: int = DEFLATED_KEEP) -> None:
        self._keep = keep
        self._deflated: dict[bytes, bytes] = {}

    def __call__(self, part: bytes | Chunk) -> bytes:
        if isinstance(part, Chunk):
            return part.gzipped() if part.data else b""
        if not part:
            return b""
        if len(part) < STORED_BELOW:
            return stored_gzip(part)
        member = self._deflated.get(part)
        if member is None:
            if len(self._deflated) >= self._keep:
                self._deflated.clear()
            member = self._deflated[part] = Chunk(part).gzipped()
        return member


class HttpDate:
    """The Date header's value (RFC 9110 5.6.7), formatted once a second."""

    def __init__(self, clock: Callable[[], float] = time.time) -> None:
        self._clock = clock
        self._at = -1
        self._text = b""

    def __call__(self) -> bytes:
        now = int(self._clock())
        if self._at != now:
            self._at, self._text = now, formatdate(now, usegmt=True).encode()
        return self._text


def build_response(code: int, parts: Sequence[bytes | Chunk], ctype: str, date: bytes, *, close: bool,
                   head: bool = False, v10: bool = False,
                   gzip_member: Callable[[bytes | Chunk], bytes] | None = None) -> list[bytes]:
    """The buffers of one response: the head, then (unless ``head``: a HEAD request) the non-empty body parts.

    ``close`` says Connection: close; otherwise an HTTP/1.0 peer (``v10``) is told keep-alive, which
    it does not assume.  ``gzip_member`` (when the client accepts gzip) turns each part into a member."""
    if gzip_member is not None:
        body = [gzip_member(p) for p in parts]
        extra = _GZIP_HEADERS
    else:
        body = [p.data if isinstance(p, Chunk) else p for p in parts]
        extra = b""
    body = [b for b in body if b]
    if close:
        extra += b"\r\nConnection: close"
    elif v10:
        extra += b"\r\nConnection: keep-alive"
    out = [b"".join((b"HTTP/1.1 %d %s\r\nDate: " % (code, _PHRASES[code]), date,
                     b"\r\nContent-Type: ", ctype.encode(), b"\r\nContent-Length: %d" % sum(map(len, body)),
                     extra, b"\r\n\r\n"))]
    if not head:
        out += body
    return out
