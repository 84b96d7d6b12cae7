"""The source registry: each source module declares its name, config section and builder, and the
agent builds every enabled source from its own section (sources/registry.py)."""

from __future__ import annotations

import dataclasses
import typing
from dataclasses import replace
from pathlib import Path
from typing import Any

from fabricmon.agent.runtime import build_sources, source_context
from fabricmon.config import AgentConfig, EthtoolConfig, SourcesConfig, TransceiverConfig, load_agent_config
from fabricmon.sources.registry import MODULES, SourceContext, source_specs
from fabricmon.sources.registry import build_sources as registry_build


def _close(sources) -> None:
    for s in sources:
        s.close()


def test_every_config_section_has_exactly_one_source_of_its_class():
    hints = typing.get_type_hints(SourcesConfig)
    sections = {f.name: hints[f.name] for f in dataclasses.fields(SourcesConfig)}
    specs = source_specs()
    assert len(specs) == len(MODULES) == len({s.name for s in specs})
    assert {s.name: s.config_class for s in specs if s.config_class is not None} == sections
    assert [s.name for s in specs if s.config_class is None] == ["pci"]  # no section: always built
    # the registry names each module's section so a disabled one is never imported: the same names
    assert [section for section, _ in MODULES] == [s.name if s.config_class is not None else None for s in specs]


def test_each_source_is_built_from_its_own_section(tmp_path: Path):
    (tmp_path / "agent.yaml").write_text(
        "ethtool_dir: eth\n"  # relative paths are kept as given: only shard paths are rebased
        f"nvml: fake:{tmp_path / 'nvml.json'}\n"
        "sources:\n"
        "  infiniband: {timeout: 0.3}\n"
        "  ethtool: {timeout: 0.4, allow: ['^rx_vport_']}\n"
        "  nvml: {timeout: 0.6}\n"
        "  fabric_config: {timeout: 0.7}\n"
        "  transceiver: {enabled: true, interval: 30}\n"
        "profile: {mtu: 4200}\n")
    cfg = load_agent_config(tmp_path / "agent.yaml")
    built = build_sources(cfg)
    try:
        by_name: dict[str, Any] = {s.name: s for s in built}
        # MODULES order; host too, since sysfs_root is this host's /sys
        # (jobs: the Slurm prolog's job files, on by default where the agent reads this host)
        assert [s.name for s in built] == ["infiniband", "ethtool", "fabric_config", "nvml", "pci", "transceiver",
                                           "host", "jobs"]
        assert {n: s.timeout for n, s in by_name.items() if n not in ("host", "pci")} == {
            "infiniband": 0.3, "ethtool": 0.4, "fabric_config": 0.7, "nvml": 0.6, "transceiver": 1.0, "jobs": 1.0}
        assert by_name["ethtool"].config.allow == ("^rx_vport_",) and by_name["ethtool"].ethtool_dir == "eth"
        assert by_name["fabric_config"].profile.mtu == 4200 and by_name["fabric_config"].ethtool_dir == "eth"
        assert by_name["transceiver"].interval == 30.0
    finally:
        _close(built)


def test_disabled_sections_and_hosts_without_a_source_build_nothing(tmp_path: Path):
    off = SourcesConfig(infiniband=replace(SourcesConfig().infiniband, enabled=False),
                        ethtool=EthtoolConfig(enabled=False), transceiver=TransceiverConfig(enabled=False))
    ctx = SourceContext(sysfs_root=str(tmp_path / "sys"), ethtool_dir=str(tmp_path), nvml="off")
    built = registry_build(off, ctx)
    try:
        # fabric_config on by default, pci always; nvml off; host off for a tree that is not this host's /sys
        assert [s.name for s in built] == ["fabric_config", "pci"]
    finally:
        _close(built)
    ctx = source_context(AgentConfig(sysfs_root="/x/sys", nvml="off"))
    assert ctx == SourceContext(sysfs_root="/x/sys", nvml="off")
