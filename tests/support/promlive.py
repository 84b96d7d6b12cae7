"""Panel queries as Grafana sends them."""

from __future__ import annotations

import re

# Grafana's $__rate_interval at a 1 s scrape: max(4 x scrape interval, step + scrape) = 4 s.
RATE_INTERVAL = "4s"


def substitute(expr: str) -> str:
    """A panel query as Grafana sends it with every variable at "All" (``.*``)."""
    expr = expr.replace("$__rate_interval", RATE_INTERVAL)
    return re.sub(r"\$\{?(\w+)\}?", ".*", expr)
