"""NCCL Inspector tail under hostile input: huge values, bad names, series bounds, rename rotation."""

from __future__ import annotations

import math
import os

from prometheus_client.parser import text_string_to_metric_families

from fabricmon.agent.exporter import exposition
from fabricmon.agent.nccl_inspector import NcclInspectorSource
from fabricmon.agent.poller import Poller
from fabricmon.model import Reading, Semantics, SourceResult
from fabricmon.sources.inventory import Inventory
from support.nccllines import rec


class Steady:
    """A healthy source standing in for IB/ethtool/NVML: one gauge every poll."""

    name = "steady"
    timeout = 1.0

    def poll(self, inventory) -> SourceResult:
        return SourceResult(self.name, readings=[Reading("fabricmon_host_load1", (), 1.5)])

    def close(self) -> None:
        pass


def poller(*sources) -> Poller:
    return Poller("n", list(sources), discover=lambda: Inventory(sysfs_root=""))


def count(res, rank="0", coll="AllReduce"):
    for r in res.readings:
        if r.family == "fabricmon_nccl_collectives_total" and dict(r.labels)["rank"] == rank \
                and dict(r.labels)["collective"] == coll:
            return r.value
    return None


def test_huge_values_never_overflow_and_other_sources_keep_polling(tmp_path):
    src = NcclInspectorSource(str(tmp_path))
    p = poller(src, Steady())
    (tmp_path / "r0.log").write_text(rec(size=1e308, us=1e308) * 2 + rec(sn=3))
    for _ in range(3):
        snap = p.poll_once()
        fams = {s.family: s.value for s in snap.samples}
        assert fams["fabricmon_host_load1"] == 1.5
        assert all(math.isfinite(s.value) for s in snap.samples)
        list(text_string_to_metric_families(exposition(snap).decode()))
    assert {st.source: st.up for st in snap.sources}["nccl_inspector"]
    assert src.rejected["out_of_range"] == 2
    assert fams["fabricmon_nccl_collectives_total"] == 1


def test_a_source_with_an_unconvertible_value_costs_only_itself():
    class Bad:
        name = "bad"
        timeout = 1.0

        def poll(self, inventory):
            return SourceResult(self.name, readings=[
                Reading("fabricmon_nccl_collective_bytes_total", (("rank", "0"), ("comm", "c"), ("collective", "x")),
                        float("inf"), Semantics.MONOTONIC),
                Reading("fabricmon_nccl_collectives_total", (("rank", "0"), ("comm", "c"), ("collective", "x")),
                        10**400, Semantics.MONOTONIC)])

        def close(self):
            pass

    p = poller(Bad(), Steady())
    for _ in range(2):
        snap = p.poll_once()
        assert {s.family: s.value for s in snap.samples}["fabricmon_host_load1"] == 1.5
        bad = {st.source: st for st in snap.sources}["bad"]
        assert bad.errors_total >= 1


def test_lone_surrogate_collective_name_is_rejected_and_scrape_survives(tmp_path):
    src = NcclInspectorSource(str(tmp_path))
    p = poller(src)
    bad = rec().replace('"coll":"AllReduce"', '"coll":"\\ud800"')
    ctl = rec().replace('"coll":"AllReduce"', '"coll":"All\\nReduce"')
    badcomm = rec().replace('"id":"0x7f8c496ae9f661"', '"id":"\\udfff"')
    (tmp_path / "r0.log").write_text(bad + ctl + badcomm + "\xff\n" + rec())
    snap = p.poll_once()
    text = exposition(snap).decode("utf-8")
    fams = {f.name: f for f in text_string_to_metric_families(text)}
    assert [s.value for s in fams["fabricmon_nccl_collectives"].samples] == [1.0]
    assert sum(src.rejected.values()) == 4


def test_series_are_bounded_and_drops_counted(tmp_path):
    src = NcclInspectorSource(str(tmp_path), max_series=100)
    (tmp_path / "r0.log").write_text("".join(rec(comm=f"0x{i:x}") for i in range(5000)))
    res = src.poll()
    series = {r.labels for r in res.readings if r.family == "fabricmon_nccl_collectives_total"}
    assert len(series) == 100
    dropped = {dict(r.labels)["reason"]: r.value for r in res.readings
               if r.family == "fabricmon_intake_series_dropped_total" and dict(r.labels)["source"] == "nccl_inspector"}
    assert dropped["limit"] == 4900


def test_idle_series_expire_and_free_their_slots(tmp_path):
    now = [0.0]
    src = NcclInspectorSource(str(tmp_path), max_series=1, series_ttl=10.0, clock=lambda: now[0])
    f = tmp_path / "r0.log"
    f.write_text(rec(comm="0xa"))
    assert count(src.poll()) == 1
    now[0] += 11
    with open(f, "a") as fh:
        fh.write(rec(comm="0xb"))
    res = src.poll()
    assert {dict(r.labels)["comm"] for r in res.readings if r.family == "fabricmon_nccl_collectives_total"} == {"0xb"}


def test_rename_rotation_does_not_double_count(tmp_path):
    src = NcclInspectorSource(str(tmp_path))
    f = tmp_path / "r0.log"
    f.write_text(rec() * 3)
    assert count(src.poll()) == 3
    os.rename(f, tmp_path / "r0.log.1")   # logrotate-style rename; NCCL keeps appending to it
    with open(tmp_path / "r0.log.1", "a") as fh:
        fh.write(rec())
    assert count(src.poll()) == 4
    f.write_text(rec() * 2)                  # a new file under the old name: read from its beginning
    assert count(src.poll()) == 6
    os.link(f, tmp_path / "r0.hardlink")     # the same inode under two names is read once
    with open(f, "a") as fh:
        fh.write(rec())
    assert count(src.poll()) == 7


def test_overlong_line_is_dropped_and_counted(tmp_path):
    src = NcclInspectorSource(str(tmp_path))
    (tmp_path / "r0.log").write_text('{"x":"' + "a" * (200 * 1024) + '"}\n' + rec())
    res = src.poll()
    assert count(res) == 1 and src.rejected["too_long"] == 1


def test_only_the_newest_files_of_an_overfull_directory_are_tailed(tmp_path, monkeypatch):
    import fabricmon.agent.nccl_inspector as ni

    monkeypatch.setattr(ni, "MAX_FILES", 3)
    src = NcclInspectorSource(str(tmp_path))
    for i in range(6):
        f = tmp_path / f"old-{i}.log"
        f.write_text(rec(rank=i))
        os.utime(f, ns=(10**18 + i, 10**18 + i))  # old-3, old-4 and old-5 are the newest
    res = src.poll()
    ranks = {dict(r.labels)["rank"] for r in res.readings if r.family == "fabricmon_nccl_collectives_total"}
    assert ranks == {"3", "4", "5"}
