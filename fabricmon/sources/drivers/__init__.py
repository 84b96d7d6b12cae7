"""Driver knowledge as data: what each statistic name of each driver family means.

A ``DriverTable`` is a list of ``StatRule`` rows, one per name or per name
pattern, each cited to the driver source it was read from.  A pattern holds
placeholders (``{priority}``, ``{lane}``, ``{cos}``, ``{tc}``, ``{n}``,
``{rest}``); their values can be used in the rule's labels.  The tables are
the only place that knows driver spellings: the ethtool and infiniband sources
look names up here and never match names themselves.

Kinds: a COUNTER only grows (64-bit unless ``width`` says the register is
narrower, then it wraps); a GAUGE is a level that rises and falls (resource
counts, a FIFO register); a HIGH_WATER mark only rises until the driver resets
it.  Gauges and high-water marks are exported as read and never produce a
counter reset.

``family`` None: the name is known (the driver defines it) but only its raw
value is exported, through the configured allowlist.  A name no rule matches
is *unclassified*: counted per interface or device, logged once, raw through
the allowlist.
"""

from __future__ import annotations

import enum
import re
from dataclasses import dataclass, field

from ...model import Semantics


class Kind(enum.Enum):
    COUNTER = "counter"
    GAUGE = "gauge"
    HIGH_WATER = "high_water"


# units a driver counts in -> factor to the exported base unit
UNIT_SCALE: dict[str, float] = {
    "frames": 1.0, "packets": 1.0, "events": 1.0, "bits": 1.0, "bytes": 1.0, "errors": 1.0,
    "us": 1e-6,  # pause durations in microseconds -> seconds
    "ms": 1e-3,
    "percent": 0.01,  # mlx5 outbound_pci_stalled_*: percent of the last second -> ratio
    "count": 1.0,  # resource levels (gauges)
}

# placeholder -> regex; a name's placeholder values may be used in the labels
PLACEHOLDERS: dict[str, str] = {
    "priority": "[0-7]",
    "tc": "[0-7]",
    "cos": "[0-7]",
    "lane": "[0-9]{1,2}",
    "n": "[0-9]{1,4}",
    "direction": "rx|tx",
    "rest": ".+",
}
_PH = re.compile(r"\{([a-z]+)\}")


@dataclass(frozen=True, slots=True)
class StatRule:
    """One driver statistic (or a pattern of them) and where its value goes.

    ``labels``: the curated family's labels besides ``interface`` (ethtool) or
    ``device``/``port`` (hw_counters), in the family's spec order; values may
    name placeholders (``"{priority}"``) or ``{name}`` (the raw name) or
    ``{canonical}``.  ``canonical``: the name the curated ``counter`` label
    carries where it differs from the raw one (an older spelling of the same
    driver, or another driver's name for the very same counter), so a kernel
    upgrade or a vendor's rename does not split a series.
    """

    pattern: str
    family: str | None
    labels: tuple[tuple[str, str], ...] = ()
    kind: Kind = Kind.COUNTER
    width: int = 64
    unit: str = "count"
    canonical: str | None = None
    also: tuple[str, ...] = ()  # further curated families of the same value (hw_counters: cnp, retries)

    @property
    def semantics(self) -> Semantics:
        if self.kind is not Kind.COUNTER:
            return Semantics.GAUGE
        return Semantics.WRAPPING if self.width < 64 else Semantics.MONOTONIC

    @property
    def scale(self) -> float:
        return UNIT_SCALE[self.unit]


@dataclass(frozen=True, slots=True)
class Match:
    """A name looked up in a table: the rule and the placeholder values of this name."""

    rule: StatRule
    name: str
    values: dict[str, str]

    @property
    def counter(self) -> str:
        return _fill(self.rule.canonical, self) if self.rule.canonical else self.name

    def labels(self) -> tuple[tuple[str, str], ...]:
        return tuple((k, _fill(v, self)) for k, v in self.rule.labels)


def _fill(template: str, m: Match) -> str:
    out = template.replace("{name}", m.name)
    if "{canonical}" in out:
        out = out.replace("{canonical}", m.counter)
    for k, v in m.values.items():
        out = out.replace("{" + k + "}", v)
    return out


@dataclass(frozen=True, slots=True)
class XoffRefresh:
    """How a driver's NIC refreshes PFC XOFF while it holds its link partner paused.

    A PFC frame asks the partner to stop for ``quanta`` x 512 bit times (IEEE 802.1Qbb); a port that
    keeps its partner paused sends the next XOFF after ``refresh_quanta`` of them.  At a link speed of
    S bit/s a port paused without a break therefore sends S / (refresh_quanta x 512) XOFF frames a
    second per priority (or traffic class): the denominator that turns a driver's XOFF frame count
    into the share of time it paused, for drivers that count pause frames but not pause time.
    """

    refresh_quanta: int
    source: str

    def frames_per_second(self, speed_gbps: float) -> float:
        return speed_gbps * 1e9 / (self.refresh_quanta * 512)


@dataclass
class DriverTable:
    """The rules of one driver family; exact names are a dict lookup, patterns a short scan."""

    driver: str
    source: str  # the driver source the rules were read from (path and tag or commit)
    rules: tuple[StatRule, ...]
    # set only for drivers that count pause in frames and give no pause time (ice)
    xoff_refresh: XoffRefresh | None = None
    _exact: dict[str, StatRule] = field(default_factory=dict, init=False, repr=False)
    _patterns: list[tuple[re.Pattern[str], StatRule]] = field(default_factory=list, init=False, repr=False)

    def __post_init__(self) -> None:
        for rule in self.rules:
            if "{" not in rule.pattern:
                if rule.pattern in self._exact:
                    raise ValueError(f"{self.driver}: {rule.pattern} listed twice")
                self._exact[rule.pattern] = rule
                continue
            parts = []
            pos = 0
            for m in _PH.finditer(rule.pattern):
                parts.append(re.escape(rule.pattern[pos:m.start()]))
                parts.append(f"(?P<{m.group(1)}>{PLACEHOLDERS[m.group(1)]})")
                pos = m.end()
            parts.append(re.escape(rule.pattern[pos:]))
            self._patterns.append((re.compile("".join(parts)), rule))

    def lookup(self, name: str) -> Match | None:
        rule = self._exact.get(name)
        if rule is not None:
            return Match(rule, name, {})
        for rx, rule in self._patterns:
            m = rx.fullmatch(name)
            if m:
                return Match(rule, name, m.groupdict())
        return None

    def names(self) -> list[str]:
        return [r.pattern for r in self.rules]


def raw_only(*names: str) -> tuple[StatRule, ...]:
    """Names the driver defines whose raw value is exported only through the allowlist."""
    return tuple(StatRule(n, None) for n in names)
