"""The ib_switches source's fake sweep backend (``sources.ib_switches.backend: fake:FILE``): a sweep the
real sweeper took from the tools' captured outputs (tests/fixtures/ib_switches), written as the fake
file and read back, gives the source the same series; a bad file is a failed sweep that says why."""

from __future__ import annotations

import json

import pytest

from fabricmon.config import IbSwitchesConfig
from fabricmon.configload import ConfigError, build
from fabricmon.sources.ib_switches.backend_fake import FakeSweep, fake_sweep_document
from fabricmon.sources.ib_switches.source import SOURCE, IbSwitchesSource, sweep_readings
from fabricmon.sources.inventory import Inventory
from fabricmon.sources.registry import SourceContext
from support.ibtools import Clock, FakeTools, make_sweeper


def _values(readings) -> dict:
    return {(r.family, r.labels): r.value for r in readings if r.family != "fabricmon_switch_sweep_age_seconds"}


def test_a_real_sweep_through_the_fake_file_gives_the_same_series(tmp_path):
    tools, clock = FakeTools(), Clock()
    sw = make_sweeper(tools, clock)
    snap = sw.sweep_once()
    path = tmp_path / "sweep.json"
    path.write_text(json.dumps(fake_sweep_document(snap, sw.queries)))
    fake = FakeSweep(str(path))
    got = fake.snapshot()
    assert _values(sweep_readings(got, clock())) == _values(sweep_readings(snap, clock()))
    assert any(r.family == "fabricmon_switch_port_errors_total" for r in sweep_readings(got, clock()))
    assert fake.queries == sw.queries
    sw.stop()


def test_the_source_built_with_a_fake_backend_reads_the_file(tmp_path):
    tools, clock = FakeTools(), Clock()
    sw = make_sweeper(tools, clock)
    path = tmp_path / "sweep.json"
    path.write_text(json.dumps(fake_sweep_document(sw.sweep_once(), sw.queries)))
    sw.stop()
    cfg = IbSwitchesConfig(enabled=True, backend=f"fake:{path}")
    src = SOURCE.build(cfg, SourceContext.__new__(SourceContext))  # the registry's way to the source
    assert isinstance(src, IbSwitchesSource)
    try:
        result = src.poll(Inventory("/nonexistent"))
        assert result.up and not result.errors
        assert any(r.family == "fabricmon_switch_port_up" for r in result.readings)
    finally:
        src.close()


@pytest.mark.parametrize("content, why", [
    (None, "No such file"),
    ("{", "not JSON"),
    ('{"version": 2}', "version"),
    ('{"version": 1, "ended_at": 1, "seconds": 1, "switches": [{"name": "leaf-1", "guid": "zz"}]}', "guid"),
    ('{"version": 1, "ended_at": 1, "seconds": 1, "switches": [{"name": "leaf-1", "guid": "0x1", '
     '"ports": {"3": {"errors": {"made_up": 1}}}}]}', "made_up"),
    ('{"version": 1, "ended_at": 1, "seconds": 1, "switches": [{"name": "leaf-1", "guid": "0x1", '
     '"ports": {"300": {}}}]}', "switches[0].ports.300"),
])
def test_a_bad_fake_file_is_a_failed_sweep_saying_why(tmp_path, content, why):
    path = tmp_path / "sweep.json"
    if content is not None:
        path.write_text(content)
    src = IbSwitchesSource(IbSwitchesConfig(enabled=True), sweeper=FakeSweep(str(path)), start_thread=False)
    result = src.poll(Inventory("/nonexistent"))
    assert not result.up and why in result.messages[0] and str(path) in result.messages[0]


def test_backend_must_be_tools_or_a_fake_file():
    with pytest.raises(ConfigError, match=r"agent.yaml: sources.ib_switches.backend: must be tools or fake:FILE"):
        build(IbSwitchesConfig, {"backend": "fake:"}, "sources.ib_switches", "agent.yaml")
