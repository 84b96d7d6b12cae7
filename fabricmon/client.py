"""Report per-rank step timings to the local fabricmon agent (standard library only).

    from fabricmon.client import report_step
    report_step("llm-7b", rank=17, step=1200, step_seconds=1.82, comm_seconds=0.41)

One JSON line goes to the agent's Unix socket (``/run/fabricmon/ranks.sock``,
or ``$FABRICMON_RANKS_SOCKET``), falling back to ``POST /v1/ranks`` on
``http://127.0.0.1:9723`` (or ``$FABRICMON_RANKS_HTTP``; an empty value turns
the fallback off).  Both use a short timeout, and nothing here ever raises into
the training loop: the result is True when the line was handed over, else False.
"""

from __future__ import annotations

import http.client as _httpclient
import json
import math
import os
import socket
import time
import urllib.parse

DEFAULT_SOCKET = "/run/fabricmon/ranks.sock"
DEFAULT_HTTP = "http://127.0.0.1:9723/v1/ranks"
DEFAULT_TIMEOUT = 0.1
_UNSET = object()


def _env_int(name: str) -> int | None:
    try:
        return int(os.environ[name])
    except (KeyError, ValueError):
        return None


def send_line(line: str, *, socket_path=_UNSET, http=_UNSET, timeout: float = DEFAULT_TIMEOUT) -> bool:
    """Send one JSON line to the agent; never raises."""
    try:
        if socket_path is _UNSET:
            socket_path = os.environ.get("FABRICMON_RANKS_SOCKET", DEFAULT_SOCKET)
        if http is _UNSET:
            http = os.environ.get("FABRICMON_RANKS_HTTP", DEFAULT_HTTP)
        data = (line.rstrip("\n") + "\n").encode()
        if socket_path:
            try:
                with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
                    s.settimeout(timeout)
                    s.connect(socket_path)
                    s.sendall(data)
                return True
            except OSError:
                pass
        if http:
            u = urllib.parse.urlsplit(http if "://" in http else f"http://{http}")
            conn = _httpclient.HTTPConnection(u.hostname or "127.0.0.1", u.port or 80, timeout=timeout)
            try:
                conn.request("POST", u.path or "/v1/ranks", body=data,
                             headers={"Content-Type": "application/x-ndjson"})
                resp = conn.getresponse()
                resp.read()
                return resp.status == 200
            finally:
                conn.close()
    except Exception:
        return False
    return False


def report_step(
    job: str,
    rank: int,
    step: int,
    step_seconds: float,
    comm_seconds: float = 0.0,
    local_rank: int | None = None,
    gpu: int | None = None,
    group: dict[str, int] | None = None,
    socket_path=_UNSET,
    http=_UNSET,
    *,
    timeout: float = DEFAULT_TIMEOUT,
    ts: float | None = None,
) -> bool:
    """Report one training step of one rank.  ``local_rank`` defaults to ``$LOCAL_RANK``
    (else 0); ``gpu`` defaults, on the agent, to ``local_rank``."""
    try:
        if local_rank is None:
            local_rank = _env_int("LOCAL_RANK") or 0
        obj = {"job": str(job), "rank": int(rank), "local_rank": int(local_rank), "step": int(step),
               "step_seconds": float(step_seconds), "comm_seconds": float(comm_seconds),
               "ts": time.time() if ts is None else float(ts)}
        if not (math.isfinite(obj["step_seconds"]) and math.isfinite(obj["comm_seconds"])):
            return False
        if gpu is not None:
            obj["gpu"] = int(gpu)
        if group:
            obj["group"] = {str(k): int(v) for k, v in group.items()}
        return send_line(json.dumps(obj, separators=(",", ":")), socket_path=socket_path, http=http, timeout=timeout)
    except Exception:
        return False


def report_layout(job: str, layout: dict[str, int], socket_path=_UNSET, http=_UNSET, *,
                  timeout: float = DEFAULT_TIMEOUT) -> bool:
    """Describe a job's parallel layout once, e.g. ``{"tp": 8, "pp": 4, "dp": 64}``."""
    try:
        line = json.dumps({"job": str(job), "layout": {str(k): int(v) for k, v in layout.items()}},
                          separators=(",", ":"))
        return send_line(line, socket_path=socket_path, http=http, timeout=timeout)
    except Exception:
        return False
