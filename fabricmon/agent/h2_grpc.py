"""The agent's gRPC client: one bidi-streaming call over HTTP/2, on ``h2`` (pure Python).

Why not grpcio: ``import grpc`` alone costs the agent 17-20 MiB of RSS (its core library, plus the asyncio
and ssl it imports), and the agent makes one call.  The aggregator keeps grpcio's server.

Wire format: https://github.com/grpc/grpc/blob/master/doc/PROTOCOL-HTTP2.md.  The interface is the part of
grpcio's the stream session uses: ``Channel.stream_stream(method, ...)`` gives a callable; calling it with a
request iterator gives a ``Call``, an iterator of responses with ``cancel()``; a call that does not end OK
raises ``RpcError`` (``code()``, ``details()``) from the iteration, never from the call itself (grpcio's
``wait_for_ready=False``).

Threads: the thread iterating the call owns the socket and the ``H2Connection`` (connects, reads, writes,
pings); a pump thread moves requests from the caller's iterator into an outbox and wakes it through a pipe.
One owner, so no TLS object is ever used from two threads at once; ``cancel()`` from any thread writes to
the same pipe.  Every wait is bounded.
"""

from __future__ import annotations

import os
import select
import socket
import ssl
import struct
import threading
import time
import urllib.parse
from collections import deque
from collections.abc import Callable, Iterable, Iterator
from typing import Any

import h2.config
import h2.connection
import h2.errors
import h2.events
import h2.exceptions

from .. import __version__
from ..configload import split_hostport
from .grpc_status import HTTP_STATUS, RST_STREAM_STATUS, RpcError, StatusCode, status_from_number

_FRAME = struct.Struct(">BI")  # gRPC length-prefixed message: compressed flag, length
MAX_RECEIVE_BYTES = 1024 * 1024
PING_TIMEOUT = 10.0  # seconds a keepalive PING waits for its ACK before the connection is declared dead
CONNECT_TIMEOUT = 10.0  # TCP connect and TLS handshake, each
OUTBOX_LIMIT = 8 * 1024 * 1024  # bytes queued for sending before the pump waits for the socket
_USER_AGENT = f"fabricmon/{__version__} h2/{h2.__version__}"  # type: ignore[attr-defined]


class Channel:
    """Where calls go: the target, TLS (``ssl_context``, ALPN h2; ``server_name``: the name checked against
    the server's certificate, else the target's host) and keepalive.  Each call opens its own connection
    (the agent makes one call per connection; a new session opens a new channel)."""

    def __init__(self, target: str, ssl_context: ssl.SSLContext | None = None, server_name: str | None = None,
                 keepalive_ms: int = 20_000,
                 max_message_bytes: int = 4 * 1024 * 1024, max_receive_bytes: int = MAX_RECEIVE_BYTES,
                 connect_timeout: float = CONNECT_TIMEOUT, ping_timeout: float = PING_TIMEOUT) -> None:
        self.host, self.port = split_hostport(target)
        self.target = target
        self.ssl_context = ssl_context
        self.server_name = server_name
        self.keepalive = keepalive_ms / 1000.0
        self.max_message_bytes = max_message_bytes
        self.max_receive_bytes = max_receive_bytes
        self.connect_timeout = connect_timeout
        self.ping_timeout = ping_timeout
        self._calls: list[Call] = []

    def stream_stream(self, method: str, request_serializer: Callable[[Any], bytes] | None = None,
                      response_deserializer: Callable[[bytes], Any] | None = None) -> Callable[..., Call]:
        def invoke(requests: Iterable[Any], metadata: Iterable[tuple[str, str]] = (),
                   wait_for_ready: bool = False) -> Call:
            del wait_for_ready  # never waits: a connection that fails ends the call UNAVAILABLE
            call = Call(self, method, requests, tuple(metadata), request_serializer, response_deserializer)
            self._calls.append(call)
            return call
        return invoke

    def close(self) -> None:
        for call in self._calls:
            call.cancel()
        self._calls.clear()


