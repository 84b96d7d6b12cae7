"""Read one label of this node's Kubernetes Node object from the API server.

``GET /api/v1/nodes/NAME`` with the pod's service-account token (re-read on every call:
projected tokens are rotated by the kubelet) over TLS verified against the cluster CA.  The
agent's ClusterRole needs ``get`` on ``nodes``.  Every failure is a ``NodeLabelError`` whose
text says what to fix; the caller retries (an API server restart must not stop the agent).
"""

from __future__ import annotations

import json
import os
import ssl
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Mapping
from pathlib import Path

MAX_BODY = 4 << 20  # a Node object is tens of KiB; more is not an API server answering


class NodeLabelError(Exception):
    """Why the label could not be read; ``str()`` is one line for logs and /readyz."""


def in_cluster_api_server(env: Mapping[str, str] = os.environ) -> str:
    """The API server a pod reaches (the kubelet sets these in every container)."""
    host, port = env.get("KUBERNETES_SERVICE_HOST", ""), env.get("KUBERNETES_SERVICE_PORT", "443")
    if not host:
        raise NodeLabelError("not in a Kubernetes pod (KUBERNETES_SERVICE_HOST unset) and shard.node_label."
                             "api_server not given")
    return f"https://[{host}]:{port}" if ":" in host else f"https://{host}:{port}"


def _request(url: str, token: str, ca_file: str, timeout: float) -> bytes:
    try:
        ctx = ssl.create_default_context(cafile=ca_file)
    except (OSError, ssl.SSLError) as exc:
        raise NodeLabelError(f"cannot load CA {ca_file}: {exc}") from None
    # No proxy: the API server is reached directly, as client-go does for in-cluster config.
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}), urllib.request.HTTPSHandler(context=ctx))
    req = urllib.request.Request(url, headers={"Authorization": f"Bearer {token}", "Accept": "application/json"})
    with opener.open(req, timeout=timeout) as resp:
        body = resp.read(MAX_BODY + 1)
    if len(body) > MAX_BODY:
        raise NodeLabelError(f"{url}: answer larger than {MAX_BODY} bytes")
    return body


def read_node_label(api_server: str, node: str, key: str, token_file: str, ca_file: str,
                    timeout: float = 5.0) -> str:
    """The value of label ``key`` on Node ``node``; raises NodeLabelError."""
    try:
        token = Path(token_file).read_text().strip()
    except OSError as exc:
        raise NodeLabelError(f"cannot read service-account token {token_file}: {exc.strerror or exc}") from None
    if not token:
        raise NodeLabelError(f"service-account token {token_file} is empty")
    url = f"{api_server.rstrip('/')}/api/v1/nodes/{urllib.parse.quote(node, safe='')}"
    try:
        body = _request(url, token, ca_file, timeout)
    except urllib.error.HTTPError as exc:
        if exc.code == 404:
            raise NodeLabelError(f"GET {url}: 404: no Node named {node!r} (is --node-name the "
                                 f"Kubernetes node name, spec.nodeName?)") from None
        if exc.code in (401, 403):
            raise NodeLabelError(f"GET {url}: {exc.code} {exc.reason}: the agent's service account needs "
                                 f"get on nodes (ClusterRole fabricmon-agent-node-reader)") from None
        raise NodeLabelError(f"GET {url}: HTTP {exc.code} {exc.reason}") from None
    except urllib.error.URLError as exc:
        raise NodeLabelError(f"GET {url}: cannot reach the API server: {exc.reason}") from None
    except (TimeoutError, OSError) as exc:  # a read timeout is not wrapped in URLError
        raise NodeLabelError(f"GET {url}: {type(exc).__name__}: {exc or 'timed out'}") from None
    try:
        obj = json.loads(body)
        labels = obj["metadata"].get("labels") or {}
    except (ValueError, KeyError, TypeError, AttributeError):
        raise NodeLabelError(f"GET {url}: the answer is not a Node object") from None
    value = labels.get(key) if isinstance(labels, dict) else None
    if not isinstance(value, str):
        raise NodeLabelError(f"Node {node!r} has no label {key} (kubectl label node {node} {key}=UNIT)")
    return value
