"""The loop listener's response builder (fabricmon/httpresponse.py): status line, headers and body buffers.

Table-driven over what the loop answers: a 200 with keep-alive for HTTP/1.1 and 1.0, Connection:
close, HEAD (the head's Content-Length, no body), each error status the parser raises, and gzip
(per-part members that decompress as one stream, a Chunk's cached member reused)."""

from __future__ import annotations

import gzip

import pytest

from fabricmon.httpresponse import STORED_BELOW, GzipMembers, HttpDate, build_response, stored_gzip
from fabricmon.httpserve import TEXT, Chunk

DATE = b"Sat, 28 Nov 2026 18:00:00 GMT"


def split(out: list[bytes]) -> tuple[str, dict[str, str], bytes]:
    head, _, rest = out[0].partition(b"\r\n\r\n")
    assert rest == b""  # the head is a buffer of its own: the body parts are sent as they are
    status, *lines = head.decode("latin-1").split("\r\n")
    headers = dict(line.split(": ", 1) for line in lines)
    return status, headers, b"".join(out[1:])


CASES = [
    # code, parts, close, head, v10, status line, Connection header, body
    (200, [b"a 1\n", Chunk(b"b 2\n")], False, False, False, "HTTP/1.1 200 OK", None, b"a 1\nb 2\n"),
    (200, [b"a 1\n"], False, False, True, "HTTP/1.1 200 OK", "keep-alive", b"a 1\n"),
    (200, [b"a 1\n"], True, False, False, "HTTP/1.1 200 OK", "close", b"a 1\n"),
    (200, [b"a 1\n"], True, False, True, "HTTP/1.1 200 OK", "close", b"a 1\n"),
    (200, [b"a 1\n", b""], False, True, False, "HTTP/1.1 200 OK", None, b""),  # HEAD
    (400, [b"bad request line\n"], True, False, False, "HTTP/1.1 400 Bad Request", "close", b"bad request line\n"),
    (404, [b"not found\n"], False, False, False, "HTTP/1.1 404 Not Found", None, b"not found\n"),
    (431, [b"too many headers\n"], True, False, False,
     "HTTP/1.1 431 Request Header Fields Too Large", "close", b"too many headers\n"),
    (501, [b"unsupported method POST\n"], True, False, False,
     "HTTP/1.1 501 Not Implemented", "close", b"unsupported method POST\n"),
    (505, [b"unsupported version HTTP/2.0\n"], True, False, False,
     "HTTP/1.1 505 HTTP Version Not Supported", "close", b"unsupported version HTTP/2.0\n"),
]


@pytest.mark.parametrize(("code", "parts", "close", "head", "v10", "status", "connection", "body"), CASES)
def test_responses_carry_status_headers_and_body(code, parts, close, head, v10, status, connection, body):
    got_status, headers, got_body = split(build_response(code, parts, TEXT, DATE, close=close, head=head, v10=v10))
    assert got_status == status
    assert headers.get("Connection") == connection
    assert headers["Date"] == DATE.decode() and headers["Content-Type"] == TEXT
    want_length = sum(len(p.data if isinstance(p, Chunk) else p) for p in parts)
    assert int(headers["Content-Length"]) == want_length  # HEAD too: the length a GET would get
    assert got_body == body
    assert "Content-Encoding" not in headers


@pytest.mark.parametrize("head", [False, True])
def test_gzip_parts_decompress_as_one_stream(head):
    big = b"".join(b"m{i=\"%d\"} %d\n" % (i, i) for i in range(STORED_BELOW))  # deflated, not stored
    parts = [Chunk(b"cached 1\n"), b"", big, b"age 0.5\n"]
    out = build_response(200, parts, TEXT, DATE, close=False, head=head, gzip_member=GzipMembers())
    _, headers, body = split(out)
    assert headers["Content-Encoding"] == "gzip" and headers["Vary"] == "Accept-Encoding"
    members = build_response(200, parts, TEXT, DATE, close=False, gzip_member=GzipMembers())[1:]
    assert len(members) == 3  # the empty part adds no member
    assert int(headers["Content-Length"]) == sum(map(len, members))
    assert gzip.decompress(b"".join(members)) == b"cached 1\n" + big + b"age 0.5\n"
    assert body == (b"" if head else b"".join(members))


def test_gzip_members_reuse_a_chunks_member_and_keep_the_last_deflated():
    chunk = Chunk(b"x 1\n" * 400)
    members = GzipMembers(keep=2)
    assert members(chunk) is chunk.gzipped()
    small = b"age 0.5\n"
    assert members(small) == stored_gzip(small)  # below STORED_BELOW: no compressor set up
    big = [bytes([65 + i]) * STORED_BELOW for i in range(3)]
    first = members(big[0])
    assert members(big[0]) is first  # kept: compressed once per distinct text
    members(big[1])
    members(big[2])  # over ``keep``: the cache starts over
    again = members(big[0])
    assert again is not first and gzip.decompress(again) == big[0]


def test_http_date_is_formatted_once_a_second():
    now = [1_795_888_800.2]
    date = HttpDate(clock=lambda: now[0])
    first = date()
    assert first == DATE
    now[0] += 0.5
    assert date() is first
    now[0] += 1
    assert date() == b"Sat, 28 Nov 2026 18:00:01 GMT"
