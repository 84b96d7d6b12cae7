"""The fake sweep backend: a JSON file holding the last complete sweep (written atomically by the
simulator, ``sim.switches``/``sim.sweep_feed``), re-read on each poll and checked as a tool's output is.
The format is ``SweepSnapshot`` as data:

```json
{"version": 1, "ended_at": 1764000010.0, "seconds": 0.8, "queries": {"ok": 1234, "timeout": 0, "error": 0},
 "switches": [{"name": "leaf-u0-r3", "guid": "0x0002c9...", "lid": 4099, "reachable": true, "problem": "",
               "cables": {"17": ["spine-1", 5, "switch", "0x0002c9..."]},
               "states": {"17": ["Active", "LinkUp"]},
               "ports": {"17": {"errors": {"symbol_error": 12}, "xmit_data": 1, "rcv_data": 2, "xmit_wait": 3}}}]}
```

Counter values are the 64-bit extended counters (PortCounters with IsAddlPortCountersExtendedSupported).
A file that is missing or malformed is a failed sweep (``problem``), never an empty fabric."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from ..bounds import Rejected, read_bounded
from .fabric_map import Cable, Switch
from .parse import ERROR_FIELDS, PortSample, PortState
from .sweeper import RESULTS, SweepSnapshot, SwitchReading

FORMAT_VERSION = 1
_MAX_BYTES = 256 << 20  # a 4,096-node fabric's sweep is tens of MB
_MAX_PORT = 255
_COUNTERS = frozenset(ERROR_FIELDS.values())


class FakeSweepError(ValueError):
    pass


def _int(v: Any, what: str, lo: int = 0, hi: int = (1 << 64) - 1) -> int:
    if isinstance(v, bool) or not isinstance(v, int) or not lo <= v <= hi:
        raise FakeSweepError(f"{what}: must be an integer in {lo}..{hi}, got {v!r}")
    return v


def _port(key: str, where: str) -> int:
    if not key.isdigit():
        raise FakeSweepError(f"{where}: port {key!r} is not a number")
    return _int(int(key), f"{where}.{key}", 1, _MAX_PORT)


def _switch(doc: dict, i: int) -> SwitchReading:
    where = f"switches[{i}]"
    name = doc.get("name")
    if not isinstance(name, str) or not name or len(name) > 256:
        raise FakeSweepError(f"{where}.name: must be a switch name, got {name!r}")
    guid_text = doc.get("guid", "")
    try:
        guid = int(guid_text, 16)
    except (TypeError, ValueError):
        raise FakeSweepError(f"{where}.guid: not a hex GUID: {guid_text!r}") from None
    sw = Switch(name, guid, _int(doc.get("lid", 0), f"{where}.lid", 0, 0xFFFF), 0)
    for key, cab in (doc.get("cables") or {}).items():
        if not (isinstance(cab, list) and len(cab) == 4 and cab[2] in ("switch", "host")):
            raise FakeSweepError(f"{where}.cables.{key}: must be [peer, peer_port, switch|host, peer_guid]")
        sw.cables[_port(key, f"{where}.cables")] = Cable(str(cab[0]), _int(cab[1], f"{where}.cables.{key}[1]", 0, 255),
                                                         cab[2], int(str(cab[3]), 16))
    sw.nports = max(sw.cables, default=0)
    if not doc.get("reachable", True):
        return SwitchReading(sw, False, problem=str(doc.get("problem", "unreachable"))[:200])
    states = {}
    for key, st in (doc.get("states") or {}).items():
        if not (isinstance(st, list) and len(st) == 2 and all(isinstance(x, str) for x in st)):
            raise FakeSweepError(f"{where}.states.{key}: must be [LinkState, PhysLinkState]")
        states[_port(key, f"{where}.states")] = PortState(st[0], st[1])
    ports = {}
    for key, pc in (doc.get("ports") or {}).items():
        w = f"{where}.ports.{key}"
        if not isinstance(pc, dict):
            raise FakeSweepError(f"{w}: must be a mapping")
        errors = {}
        for cname, v in (pc.get("errors") or {}).items():
            if cname not in _COUNTERS:
                raise FakeSweepError(f"{w}.errors.{cname}: not a PMA error counter")
            errors[cname] = (_int(v, f"{w}.errors.{cname}"), 64)
        data = [(_int(pc[k], f"{w}.{k}"), 64) if k in pc else None for k in ("xmit_data", "rcv_data", "xmit_wait")]
        ports[_port(key, f"{where}.ports")] = PortSample(errors, data[0], data[1], data[2])
    return SwitchReading(sw, True, ports, states)


def parse_fake_sweep(text: str) -> tuple[SweepSnapshot, dict[str, int]]:
    try:
        doc = json.loads(text)
    except ValueError as exc:
        raise FakeSweepError(f"not JSON: {exc}") from None
    if not isinstance(doc, dict) or doc.get("version") != FORMAT_VERSION:
        raise FakeSweepError(f"version: must be {FORMAT_VERSION}")
    ended = doc.get("ended_at")
    secs = doc.get("seconds")
    if not isinstance(ended, (int, float)) or not isinstance(secs, (int, float)) or secs < 0:
        raise FakeSweepError("ended_at, seconds: must be numbers (seconds >= 0)")
    switches = doc.get("switches")
    if not isinstance(switches, list):
        raise FakeSweepError("switches: must be a list")
    queries = {r: _int((doc.get("queries") or {}).get(r, 0), f"queries.{r}") for r in RESULTS}
    return SweepSnapshot(float(ended), float(secs), [_switch(s, i) for i, s in enumerate(switches)]), queries


def fake_sweep_document(snap: SweepSnapshot, queries: dict[str, int]) -> dict:
    """The file's content for ``snap`` (what the simulator writes)."""
    def switch(r: SwitchReading) -> dict:
        sw = r.switch
        out: dict[str, Any] = {"name": sw.name, "guid": sw.guid_text, "lid": sw.lid, "reachable": r.reachable,
                               "problem": r.problem,
                               "cables": {str(p): [c.peer, c.peer_port, c.peer_type, f"0x{c.peer_guid:016x}"]
                                          for p, c in sorted(sw.cables.items())},
                               "states": {str(p): [s.link, s.physical] for p, s in sorted(r.states.items())},
                               "ports": {}}
        for p, s in sorted(r.ports.items()):
            row: dict[str, Any] = {"errors": {k: v for k, (v, _w) in sorted(s.errors.items())}}
            for k, val in (("xmit_data", s.xmit_data), ("rcv_data", s.rcv_data), ("xmit_wait", s.xmit_wait)):
                if val is not None:
                    row[k] = val[0]
            out["ports"][str(p)] = row
        return out

    return {"version": FORMAT_VERSION, "ended_at": snap.ended_at, "seconds": snap.seconds,
            "queries": dict(queries), "switches": [switch(r) for r in snap.switches]}


class FakeSweep:
    """The sweep backend over a fake file: ``snapshot()`` re-reads it (a new sweep when the simulator
    rewrote it); a missing or bad file is a failed sweep saying why."""

    def __init__(self, path: str) -> None:
        self.path = Path(path)
        self._queries = dict.fromkeys(RESULTS, 0)
        self._mtime: float | None = None
        self._snap = SweepSnapshot()

    @property
    def queries(self) -> dict[str, int]:
        return dict(self._queries)

    def snapshot(self) -> SweepSnapshot:
        try:
            st = self.path.stat()
            if self._mtime == st.st_mtime_ns and self._snap.ended_at:
                return self._snap
            text = read_bounded(str(self.path), _MAX_BYTES).decode("utf-8", "replace")
            self._snap, self._queries = parse_fake_sweep(text)
            self._mtime = st.st_mtime_ns
        except OSError as exc:
            return SweepSnapshot(problem=f"fake sweep {self.path}: {exc.strerror or exc}")
        except (FakeSweepError, Rejected) as exc:
            return SweepSnapshot(problem=f"fake sweep {self.path}: {exc}")
        return self._snap

    def start(self) -> None:
        pass

    def stop(self, timeout: float = 10.0) -> None:
        pass
