"""One switch's latest gNMI values, as ready ``Reading``s, bounded by ``max_series``.

The session (on the gNMI thread) writes; the agent's poll copies.  Readings are built when a value
changes (every SAMPLE interval at most), never per poll, and an unchanged value keeps its very Reading,
so the counter tracker takes its fast path.  When a session ends, every value of the switch goes: a
switch that stalls, sends garbage or is away costs its own series (its failures are counted)."""

from __future__ import annotations

import re
import threading
from dataclasses import dataclass, field

from ...components import SWITCH_PORT_NAME
from ...model import Labels, Reading, Semantics
from .decode import Decoded
from .profiles import CHECKS_LOSSLESS, COUNTER, SONIC_ECN_OFF

REASONS = ("unreachable", "auth", "credentials", "stalled", "oversize", "malformed", "series_limit", "ended",
           "error")
PRIORITIES = range(8)
_MAC = re.compile(r"[0-9a-fA-F]{2}([:-][0-9a-fA-F]{2}){5}")


def far_end(lldp: dict[str, str], switches: frozenset[str]) -> tuple[str, str, str] | None:
    """(peer, peer_port, peer_type) of a port's LLDP neighbour, as the topology import names them (domain
    stripped, a port name rather than a MAC); None when it names nothing usable.  ``peer_type`` is
    ``switch`` for a switch this agent subscribes to, else ``unknown`` (the aggregator knows the hosts)."""
    name = lldp.get("peer", "").strip()
    if not name.replace(".", "").isdigit():
        name = name.split(".", 1)[0]
    if not SWITCH_PORT_NAME.fullmatch(name) or "/" in name:
        return None
    port = ""
    for text in (lldp.get("peer_port", ""), lldp.get("peer_port_descr", "")):
        if text and SWITCH_PORT_NAME.fullmatch(text) and not _MAC.fullmatch(text):
            port = text
            break
    return name, port, "switch" if name in switches else "unknown"


@dataclass
class StoreView:
    """What one poll serves of one switch (copies)."""

    name: str
    profile: str
    up: bool
    last_message: float | None
    failures: dict[str, int]
    updates: int
    readings: list[Reading]
    lossless: list[Reading] = field(default_factory=list)
    problem: str | None = None


