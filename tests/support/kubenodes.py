"""An in-process HTTPS Kubernetes API for Node objects: ``GET``/``PATCH /api/v1/nodes/NAME`` and
``PATCH .../status``, over real TLS with a bearer token, recording every request as it came.

What it applies is what the API server does with the two patch types the remediation sends (Kubernetes API
concepts, "Server-side patch" / kubectl patch docs): a JSON merge patch (RFC 7386: objects merge, a list or a
scalar replaces, null deletes) with an optimistic-concurrency check on ``metadata.resourceVersion`` (409
Conflict when it is not the current one), and a strategic merge patch on ``status.conditions`` (NodeStatus
.Conditions: ``patchStrategy:"merge" patchMergeKey:"type"`` in k8s.io/api core/v1/types.go).  Each change
bumps the resourceVersion.
"""

from __future__ import annotations

import copy
import json
import threading
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler
from pathlib import Path
from typing import Any

from support.certs import make_pki
from support.https_json import HttpsServer, send_json


@dataclass(frozen=True)
class Request:
    method: str
    path: str
    content_type: str
    body: Any


def merge_patch(target: Any, patch: Any) -> Any:
    """RFC 7386 section 2, MergePatch(Target, Patch)."""
    if not isinstance(patch, dict):
        return copy.deepcopy(patch)
    out = dict(target) if isinstance(target, dict) else {}
    for k, v in patch.items():
        if v is None:
            out.pop(k, None)
        else:
            out[k] = merge_patch(out.get(k), v)
    return out


class FakeNodeApi:
    def __init__(self, tmp: Path, token: str = "sa-token-remediation") -> None:
        tmp.mkdir(parents=True, exist_ok=True)
        pki = make_pki(tmp, {})
        self.ca = str(pki["ca"])
        self.token_file = tmp / "token"
        self.token_file.write_text(token + "\n")
        self.token = token
        self.nodes: dict[str, dict[str, Any]] = {}
        self.requests: list[Request] = []
        self.conflicts = 0  # answer the next N taint patches 409 (another writer got there first)
        self.lock = threading.Lock()
        server = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args) -> None:
                pass

            def _name(self) -> tuple[str | None, bool]:
                prefix = "/api/v1/nodes/"
                if not self.path.startswith(prefix):
                    return None, False
                rest = self.path[len(prefix):]
                status = rest.endswith("/status")
                return rest.removesuffix("/status"), status

            def _auth(self) -> bool:
                if self.headers.get("Authorization") != f"Bearer {server.token}":
                    self._send(401, {"kind": "Status", "code": 401, "reason": "Unauthorized"})
                    return False
                return True

            def do_GET(self) -> None:
                with server.lock:
                    server.requests.append(Request("GET", self.path, "", None))
                if not self._auth():
                    return
                name, _ = self._name()
                with server.lock:
                    node = copy.deepcopy(server.nodes.get(name or ""))
                if node is None:
                    return self._send(404, {"kind": "Status", "code": 404, "reason": "NotFound"})
                self._send(200, node)

            def do_PATCH(self) -> None:
                raw = self.rfile.read(int(self.headers.get("Content-Length", "0")))
                ctype = self.headers.get("Content-Type", "")
                try:
                    body = json.loads(raw)
                except ValueError:
                    return self._send(400, {"kind": "Status", "code": 400, "reason": "BadRequest"})
                with server.lock:
                    server.requests.append(Request("PATCH", self.path, ctype, body))
                if not self._auth():
                    return
                name, status = self._name()
                with server.lock:
                    node = server.nodes.get(name or "")
                    if node is None:
                        return self._send(404, {"kind": "Status", "code": 404, "reason": "NotFound"})
                    if status:
                        if ctype != "application/strategic-merge-patch+json":
                            return self._send(415, {"kind": "Status", "code": 415})
                        conds = {c["type"]: c for c in node.setdefault("status", {}).get("conditions", [])}
                        for c in body.get("status", {}).get("conditions", []):
                            conds[c["type"]] = {**conds.get(c["type"], {}), **c}
                        node["status"]["conditions"] = list(conds.values())
                    else:
                        if ctype != "application/merge-patch+json":
                            return self._send(415, {"kind": "Status", "code": 415})
                        rv = body.get("metadata", {}).get("resourceVersion")
                        if server.conflicts > 0 or (rv and rv != node["metadata"]["resourceVersion"]):
                            server.conflicts = max(0, server.conflicts - 1)
                            return self._send(409, {"kind": "Status", "code": 409, "reason": "Conflict"})
                        patch = copy.deepcopy(body)
                        patch.get("metadata", {}).pop("resourceVersion", None)
                        server.nodes[name or ""] = node = merge_patch(node, patch)
                    node["metadata"]["resourceVersion"] = str(int(node["metadata"]["resourceVersion"]) + 1)
                    out = copy.deepcopy(node)
                self._send(200, out)

            def _send(self, code: int, obj: dict) -> None:
                send_json(self, code, obj)

        self._server = HttpsServer(Handler, pki["server"], "fake-node-api")
        self.url = self._server.url

    def add_node(self, name: str, *, taints: list[dict] | None = None, unschedulable: bool = False) -> None:
        spec: dict[str, Any] = {}
        if taints:
            spec["taints"] = taints
        if unschedulable:
            spec["unschedulable"] = True
        with self.lock:
            self.nodes[name] = {"kind": "Node", "apiVersion": "v1",
                                "metadata": {"name": name, "resourceVersion": "100", "labels": {}},
                                "spec": spec, "status": {"conditions": [
                                    {"type": "Ready", "status": "True", "reason": "KubeletReady"}]}}

    def node(self, name: str) -> dict[str, Any]:
        with self.lock:
            return copy.deepcopy(self.nodes[name])

    def patches(self) -> list[Request]:
        with self.lock:
            return [r for r in self.requests if r.method == "PATCH"]

    def close(self) -> None:
        self._server.close()