class Call:
    """One streaming call: iterate it for the responses; ``cancel()`` from any thread ends it."""

    def __init__(self, channel: Channel, method: str, requests: Iterable[Any], metadata: tuple[tuple[str, str], ...],
                 serializer: Callable[[Any], bytes] | None, deserializer: Callable[[bytes], Any] | None) -> None:
        self.ch = channel
        self.method = method
        self.metadata = metadata
        self.serializer = serializer
        self.deserializer = deserializer
        # a socket pair, not a pipe: once closed, a late wake fails on the object, never on a reused fd
        self._wake_r, self._wake_w = socket.socketpair()
        self._wake_r.setblocking(False)
        self._wake_w.setblocking(False)
        self._cv = threading.Condition()
        self._outbox: deque[bytes] = deque()  # framed messages, guarded by _cv
        self._outbox_bytes = 0
        self._requests_done = False
        self._request_error: str | None = None
        self._cancelled = False
        self._ended = False  # set once, by the I/O thread: no more sends, the pump stops
        self._final: RpcError | None = None
        self._finished_ok = False
        self._sock: socket.socket | None = None
        self._conn: h2.connection.H2Connection | None = None
        self._sid = 0
        self._sending = b""  # the outbox message being sent (what flow control has not let out yet)
        self._send_closed = False
        self._recv = bytearray()
        self._responses: deque[Any] = deque()
        self._headers: dict[str, str] = {}
        self._trailers: dict[str, str] = {}
        self._last_frame = 0.0
        self._ping_sent: float | None = None
        self.pings_acked = 0
        self._pump = threading.Thread(target=self._pump_requests, args=(requests,), name="fabricmon-stream-send",
                                      daemon=True)
        self._pump.start()

    # -- the caller's side -------------------------------------------------------------------------------
    def __iter__(self) -> Iterator[Any]:
        return self

    def __next__(self) -> Any:
        while True:
            if self._responses:
                return self._responses.popleft()
            if self._finished_ok:
                raise StopIteration
            if self._final is not None:
                raise self._final
            try:
                if self._cancelled and self._sock is None:
                    raise RpcError(StatusCode.CANCELLED, "cancelled")
                if self._sock is None:
                    self._connect()
                self._turn()
            except RpcError as exc:
                self._finish(exc)
            except (OSError, h2.exceptions.H2Error) as exc:
                self._finish(RpcError(StatusCode.UNAVAILABLE, f"{type(exc).__name__}: {exc}"))

    def cancel(self) -> None:
        self._cancelled = True
        self._wake()

    # -- requests ---------------------------------------------------------------------------------------
    def _pump_requests(self, requests: Iterable[Any]) -> None:
        try:
            for item in requests:
                data = self.serializer(item) if self.serializer else item
                framed = _FRAME.pack(0, len(data)) + data
                with self._cv:
                    while self._outbox_bytes > OUTBOX_LIMIT and not self._ended:
                        self._cv.wait(0.5)
                    if self._ended:
                        return
                    self._outbox.append(framed)
                    self._outbox_bytes += len(framed)
                self._wake()
        except Exception as exc:  # grpcio cancels a call whose request iterator raises
            self._request_error = f"request iterator raised {type(exc).__name__}: {exc}"
        finally:
            with self._cv:
                self._requests_done = True
            self._wake()

    def _wake(self) -> None:
        try:
            self._wake_w.send(b"\0")
        except OSError:
            pass  # full (a wake is pending anyway) or closed (the call ended)

    # -- the connection ---------------------------------------------------------------------------------
    def _connect(self) -> None:
        ch = self.ch
        try:
            raw = socket.create_connection((ch.host, ch.port), timeout=ch.connect_timeout)
        except OSError as exc:
            raise RpcError(StatusCode.UNAVAILABLE, f"failed to connect to {ch.target}: {exc}") from None
        raw.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        sock: socket.socket = raw
        if ch.ssl_context is not None:
            name = ch.server_name or ch.host
            try:
                sock = ch.ssl_context.wrap_socket(raw, server_hostname=name)
            except (ssl.SSLError, ssl.CertificateError, OSError) as exc:
                raw.close()
                raise RpcError(StatusCode.UNAVAILABLE, f"TLS handshake with {ch.target}: {exc}") from None
        sock.setblocking(False)
        self._sock = sock
        conn = h2.connection.H2Connection(h2.config.H2Configuration(client_side=True, header_encoding="utf-8"))
        conn.initiate_connection()
        self._conn = conn
        self._sid = conn.get_next_available_stream_id()
        authority = ch.server_name or ch.target
        headers = [(":method", "POST"), (":scheme", "https" if ch.ssl_context else "http"), (":path", self.method),
                   (":authority", authority), ("content-type", "application/grpc"), ("te", "trailers"),
                   ("user-agent", _USER_AGENT)]
        headers += [(k.lower(), v) for k, v in self.metadata]
        conn.send_headers(self._sid, headers)
        self._last_frame = time.monotonic()

    def _turn(self) -> None:
        """One pass: send what flow control allows, wait (bounded) for the socket or a wake, read."""
        assert self._sock is not None and self._conn is not None
        sock, conn = self._sock, self._conn
        if self._cancelled:
            try:
                conn.reset_stream(self._sid, h2.errors.ErrorCodes.CANCEL)
                sock.send(conn.data_to_send())
            except (OSError, h2.exceptions.H2Error):
                pass
            raise RpcError(StatusCode.CANCELLED, "cancelled")
        if self._request_error:
            raise RpcError(StatusCode.CANCELLED, self._request_error)
        self._fill_window(conn)
        now = time.monotonic()
        if self._ping_sent is not None and now - self._ping_sent > self.ch.ping_timeout:
            raise RpcError(StatusCode.UNAVAILABLE, f"keepalive: no PING ACK within {self.ch.ping_timeout:.0f}s")
        if self._ping_sent is None and now - self._last_frame > self.ch.keepalive:
            conn.ping(os.urandom(8))
            self._ping_sent = now
        out = conn.data_to_send()
        if out:
            self._send_all(sock, out)
        deadline = (self._ping_sent + self.ch.ping_timeout) if self._ping_sent is not None \
            else self._last_frame + self.ch.keepalive
        wait = min(max(deadline - now, 0.0) + 0.01, 1.0)
        pending = isinstance(sock, ssl.SSLSocket) and sock.pending() > 0
        readable = [sock] if pending else select.select([sock, self._wake_r], [], [], wait)[0]
        if self._wake_r in readable:
            try:
                self._wake_r.recv(4096)
            except OSError:
                pass
        if sock in readable:
            self._read(sock, conn)

    def _read(self, sock: socket.socket, conn: h2.connection.H2Connection) -> None:
        try:
            data = sock.recv(65536)
        except (ssl.SSLWantReadError, ssl.SSLWantWriteError, BlockingIOError):
            return
        if not data:
            raise RpcError(StatusCode.UNAVAILABLE, "connection closed by the server")
        self._last_frame = time.monotonic()
        for event in conn.receive_data(data):
            self._on_event(conn, event)
        out = conn.data_to_send()  # SETTINGS and PING acks, WINDOW_UPDATEs
        if out:
            self._send_all(sock, out)

    def _on_event(self, conn: h2.connection.H2Connection, event: h2.events.Event) -> None:
        if isinstance(event, h2.events.ResponseReceived):
            self._headers = {str(k): str(v) for k, v in event.headers}
        elif isinstance(event, h2.events.TrailersReceived):
            self._trailers = {str(k): str(v) for k, v in event.headers}
        elif isinstance(event, h2.events.DataReceived):
            conn.acknowledge_received_data(event.flow_controlled_length, event.stream_id)
            self._recv += event.data
            self._unframe()
        elif isinstance(event, h2.events.StreamEnded):
            self._end_of_stream()
        elif isinstance(event, h2.events.StreamReset):
            code = RST_STREAM_STATUS.get(int(event.error_code), StatusCode.INTERNAL)
            raise RpcError(code, f"stream reset by the server (HTTP/2 error {event.error_code!s})")
        elif isinstance(event, h2.events.ConnectionTerminated):
            extra = (event.additional_data or b"").decode("utf-8", "replace")
            raise RpcError(StatusCode.UNAVAILABLE, f"GOAWAY from the server ({event.error_code!s}) {extra}".strip())
        elif isinstance(event, h2.events.PingAckReceived):
            self._ping_sent = None
            self.pings_acked += 1

    def _unframe(self) -> None:
        buf = self._recv
        while len(buf) >= _FRAME.size:
            compressed, length = _FRAME.unpack_from(buf)
            if length > self.ch.max_receive_bytes:
                raise RpcError(StatusCode.RESOURCE_EXHAUSTED,
                               f"received message larger than max ({length} vs. {self.ch.max_receive_bytes})")
            if compressed:
                raise RpcError(StatusCode.INTERNAL, "compressed message, no grpc-encoding was offered")
            if len(buf) < _FRAME.size + length:
                return
            body = bytes(buf[_FRAME.size:_FRAME.size + length])
            del buf[:_FRAME.size + length]
            self._responses.append(self.deserializer(body) if self.deserializer else body)

    def _end_of_stream(self) -> None:
        # Trailers-Only: the status came in the response HEADERS, ended there.
        meta = self._trailers or self._headers
        if "grpc-status" not in meta:
            http = int(self._headers.get(":status", "0") or 0)
            code = HTTP_STATUS.get(http, StatusCode.UNKNOWN)
            raise RpcError(code, f"HTTP status {http} without grpc-status")
        code = status_from_number(meta["grpc-status"])
        if self._recv:
            raise RpcError(StatusCode.INTERNAL, f"stream ended inside a message ({len(self._recv)} bytes)")
        if code is StatusCode.OK:
            self._finished_ok = True
            self._close()
            return
        raise RpcError(code, urllib.parse.unquote(meta.get("grpc-message", "")))

    def _fill_window(self, conn: h2.connection.H2Connection) -> None:
        """Move outbox bytes into HTTP/2 DATA frames as far as the stream's send window allows."""
        while True:
            if not self._sending:
                with self._cv:
                    if self._outbox:
                        self._sending = self._outbox.popleft()
                        self._outbox_bytes -= len(self._sending)
                        self._cv.notify_all()
                    elif self._requests_done and not self._send_closed:
                        conn.end_stream(self._sid)  # half-close: the request iterator ended
                        self._send_closed = True
                        return
                    else:
                        return
                if len(self._sending) - _FRAME.size > self.ch.max_message_bytes:
                    raise RpcError(StatusCode.RESOURCE_EXHAUSTED, f"sent message larger than max "
                                   f"({len(self._sending) - _FRAME.size} vs. {self.ch.max_message_bytes})")
            n = min(len(self._sending), conn.local_flow_control_window(self._sid), conn.max_outbound_frame_size)
            if n <= 0:
                return  # a WINDOW_UPDATE wakes the reading side of _turn
            conn.send_data(self._sid, self._sending[:n])
            self._sending = self._sending[n:]

    def _send_all(self, sock: socket.socket, data: bytes) -> None:
        """Write all of ``data`` on the non-blocking socket, waiting (bounded) while the kernel's buffer is full."""
        view = memoryview(data)
        deadline = time.monotonic() + self.ch.ping_timeout
        while view:
            try:
                sent = sock.send(view)
                view = view[sent:]
                continue
            except (BlockingIOError, ssl.SSLWantWriteError, ssl.SSLWantReadError):
                pass
            left = deadline - time.monotonic()
            if left <= 0 or self._cancelled:
                raise RpcError(StatusCode.UNAVAILABLE, "the server stopped reading (send buffer full)")
            select.select([], [sock], [], min(left, 0.5))

    # -- the end ----------------------------------------------------------------------------------------
    def _finish(self, exc: RpcError) -> None:
        self._final = exc
        self._close()

    def _close(self) -> None:
        with self._cv:
            self._ended = True
            self._outbox.clear()
            self._outbox_bytes = 0
            self._cv.notify_all()
        if self._sock is not None:
            try:
                self._sock.close()
            except OSError:
                pass
        self._wake_r.close()
        self._wake_w.close()
