"""The rules mixin (deploy/prometheus/mixin.py) loaded as a module."""

from __future__ import annotations

import importlib.util
import sys

from support.promtools import REPO

PROM = REPO / "deploy" / "prometheus"


MIXIN = PROM / "mixin.py"


def _mixin():
    spec = importlib.util.spec_from_file_location("fabricmon_rules_mixin", MIXIN)
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod  # dataclasses look their module up
    spec.loader.exec_module(mod)
    return mod
