"""tomllib where the standard library has it (3.11+), else tomli (pytest's own dependency on 3.10)."""

from __future__ import annotations

import sys

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - 3.10 only
    import tomli as tomllib

loads = tomllib.loads
