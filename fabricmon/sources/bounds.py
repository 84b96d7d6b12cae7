"""The validation boundary for every number the agent takes from outside.

Sysfs files, ``ethtool -S`` dumps, the SIOCETHTOOL buffers and the fake NVML
file are written by drivers, firmware, the simulator or whoever can write the
fixture directory.  A value that is not a finite number within the range its
source declares is rejected here, with a ``reason``, instead of reaching the
counter tracker or the exposition: one 10 MB file of digits must not become a
``3.1e128`` sample, and one NaN must not stop a snapshot being built.

Reasons (the ``reason`` label of ``fabricmon_source_values_rejected_total``):

* ``not_integer`` - text that is not plain decimal digits (or a JSON/YAML value
  that is not an integral number);
* ``too_long`` - a file or field larger than its source can legitimately be;
* ``out_of_range`` - an integer beyond the counter's declared width (at most
  64 bits), a negative counter, or a gauge outside its documented range;
* ``not_finite`` - NaN or an infinity;
* ``malformed`` - text that is not in its documented shape (a port rate or
  state line, an ethtool dump with no statistics in it).
"""

from __future__ import annotations

import math
import os
from collections.abc import Iterable

from ..model import Reading, Semantics
from ..rejected import InputRejected
from ..textcheck import valid_ifname

__all__ = [
    "MAX_COUNTER_DIGITS",
    "REASONS",
    "U64_MAX",
    "Rejected",
    "RejectCounts",
    "check_finite",
    "check_gauge",
    "counter_from_bytes",
    "counter_from_text",
    "counter_value",
    "read_bounded",
    "screen_readings",
    "valid_ifname",
    "valid_label_text",
]

U64_MAX = (1 << 64) - 1
MAX_COUNTER_DIGITS = len(str(U64_MAX))  # 20
REASONS = ("not_integer", "too_long", "out_of_range", "not_finite", "malformed")
REJECTED_FAMILY = "fabricmon_source_values_rejected_total"


class Rejected(InputRejected):
    """An outside value refused at the boundary; ``reason`` is one of ``REASONS``."""

    def __init__(self, reason: str, detail: str) -> None:
        super().__init__(reason, f"rejected ({reason}): {detail}")


def _check_width(value: int, width: int, what: str) -> int:
    if value < 0:
        raise Rejected("out_of_range", f"{what} is negative: {value}")
    if value >> min(width, 64):
        raise Rejected("out_of_range", f"{what} {_short(value)} exceeds its {min(width, 64)}-bit width")
    return value


def _short(value: int) -> str:
    text = str(value)
    return text if len(text) <= 24 else f"{text[:8]}...({len(text)} digits)"


def counter_from_bytes(data: bytes, width: int = 64, what: str = "value") -> int:
    """A sysfs counter file's content -> int within ``width`` bits, or Rejected.

    Only ASCII decimal digits (surrounding whitespace and NULs stripped) are
    accepted: ``int()`` would also take ``-5``, ``+5``, ``1_000`` and
    non-ASCII digits.  The digit count is checked before converting, so a huge
    file costs no big-integer arithmetic.
    """
    text = data.strip(b" \t\r\n\0")
    if not text.isdigit():  # bytes.isdigit is ASCII-only
        raise Rejected("not_integer", f"{what} is not an integer: {text[:40]!r}")
    if len(text) > MAX_COUNTER_DIGITS:
        raise Rejected("too_long", f"{what} has {len(text)} digits")
    return _check_width(int(text), width, what)


def counter_from_text(text: str, width: int = 64, what: str = "value") -> int:
    """As ``counter_from_bytes`` for text (``ethtool -S`` values)."""
    try:
        data = text.encode("ascii")
    except UnicodeEncodeError:
        raise Rejected("not_integer", f"{what} is not an integer: {text[:40]!r}") from None
    return counter_from_bytes(data, width, what)


def counter_value(value: object, width: int = 64, what: str = "value") -> int:
    """A counter from a parsed JSON/YAML value: an int, an integral float or a decimal/0x string."""
    if isinstance(value, bool):
        raise Rejected("not_integer", f"{what} is a boolean")
    if isinstance(value, int):
        return _check_width(value, width, what)
    if isinstance(value, float):
        if not math.isfinite(value):
            raise Rejected("not_finite", f"{what} is {value}")
        if not value.is_integer():
            raise Rejected("not_integer", f"{what} is not an integer: {value}")
        return _check_width(int(value), width, what)
    if isinstance(value, str):
        s = value.strip()
        if s[:2].lower() == "0x":
            digits = s[2:]
            if not digits or len(digits) > 16 or any(c not in "0123456789abcdefABCDEF" for c in digits):
                raise Rejected("not_integer", f"{what} is not a hex integer: {s[:40]!r}")
            return _check_width(int(digits, 16), width, what)
        return counter_from_text(s, width, what)
    raise Rejected("not_integer", f"{what} is a {type(value).__name__}, not an integer")


