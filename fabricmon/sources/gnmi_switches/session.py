"""One switch's gNMI connection: a channel (TLS unless ``insecure``), one Subscribe call per profile
group on it (STREAM, SAMPLE every ``interval``), each message under a stall deadline, a bound on the
message size, and reconnects with jittered exponential backoff.

Every session ends with a reason that is counted: ``unreachable`` (the channel never became ready, or the
transport failed), ``auth`` (the switch refused the credentials), ``credentials`` (a file we could not
read), ``stalled`` (no message for ``stall_intervals`` intervals), ``oversize`` (a message over
``max_message_bytes``), ``ended`` (the switch closed the stream) or ``error``.  Runs on the runner's
event loop; nothing here blocks it."""

from __future__ import annotations

import asyncio
import random
from collections.abc import Callable
from pathlib import Path

import grpc
import grpc.aio
import structlog

from ...config import GnmiSwitchesConfig, GnmiTargetConfig
from ...proto import gnmi_pb2, gnmi_pb2_grpc
from .decode import decode, parse_path
from .profiles import PROFILE_GROUPS, Group
from .store import SwitchStore

log = structlog.get_logger("fabricmon.gnmi")

_CODE_REASON = {
    grpc.StatusCode.UNAUTHENTICATED: "auth",
    grpc.StatusCode.PERMISSION_DENIED: "auth",
    grpc.StatusCode.RESOURCE_EXHAUSTED: "oversize",
    grpc.StatusCode.UNAVAILABLE: "unreachable",
    grpc.StatusCode.DEADLINE_EXCEEDED: "stalled",
}


class SessionEnded(Exception):
    def __init__(self, reason: str, detail: str) -> None:
        super().__init__(f"{reason}: {detail}")
        self.reason = reason
        self.detail = detail


def subscribe_request(group: Group, interval_s: float) -> gnmi_pb2.SubscribeRequest:
    sl = gnmi_pb2.SubscriptionList(prefix=gnmi_pb2.Path(origin=group.origin, target=group.target),
                                   mode=gnmi_pb2.SubscriptionList.STREAM, encoding=gnmi_pb2.JSON_IETF)
    for p in group.paths:
        sl.subscription.add(path=parse_path(p), mode=gnmi_pb2.SAMPLE, sample_interval=int(interval_s * 1e9))
    return gnmi_pb2.SubscribeRequest(subscribe=sl)


def backoff_delay(failures: int, lo: float, hi: float, rnd: Callable[[], float] = random.random) -> float:
    """Exponential in consecutive failures, jittered to [50%, 100%] so switches do not reconnect in step."""
    return min(hi, lo * (2 ** min(failures, 30))) * (0.5 + 0.5 * rnd())


def _read(path: str | None) -> bytes | None:
    return Path(path).read_bytes() if path else None


