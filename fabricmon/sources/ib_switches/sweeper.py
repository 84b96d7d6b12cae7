"""The sweep schedule, on a thread of its own (never on the 1 s poll path).

Every ``health_interval``: every switch port's PortInfo (``port_state: walk``, the default: one
``iblinkinfo`` process whose discovery walk reads them all live), then per switch (``concurrency``
switches at a time, one query each in flight) an AllPortSelect probe (``perfquery -a``: about 3 MADs per
switch).  Every port's counters (``perfquery -x -l``, 64-bit data; plus ``perfquery -l`` for the error
counters where the PMA has no 64-bit error counters) are read every ``full_interval``, and at once for a
switch whose AllPortSelect error sums moved, so errors show within one health interval.

PortInfo by ``smpquery`` is one process per port: with ``port_state: smpquery``, and for a switch the walk
did not report (it failed, or did not reach it), the switch-to-switch cables each at one end
(``_state_ports``) every health sweep and every cabled port on a full read.  A process per port is what
made a full sweep of 3,840 ports take minutes (docs/benchmarks.md).  The
map (``ibnetdiscover --cache``) is refreshed every ``rediscover_interval``, never per sweep.

A switch whose probe fails after ``retries`` more tries is unreachable for this sweep: it costs its own
series only.  The last complete sweep is what ``snapshot()`` gives."""

from __future__ import annotations

import os
import shutil
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

import structlog

from ...config import IbSwitchesConfig
from ...topology_import.ibnetdiscover import IbnetParseError, parse_ibnetdiscover
from ...topology_import.nodemap import NodeMapError, parse_node_name_map
from .fabric_map import Switch, merge_cables, switch_map
from .parse import (
    ParseError,
    PortCounters,
    PortSample,
    PortState,
    failure_kind,
    parse_iblinkinfo,
    parse_perfquery,
    parse_portinfo,
    port_sample,
)
from .tools import Commands, Runner, ToolRun, run_tool

_log = structlog.get_logger("fabricmon.sources.ib_switches")

RESULTS = ("ok", "timeout", "error")


@dataclass
class SwitchReading:
    switch: Switch
    reachable: bool
    ports: dict[int, PortSample] = field(default_factory=dict)  # per-port counters, last full read
    states: dict[int, PortState] = field(default_factory=dict)
    problem: str = ""


@dataclass
class SweepSnapshot:
    ended_at: float = 0.0  # wall clock; 0: no sweep completed yet
    seconds: float = 0.0
    switches: list[SwitchReading] = field(default_factory=list)
    problem: str = ""  # the whole sweep failed (no map): why

    @property
    def unreachable(self) -> int:
        return sum(1 for s in self.switches if not s.reachable)


class SweepError(RuntimeError):
    pass