def check_finite(value: float, what: str = "value") -> float:
    if not math.isfinite(value):
        raise Rejected("not_finite", f"{what} is {value}")
    return value


def check_gauge(value: object, lo: float, hi: float, what: str = "value") -> float:
    """A finite number within ``[lo, hi]`` (the source's documented range)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise Rejected("not_integer", f"{what} is a {type(value).__name__}, not a number")
    if isinstance(value, int) and not lo <= value <= hi:
        raise Rejected("out_of_range", f"{what} {_short(value)} outside {lo:g}..{hi:g}")
    v = float(value)
    check_finite(v, what)
    if not lo <= v <= hi:
        raise Rejected("out_of_range", f"{what} {v:g} outside {lo:g}..{hi:g}")
    return v


MAX_LABEL_TEXT = 128  # device attributes used as label values (fw_ver, board_id, node_guid, hca_type)


def valid_label_text(text: str) -> bool:
    """A short printable attribute: a 4 KiB sysfs page of junk must not become a label value."""
    return len(text) <= MAX_LABEL_TEXT and text.isprintable()


def read_bounded(path: str, limit: int, flags: int = os.O_RDONLY | os.O_CLOEXEC) -> bytes:
    """At most ``limit`` bytes of ``path``; Rejected(too_long) when the file holds more.

    Reads ``limit + 1`` bytes so a file of exactly ``limit`` bytes is accepted
    and one byte more is not; never more, whatever the file's size.  Opened non-blocking
    and refused unless ``fstat`` on the descriptor says regular file (guarded_io): a FIFO
    in a fixture dir cannot block the poll.  ``flags`` adds O_NOFOLLOW where wanted.
    """
    from .guarded_io import open_regular

    fd, _ = open_regular(path, follow_symlinks=not flags & os.O_NOFOLLOW)
    try:
        chunks: list[bytes] = []
        left = limit + 1
        while left > 0:
            chunk = os.read(fd, min(left, 1 << 16))
            if not chunk:
                break
            chunks.append(chunk)
            left -= len(chunk)
    finally:
        os.close(fd)
    data = b"".join(chunks)
    if len(data) > limit:
        raise Rejected("too_long", f"{path} is larger than {limit} bytes")
    return data


def screen_readings(readings: Iterable[Reading], rejects: RejectCounts,
                    errors: list[str] | None = None) -> list[Reading]:
    """The Readings whose values are finite and, for counters, integers within their width.

    The last guard before the counter tracker (which would raise on a NaN
    counter and so lose the whole snapshot).  A refused Reading is counted in
    ``rejects`` and described in ``errors``.
    """
    out: list[Reading] = []
    gauge = Semantics.GAUGE
    for r in readings:
        v = r.value
        t = type(v)
        # Fast paths (this runs over every Reading of a poll): a plain int
        # within its width, or a finite float gauge (inf - inf and nan - nan are nan).
        if type(v) is int and 0 <= v and not v >> r.width:  # (type(v), not t: mypy narrows only this)
            out.append(r)
            continue
        if t is float and r.semantics is gauge and v - v == 0.0:
            out.append(r)
            continue
        try:
            if r.semantics is Semantics.GAUGE:
                if isinstance(v, float):
                    check_finite(v, r.family)
                elif not isinstance(v, int):
                    raise Rejected("not_integer", f"{r.family} is a {type(v).__name__}")
            elif isinstance(v, float):
                # A counter from a double field: the tracker truncates it, so
                # only finiteness and range matter here.
                check_finite(v, r.family)
                if not 0.0 <= v < float(1 << min(r.width, 64)):
                    raise Rejected("out_of_range", f"{r.family} {v:g} outside its {r.width}-bit width")
            else:
                counter_value(v, r.width, r.family)
        except Rejected as exc:
            rejects.add(exc.reason)
            if errors is not None:
                errors.append(f"{r.family}{dict(r.labels)}: {exc}")
            continue
        out.append(r)
    return out


class RejectCounts:
    """Cumulative count of rejected values of one collector, by reason.

    Exported as ``fabricmon_source_values_rejected_total{collector,reason}``
    once a reason has been seen (a clean node exports none of these series).
    """

    __slots__ = ("collector", "_counts", "_readings")

    def __init__(self, collector: str) -> None:
        self.collector = collector
        self._counts: dict[str, int] = {}
        self._readings: tuple[Reading, ...] = ()

    def add(self, reason: str, n: int = 1) -> None:
        self._counts[reason] = self._counts.get(reason, 0) + n
        self._readings = ()

    def count(self, reason: str | None = None) -> int:
        if reason is None:
            return sum(self._counts.values())
        return self._counts.get(reason, 0)

    def readings(self) -> tuple[Reading, ...]:
        """The same tuple of Readings while nothing new was rejected (the tracker reuses them by identity)."""
        if not self._readings and self._counts:
            self._readings = tuple(
                Reading(REJECTED_FAMILY, (("collector", self.collector), ("reason", reason)), count,
                        Semantics.MONOTONIC, 64, "")
                for reason, count in sorted(self._counts.items())
            )
        return self._readings
