"""Host source (psutil) on this machine, plus the CPU-ratio arithmetic on canned cpu_times."""

from __future__ import annotations

import time
from collections import namedtuple

import psutil
from prometheus_client.parser import text_string_to_metric_families

from fabricmon.agent.exporter import exposition
from fabricmon.agent.poller import Poller
from fabricmon.metrics import SPECS
from fabricmon.model import Semantics
from fabricmon.sources.host import HostSource
from fabricmon.sources.inventory import Inventory

CpuTimes = namedtuple("CpuTimes", "user nice system idle iowait irq softirq steal guest guest_nice")


def _inv() -> Inventory:
    return Inventory(sysfs_root="")


def test_first_poll_primes_cpu_then_ratio_plausible() -> None:
    src = HostSource()
    first = src.poll(_inv())
    assert first.up and first.errors == 0
    assert not [r for r in first.readings if r.family == "fabricmon_host_cpu_utilization_ratio"]
    sum(i * i for i in range(200_000))  # some CPU time between the polls
    time.sleep(0.05)  # cpu_times advance in clock ticks
    second = src.poll(_inv())
    (cpu,) = [r for r in second.readings if r.family == "fabricmon_host_cpu_utilization_ratio"]
    assert 0.0 <= cpu.value <= 1.0


def test_cpu_ratio_counts_iowait_as_idle_and_guest_once() -> None:
    times = iter([
        CpuTimes(100, 0, 50, 800, 50, 0, 0, 0, 10, 0),
        # +30 user (of which +10 guest, already inside user), +10 system, +40 idle, +20 iowait
        CpuTimes(130, 0, 60, 840, 70, 0, 0, 0, 20, 0),
    ])
    src = HostSource(cpu_times=lambda: next(times))
    src.poll(_inv())
    (cpu,) = [r for r in src.poll(_inv()).readings if r.family == "fabricmon_host_cpu_utilization_ratio"]
    assert cpu.value == (30 + 10) / (30 + 10 + 40 + 20)


def test_readings_types_and_values() -> None:
    res = HostSource().poll(_inv())
    by_family: dict[str, list] = {}
    for r in res.readings:
        assert r.family in SPECS
        assert [k for k, _ in r.labels] == list(SPECS[r.family].labels)
        by_family.setdefault(r.family, []).append(r)
    (load,) = by_family["fabricmon_host_load1"]
    assert load.value >= 0 and load.semantics is Semantics.GAUGE
    (total,) = by_family["fabricmon_host_memory_total_bytes"]
    (avail,) = by_family["fabricmon_host_memory_available_bytes"]
    assert total.value == psutil.virtual_memory().total
    assert 0 < avail.value <= total.value

    nics = set(psutil.net_io_counters(pernic=True)) - {"lo"}
    rx = {dict(r.labels)["interface"]: r for r in by_family.get("fabricmon_host_network_receive_bytes_total", [])}
    assert set(rx) == nics
    for fam in ("fabricmon_host_network_receive_bytes_total", "fabricmon_host_network_transmit_bytes_total",
                "fabricmon_host_network_drops_total", "fabricmon_host_network_errors_total"):
        for r in by_family.get(fam, []):
            labels = dict(r.labels)
            assert labels["interface"] != "lo"
            assert r.semantics is Semantics.MONOTONIC and r.group == f"net/{labels['interface']}"
            assert isinstance(r.value, int) and r.value >= 0
            if "direction" in labels:
                assert labels["direction"] in ("rx", "tx")
    for ifname in nics:
        dirs = sorted(dict(r.labels)["direction"] for r in by_family["fabricmon_host_network_drops_total"]
                      if dict(r.labels)["interface"] == ifname)
        assert dirs == ["rx", "tx"]


def test_exposition_through_poller_excludes_lo() -> None:
    poller = Poller("node-000", [HostSource()], _inv)
    try:
        poller.poll_once()
        time.sleep(0.05)  # cpu_times advance in clock ticks
        snap = poller.poll_once()
    finally:
        poller.close()
    (st,) = [s for s in snap.sources if s.source == "host"]
    assert st.up and st.errors_total == 0
    names: set[str] = set()
    for fam in text_string_to_metric_families(exposition(snap).decode()):
        for s in fam.samples:
            names.add(s.name)
            assert s.labels.get("interface") != "lo"
            assert s.labels["node"] == "node-000"
    assert {"fabricmon_host_cpu_utilization_ratio", "fabricmon_host_load1", "fabricmon_host_memory_total_bytes",
            "fabricmon_host_memory_available_bytes"} <= names


def test_poll_within_one_tick_keeps_baseline() -> None:
    times = iter([
        CpuTimes(100, 0, 0, 100, 0, 0, 0, 0, 0, 0),
        CpuTimes(100, 0, 0, 100, 0, 0, 0, 0, 0, 0),  # no tick elapsed: nothing reported
        CpuTimes(150, 0, 0, 150, 0, 0, 0, 0, 0, 0),
    ])
    src = HostSource(cpu_times=lambda: next(times))
    src.poll(_inv())
    assert not [r for r in src.poll(_inv()).readings if r.family == "fabricmon_host_cpu_utilization_ratio"]
    (cpu,) = [r for r in src.poll(_inv()).readings if r.family == "fabricmon_host_cpu_utilization_ratio"]
    assert cpu.value == 0.5


def test_constructed_from_agent_config() -> None:
    from dataclasses import replace

    from fabricmon.agent.runtime import source_context
    from fabricmon.config import AgentConfig, HostConfig, SourcesConfig
    from fabricmon.sources.host import SOURCE

    cfg = AgentConfig(sources=replace(SourcesConfig(), host=HostConfig(timeout=0.25)))
    src = SOURCE.build(cfg.sources.host, source_context(cfg))  # as agent/runtime.py builds it
    assert src is not None and src.name == "host" and src.timeout == 0.25
    assert HostSource().timeout == HostConfig().timeout
    assert HostSource(cfg.sources.host, timeout=1.5).timeout == 1.5
    # a fixture or simulated sysfs tree: this machine's /proc would describe another host
    assert SOURCE.build(cfg.sources.host, source_context(replace(cfg, sysfs_root="/tmp/fx/sys"))) is None