class Sweeper:
    def __init__(self, config: IbSwitchesConfig, *, runner: Runner = run_tool,
                 clock: Callable[[], float] = time.time, monotonic: Callable[[], float] = time.monotonic) -> None:
        self.config = config
        self.commands = Commands(config)
        self._run = runner
        self._clock = clock
        self._mono = monotonic
        self._lock = threading.Lock()
        self._queries: Counter[str] = Counter({r: 0 for r in RESULTS})
        self._snap = SweepSnapshot()
        self._map: list[Switch] = []
        self._map_at: float | None = None
        self._probe: dict[int, dict[str, int]] = {}  # guid -> AllPortSelect error sums of the last probe
        self._ports: dict[int, dict[int, PortSample]] = {}
        self._states: dict[int, dict[int, PortState]] = {}
        self._full_at: dict[int, float] = {}
        self._with_hosts: set[int] = set()  # switches with a host cable: leaves
        self._node_names = self._load_node_names()
        self._exclude = {e.strip().casefold() for e in config.exclude}
        self._dir = tempfile.mkdtemp(prefix="fabricmon-ibsweep-")
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def _load_node_names(self) -> dict[int, str]:
        path = self.config.node_name_map
        if not path:
            return {}
        try:
            with open(path, encoding="utf-8") as f:
                return parse_node_name_map(f.read())
        except (OSError, NodeMapError) as exc:
            raise SweepError(f"sources.ib_switches.node_name_map: {path}: {exc}") from exc

    # ------------------------------------------------------------------ queries
    @property
    def queries(self) -> dict[str, int]:
        with self._lock:
            return dict(self._queries)

    def _query(self, argv: list[str], deadline_s: float | None = None, retries: int | None = None) -> ToolRun:
        """One query, tried again up to ``retries`` times; each try is counted by its result."""
        run = ToolRun(1, "", "stopping", 0.0)
        for _ in range(1 + (self.config.retries if retries is None else retries)):
            if self._stop.is_set():
                break  # stopping: a sweep in flight ends within one query, not after every switch
            run = self._run(argv, self.commands.deadline_s if deadline_s is None else deadline_s)
            result = "ok" if run.ok else ("timeout" if run.rc is None else failure_kind(run.stderr))
            with self._lock:
                self._queries[result] += 1
            if run.ok or self._stop.is_set():
                break
        return run

    # ------------------------------------------------------------------ the map
    def rediscover(self) -> list[Switch]:
        cache = os.path.join(self._dir, "fabric.cache")
        if os.path.exists(cache):
            os.unlink(cache)  # ibnetdiscover refuses to overwrite a cache file
        run = self._query(self.commands.discover(cache))
        if not run.ok:
            raise SweepError(f"ibnetdiscover failed: {_last_line(run.stderr)}")
        try:
            fabric = parse_ibnetdiscover(run.stdout)
        except IbnetParseError as exc:
            raise SweepError(f"ibnetdiscover output: {exc}") from exc
        switches = [s for s in switch_map(fabric, self._node_names)
                    if s.name.casefold() not in self._exclude and s.guid_text not in self._exclude
                    and f"0x{s.guid:x}" not in self._exclude]
        self._map = merge_cables(switches, self._map)
        self._with_hosts = {s.guid for s in self._map if any(c.peer_type == "host" for c in s.cables.values())}
        self._map_at = self._mono()
        _log.info("switch_map_refreshed", switches=len(self._map),
                  cabled_ports=sum(len(s.cables) for s in self._map))
        return self._map

    # ------------------------------------------------------------------ one switch
    def _walk_states(self) -> dict[int, dict[int, PortState]]:
        """Every switch port's live PortInfo from one walk; empty when the walk failed (the sweep then reads
        PortInfo per port, as with ``port_state: smpquery``)."""
        if self.config.port_state != "walk":
            return {}
        # not tried again: a failed walk costs a health interval at most, and per-port reads stand in for it
        run = self._query(self.commands.link_walk(), self.commands.walk_deadline_s, retries=0)
        if not run.ok:
            _log.warning("switch_port_walk_failed", problem=_last_line(run.stderr))
            return {}
        try:
            return parse_iblinkinfo(run.stdout)
        except ParseError as exc:
            _log.warning("switch_output_unparsed", command="iblinkinfo", problem=str(exc))
            return {}

    def _sweep_switch(self, sw: Switch, now: float,
                      walked: dict[int, PortState] | None = None) -> SwitchReading:
        if sw.lid <= 0:
            return SwitchReading(sw, False, problem="no LID (is a subnet manager running?)")
        probe_run = self._query(self.commands.all_ports(sw.lid))
        if not probe_run.ok:
            return SwitchReading(sw, False, problem=f"perfquery -a: {_last_line(probe_run.stderr)}")
        try:
            sums = parse_perfquery(probe_run.stdout)[0].errors()
        except ParseError as exc:
            return SwitchReading(sw, False, problem=str(exc))
        sums_now = {k: v for k, (v, _w) in sums.items()}
        moved = self._probe.get(sw.guid) != sums_now
        due = now - self._full_at.get(sw.guid, float("-inf")) >= self.config.full_interval
        full = due or moved or sw.guid not in self._ports
        states = dict(self._states.get(sw.guid, {}))
        if walked is not None:
            # the walk read this switch: every cabled port it reported; one it did not (the link went down
            # and the port vanished from a partial view) keeps its last state until a walk says otherwise
            states.update({p: walked[p] for p in sw.cables if p in walked})
        # without the walk, PortInfo by smpquery (one SMP, but one process per port): every cabled port on a
        # full read or when the switch's error sums moved (a link going down counts LinkDowned), else only the
        # switch-to-switch cables, each at one end (host cables' state is their host agents' between full reads)
        for port in [] if walked is not None else sorted(sw.cables) if full else self._state_ports(sw):
            run = self._query(self.commands.port_info(sw.lid, port))
            if run.ok:
                try:
                    states[port] = parse_portinfo(run.stdout)
                except ParseError:
                    pass  # keeps the last state read; the query counted as ok but told nothing
        self._states[sw.guid] = states
        reading = SwitchReading(sw, True, states=states)
        if full:
            ports = self._read_ports(sw)
            if ports is not None:
                self._ports[sw.guid] = ports
                self._full_at[sw.guid] = now
                self._probe[sw.guid] = sums_now
            else:
                reading.problem = "per-port read failed; counters of the last full read served"
        reading.ports = self._ports.get(sw.guid, {})
        return reading

    def _state_ports(self, sw: Switch) -> list[int]:
        """The switch-to-switch cables whose state this switch's end reads in a health sweep: the leaf's end
        (the switch with hosts), else the end with the lower (GUID, port)."""
        out = []
        for port, c in sorted(sw.cables.items()):
            if c.peer_type != "switch":
                continue
            here, there = sw.guid in self._with_hosts, c.peer_guid in self._with_hosts
            if here != there:
                if here:
                    out.append(port)
            elif (sw.guid, port) < (c.peer_guid, c.peer_port):
                out.append(port)
        return out

    def _read_ports(self, sw: Switch) -> dict[int, PortSample] | None:
        ext = self._blocks(self.commands.ports_extended(sw.lid))
        if ext is None:
            return None
        basic: dict[int, PortCounters] = {}
        if not any(b.errors() for b in ext.values()):
            # no 64-bit error counters (CapMask2 without IsAddlPortCountersExtendedSupported): PortCounters too
            got = self._blocks(self.commands.ports(sw.lid))
            if got is None:
                return None
            basic = got
        return {port: port_sample(ext.get(port), basic.get(port)) for port in sorted(set(ext) | set(basic))}

    def _blocks(self, argv: list[str]) -> dict[int, PortCounters] | None:
        run = self._query(argv)
        if not run.ok:
            return None
        try:
            return {b.port: b for b in parse_perfquery(run.stdout)}
        except ParseError as exc:
            _log.warning("switch_output_unparsed", command=argv[0], problem=str(exc))
            return None

    # ------------------------------------------------------------------ a sweep
    def sweep_once(self) -> SweepSnapshot:
        t0 = self._mono()
        try:
            if self._map_at is None or t0 - self._map_at >= self.config.rediscover_interval:
                self.rediscover()
        except SweepError as exc:
            if not self._map:
                snap = SweepSnapshot(self._clock(), self._mono() - t0, [], str(exc))
                with self._lock:
                    self._snap = snap
                _log.warning("switch_sweep_failed", problem=str(exc))
                return snap
            _log.warning("switch_rediscover_failed", problem=str(exc), kept_switches=len(self._map))
        walk = self._walk_states()
        now = self._mono()
        with ThreadPoolExecutor(max_workers=self.config.concurrency, thread_name_prefix="fabricmon-ibsweep") as ex:
            readings = list(ex.map(lambda sw: self._sweep_switch(sw, now, walk.get(sw.guid)), self._map))
        snap = SweepSnapshot(self._clock(), self._mono() - t0, readings)
        with self._lock:
            self._snap = snap
        return snap

    def snapshot(self) -> SweepSnapshot:
        with self._lock:
            return self._snap

    # ------------------------------------------------------------------ the thread
    def start(self) -> None:
        if self._thread is None:
            self._thread = threading.Thread(target=self._loop, name="fabricmon-ibsweep", daemon=True)
            self._thread.start()

    def _loop(self) -> None:
        while not self._stop.is_set():
            t0 = self._mono()
            try:
                self.sweep_once()
            except Exception:  # noqa: BLE001 - the thread must outlive one bad sweep; logged with its traceback
                _log.exception("switch_sweep_crashed")
            self._stop.wait(max(0.0, self.config.health_interval - (self._mono() - t0)))

    def stop(self, timeout: float = 10.0) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout)
            self._thread = None
        shutil.rmtree(self._dir, ignore_errors=True)


def _last_line(text: str) -> str:
    lines = [ln.strip() for ln in text.strip().splitlines() if ln.strip() and "sim_connect" not in ln]
    return lines[-1][:200] if lines else "no message"
