"""One HTTP exchange under a total deadline and a size bound (urllib, with its handlers).

urllib's ``timeout`` bounds each socket operation, not the exchange: a server that answers 200 and
then drips a byte every 2 s never times out (issue 35: a dripping Alertmanager held the aggregator's
start and starved the cross-shard evidence poll).  Here a timer shuts the connection's socket down at
the deadline, whatever phase it is in (connect, TLS handshake, headers, body), so the call returns
``TimeoutError`` within the deadline and the caller can try the next URL."""

from __future__ import annotations

import http.client
import socket
import threading
import urllib.request
from typing import Any


class _Watch:
    """Shuts down the socket it was given once the deadline passes (also one given after it passed)."""

    def __init__(self, deadline_s: float) -> None:
        self.expired = False
        self._sock: socket.socket | None = None
        self._lock = threading.Lock()
        self._timer = threading.Timer(deadline_s, self._fire)
        self._timer.daemon = True

    def start(self) -> None:
        self._timer.start()

    def cancel(self) -> None:
        self._timer.cancel()

    def arm(self, sock: socket.socket) -> None:
        with self._lock:
            self._sock = sock
            if self.expired:
                self._shut()

    def _fire(self) -> None:
        with self._lock:
            self.expired = True
            self._shut()

    def _shut(self) -> None:
        if self._sock is not None:
            try:
                self._sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass


def _watched(base: type[http.client.HTTPConnection], watch: _Watch) -> Any:
    class Conn(base):  # type: ignore[valid-type,misc]
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, **kwargs)

            def connect(address: tuple[str, int], timeout: Any = None, source: Any = None) -> socket.socket:
                sock = socket.create_connection(address, timeout, source)  # what http.client uses
                watch.arm(sock)  # the TCP socket: a TLS handshake on it is cut too
                return sock

            self._create_connection = connect

    return Conn


class _Http(urllib.request.HTTPHandler):
    def __init__(self, watch: _Watch) -> None:
        super().__init__()
        self._watch = watch

    def http_open(self, req: urllib.request.Request) -> http.client.HTTPResponse:
        return self.do_open(_watched(http.client.HTTPConnection, self._watch), req)


class _Https(urllib.request.HTTPSHandler):
    def __init__(self, watch: _Watch) -> None:
        super().__init__()
        self._watch = watch

    def https_open(self, req: urllib.request.Request) -> http.client.HTTPResponse:
        return self.do_open(_watched(http.client.HTTPSConnection, self._watch), req,
                            context=self._context)  # type: ignore[attr-defined]


def exchange(req: urllib.request.Request | str, *, deadline_s: float, max_bytes: int,
             handlers: tuple[Any, ...] = ()) -> tuple[int, bytes]:
    """(status, body) of one request, all of it within ``deadline_s``.  Raises TimeoutError past the
    deadline, ValueError for a body over ``max_bytes``, and what urllib raises otherwise (HTTPError
    for a 4xx/5xx, URLError/OSError); http.client's own protocol errors come as OSError."""
    watch = _Watch(deadline_s)
    opener = urllib.request.build_opener(*handlers, _Http(watch), _Https(watch))
    watch.start()
    try:
        with opener.open(req, timeout=deadline_s) as resp:
            body = resp.read(max_bytes + 1)
            status = int(resp.status)
    except (OSError, http.client.HTTPException) as exc:
        if watch.expired:
            raise TimeoutError(f"no complete answer within {deadline_s:g} s") from None
        if isinstance(exc, OSError):
            raise
        raise OSError(f"bad HTTP answer: {type(exc).__name__}: {exc}") from None
    finally:
        watch.cancel()
    if watch.expired:
        raise TimeoutError(f"no complete answer within {deadline_s:g} s")
    if len(body) > max_bytes:
        raise ValueError(f"answer larger than {max_bytes} bytes")
    return status, body
