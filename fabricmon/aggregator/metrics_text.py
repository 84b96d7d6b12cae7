"""The aggregator's /metrics body: the bytes prometheus_client's ``generate_latest`` writes, made faster.

``generate_latest`` validates every label name of every sample with a regular expression and escapes
it, then formats each line through ``str.format``: about 15 us a sample here, 9 ms for the 600 lines a
32-node aggregator exposes, paid on every scrape (and on every freshness probe of bench_freshness).
The names repeat (a few dozen across hundreds of samples), and so do the label pairs from one scrape to
the next, so each is escaped once and remembered (bounded);
the rest is the same steps in the same order with the library's own escaping and number formatting.
``tests/aggregator/test_metrics_text.py`` holds it to ``generate_latest`` byte for byte.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, cast

from prometheus_client.openmetrics.exposition import escape_label_name, escape_metric_name
from prometheus_client.utils import floatToGoString

_go = cast(Callable[[float], str], floatToGoString)  # the library's number spelling (untyped there)

# OpenMetrics types written as Prometheus text types (generate_latest's munging)
_TEXT_TYPE = {"info": "gauge", "stateset": "gauge", "gaugehistogram": "histogram", "unknown": "untyped"}
_OM_SUFFIXES = ("_created", "_gsum", "_gcount")  # samples generate_latest moves into gauges of their own
_NAMES_MAX = 4096  # escaped names remembered: far above what the aggregator exposes; cleared past it

_label_names: dict[str, str] = {}
_metric_names: dict[str, str] = {}
# label pairs as written: the same nodes, devices and reasons come back on every scrape
_pairs: dict[tuple[str, str], str] = {}
_PAIRS_MAX = 65536


def _label_name(k: str) -> str:
    got = _label_names.get(k)
    if got is None:
        if len(_label_names) >= _NAMES_MAX:
            _label_names.clear()
        got = _label_names[k] = escape_label_name(k)
    return got


def _metric_name(n: str) -> str:
    got = _metric_names.get(n)
    if got is None:
        if len(_metric_names) >= _NAMES_MAX:
            _metric_names.clear()
        got = _metric_names[n] = escape_metric_name(n)
    return got


def _pair(k: str, v: str) -> str:
    """``name="value"`` escaped as generate_latest escapes them (the value: backslash, newline, quote)."""
    if len(_pairs) >= _PAIRS_MAX:
        _pairs.clear()
    value = v.replace("\\", r"\\").replace("\n", r"\n").replace('"', r'\"')
    got = _pairs[(k, v)] = f'{_label_name(k)}="{value}"'
    return got


def _line(s: Any) -> str:
    labels = s.labels
    ts = "" if s.timestamp is None else f" {int(float(s.timestamp) * 1000):d}"
    if labels:
        get = _pairs.get
        inner = ",".join([get((k, v)) or _pair(k, v) for k, v in sorted(labels.items())])
        return f"{_metric_name(s.name)}{{{inner}}} {_go(s.value)}{ts}\n"
    return f"{_metric_name(s.name)} {_go(s.value)}{ts}\n"


def _family(metric: Any) -> str:
    """One family's lines, HELP and TYPE first, as generate_latest writes them."""
    out: list[str] = []
    name, mtype = metric.name, metric.type
    shown = name + "_total" if mtype == "counter" else name + "_info" if mtype == "info" else name
    doc = metric.documentation.replace("\\", r"\\").replace("\n", r"\n")
    esc = _metric_name(shown)
    out.append(f"# HELP {esc} {doc}\n")
    out.append(f"# TYPE {esc} {_TEXT_TYPE.get(mtype, mtype)}\n")
    om: dict[str, list[str]] = {}
    om_names = {name + suffix: suffix for suffix in _OM_SUFFIXES}
    for s in metric.samples:
        suffix = om_names.get(s.name)
        if suffix is None:
            out.append(_line(s))
        else:
            om.setdefault(suffix, []).append(_line(s))
    for suffix, lines in sorted(om.items()):
        esc = _metric_name(name + suffix)
        out.append(f"# HELP {esc} {doc}\n")
        out.append(f"# TYPE {esc} gauge\n")
        out.extend(lines)
    return "".join(out)


# the attribute a frozen family carries its text in (``freeze``)
_TEXT_ATTR = "_fabricmon_text"


def freeze(metric: Any) -> Any:
    """``metric`` with its text rendered now and kept on it: ``render`` writes that text, not the samples.
    For families a collector builds once per version of what they show (the topology's hundreds of info
    series) and yields again until it changes; adding samples after this is not seen."""
    setattr(metric, _TEXT_ATTR, _family(metric))
    return metric


def render(registry: Any) -> bytes:
    """What ``prometheus_client.generate_latest(registry)`` returns (its default escaping)."""
    out: list[str] = []
    for metric in registry.collect():
        text = getattr(metric, _TEXT_ATTR, None)
        out.append(text if text is not None else _family(metric))
    return "".join(out).encode("utf-8")
