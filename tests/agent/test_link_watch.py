"""The agent's link watch (agent/linkwatch.py) and the poller's off-cadence polls (OffCadenceGate):
a link state change between polls triggers one full poll; a flapping link at most one between two
regular polls; vanished, junk or stuck files cost their own link, counted, never the watch."""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path

import pytest

from fabricmon.agent import linkwatch as lw
from fabricmon.agent.linkwatch import LinkWatch, watched_links
from fabricmon.agent.poller import OffCadenceGate, Poller
from fabricmon.agent.runtime import build_agent, make_link_watch
from fabricmon.config import AgentConfig, ConfigError, load_agent_config
from fabricmon.sources.inventory import Inventory, discover
from support.agentrig import http_get, metric, parse_metrics
from support.countingsource import CountingSource

DEV = "mlx5_3"


def _put(path: Path, text: str) -> None:
    """Atomically, as sysfs changes a value: a reader never sees half a file."""
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(text)
    os.replace(tmp, path)


def _port(root: Path, dev: str = DEV) -> Path:
    return root / "sys" / "class" / "infiniband" / dev / "ports" / "1"


def _netdev(inv: Inventory, dev: str = DEV) -> str:
    return next(p.netdev for p in inv.ports if p.device == dev)


class _Requests:
    def __init__(self) -> None:
        self.n = 0

    def __call__(self) -> None:
        self.n += 1


def _watch(root: Path, extra: tuple[str, ...] = ()) -> tuple[LinkWatch, _Requests, Inventory]:
    inv = discover(str(root / "sys"), extra_netdevs=extra)
    req = _Requests()
    return LinkWatch(lambda: inv, req, 1.0), req, inv


def test_watched_files_are_the_sources_files(make_fixture):
    root = make_fixture(layout="roce")
    inv = discover(str(root / "sys"), extra_netdevs=("lo0",))
    links = watched_links(inv)
    by_key = {link.key: link for link in links}
    assert len(inv.ports) == 9 and set(by_key) == {f"{p.device}/1" for p in inv.ports} | {"lo0"}
    port = by_key[f"{DEV}/1"]
    names = [os.path.relpath(path, root / "sys") for path, _ in port.files]
    nd = _netdev(inv)
    assert names == [f"class/infiniband/{DEV}/ports/1/state", f"class/infiniband/{DEV}/ports/1/phys_state",
                     f"class/infiniband/{DEV}/ports/1/rate", f"class/infiniband/{DEV}/ports/1/counters/link_downed",
                     f"class/net/{nd}/operstate", f"class/net/{nd}/carrier_changes",
                     f"class/net/{nd}/carrier_down_count"]
    assert [w.name for _, w in by_key["lo0"].files] == ["operstate", "carrier_changes", "carrier_down_count"]
    # the sources' parsers, not a second set: ids, (Gb/s, lanes), counts, the operstate word
    values = list(lw.read_link(port).values())
    assert values[:3] == [4, 5, (400.0, 4)] and values[4] == "up", values
    assert all(isinstance(v, int) for v in (values[3], values[5], values[6])), values


@pytest.mark.parametrize("change", ["state", "phys_state", "rate", "link_downed", "operstate", "carrier_changes"])
def test_a_state_change_requests_one_poll(make_fixture, change):
    root = make_fixture(layout="roce", fresh=True)
    watch, req, inv = _watch(root)
    first = watch.tick()
    assert first.changed == [] and first.watched == 9 and first.unwatched == [] and req.n == 0
    assert watch.tick().changed == [] and req.n == 0  # nothing moved: nothing asked
    port, net = _port(root), root / "sys" / "class" / "net" / _netdev(inv)
    target, text = {
        "state": (port / "state", "1: DOWN\n"), "phys_state": (port / "phys_state", "2: Polling\n"),
        "rate": (port / "rate", "200 Gb/sec (2X NDR)\n"), "link_downed": (port / "counters" / "link_downed", "2\n"),
        "operstate": (net / "operstate", "down\n"), "carrier_changes": (net / "carrier_changes", "99\n"),
    }[change]
    _put(target, text)
    p = watch.tick()
    assert p.changed == [f"{DEV}/1"] and req.n == 1
    assert watch.tick().changed == [] and req.n == 1  # the new value is the baseline now
    st = watch.stats()
    assert st["changes_total"] == 1 and st["requests_total"] == 1 and st["passes_total"] == 4
    assert st["reads_total"] == 4 * 9 * 7 and st["read_errors_total"] == 0


