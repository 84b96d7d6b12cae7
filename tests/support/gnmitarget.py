"""An in-process gNMI target served by grpcio on 127.0.0.1: answers Subscribe (STREAM, SAMPLE) with the
notifications of a fixture (tests/fixtures/gnmi/README.md) every sample interval, and scripts what
switches do: counter ramps and resets (``set``), disconnects, malformed updates, a stalled stream and
oversized messages.  TLS and username/password metadata when asked."""

from __future__ import annotations

import copy
import json
import threading
import time
from concurrent import futures
from pathlib import Path
from typing import Any

import grpc

from fabricmon.proto import gnmi_pb2, gnmi_pb2_grpc
from fabricmon.sources.gnmi_switches.decode import parse_path

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "gnmi"


def load_fixture(profile: str) -> list[dict[str, Any]]:
    return json.loads((FIXTURES / f"{profile}.json").read_text())["notifications"]


def _typed(value: Any) -> gnmi_pb2.TypedValue:
    if isinstance(value, bool):
        return gnmi_pb2.TypedValue(bool_val=value)
    if isinstance(value, int):
        return gnmi_pb2.TypedValue(uint_val=value)
    if isinstance(value, float):
        return gnmi_pb2.TypedValue(double_val=value)
    if isinstance(value, str):
        return gnmi_pb2.TypedValue(string_val=value)
    return gnmi_pb2.TypedValue(json_ietf_val=json.dumps(value).encode())


class ScriptedTarget(gnmi_pb2_grpc.gNMIServicer):
    """``mode``: ``normal``; ``stall`` (after the first sample and sync, nothing more: the handler blocks
    until the target stops); ``oversize`` (a 10 MB update after sync); ``garbage`` (malformed updates
    along with the real ones); ``disconnect_after`` N samples ends each stream (the switch restarts)."""

    def __init__(self, profile: str, *, credentials: tuple[str, str] | None = None) -> None:
        self.notifications = load_fixture(profile)
        self.lock = threading.Lock()
        self.mode = "normal"
        self.disconnect_after: int | None = None
        self.credentials = credentials
        self.subscribes: list[gnmi_pb2.SubscribeRequest] = []
        self.metadata: list[dict[str, str]] = []
        self.samples_sent = 0
        self.streams_opened = 0
        self.closing = threading.Event()

    # ---------------------------------------------------------------- scripting
    def set(self, prefix: str, path: str, value: Any, field: str | None = None, *, target: str = "") -> None:
        """Set the value at ``prefix`` + ``path`` (``field``: one member of its JSON object, or of one row
        of it: ``"Ethernet0:3/SAI_QUEUE_STAT_DROPPED_PACKETS"``)."""
        with self.lock:
            for n in self.notifications:
                if n["target"] == target and n["prefix"] == prefix and path in n["updates"]:
                    if field is None:
                        n["updates"][path] = value
                        return
                    obj = n["updates"][path]
                    *parents, last = field.split("/")
                    for p in parents:
                        obj = obj[p]
                    obj[last] = value
                    return
        raise KeyError((target, prefix, path, field))

    def _notifications(self, target: str) -> list[gnmi_pb2.Notification]:
        now = time.time_ns()
        with self.lock:
            chosen = copy.deepcopy([n for n in self.notifications if n["target"] == target])
        out = []
        for n in chosen:
            note = gnmi_pb2.Notification(timestamp=now, prefix=parse_path(n["prefix"], target=target))
            for path, value in n["updates"].items():
                note.update.add(path=parse_path(path), val=_typed(value))
            out.append(note)
        if self.mode == "garbage":
            bad = gnmi_pb2.Notification(timestamp=now, prefix=gnmi_pb2.Path(target=target))
            bad.update.add(path=parse_path("COUNTERS/Ethernet0" if target else
                                           "/interfaces/interface[name=Ethernet1/1]/state/counters"),
                           val=gnmi_pb2.TypedValue(json_ietf_val=b"{not json"))
            bad.update.add(path=parse_path("/interfaces/interface[name=Ethernet1/1]/state/counters/in-errors"
                                           if not target else "COUNTERS/Ethernet0/SAI_PORT_STAT_IF_IN_ERRORS"),
                           val=gnmi_pb2.TypedValue(string_val="-12 errors"))
            out.append(bad)
        return out

    # ---------------------------------------------------------------- the RPC
    def Subscribe(self, request_iterator, context):  # noqa: N802 (the gNMI method name)
        md = dict(context.invocation_metadata())
        req = next(request_iterator)
        with self.lock:
            self.subscribes.append(req)
            self.metadata.append(md)
            self.streams_opened += 1
        if self.credentials is not None and (md.get("username"), md.get("password")) != self.credentials:
            context.abort(grpc.StatusCode.UNAUTHENTICATED, "bad username or password")
        sl = req.subscribe
        target = sl.prefix.target
        interval = max(0.05, min(s.sample_interval for s in sl.subscription) / 1e9)
        sent = 0
        first = True
        while context.is_active() and not self.closing.is_set():
            for note in self._notifications(target):
                yield gnmi_pb2.SubscribeResponse(update=note)
            if first:
                yield gnmi_pb2.SubscribeResponse(sync_response=True)
                first = False
            sent += 1
            with self.lock:
                self.samples_sent += 1
            if self.mode == "oversize":
                huge = gnmi_pb2.Notification(prefix=gnmi_pb2.Path(target=target))
                huge.update.add(path=parse_path("/interfaces/interface[name=Ethernet1/1]/state/description"),
                                val=gnmi_pb2.TypedValue(string_val="x" * (10 * 1024 * 1024)))
                yield gnmi_pb2.SubscribeResponse(update=huge)
            if self.mode == "stall":
                self.closing.wait()  # a switch whose telemetry process hangs: the TCP connection stays up
                return
            if self.disconnect_after is not None and sent >= self.disconnect_after:
                return
            self.closing.wait(interval)


class TargetServer:
    """A grpcio server for one ScriptedTarget on a free loopback port (TLS with ``tls=(key, cert)``)."""

    def __init__(self, target: ScriptedTarget, tls: tuple[str, str] | None = None) -> None:
        self.target = target
        self.server = grpc.server(futures.ThreadPoolExecutor(max_workers=8),
                                  options=[("grpc.max_send_message_length", 64 * 1024 * 1024)])
        gnmi_pb2_grpc.add_gNMIServicer_to_server(target, self.server)
        if tls is None:
            self.port = self.server.add_insecure_port("127.0.0.1:0")
        else:
            key, cert = (Path(p).read_bytes() for p in tls)
            creds = grpc.ssl_server_credentials([(key, cert)])
            self.port = self.server.add_secure_port("127.0.0.1:0", creds)
        self.address = f"127.0.0.1:{self.port}"
        self.server.start()

    def stop(self) -> None:
        self.target.closing.set()
        self.server.stop(grace=None).wait(5)
