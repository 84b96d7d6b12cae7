"""A small threaded HTTP server with GET routes, shared by the agent and the aggregator."""

from __future__ import annotations

import threading
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, urlparse

TEXT = "text/plain; charset=utf-8"

# A route takes the parsed query string and returns (status, body, content type).
Route = Callable[[dict[str, list[str]]], tuple[int, bytes, str]]


def probe(ok: Callable[[], bool], good: bytes, bad: bytes) -> Route:
    """A health or readiness route: 200 with ``good`` when ``ok()``, else 503 with ``bad``."""
    return lambda q: (200, good, TEXT) if ok() else (503, bad, TEXT)


class RoutedHTTPServer:
    def __init__(self, host: str, port: int, routes: dict[str, Route], name: str = "http") -> None:
        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def do_GET(self) -> None:  # noqa: N802 (http.server API)
                u = urlparse(self.path)
                route = routes.get(u.path)
                if route is None:
                    self._send(404, b"not found\n", TEXT)
                    return
                self._send(*route(parse_qs(u.query)))

            def _send(self, code: int, body: bytes, ctype: str) -> None:
                self.send_response(code)
                self.send_header("Content-Type", ctype)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args) -> None:
                pass  # scrapes every second would flood the log; structlog is the log

        self._server = ThreadingHTTPServer((host, port), Handler)
        self._server.daemon_threads = True
        self._thread = threading.Thread(target=self._server.serve_forever, name=name, daemon=True)

    @property
    def port(self) -> int:
        return self._server.server_address[1]

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(timeout=5)