def test_vanished_junk_and_absent_files_cost_their_link_only(make_fixture):
    root = make_fixture(layout="roce", fresh=True)
    watch, req, inv = _watch(root)
    net = root / "sys" / "class" / "net" / _netdev(inv)
    other = root / "sys" / "class" / "net" / _netdev(inv, "mlx5_5")
    (other / "carrier_down_count").unlink()  # an older kernel: absent from the start, nothing lost
    assert watch.tick().unwatched == []
    (_port(root) / "state").unlink()  # vanished under the watch
    _put(net / "carrier_changes", "N/A\n")  # junk where a count was
    p = watch.tick()
    assert p.changed == [] and req.n == 0  # a read that fails is no state change
    assert [u.split(":")[0] for u in p.unwatched] == [f"{DEV}/1"] and p.watched == 8
    assert "state" in p.unwatched[0] and "FileNotFoundError" in p.unwatched[0]
    assert watch.stats()["links_unwatched"] == 1 and watch.stats()["read_errors_total"] == 2
    # back, with new values: a new baseline (the regular poll reads them), not a change
    _put(_port(root) / "state", "1: DOWN\n")
    _put(net / "carrier_changes", "5\n")
    p = watch.tick()
    assert p.unwatched == [] and p.changed == [] and req.n == 0
    _put(_port(root) / "state", "4: ACTIVE\n")
    assert watch.tick().changed == [f"{DEV}/1"] and req.n == 1
    # the whole port gone (hot unplug before the next discovery): counted, never raised
    gone = _port(root, "mlx5_2")
    for name in os.listdir(gone):
        if (gone / name).is_file():
            (gone / name).unlink()
    p = watch.tick()
    assert [u.split(":")[0] for u in p.unwatched] == ["mlx5_2/1"]


def test_a_stuck_device_costs_its_links_not_the_watch(make_fixture, monkeypatch):
    root = make_fixture(layout="roce")
    inv = discover(str(root / "sys"))
    release = threading.Event()
    real = lw.read_link

    def read(link):
        if link.worker == DEV:
            release.wait(10.0)  # a firmware-stuck HCA sleeping in a sysfs read
        return real(link)

    monkeypatch.setattr(lw, "read_link", read)
    req = _Requests()
    watch = LinkWatch(lambda: inv, req, 1.0, deadline=0.2)
    try:
        for _ in range(3):
            t0 = time.monotonic()
            p = watch.tick()
            assert time.monotonic() - t0 < 5.0  # bounded by the deadline, generously on a loaded machine
            assert [u.split(":")[0] for u in p.unwatched] == [f"{DEV}/1"] and p.watched == 8
        assert "blocked" in p.unwatched[0]
    finally:
        release.set()
        watch.close()


def test_gate_allows_one_off_cadence_poll_between_regular_polls():
    g = OffCadenceGate()
    assert g.take() and not g.take() and not g.take()
    g.regular()
    assert g.take() and not g.take()


def _wait(pred, seconds: float) -> bool:
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        if pred():
            return True
        time.sleep(0.01)
    return pred()


def test_poller_runs_a_requested_poll_at_once_and_holds_the_rest_until_the_next_regular_poll():
    src = CountingSource()
    p = Poller("n", [src], lambda: Inventory(sysfs_root=""))
    stop = threading.Event()
    th = threading.Thread(target=p.run, args=(stop, 30.0, False), daemon=True)  # the next regular poll is far away
    th.start()
    try:
        assert _wait(lambda: src.polls == 1, 10.0)
        p.request_poll()
        assert _wait(lambda: src.polls == 2, 10.0)  # at once, not in 30 s
        snap = p.latest
        assert snap is not None and snap.seq == 2 and 0 < snap.interval_seconds < 30.0
        for _ in range(5):  # a flapping link asks again and again
            p.request_poll()
            assert _wait(lambda: p.off_cadence_held_total >= 1, 10.0)
        assert src.polls == 2 and p.off_cadence_polls_total == 1 and p.off_cadence_held_total >= 1
    finally:
        stop.set()
        p.wake()
        th.join(5.0)
    assert not th.is_alive()


