"""An Alertmanager that misbehaves on purpose, on 127.0.0.1 (a real one cannot be made to): its GET of
/api/v2/alerts answers as ``mode`` says: ``empty`` ([]), ``null``, ``list_label`` (a label whose value is
a list), or ``drip`` (200, then one byte every 0.3 s, at most 200 of them).  POSTs are recorded and
answered 200, or dripped too when ``drip_posts``."""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


class FakeAlertmanager:
    def __init__(self, mode: str = "empty", *, drip_posts: bool = False, list_label_component: str = "x") -> None:
        self.mode = mode
        self.posted: list[dict] = []
        self.gets = 0
        self.stop = threading.Event()
        am = self
        answers = {"empty": b"[]", "null": b"null",
                   "list_label": json.dumps([{"labels": {"alertname": ["FabricLinkDown"],
                                                         "component": list_label_component}}]).encode()}

        class H(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
                am.posted.extend(json.loads(body))
                self._drip() if drip_posts else self._answer(b"")

            def do_GET(self) -> None:
                am.gets += 1
                self._drip() if am.mode == "drip" else self._answer(answers[am.mode])

            def _drip(self) -> None:
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", "200")
                self.end_headers()
                for _ in range(200):  # bounded: 60 s at most
                    if am.stop.wait(0.3):
                        return
                    try:
                        self.wfile.write(b" ")
                        self.wfile.flush()
                    except OSError:
                        return

            def _answer(self, body: bytes) -> None:
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *a: object) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), H)
        self.server.daemon_threads = True
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"

    def close(self) -> None:
        self.stop.set()
        self.server.shutdown()
        self.server.server_close()
