"""A loopback HTTPS server standing in for the Kubernetes API server's ``GET /api/v1/nodes/NAME`` and
``GET /api/v1/namespaces/NS/pods/NAME`` (a Pod object as the test sets it: tests/fixtures/kubernetes/).

This machine has no cluster: the agent's node-label lookup talks to this instead, over real TLS
(a test CA from tests/support/certs.py) with a bearer token.  Each test sets what it answers: a Node
object with labels, an HTTP error, or nothing at all (a hang, for timeouts).
"""

from __future__ import annotations

import threading
from http.server import BaseHTTPRequestHandler
from pathlib import Path

from support.certs import make_pki
from support.https_json import HttpsServer, send_json


class FakeApiServer:
    def __init__(self, tmp: Path, token: str = "sa-token-1") -> None:
        tmp.mkdir(parents=True, exist_ok=True)
        pki = make_pki(tmp, {})
        self.ca = pki["ca"]
        self.token_file = tmp / "token"
        self.token_file.write_text(token + "\n")
        self.token = token
        self.nodes: dict[str, dict[str, str]] = {}  # node -> labels
        self.pods: dict[tuple[str, str], dict] = {}  # (namespace, name) -> the Pod object to answer
        self.status: int | None = None  # answer every request with this status instead
        self.hang = threading.Event()  # set: requests wait (bounded) for release
        self.release = threading.Event()
        self.requests: list[tuple[str, str | None]] = []  # (path, Authorization header)
        self.lock = threading.Lock()
        server = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args) -> None:  # keep test output quiet
                pass

            def do_GET(self) -> None:
                with server.lock:
                    server.requests.append((self.path, self.headers.get("Authorization")))
                if server.hang.is_set():
                    server.release.wait(10.0)
                    return
                if self.headers.get("Authorization") != f"Bearer {server.token}":
                    return self._send(401, {"kind": "Status", "code": 401, "reason": "Unauthorized"})
                if server.status is not None:
                    return self._send(server.status, {"kind": "Status", "code": server.status})
                parts = self.path.split("/")
                if len(parts) == 7 and parts[:4] == ["", "api", "v1", "namespaces"] and parts[5] == "pods":
                    obj = server.pods.get((parts[4], parts[6]))
                    if obj is None:
                        return self._send(404, {"kind": "Status", "code": 404, "reason": "NotFound"})
                    return self._send(200, obj)
                prefix = "/api/v1/nodes/"
                name = self.path[len(prefix):] if self.path.startswith(prefix) else None
                if name not in server.nodes:
                    return self._send(404, {"kind": "Status", "code": 404, "reason": "NotFound"})
                self._send(200, {"kind": "Node", "apiVersion": "v1",
                                 "metadata": {"name": name, "labels": server.nodes[name]}})

            def _send(self, code: int, obj: dict) -> None:
                send_json(self, code, obj)

        self._server = HttpsServer(Handler, pki["server"], "fake-apiserver")
        self.url = self._server.url

    def paths(self) -> list[str]:
        with self.lock:
            return [p for p, _ in self.requests]

    def close(self) -> None:
        self.release.set()
        self._server.close()
