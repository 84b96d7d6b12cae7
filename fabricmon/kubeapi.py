"""One GET against the Kubernetes API server with a pod's service account (the in-cluster credentials).

The token is re-read on every call (projected tokens are rotated by the kubelet), TLS is verified
against the cluster CA, and no proxy is used (client-go's in-cluster config neither).  Every failure is a
``KubeApiError`` whose ``reason`` is a fixed word for a metric label and whose text says what to fix.
"""

from __future__ import annotations

import json
import os
import ssl
import urllib.error
import urllib.request
from collections.abc import Mapping
from pathlib import Path

MAX_BODY = 4 << 20  # one object is tens of KiB; more is not an API server answering


class KubeApiError(Exception):
    """``reason``: ``api`` (no answer, an HTTP error, no credentials) or ``answer`` (not the object asked for)."""

    def __init__(self, reason: str, message: str, status: int = 0) -> None:
        super().__init__(message)
        self.reason = reason
        self.status = status


def in_cluster_api_server(env: Mapping[str, str] = os.environ) -> str:
    """The API server a pod reaches (the kubelet sets these in every container); "" outside a pod."""
    host, port = env.get("KUBERNETES_SERVICE_HOST", ""), env.get("KUBERNETES_SERVICE_PORT", "443")
    if not host:
        return ""
    return f"https://[{host}]:{port}" if ":" in host else f"https://{host}:{port}"


def get_json(url: str, token_file: str, ca_file: str, timeout: float) -> object:
    """The decoded JSON body of ``GET url``; raises KubeApiError."""
    try:
        token = Path(token_file).read_text().strip()
    except OSError as exc:
        raise KubeApiError("api", f"cannot read service-account token {token_file}: {exc.strerror or exc}") from None
    if not token:
        raise KubeApiError("api", f"service-account token {token_file} is empty")
    try:
        ctx = ssl.create_default_context(cafile=ca_file)
    except (OSError, ssl.SSLError) as exc:
        raise KubeApiError("api", f"cannot load CA {ca_file}: {exc}") from None
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}), urllib.request.HTTPSHandler(context=ctx))
    req = urllib.request.Request(url, headers={"Authorization": f"Bearer {token}", "Accept": "application/json"})
    try:
        with opener.open(req, timeout=timeout) as resp:
            body = resp.read(MAX_BODY + 1)
    except urllib.error.HTTPError as exc:
        raise KubeApiError("api", f"GET {url}: HTTP {exc.code} {exc.reason}", exc.code) from None
    except urllib.error.URLError as exc:
        raise KubeApiError("api", f"GET {url}: cannot reach the API server: {exc.reason}") from None
    except (TimeoutError, OSError) as exc:  # a read timeout is not wrapped in URLError
        raise KubeApiError("api", f"GET {url}: {type(exc).__name__}: {exc or 'timed out'}") from None
    if len(body) > MAX_BODY:
        raise KubeApiError("answer", f"GET {url}: answer larger than {MAX_BODY} bytes")
    try:
        return json.loads(body)
    except ValueError:
        raise KubeApiError("answer", f"GET {url}: the answer is not JSON") from None
