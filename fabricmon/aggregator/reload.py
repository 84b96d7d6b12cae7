"""SIGHUP for the aggregator: re-read the config and the contents of every file it names, apply
what changed, or refuse it all with one line naming the file and why.

Runs in its own thread, never the detection thread, and a changed topology is parsed in a child
process (topology_child.py): parsing a 4,096-node file takes seconds of CPU under the GIL, and
ticks go on meanwhile; the engine's lock is held only for the swaps.  The reload event is
cleared before each run, so the SIGHUPs of a storm that arrive during one run make exactly one
more (coalesced), never a queue.

What a reload applies:
* ``detection`` thresholds;
* the token files' contents (credentials.py): rotation, and revocation that cuts the live
  streams whose token was removed;
* the server certificate, key and client CA bundle (``auth.tls_*``): new handshakes use the new
  material (gRPC dynamic credentials), live streams keep theirs; a bundle may hold the old and
  the new CA during a rotation;
* the topology's contents (topology_reload.py): nodes added and removed; anything else needs a
  restart and is refused;
* the web config (HTTP TLS and users).
The token and TLS files are also watched (filewatch.py): when one changes on disk (a Kubernetes
Secret update, a rewritten /etc/fabricmon/token) the same run happens without a SIGHUP, re-reading
the files the running config names.
Everything is read and checked before anything is applied; ``fabricmon_config_last_reload_successful``
is 1 only when all of it was.  A changed listener, file path, Alertmanager or shard needs a restart.
"""

from __future__ import annotations

import dataclasses
import hashlib
import ssl
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

import structlog

from ..buildinfo import ReloadStatus
from ..configload import ConfigError
from . import topology_reload
from .config import AggregatorConfig, DetectionSettings
from .credentials import load_credentials
from .runtime import AggregatorRuntime
from .server import ServerTls, read_tls_files
from .topology_child import load_apart

if TYPE_CHECKING:
    from ..webconfig import WebConfig
    from .engine import Engine

log = structlog.get_logger("fabricmon.aggregator")


def file_digest(path: str) -> str:
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


def apply_detection(engine: Engine, new: DetectionSettings) -> None:
    """Swap the engine's detection thresholds between two ticks.  The few values the engine derives
    from them at construction are derived again; the straggler window sizes its history bitmasks
    and so needs a restart (refused in ``Reloader.prepare``)."""
    with engine.lock:
        engine.settings = new  # the engine's setter reconfigures its ingest stage (fatal XIDs, config checks)
        engine.stragglers.s = new
        engine.manager.default_hold_s = new.hold_s
        engine.heartbeats.stall_s = new.hang_stall_s
        engine.cost.settings = new  # its baseline's lead and straggler window


def _check_tls(tls: ServerTls, source: str) -> tuple[bytes, bytes, bytes | None]:
    """The material read, after OpenSSL accepted it: the key matches the certificate, the bundle parses."""
    try:
        material = read_tls_files(tls)
    except OSError as exc:
        raise ConfigError(f"{source}: auth.tls_*: cannot read {exc.filename}: {exc.strerror}") from None
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    try:
        ctx.load_cert_chain(tls.cert, tls.key)
    except (ssl.SSLError, OSError) as exc:
        raise ConfigError(f"{source}: auth.tls_cert: {tls.cert} with auth.tls_key {tls.key}: not a certificate "
                          f"chain and its key ({getattr(exc, 'reason', None) or exc})") from None
    if tls.client_ca:
        try:
            ctx.load_verify_locations(cafile=tls.client_ca)
        except (ssl.SSLError, OSError) as exc:
            raise ConfigError(f"{source}: auth.tls_client_ca: {tls.client_ca}: not a PEM CA bundle "
                              f"({getattr(exc, 'reason', None) or exc})") from None
    return material


def secret_files(cfg: AggregatorConfig) -> list[str | None]:
    """The files a rotation changes (watched by filewatch.py): tokens, TLS certificate, key and CA."""
    a = cfg.auth
    return [a.token_file, a.node_tokens_file, a.tls_cert, a.tls_key, a.tls_client_ca]