class SwitchStore:
    def __init__(self, name: str, profile: str, max_series: int, switches: frozenset[str] = frozenset()) -> None:
        self.name = name
        self.switches = switches  # every switch this agent subscribes to: an LLDP peer among them is a switch
        self.profile = profile
        self.max_series = max_series
        self._lock = threading.Lock()
        self._readings: dict[tuple[str, Labels], Reading] = {}
        self._pfc: dict[str, frozenset[int]] = {}
        self._queue_wred: dict[tuple[str, int], str] = {}
        self._wred_ecn: dict[str, str] = {}
        self._lldp: dict[str, dict[str, str]] = {}
        self._config_synced = False
        self._up = False
        self._last: float | None = None
        self._failures = dict.fromkeys(REASONS, 0)
        self._updates = 0
        self._problem: str | None = None
        self._facts_cache: list[Reading] | None = None

    # ---------------------------------------------------------------- writer (the gNMI thread)
    def apply(self, d: Decoded, now: float) -> list[str]:
        """Take one notification's points and facts; returns problems worth a log line."""
        notes = list(d.notes)
        with self._lock:
            self._last = now
            self._updates += d.accepted
            self._failures["malformed"] += d.malformed
            refused = 0
            sw = (("switch", self.name),)
            for p in d.points:
                labels = sw + p.labels
                key = (p.family, labels)
                old = self._readings.get(key)
                if old is None and len(self._readings) >= self.max_series:
                    refused += 1
                    continue
                if old is None or old.value != p.value:
                    if p.kind == COUNTER:
                        r = Reading(p.family, labels, p.value, Semantics.MONOTONIC, 64, f"gnmi:{self.name}/{p.port}")
                    else:
                        r = Reading(p.family, labels, p.value)
                    self._readings[key] = r
            if refused:
                self._failures["series_limit"] += refused
                notes.append(f"{refused} series refused: max_series {self.max_series} reached")
            for port, far in d.lldp.items():
                if port in self._lldp or len(self._lldp) < self.max_series:
                    self._lldp.setdefault(port, {}).update(far)
                    self._facts_cache = None
            if d.pfc_enable or d.queue_wred or d.wred_ecn:
                facts = len(self._pfc) + len(self._queue_wred) + len(self._wred_ecn)
                new = (len(d.pfc_enable.keys() - self._pfc.keys()) + len(d.queue_wred.keys() - self._queue_wred.keys())
                       + len(d.wred_ecn.keys() - self._wred_ecn.keys()))
                if facts + new > self.max_series:
                    self._failures["series_limit"] += 1  # a config table larger than any switch has: refused
                    notes.append(f"config rows refused: more than max_series {self.max_series}")
                else:
                    self._pfc.update(d.pfc_enable)
                    self._queue_wred.update(d.queue_wred)
                    self._wred_ecn.update(d.wred_ecn)
                    self._facts_cache = None
        return notes

    def synced(self, target: str, now: float) -> None:
        """The target sent sync_response for one subscription group: it has sent everything once."""
        with self._lock:
            self._last = now
            self._up = True
            self._problem = None
            if target == "CONFIG_DB":
                self._config_synced = True
                self._facts_cache = None

    def lost(self, reason: str | None, problem: str | None) -> None:
        """The session ended: count why (None: a reconnect asked for, e.g. new credentials) and drop every
        value of this switch."""
        with self._lock:
            if reason is not None:
                self._failures[reason if reason in self._failures else "error"] += 1
            self._problem = problem
            self._up = False
            self._readings.clear()
            self._pfc.clear()
            self._queue_wred.clear()
            self._wred_ecn.clear()
            self._lldp.clear()
            self._config_synced = False
            self._facts_cache = None

    # ---------------------------------------------------------------- reader (the agent's poll)
    def view(self) -> StoreView:
        with self._lock:
            if self._facts_cache is None:
                self._facts_cache = self._facts()
            return StoreView(self.name, self.profile, self._up, self._last, dict(self._failures), self._updates,
                             list(self._readings.values()), self._facts_cache, self._problem)

    def _facts(self) -> list[Reading]:
        """The far end of each port's cable (LLDP), whether the lossless settings are read, and the PFC-enabled
        priorities and ECN-marking queues of every port (sonic, once CONFIG_DB synced), each a bitmask: two
        series per port (not sixteen), and a priority missing on a port is a 0 bit the aggregator compares."""
        checked = CHECKS_LOSSLESS.get(self.profile, False)
        out = []
        for port, lldp in sorted(self._lldp.items()):  # the far end of each cable, from the switch's LLDP
            far = far_end(lldp, self.switches)
            if far is not None:
                out.append(Reading("fabricmon_switch_port_info", (
                    ("switch", self.name), ("switch_guid", ""), ("port", port), ("peer", far[0]),
                    ("peer_port", far[1]), ("peer_type", far[2])), 1.0))
        out += [Reading("fabricmon_switch_lossless_config_checked", (("switch", self.name), ("profile", self.profile)),
                       1.0 if checked and self._config_synced else 0.0)]
        if not checked or not self._config_synced:
            return out
        ports = {lab[1][1] for (_f, lab) in self._readings if len(lab) > 1 and lab[1][0] == "port"}
        ports |= set(self._pfc)
        for port in sorted(ports):
            sp = (("switch", self.name), ("port", port))
            pfc = sum(1 << p for p in self._pfc.get(port, frozenset()) if p in PRIORITIES)
            ecn = 0
            for q in PRIORITIES:
                prof = self._queue_wred.get((port, q))
                if prof and self._wred_ecn.get(prof, "") not in SONIC_ECN_OFF:
                    ecn |= 1 << q
            out.append(Reading("fabricmon_switch_port_pfc_enabled_priorities", sp, float(pfc)))
            out.append(Reading("fabricmon_switch_port_ecn_marking_queues", sp, float(ecn)))
        return out