def test_config_link_watch_interval(tmp_path):
    assert AgentConfig().link_watch_interval == 1.0
    for bad in ("-1", "0.01", ".nan", "4000"):
        f = tmp_path / "a.yaml"
        f.write_text(f"link_watch_interval: {bad}\n")
        with pytest.raises(ConfigError, match="link_watch_interval"):
            load_agent_config(f)
    p = Poller("n", [], lambda: Inventory(sysfs_root=""))
    assert make_link_watch(AgentConfig(interval=5.0, link_watch_interval=0.0), p) is None  # disabled
    assert make_link_watch(AgentConfig(interval=1.0), p) is None  # every poll reads link state already
    w = make_link_watch(AgentConfig(interval=5.0), p)
    assert w is not None and w.interval == 1.0


def test_agent_on_a_node_tree_polls_within_seconds_of_a_link_going_down(make_fixture):
    """The real agent runtime (poll thread, watch thread, /metrics) at a 5 s interval."""
    root = make_fixture(layout="ib", fresh=True)
    # align_polls off: the next regular poll is 5 s after the first (aligned, it could be 1.25 s away and
    # come before the watch's change, which this test tells apart from it)
    cfg = AgentConfig(sysfs_root=str(root / "sys"), ethtool_dir=str(root / "ethtool"), interval=5.0, nvml="off",
                      listen="127.0.0.1:0", align_polls=False)
    agent = build_agent(cfg)
    watch = agent.link_watch
    assert watch is not None
    # the three files change together: a pass waits here while the test writes them
    writing = threading.Event()
    writing.set()
    inventory = watch._inventory
    watch._inventory = lambda: (writing.wait(20.0), inventory())[1]
    port = agent.start_http()
    agent.start_polling()
    try:
        assert _wait(lambda: agent.poller.latest is not None and agent.link_watch.passes_total >= 2, 20.0)
        first = agent.poller.latest
        assert first is not None and first.seq == 1  # the watch saw nothing: no poll yet besides the first
        writing.clear()
        downed_before = int((_port(root) / "counters" / "link_downed").read_text())
        _put(_port(root) / "state", "1: DOWN\n")
        _put(_port(root) / "phys_state", "3: Disabled\n")
        _put(_port(root) / "counters" / "link_downed", f"{downed_before + 1}\n")
        t0 = time.monotonic()
        writing.set()
        assert _wait(lambda: agent.poller.off_cadence_polls_total == 1, 20.0)
        took = time.monotonic() - t0
        snap = agent.poller.latest
        assert snap is not None and snap.seq == 2
        # an off-cadence batch: shorter than the 5 s interval, deltas since the first poll
        assert 0 < snap.interval_seconds < 5.0 or took > 5.0
        lab = (("device", DEV), ("port", "1"))
        assert [s.value for s in snap.samples if s.family == "fabricmon_ib_port_state" and s.labels == lab] == [1]
        downed = [d for d in snap.deltas if d.family == "fabricmon_ib_port_errors_total"
                  and dict(d.labels).get("counter") == "link_downed" and dict(d.labels)["device"] == DEV]
        assert [d.delta for d in downed] == [1.0]
        status, body = http_get(f"http://127.0.0.1:{port}/metrics", timeout=10.0)
        m = parse_metrics(body)
        node = agent.node
        assert status == 200
        assert metric(m, "fabricmon_link_watch_triggered_polls_total", node=node) == 1.0
        assert (metric(m, "fabricmon_link_watch_changes_total", node=node) or 0) >= 1.0
        assert metric(m, "fabricmon_link_watch_links_watched", node=node) == 9.0
        assert metric(m, "fabricmon_link_watch_links_unwatched", node=node) == 0.0
        # the exported counter is the file's value, whatever poll read it
        assert metric(m, "fabricmon_ib_port_errors_total", node=node, device=DEV, port="1", counter="link_downed") \
            == downed_before + 1
    finally:
        agent.stop()
