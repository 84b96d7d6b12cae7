"""A webhook receiver and a real Alertmanager started for it."""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import yaml

from fabricmon import components
from fabricmon.aggregator.incidents import Finding, IncidentManager
from support.promtools import ALERTMANAGER, Alertmanager, _start, free_port, require_binary


class Webhook:
    def __init__(self) -> None:
        self.received: list[dict] = []
        self.lock = threading.Lock()
        hook = self

        class H(BaseHTTPRequestHandler):
            def log_message(self, *a):
                pass

            def do_POST(self):
                body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
                with hook.lock:
                    hook.received.append(json.loads(body))
                self.send_response(200)
                self.send_header("Content-Length", "0")
                self.end_headers()

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), H)
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}/hook"

    def alerts(self, status: str | None = None) -> list[dict]:
        with self.lock:
            out = [a for n in self.received for a in n["alerts"]]
        return [a for a in out if status is None or a["status"] == status]

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def _am_config(hook_url: str) -> dict:
    return {
        "route": {"receiver": "hook", "group_by": ["alertname", "component"], "group_wait": "0s",
                  "group_interval": "1s", "repeat_interval": "1h"},
        "receivers": [{"name": "hook", "webhook_configs": [{"url": hook_url, "send_resolved": True}]}],
    }


def _start_am(tmp_path, hook_url: str, port: int | None = None, host: str = "127.0.0.1") -> Alertmanager:
    binary = require_binary(ALERTMANAGER)
    tmp_path.mkdir(parents=True, exist_ok=True)
    cfg = tmp_path / "alertmanager.yml"
    cfg.write_text(yaml.safe_dump(_am_config(hook_url)))
    (tmp_path / "data").mkdir(exist_ok=True)
    port = port or free_port()
    argv = [binary, f"--config.file={cfg}", f"--storage.path={tmp_path / 'data'}",
            f"--web.listen-address={host}:{port}", "--cluster.listen-address=", "--log.level=warn"]
    svc = _start("alertmanager", argv, port, tmp_path, "/-/ready", 20.0, host=host)
    return Alertmanager(svc.name, svc.proc, svc.port, svc.workdir, svc.log_path, host=host)


def _incident(mgr: IncidentManager, now: float, *, fire=True):
    f = Finding("FabricLinkErrors", components.link("node-003", "mlx5_3", 1),
                {"node": "node-003", "rail": "3", "leaf": "leaf-u0-r3", "cluster": "test"},
                ["PMA symbol/rcv errors +1234 in 3s"], fire=fire, keep=fire, ranks=(27,), jobs=("llm",))
    return mgr.update([f], now)
