"""The loop listener's request parser (fabricmon/httprequest.py): bytes in, a typed request or an error code out.

Table-driven over the shapes the loop sees: a good GET and HEAD, each bad-request code (400, 431,
505; 501 is the server's, for a method it has no route for, so the parser passes the method
through), keep-alive for HTTP/1.0 and 1.1, and where the header block ends (CRLF or bare LF)."""

from __future__ import annotations

import pytest

from fabricmon.httprequest import BadRequest, header_end, parse_head


def head_of(raw: bytes) -> bytes:
    end, _ = header_end(raw)
    assert end >= 0, raw
    return raw[:end]


GOOD = [
    # raw request, method, target, version, keep_alive, accept_encoding, body
    (b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n", "GET", "/metrics", "HTTP/1.1", True, None, False),
    (b"HEAD /metrics HTTP/1.1\r\nHost: x\r\n\r\n", "HEAD", "/metrics", "HTTP/1.1", True, None, False),
    (b"GET /x HTTP/1.1\r\nConnection: close\r\n\r\n", "GET", "/x", "HTTP/1.1", False, None, False),
    (b"GET /x HTTP/1.1\r\nConnection: Keep-Alive, Close\r\n\r\n", "GET", "/x", "HTTP/1.1", False, None, False),
    (b"GET /x HTTP/1.0\r\n\r\n", "GET", "/x", "HTTP/1.0", False, None, False),
    (b"GET /x HTTP/1.0\r\nConnection: keep-alive\r\n\r\n", "GET", "/x", "HTTP/1.0", True, None, False),
    (b"GET /x HTTP/1.0\r\nCONNECTION: Keep-Alive\r\n\r\n", "GET", "/x", "HTTP/1.0", True, None, False),
    (b"GET /x?a=1 HTTP/1.1\nAccept-Encoding: gzip\n\n", "GET", "/x?a=1", "HTTP/1.1", True, " gzip", False),
    (b"GET http://h/x HTTP/1.1\r\nContent-Length: 0\r\n\r\n", "GET", "http://h/x", "HTTP/1.1", True, None, False),
    (b"GET /x HTTP/1.1\r\nContent-Length: 5\r\n\r\nhello", "GET", "/x", "HTTP/1.1", True, None, True),
    (b"GET /x HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n", "GET", "/x", "HTTP/1.1", True, None, True),
    (b"POST /x HTTP/1.1\r\n\r\n", "POST", "/x", "HTTP/1.1", True, None, False),  # the server's 501
]


@pytest.mark.parametrize(("raw", "method", "target", "version", "keep", "enc", "body"), GOOD)
def test_good_requests_parse_to_their_fields(raw, method, target, version, keep, enc, body):
    req = parse_head(head_of(raw), max_headers=100)
    assert (req.method, req.target, req.version) == (method, target, version)
    assert req.keep_alive is keep
    assert req.accept_encoding == enc
    assert req.body is body


BAD = [
    (b"GET /x\r\n\r\n", 400, "bad request line"),
    (b"GET /x HTTP/1.1 extra\r\n\r\n", 400, "bad request line"),
    (b"GET /x FTP/1.1\r\n\r\n", 400, "unsupported version FTP/1.1"),
    (b"GET /x HTTP/1.1\r\nno colon here\r\n\r\n", 400, "bad header line"),
    (b"GET /x HTTP/1.1\r\n: empty name\r\n\r\n", 400, "bad header line"),
    (b"GET /x HTTP/1.1\r\nA: 1\r\n folded: on\r\n\r\n", 400, "bad header line"),  # obsolete folding
    (b"GET /x HTTP/1.1\r\n" + b"".join(b"H%d: v\r\n" % i for i in range(4)) + b"\r\n", 431, "too many headers"),
    (b"GET /x HTTP/2.0\r\n\r\n", 505, "unsupported version HTTP/2.0"),
    (b"GET /x HTTP/0.9\r\n\r\n", 505, "unsupported version HTTP/0.9"),
]


@pytest.mark.parametrize(("raw", "code", "text"), BAD)
def test_bad_requests_raise_their_status(raw, code, text):
    with pytest.raises(BadRequest) as bad:
        parse_head(head_of(raw), max_headers=3)
    assert (bad.value.code, str(bad.value)) == (code, text)


def test_header_limit_counts_header_lines_only():
    raw = b"GET /x HTTP/1.1\r\n" + b"".join(b"H%d: v\r\n" % i for i in range(3)) + b"\r\n"
    assert parse_head(head_of(raw), max_headers=3).method == "GET"  # exactly at the limit


@pytest.mark.parametrize(("buf", "want"), [
    (b"GET / HTTP/1.1\r\nHost: x\r\n", (-1, 0)),  # incomplete
    (b"GET / HTTP/1.1\r\n\r\nGET /next", (16, 2)),  # CRLF: the blank line starts after the last header's CRLF
    (b"GET / HTTP/1.1\n\nrest", (15, 1)),  # bare LF, as http.server accepts
    (b"GET / HTTP/1.1\nA: b\n\n\r\n\r\n", (20, 1)),  # the earlier end wins
])
def test_header_end_finds_the_first_blank_line(buf, want):
    assert header_end(bytearray(buf)) == want
