"""The agent source ``ib_switches``: serves the sweeper's last complete sweep to the 1 s poll (it never
queries a switch itself), as the families of DESIGN.md "The switch side of the fabric"."""

from __future__ import annotations

import time
from collections.abc import Callable

from ...config import IbSwitchesConfig
from ...model import Reading, Semantics, SourceResult
from ..errorlog import ErrorLog
from ..inventory import Inventory
from ..registry import SourceContext, SourceSpec
from .backend import SweepBackend
from .backend_fake import FakeSweep
from .parse import PortSample
from .sweeper import Sweeper, SweepSnapshot

WORD_BYTES = 4  # PortXmitData/PortRcvData count 4-byte words (IBTA 16.1.3.5)
ERRORS = "fabricmon_switch_port_errors_total"


def _counter(family: str, labels: tuple[tuple[str, str], ...], value: int, width: int, group: str, *,
             saturating: bool = False, scale: float = 1.0) -> Reading:
    # 64-bit counters (and the 32-bit wait and data counters, which pin without a flag family of their own)
    # are MONOTONIC: a decrease is a reset, as when another tool cleared them.
    sem = Semantics.SATURATING if saturating and width < 64 else Semantics.MONOTONIC
    return Reading(family, labels, value, sem, width, group, scale)


def port_readings(switch: str, port: int, sample: PortSample) -> list[Reading]:
    sp = (("switch", switch), ("port", str(port)))
    group = f"switch:{switch}/{port}"  # one port's counters reset together (someone cleared them)
    out = [_counter(ERRORS, sp + (("counter", name),), v, w, group, saturating=True)
           for name, (v, w) in sorted(sample.errors.items())]
    for family, val, scale in (("fabricmon_switch_port_transmit_bytes_total", sample.xmit_data, WORD_BYTES),
                               ("fabricmon_switch_port_receive_bytes_total", sample.rcv_data, WORD_BYTES),
                               ("fabricmon_switch_port_transmit_wait_total", sample.xmit_wait, 1.0)):
        if val is not None:
            out.append(_counter(family, sp, val[0], val[1], group, scale=scale))
    return out


def sweep_readings(snap: SweepSnapshot, now: float) -> list[Reading]:
    """Every series of one sweep.  An unreachable switch has none (it is counted instead)."""
    return [*sweep_age(snap, now), *port_series(snap)]


def sweep_age(snap: SweepSnapshot, now: float) -> list[Reading]:
    if not snap.ended_at:
        return []
    return [Reading("fabricmon_switch_sweep_seconds", (), snap.seconds),
            Reading("fabricmon_switch_sweep_age_seconds", (), max(0.0, now - snap.ended_at)),
            Reading("fabricmon_switches_unreachable", (), float(snap.unreachable)),
            Reading("fabricmon_switches_swept", (), float(len(snap.switches)))]


def port_series(snap: SweepSnapshot) -> list[Reading]:
    """The per-port series of one sweep: built once per sweep, not per poll (a 3,840-port fabric is ~65k
    readings, which took most of a 1 s poll to build again each time: docs/benchmarks.md)."""
    out: list[Reading] = []
    for sr in snap.switches:
        if not sr.reachable:
            continue
        sw = sr.switch
        for port, cable in sorted(sw.cables.items()):
            out.append(Reading("fabricmon_switch_port_info", (
                ("switch", sw.name), ("switch_guid", sw.guid_text), ("port", str(port)), ("peer", cable.peer),
                ("peer_port", str(cable.peer_port)), ("peer_type", cable.peer_type)), 1.0))
            state = sr.states.get(port)
            if state is not None:
                out.append(Reading("fabricmon_switch_port_up", (("switch", sw.name), ("port", str(port))),
                                   1.0 if state.up else 0.0))
            sample = sr.ports.get(port)
            if sample is not None:
                out.extend(port_readings(sw.name, port, sample))
    return out


class IbSwitchesSource:
    name = "ib_switches"
    self_bounded = True  # poll only copies the last sweep

    def __init__(self, config: IbSwitchesConfig, *, sweeper: SweepBackend | None = None,
                 clock: Callable[[], float] = time.time, start_thread: bool = True) -> None:
        self.config = config
        self.timeout = 1.0
        self._clock = clock
        self._sweeper: SweepBackend = sweeper if sweeper is not None else Sweeper(config, clock=clock)
        self._started = not start_thread  # False: the caller drives the sweeper (tests)
        self._errlog = ErrorLog(self.name)
        self._built: tuple[SweepSnapshot | None, list[Reading]] = (None, [])  # the last sweep's port series

    def poll(self, inventory: Inventory) -> SourceResult:
        if not self._started:
            self._sweeper.start()
            self._started = True
        result = SourceResult(self.name)
        snap = self._sweeper.snapshot()
        if snap.problem:
            result.error(f"switch sweep: {snap.problem}")
            # no map at all: the whole source is down (fabricmon_collector_up{collector="ib_switches"} 0)
            result.up = bool(snap.switches)
        for sr in snap.switches:
            if not sr.reachable:
                result.error(f"switch {sr.switch.name} (lid {sr.switch.lid}): {sr.problem}")
        self._errlog.report(result.messages)
        if self._built[0] is not snap:
            self._built = (snap, port_series(snap))
        result.readings = [*sweep_age(snap, self._clock()), *self._built[1]]
        for res, n in self._sweeper.queries.items():
            result.readings.append(Reading("fabricmon_switch_queries_total", (("result", res),), n,
                                           Semantics.MONOTONIC, 64))
        return result

    def close(self) -> None:
        self._sweeper.stop()


def _build(config: IbSwitchesConfig, context: SourceContext) -> IbSwitchesSource:
    fake = config.fake_file
    return IbSwitchesSource(config, sweeper=FakeSweep(fake) if fake else None)


SOURCE = SourceSpec("ib_switches", IbSwitchesConfig, _build)
