"""HTTP/1.x request heads parsed for the loop listener (``httploop``): bytes in, a typed request or an error code out.

No I/O and no state: the loop hands over one complete head (request line and header lines, up to
its blank line) and gets back a ``Request`` or a ``BadRequest`` carrying the status to answer.
Only what a GET/HEAD route server needs is kept (Connection, Accept-Encoding, whether a body
follows); every other header is checked for shape and dropped.
"""

from __future__ import annotations

_VERSIONS = ("HTTP/1.1", "HTTP/1.0")


class BadRequest(Exception):
    """A request that is answered with ``code`` (400, 431, 505) and the connection closed."""

    def __init__(self, code: int, text: str) -> None:
        super().__init__(text)
        self.code = code


class Request:
    __slots__ = ("method", "target", "version", "connection", "accept_encoding", "body")

    def __init__(self) -> None:
        self.method = self.target = self.version = ""
        self.connection = ""  # every Connection header's value, lowercased and joined
        self.accept_encoding: str | None = None
        self.body = False  # a Content-Length other than 0, or a Transfer-Encoding

    @property
    def keep_alive(self) -> bool:
        """HTTP/1.1 keeps the connection unless told to close; HTTP/1.0 only when asked (RFC 9112 9.3)."""
        if self.version == "HTTP/1.1":
            return "close" not in self.connection
        return "keep-alive" in self.connection


def header_end(buf: bytearray | bytes) -> tuple[int, int]:
    """Where the header block ends (the offset of its blank line) and that line's length; (-1, 0) while incomplete.
    Bare LF line ends are accepted, as http.server does."""
    crlf = buf.find(b"\r\n\r\n")
    lf = buf.find(b"\n\n")
    if lf >= 0 and (crlf < 0 or lf < crlf):
        return lf + 1, 1
    return (crlf + 2, 2) if crlf >= 0 else (-1, 0)


def parse_head(head: bytes, max_headers: int) -> Request:
    """The request in ``head`` (up to ``header_end``'s offset); ``BadRequest`` for a malformed one.

    The method is not checked here: an unknown one is the server's 501, after the version is known."""
    lines = head.split(b"\n")
    if lines and lines[-1] in (b"", b"\r"):
        lines.pop()  # the blank line's own start
    if len(lines) - 1 > max_headers:
        raise BadRequest(431, "too many headers")
    words = lines[0].decode("latin-1").split()
    if len(words) != 3:
        raise BadRequest(400, "bad request line")
    req = Request()
    req.method, req.target, req.version = words
    if req.version not in _VERSIONS:
        raise BadRequest(505 if req.version.startswith("HTTP/") else 400, f"unsupported version {req.version}")
    for line in lines[1:]:
        name, colon, value = line.partition(b":")
        if not colon or not name or name[:1] in b" \t":
            raise BadRequest(400, "bad header line")  # obsolete line folding included
        key = name.strip().lower()
        if key == b"connection":
            req.connection += value.decode("latin-1").lower()
        elif key == b"accept-encoding":
            req.accept_encoding = value.decode("latin-1")
        elif key == b"content-length":
            req.body = req.body or value.strip() != b"0"
        elif key == b"transfer-encoding":
            req.body = True
    return req
