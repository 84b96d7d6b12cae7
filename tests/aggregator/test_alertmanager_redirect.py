"""An Alertmanager URL that answers a redirect (an http-to-https load balancer) loses nothing
silently: the POST is not followed (urllib would re-send it as a bodiless GET that the target
answers 200), it is counted as an error, logged with its Location, and the alerts stay queued.

A real local HTTP server answers 301, 302, 307 or 308 to POST and 200 to everything else."""

from __future__ import annotations

import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
from structlog.testing import capture_logs

from fabricmon import components
from fabricmon.aggregator.alertmanager import AlertmanagerClient
from fabricmon.aggregator.incidents import Finding, IncidentManager


class Redirector:
    """POST -> ``code`` with Location pointing at itself (/target); GET -> 200 (what a followed
    redirect would reach); POST /target -> 200 (the URL an operator should have configured)."""

    def __init__(self, code: int) -> None:
        self.requests: list[tuple[str, str]] = []
        outer = self

        class H(BaseHTTPRequestHandler):
            def log_message(self, *a):
                pass

            def _answer(self, status: int, location: str | None = None) -> None:
                self.send_response(status)
                if location:
                    self.send_header("Location", location)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def do_GET(self):
                outer.requests.append(("GET", self.path))
                self._answer(200)

            def do_POST(self):
                self.rfile.read(int(self.headers.get("Content-Length", 0)))
                outer.requests.append(("POST", self.path))
                if self.path == "/target":
                    self._answer(200)
                else:
                    self._answer(code, f"http://127.0.0.1:{self.server.server_address[1]}/target")

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), H)
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}/api/v2/alerts"

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.mark.parametrize("code", [301, 302, 303, 307, 308])
def test_a_redirected_post_is_an_error_and_the_alert_stays_queued(code):
    srv = Redirector(code)
    try:
        client = AlertmanagerClient([srv.url], timeout=3.0)
        mgr = IncidentManager(default_hold_s=1.0)
        f = Finding("FabricLinkDown", components.link("node-001", "mlx5_0"), {"node": "node-001"}, ["port DOWN"])
        client.submit(mgr.update([f], 1_764_000_000.0), 1_764_000_000.0)
        with capture_logs() as logs:
            client._once()
        assert client.sent_total["success"] == 0 and client.sent_total["error"] == 1, client.sent_total
        assert client.pending() == 1  # kept for the retry, not lost
        assert srv.requests == [("POST", "/api/v2/alerts")]  # never followed, as GET or as POST
        refused = [e for e in logs if e["event"] == "alertmanager_redirect_refused"]
        assert len(refused) == 1 and refused[0]["status"] == code and refused[0]["location"].endswith("/target")
    finally:
        srv.close()
