"""A throwaway Alertmanager on 127.0.0.1 with a webhook receiver, for the demo.

Started only when the Debian binary is installed; the demo works without it
(it then shows the aggregator's incidents only).
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import tempfile
import threading
import time
import urllib.request
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import yaml

BINARIES = ("prometheus-alertmanager", "alertmanager")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class WebhookReceiver:
    """Collects Alertmanager webhook notifications (wall time of arrival, payload)."""

    def __init__(self) -> None:
        self.notifications: list[tuple[float, dict]] = []
        self._lock = threading.Lock()
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length", "0") or 0))
                try:
                    payload = json.loads(body or b"{}")
                except ValueError:
                    payload = {}
                with receiver._lock:
                    receiver.notifications.append((time.time(), payload))
                self.send_response(200)
                self.end_headers()

            def log_message(self, *args) -> None:
                pass

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True, name="webhook")

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self._server.server_address[1]}/hook"

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()

    def alerts(self) -> list[tuple[float, str, dict]]:
        """(arrival, status, alert) for every alert in every notification."""
        with self._lock:
            return [(t, a.get("status", ""), a) for t, p in self.notifications for a in p.get("alerts", [])]


class LocalAlertmanager:
    def __init__(self, webhook_url: str) -> None:
        binary = next((b for b in (shutil.which(n) for n in BINARIES) if b), None)
        if binary is None:
            raise FileNotFoundError("no Alertmanager binary (Debian package prometheus-alertmanager)")
        self.workdir = tempfile.mkdtemp(prefix="fabricmon-demo-am-")
        self.port = _free_port()
        cfg = {
            "route": {"receiver": "webhook", "group_by": ["alertname", "component"], "group_wait": "0s",
                      "group_interval": "1s", "repeat_interval": "1h"},
            "receivers": [{"name": "webhook", "webhook_configs": [{"url": webhook_url, "send_resolved": True}]}],
        }
        path = os.path.join(self.workdir, "alertmanager.yml")
        with open(path, "w") as fh:
            yaml.safe_dump(cfg, fh)
        self._log = open(os.path.join(self.workdir, "alertmanager.log"), "wb")
        self.proc = subprocess.Popen(
            [binary, f"--config.file={path}", f"--storage.path={self.workdir}/data",
             f"--web.listen-address=127.0.0.1:{self.port}", "--cluster.listen-address="],
            stdout=self._log, stderr=subprocess.STDOUT)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def wait_ready(self, deadline_s: float = 15.0) -> None:
        end = time.monotonic() + deadline_s
        while time.monotonic() < end:
            if self.proc.poll() is not None:
                raise RuntimeError(f"alertmanager exited with {self.proc.returncode}")
            try:
                with urllib.request.urlopen(f"{self.url}/-/ready", timeout=1) as r:
                    if r.status == 200:
                        return
            except OSError:
                time.sleep(0.1)
        raise TimeoutError("alertmanager not ready")

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(5)
        except subprocess.TimeoutExpired:
            self.proc.kill()
        self._log.close()
        shutil.rmtree(self.workdir, ignore_errors=True)
