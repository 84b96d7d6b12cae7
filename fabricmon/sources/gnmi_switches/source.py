"""The agent source ``gnmi_switches``: serves every switch's latest gNMI values to the poll (it never
talks to a switch itself), as the families of DESIGN.md "The switch side of the fabric", with each
switch's health: up, failures by reason, update age, series."""

from __future__ import annotations

import time
from collections.abc import Callable

from ...config import GnmiSwitchesConfig
from ...model import Reading, Semantics, SourceResult
from ..errorlog import ErrorLog
from ..inventory import Inventory
from ..registry import SourceContext, SourceSpec
from .runner import Runner
from .store import StoreView


def switch_readings(v: StoreView, now: float) -> list[Reading]:
    sw = (("switch", v.name),)
    out = list(v.readings)
    out.extend(v.lossless)
    out.append(Reading("fabricmon_switch_gnmi_up", sw, 1.0 if v.up else 0.0))
    out.append(Reading("fabricmon_switch_gnmi_series", sw, float(len(v.readings))))
    out.append(Reading("fabricmon_switch_gnmi_updates_total", sw, v.updates, Semantics.MONOTONIC, 64))
    for reason, n in v.failures.items():
        out.append(Reading("fabricmon_switch_gnmi_failures_total", sw + (("reason", reason),), n,
                           Semantics.MONOTONIC, 64))
    if v.last_message is not None:
        out.append(Reading("fabricmon_switch_gnmi_update_age_seconds", sw, max(0.0, now - v.last_message)))
    return out


class GnmiSwitchesSource:
    name = "gnmi_switches"
    self_bounded = True  # poll only copies the stores

    def __init__(self, config: GnmiSwitchesConfig, *, clock: Callable[[], float] = time.time,
                 runner: Runner | None = None) -> None:
        self.config = config
        self.timeout = 1.0
        self._clock = clock
        self.runner = runner if runner is not None else Runner(config, clock)
        self._errlog = ErrorLog(self.name)

    def poll(self, inventory: Inventory) -> SourceResult:
        self.runner.start()
        result = SourceResult(self.name)
        if not self.runner.alive:
            result.error("gnmi switches: the subscription thread is not running")
            result.up = False
        now = self._clock()
        down = 0
        for store in self.runner.stores.values():
            v = store.view()
            if not v.up:
                down += 1
                if v.problem:
                    result.error(f"switch {v.name}: {v.problem}")
            result.readings.extend(switch_readings(v, now))
        result.readings.append(Reading("fabricmon_switch_gnmi_sample_interval_seconds", (), self.config.interval))
        result.readings.append(Reading("fabricmon_switches_gnmi_unreachable", (), float(down)))
        self._errlog.report(result.messages)
        return result

    def refresh_credentials(self) -> list[str]:
        return self.runner.refresh_credentials()

    def close(self) -> None:
        self.runner.stop()


def _build(config: GnmiSwitchesConfig, context: SourceContext) -> GnmiSwitchesSource:
    return GnmiSwitchesSource(config)


SOURCE = SourceSpec("gnmi_switches", GnmiSwitchesConfig, _build)
