"""The agent's hardware sources, each built from its own config section.

Every source module declares itself with a module-level ``SOURCE = SourceSpec(name,
config_class, build)``: ``name`` is its key under ``sources:`` in the agent config (and
its ``collector`` label), ``config_class`` the dataclass of that section (None for a
source without one, built always), and
``build(section, context)`` makes the source, or None when there is nothing to poll
here.  ``MODULES`` lists the source modules in the order the agent polls them; a source
whose section says ``enabled: false`` is not built.

Sources read their own section and the few host facts in ``SourceContext``; none sees
the whole agent config.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar

from ..config import ProfileConfig
from .base import Source

C = TypeVar("C")

# Source modules (relative to this package), in build and poll order, each with its section under
# ``sources:`` (None: no section, always built).  The section is named here so that a disabled
# source's module is never imported (the switch sweeper, the transceiver's ctypes): the agent's
# memory is what its enabled sources need (tests/sources/test_source_registry.py holds the names
# equal to the modules' own SOURCE).
MODULES: tuple[tuple[str | None, str], ...] = (
    ("infiniband", "infiniband"), ("ethtool", "ethtool"), ("fabric_config", "fabric_config"),
    ("nvml", "nvml.source"), (None, "pci_gpus"), ("transceiver", "transceiver"), ("host", "host"),
    ("ib_switches", "ib_switches.source"), ("gnmi_switches", "gnmi_switches.source"), ("jobs", "jobs"))


@dataclass(frozen=True)
class SourceContext:
    """What sources need beyond their own section: where this host is read from."""

    sysfs_root: str = "/sys"
    host_root: str = "/"  # where the host's / is seen (a container's hostPath mount): the host source's /proc
    ethtool_dir: str | None = None  # fixtures and simulation: ethtool -S dumps instead of the ioctl
    nvml: str = "auto"  # auto | off | fake:FILE
    profile: ProfileConfig = field(default_factory=ProfileConfig)  # what rail NICs are checked against


@dataclass(frozen=True)
class SourceSpec(Generic[C]):
    name: str
    config_class: type[C] | None  # None: no section of its own, always built
    build: Callable[[C, SourceContext], Source | None]


def _spec(module: str) -> SourceSpec[Any]:
    return importlib.import_module(f"{__package__}.{module}").SOURCE


def source_specs() -> tuple[SourceSpec[Any], ...]:
    """Every source module's ``SOURCE``, in ``MODULES`` order (imported here, on first use)."""
    return tuple(_spec(module) for _, module in MODULES)


def build_sources(sections: Any, context: SourceContext) -> list[Source]:
    """The enabled sources, each from its section of ``sections`` (a ``SourcesConfig``); only their
    modules are imported."""
    out: list[Source] = []
    for name, module in MODULES:
        section = getattr(sections, name) if name is not None else None
        if not getattr(section, "enabled", True):
            continue
        spec = _spec(module)
        source = spec.build(section, context)
        if source is not None:
            out.append(source)
    for source in out:  # a source that reads another's findings (jobs: NVML's GPU UUIDs) finds it here
        bind = getattr(source, "bind", None)
        if bind is not None:
            bind(out)
    return out