class Session:
    def __init__(self, target: GnmiTargetConfig, cfg: GnmiSwitchesConfig, store: SwitchStore,
                 clock: Callable[[], float]) -> None:
        self.target = target
        self.cfg = cfg
        self.store = store
        self._clock = clock
        self._files: tuple[bytes | None, ...] | None = None  # the credential files' contents last connect used
        self._current: asyncio.Task[bool] | None = None
        self._rekey = False
        self._delivered = False  # the session in progress had a message: its end resets the backoff
        self._logged = 0  # refused-update lines logged this session (a garbage-sending switch: a few, not all)
        self.sessions = 0

    # ---------------------------------------------------------------- credentials
    def _credentials(self) -> tuple[grpc.ChannelCredentials | None, list[tuple[str, str]]]:
        t = self.target
        try:
            ca, user, password = _read(t.tls_ca), _read(t.username_file), _read(t.password_file)
        except OSError as exc:
            raise SessionEnded("credentials", f"cannot read {exc.filename}: {exc.strerror or exc}") from None
        self._files = (ca, user, password)
        md: list[tuple[str, str]] = []
        if user is not None and password is not None:
            try:  # the gNMI specification's username/password metadata (section 3.1)
                md = [("username", user.decode().strip()), ("password", password.decode().strip("\r\n"))]
            except UnicodeDecodeError:
                raise SessionEnded("credentials", "username or password file is not UTF-8") from None
        creds = None if t.insecure else grpc.ssl_channel_credentials(root_certificates=ca)
        return creds, md

    def credentials_changed(self) -> bool:
        """Whether the credential files now differ from what the running session connected with (SIGHUP)."""
        t = self.target
        try:
            now = (_read(t.tls_ca), _read(t.username_file), _read(t.password_file))
        except OSError:
            return True  # the next connect says why
        return self._files is not None and now != self._files

    def reconnect(self) -> None:
        """End the running session now (new credentials): it reconnects at once, not counted as a failure."""
        if self._current is not None and not self._current.done():
            self._rekey = True
            self._current.cancel()

    # ---------------------------------------------------------------- the loop
    async def run(self, stop: asyncio.Event) -> None:
        failures = 0
        while not stop.is_set():
            self._current = asyncio.ensure_future(self._session())
            stopper = asyncio.ensure_future(stop.wait())
            await asyncio.wait({self._current, stopper}, return_when=asyncio.FIRST_COMPLETED)
            stopper.cancel()
            if stop.is_set():
                self._current.cancel()
                await asyncio.gather(self._current, return_exceptions=True)
                return
            delivered = self._delivered
            try:
                delivered = self._current.result()
                self.store.lost("ended", "the switch closed the stream")
            except asyncio.CancelledError:
                if not self._rekey:
                    raise
                self._rekey = False
                self.store.lost(None, None)
                failures = 0
                continue
            except SessionEnded as exc:
                delivered = self._delivered
                self.store.lost(exc.reason, exc.detail)
                log.warning("gnmi_session_ended", switch=self.target.name, reason=exc.reason, detail=exc.detail)
            except Exception as exc:  # a fault of ours must cost this switch's session, never the other switches
                delivered = False
                self.store.lost("error", repr(exc)[:200])
                log.error("gnmi_session_failed", switch=self.target.name, error=repr(exc))
            failures = 0 if delivered else failures + 1
            delay = backoff_delay(failures, self.cfg.backoff_min, self.cfg.backoff_max)
            try:
                await asyncio.wait_for(stop.wait(), delay)
            except asyncio.TimeoutError:
                pass

    async def _session(self) -> bool:
        t, cfg = self.target, self.cfg
        self._delivered = False
        self._logged = 0
        creds, md = self._credentials()
        options: list[tuple[str, int | str]] = [("grpc.max_receive_message_length", cfg.max_message_bytes),
                   ("grpc.keepalive_time_ms", 30_000), ("grpc.enable_retries", 0)]
        if t.tls_server_name:
            options.append(("grpc.ssl_target_name_override", t.tls_server_name))
        channel = (grpc.aio.insecure_channel(t.address, options=options) if creds is None
                   else grpc.aio.secure_channel(t.address, creds, options=options))
        calls: list[grpc.aio.StreamStreamCall] = []
        try:
            try:
                await asyncio.wait_for(channel.channel_ready(), cfg.connect_timeout)
            except asyncio.TimeoutError:
                raise SessionEnded("unreachable", f"{t.address}: no connection within {cfg.connect_timeout:g} s") \
                    from None
            self.sessions += 1
            stub = gnmi_pb2_grpc.gNMIStub(channel)
            groups = PROFILE_GROUPS[t.profile]
            readers = []
            for g in groups:
                call = stub.Subscribe(metadata=md or None)
                calls.append(call)
                readers.append(asyncio.ensure_future(self._stream(call, g)))
            done, pending = await asyncio.wait(readers, return_when=asyncio.FIRST_EXCEPTION)
            for task in pending:
                task.cancel()
            await asyncio.gather(*pending, return_exceptions=True)
            for task in done:
                exc = task.exception()
                if exc is not None:
                    raise exc
            return True
        finally:
            for call in calls:
                call.cancel()
            await channel.close(grace=None)

    async def _stream(self, call: grpc.aio.StreamStreamCall, group: Group) -> None:
        cfg, t = self.cfg, self.target
        stall_s = cfg.stall_intervals * cfg.interval
        try:
            # the request side stays open (no half-close): some targets end a STREAM subscription with it
            await call.write(subscribe_request(group, cfg.interval))
            while True:
                try:
                    msg = await asyncio.wait_for(call.read(), stall_s)
                except asyncio.TimeoutError:
                    raise SessionEnded("stalled", f"no message for {stall_s:g} s ({group.target or group.origin})") \
                        from None
                if msg is grpc.aio.EOF:
                    raise SessionEnded("ended", f"the switch closed the stream ({group.target or group.origin})")
                assert isinstance(msg, gnmi_pb2.SubscribeResponse)
                which = msg.WhichOneof("response")
                now = self._clock()
                self._delivered = True
                if which == "update":
                    notes = self.store.apply(decode(t.profile, msg.update, group.target), now)
                    for note in notes[: max(0, 5 - self._logged)]:
                        log.warning("gnmi_update_refused", switch=t.name, problem=note)
                    self._logged += len(notes)
                elif which == "sync_response":
                    self.store.synced(group.target, now)
        except grpc.aio.AioRpcError as exc:
            code = exc.code()
            reason = _CODE_REASON.get(code, "error")
            raise SessionEnded(reason, f"{code.name}: {(exc.details() or '')[:200]}") from None
