"""The start-up hold (issue 36): a node that just booted pages nothing for link state.

Every IB port waits in INIT (physical LinkUp) for the subnet manager's sweep after a reboot; the agent
starts before that.  Before the hold the aggregator opened a critical FabricLinkDown within a second."""

from __future__ import annotations

from dataclasses import replace

from fabricmon.aggregator.agents_down import restart_grace
from fabricmon.aggregator.config import DetectionSettings
from fabricmon.aggregator.startup_hold import StartupHold
from support.enginerig import T0, Cluster, _set_state

INIT, ARMED, ACTIVE, DOWN = 2, 3, 4, 1
LINK_UP, POLLING = 5, 2


def _booted(c: Cluster, node: str, boot_time: float) -> None:
    """The node's agent says hello with its boot time (as the real agent reads /proc/stat's btime)."""
    f = c.feeds[node]
    c.engine.hello(replace(f.hello(boot_id="boot-2"), boot_time=boot_time))


def _every_port(c: Cluster, node: str, state: int, phys: int):
    def inject(cl: Cluster) -> None:
        for nic in cl.feeds[node].spec.nics:
            _set_state(cl, node, nic.device, state, phys)
    return inject


def _opened(c: Cluster) -> list[tuple[str, str]]:
    return [(a, comp) for _, a, comp, is_open in c.reported if is_open]


def test_a_node_booting_with_every_port_init_pages_nothing_within_the_hold():
    c = Cluster(nodes=4, nodes_per_unit=4)
    c.run(3)
    _booted(c, "node-001", c.t)  # it just booted: its agent starts with every port INIT
    c.run(25, _every_port(c, "node-001", INIT, LINK_UP))
    assert _opened(c) == []
    c.run(3, _every_port(c, "node-001", ACTIVE, LINK_UP))  # the subnet manager swept: ACTIVE
    assert _opened(c) == []


def test_a_whole_node_down_at_once_within_the_hold_is_its_reboot_not_a_page():
    c = Cluster(nodes=4, nodes_per_unit=4)
    c.run(2)
    _booted(c, "node-002", c.t)
    c.run(20, _every_port(c, "node-002", DOWN, POLLING))
    assert _opened(c) == []


def test_init_with_link_up_past_the_hold_is_a_warning_waiting_for_the_subnet_manager():
    c = Cluster(nodes=4, nodes_per_unit=4)
    c.run(2)
    _booted(c, "node-001", c.t)
    dev = c.feeds["node-001"].spec.nics[0].device
    c.run(1, lambda cl: _set_state(cl, "node-001", dev, INIT, LINK_UP))
    c.run(int(restart_grace(DetectionSettings(), 1.0)) + 3)
    [inc] = c.incidents(alertname="FabricLinkDown")
    assert inc.component == f"node-001/{dev}/1" and inc.severity == "warning"
    assert "waiting for the subnet manager" in inc.description


def test_a_port_down_outside_any_hold_still_pages_critical_at_once():
    c = Cluster(nodes=4, nodes_per_unit=4)
    _booted(c, "node-001", T0 - 3600.0)  # booted an hour ago: no hold
    c.run(2)
    dev = c.feeds["node-001"].spec.nics[0].device
    c.run(3, lambda cl: _set_state(cl, "node-001", dev, DOWN, POLLING))
    [inc] = c.incidents(alertname="FabricLinkDown")
    assert inc.severity == "critical"


def test_hold_runs_from_the_boot_or_from_a_reboot_hello_of_an_older_agent():
    s = DetectionSettings()
    h = StartupHold()
    h.hello("a", T0, 0.0, rebooted=False)  # an older agent's first hello: nothing says it booted
    assert not h.held("a", T0 + 1, 1.0, s)
    h.hello("a", T0 + 10, 0.0, rebooted=True)  # its boot id changed: it rebooted
    assert h.held("a", T0 + 69, 1.0, s) and not h.held("a", T0 + 70, 1.0, s)
    h.hello("b", T0, T0 - 50.0, rebooted=False)  # booted 50 s ago
    assert h.held("b", T0 + 9, 1.0, s) and not h.held("b", T0 + 10, 1.0, s)
    assert h.held("b", T0 + 99, 30.0, s)  # 5 intervals of 30 s are longer than 60 s


def test_the_hello_carries_the_boot_time_read_from_proc_stat(tmp_path):
    import pytest

    from fabricmon.proto.codec import MalformedBatch, hello_from_pb, hello_to_pb
    from fabricmon.sources.host import read_boot_time

    # /proc/stat's btime line as proc(5) documents it ("btime 1764000000": boot time, seconds since the epoch)
    (tmp_path / "stat").write_text("cpu  10 0 5 100 0 0 0 0 0 0\nbtime 1764000000\nprocesses 42\n")
    assert read_boot_time(str(tmp_path / "stat")) == 1764000000.0
    assert read_boot_time(str(tmp_path / "missing")) == 0.0
    for bad in ("nan", "inf", "-5", "1e400", "x"):  # never a boot time the hello refuses or the rules hold on
        (tmp_path / "bad").write_text(f"btime {bad}\n")
        assert read_boot_time(str(tmp_path / "bad")) == 0.0, bad
    h = replace(Cluster(nodes=1, nodes_per_unit=1).feeds["node-000"].hello(), boot_time=1764000000.0)
    assert hello_from_pb(hello_to_pb(h)).boot_time == 1764000000.0
    bad = hello_to_pb(h)
    bad.boot_time_seconds = -1.0
    with pytest.raises(MalformedBatch, match="hello.boot_time_seconds"):
        hello_from_pb(bad)