class Reloader:
    def __init__(self, rt: AggregatorRuntime, cfg: AggregatorConfig, status: ReloadStatus, *,
                 load: Callable[[], AggregatorConfig], load_web: Callable[[], WebConfig | None] | None = None,
                 web: WebConfig | None = None,
                 source: str = "aggregator config") -> None:
        self.rt, self.current, self.status = rt, cfg, status
        self.load, self.load_web, self.web, self.source = load, load_web, web, source
        self.topology_digest = file_digest(cfg.topology)
        self.runs_total = 0
        self._thread: threading.Thread | None = None
        # set by the file watch (filewatch.py) when a token or TLS file changed on disk: a run that
        # re-reads the files the running config names, the config file itself as it was
        self.files_changed = threading.Event()

    # ------------------------------------------------------------------ the thread
    def start(self, reload: threading.Event, stop: threading.Event) -> Reloader:
        self._thread = threading.Thread(target=self._run, args=(reload, stop), name="fabricmon-reload", daemon=True)
        self._thread.start()
        return self

    def _run(self, reload: threading.Event, stop: threading.Event) -> None:
        while not stop.is_set():
            if not reload.wait(0.2) and not self.files_changed.is_set():
                continue
            signalled = reload.is_set()
            reload.clear()  # SIGHUPs from here on ask for one more run: a storm is coalesced
            self.files_changed.clear()  # a SIGHUP's run re-reads the files too
            if stop.is_set():
                return
            self.reload_once(files_only=not signalled)

    def join(self, timeout: float) -> None:
        if self._thread is not None:
            self._thread.join(timeout)

    # ------------------------------------------------------------------ one reload
    def reload_once(self, files_only: bool = False) -> bool:
        """One reload (SIGHUP); ``files_only``: the running config's files re-read, not the config
        file (a token or certificate changed on disk: an edit of the config still waits for SIGHUP)."""
        self.runs_total += 1
        t0 = time.perf_counter()
        trigger = "file change" if files_only else "SIGHUP"
        try:
            new = self.current if files_only else self.load()
            new_web = self.web if files_only or self.load_web is None else self.load_web()
            changes = self.prepare(new)
        except ConfigError as exc:
            self.status.record(False)
            log.error("config_reload_failed", error=str(exc), trigger=trigger,
                      detail="still running on the previous config")
            return False
        except Exception as exc:  # a reload must never end the process
            self.status.record(False)
            log.error("config_reload_failed", error=f"{type(exc).__name__}: {exc}", trigger=trigger,
                      detail="still running on the previous config")
            return False
        changed = []
        for what, apply in changes:
            extra = apply()
            changed.append(f"{what}: {extra}" if extra else what)
        self.current = new
        self.web = new_web
        if self.rt.http is not None:
            self.rt.http.set_web(new_web)  # certificates and users re-read: rotation without a restart
        self.status.record(True)
        log.info("config_reloaded", changed=changed, trigger=trigger, seconds=round(time.perf_counter() - t0, 3))
        return True

    def prepare(self, new: AggregatorConfig) -> list[tuple[str, Callable[[], object]]]:
        """Read and check everything; the (what, apply) pairs of what changed.  Raises ConfigError,
        having applied nothing."""
        old, rt, source = self.current, self.rt, self.source
        fixed = [f.name for f in dataclasses.fields(old) if f.name != "detection"
                 and getattr(old, f.name) != getattr(new, f.name)]
        if fixed:
            raise ConfigError(f"{source}: {', '.join(fixed)} changed: needs a restart (reload applies detection "
                              f"and re-reads the files auth and topology name)")
        if new.detection.straggler_window != old.detection.straggler_window:
            raise ConfigError(f"{source}: detection.straggler_window changed: needs a restart")
        out: list[tuple[str, Callable[[], object]]] = []
        detection = [f"detection.{f.name}" for f in dataclasses.fields(old.detection)
                     if getattr(old.detection, f.name) != getattr(new.detection, f.name)]
        if detection:
            out.append((", ".join(detection), lambda: apply_detection(rt.engine, new.detection)))
        grpc = rt.grpc
        creds = load_credentials(new.auth, source)
        if grpc is not None and grpc.servicer is not None and grpc.servicer.credentials != creds:
            was = grpc.servicer.credentials

            def swap_tokens() -> str:
                cut = grpc.set_credentials(creds)
                return f"{cut} streams cut (token revoked)" if cut else ""

            out.append((", ".join(was.changes(creds)), swap_tokens))
        a = new.auth
        if a.tls_cert and a.tls_key:
            material = _check_tls(ServerTls(a.tls_cert, a.tls_key, a.tls_client_ca), source)
            tls = grpc.tls if grpc is not None else None
            if tls is not None and tls.current != material:
                names = [n for n, x, y in zip(("auth.tls_key", "auth.tls_cert", "auth.tls_client_ca"),
                                              tls.current, material, strict=True) if x != y]
                out.append((f"{', '.join(names)} (contents: new handshakes)", lambda: tls.update(material)))
        try:
            digest = file_digest(new.topology)  # unchanged since the last applied: nothing to parse
        except OSError as exc:
            raise ConfigError(f"{source}: topology: cannot read {new.topology}: {exc.strerror or exc}") from None
        if digest != self.topology_digest:
            # the fingerprint of the bytes parsed, not of the read above: a file rewritten between the two
            # would otherwise be recorded as one version and run as another, and the next SIGHUP, seeing
            # that recorded version, would apply nothing
            digest, parsed = load_apart(new.topology)
            change = topology_reload.plan(rt.engine.topology, parsed, f"{new.topology}")

            def swap_topology() -> str:
                self.topology_digest = digest
                if change.empty:
                    return ""
                resolved = topology_reload.apply(rt.engine, change, rt.engine.newest_ts or time.time())
                rt.hand_over(resolved)
                gone = sum(1 for inc in resolved if inc.resolved_reason == topology_reload.REASON)
                return f"{gone} incidents resolved ({topology_reload.REASON})" if gone else ""

            out.append((change.summary() if not change.empty else "topology (contents, no node added or removed)",
                        swap_topology))
        return out
