"""Opens and reads from outside that could block the agent (issue 26, "Blocking opens").

A FIFO swapped into the NCCL Inspector dump dir between the scan's ``lstat`` and the
``open`` blocked the worker for good, and its pool thread kept the agent from
exiting on SIGTERM; one blocking sysfs read took every device's IB series away
while ``/readyz`` said 200.  Real FIFOs (``os.mkfifo``) and an injected reader that
blocks on an event stand in for a stuck driver; every wait here has a deadline.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import threading
import time
from types import SimpleNamespace

import pytest

from fabricmon.agent.nccl_inspector import NcclInspectorSource
from fabricmon.agent.poller import Poller
from fabricmon.model import Reading, SourceResult
from fabricmon.sources import guarded_io
from fabricmon.sources.base_io import read_text
from fabricmon.sources.infiniband import InfinibandSource
from fabricmon.sources.inventory import Inventory, discover
from support.blocking import _Blocking
from support.nccllines import rec
from support.paths import REPO
from support.waiting import wait_until


def _in_thread(fn, timeout: float = 5.0):
    """Run ``fn`` on a daemon thread; (finished in time, its result).  A blocked call cannot hang the test."""
    out: list = []
    t = threading.Thread(target=lambda: out.append(fn()), daemon=True)
    t.start()
    t.join(timeout)
    return (not t.is_alive()), (out[0] if out else None)


# ---------------------------------------------------------------- open_regular


def test_open_regular_refuses_a_fifo_without_blocking(tmp_path):
    fifo = tmp_path / "state"
    os.mkfifo(fifo)
    finished, _ = _in_thread(lambda: pytest.raises(guarded_io.NotRegularFile, guarded_io.open_regular, str(fifo)))
    assert finished

    def refused() -> bool:
        with pytest.raises(OSError, match="a FIFO, not a regular file"):
            read_text(str(fifo))  # the sysfs helper every discovery read goes through
        return True

    assert _in_thread(refused) == (True, True)


def test_open_regular_refuses_a_final_symlink_and_reads_a_file(tmp_path):
    (tmp_path / "rate").write_text("400 Gb/sec (4X NDR)\n")
    os.symlink(tmp_path / "rate", tmp_path / "link")
    with pytest.raises(OSError):
        guarded_io.open_regular(str(tmp_path / "link"))
    assert read_text(str(tmp_path / "rate")) == "400 Gb/sec (4X NDR)"


# ---------------------------------------------------------------- NCCL Inspector tail


def test_fifo_swapped_in_after_the_scan_does_not_block_the_tail(tmp_path, monkeypatch):
    log = tmp_path / "host-pid1.log"
    log.write_text("")
    src = NcclInspectorSource(str(tmp_path))
    log.write_text(rec(sn=1) * 3)  # new records since the start: the next poll opens the file
    scan = NcclInspectorSource._scan

    def scan_then_swap(self, errors):
        found = scan(self, errors)  # lstat saw a regular file...
        os.unlink(log)
        os.mkfifo(log)  # ...and a FIFO takes its name before the open
        return found

    monkeypatch.setattr(NcclInspectorSource, "_scan", scan_then_swap)
    finished, res = _in_thread(src.poll)
    assert finished, "the NCCL tail blocked on a FIFO"
    assert any("host-pid1.log" in m and "FIFO" in m for m in res.messages), res.messages
    # and a FIFO present at start (the newline probe) does not block the constructor either
    finished, _ = _in_thread(lambda: NcclInspectorSource(str(tmp_path)))
    assert finished


# ---------------------------------------------------------------- stuck sources and devices


class _Fine:
    name = "fine"
    timeout = 0.5

    def poll(self, inventory) -> SourceResult:
        return SourceResult(self.name, readings=[Reading("fabricmon_host_up", (), 1.0)])

    def close(self) -> None:
        pass


def test_a_stuck_source_costs_only_itself_and_is_not_restarted():
    stuck, fine = _Blocking(), _Fine()
    poller = Poller("node-000", [stuck, fine], lambda: Inventory(sysfs_root=""))
    try:
        for _ in range(3):
            snap = poller.poll_once()
            st = {s.source: s for s in snap.sources}
            assert not st["stuckdrv"].up and st["stuckdrv"].stuck == ("stuckdrv",)
            assert st["fine"].up and any(s.family == "fabricmon_host_up" for s in snap.samples)
        assert stuck.calls == 1  # one outstanding read: never asked again while blocked
        stuck.release.set()
        assert wait_until(lambda: not poller.poll_once().sources[0].stuck, 5.0)
    finally:
        stuck.release.set()
        poller.close()


def test_agent_exits_while_a_read_is_stuck():
    """The poll worker of a stuck source is a daemon thread nothing joins: the process ends."""
    code = textwrap.dedent("""
        import threading, sys
        sys.path.insert(0, "tests")
        from support.blocking import _Blocking
        from fabricmon.agent.poller import Poller
        from fabricmon.sources.inventory import Inventory
        p = Poller("node-000", [_Blocking()], lambda: Inventory(sysfs_root=""))
        snap = p.poll_once()
        assert snap.sources[0].stuck, snap.sources
        p.close()
        print("closed", flush=True)
    """)
    t0 = time.monotonic()
    try:
        out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=20,
                             cwd=REPO)
    except subprocess.TimeoutExpired:
        pytest.fail("the process did not exit with a source stuck in a read")
    assert out.returncode == 0 and "closed" in out.stdout, out.stderr[-2000:]
    assert time.monotonic() - t0 < 20


@pytest.fixture
def nine_nic_tree(make_fixture):
    root = make_fixture(layout="roce", snapshots=1)
    return discover(str(root / "sys"))


def test_one_stuck_hca_costs_only_its_own_series(nine_nic_tree, monkeypatch):
    inv = nine_nic_tree
    devices = sorted({p.device for p in inv.ports})
    victim = devices[1]
    release = threading.Event()
    calls = {"victim": 0}
    # 0.7 s for the healthy devices: 0.21 s was eaten by a loaded CI worker's pause (a full collection,
    # the CPUs taken) and devices were reported blocked that were not
    src = InfinibandSource(timeout=1.0)
    real = src._poll_device

    def poll_device(ports, dev, memo, *rest):
        if ports[0].device == victim:
            calls["victim"] += 1
            release.wait(30)  # a read asleep in the driver
        return real(ports, dev, memo, *rest)

    monkeypatch.setattr(src, "_poll_device", poll_device)
    try:
        healthy = {d for d in devices if d != victim}
        for _ in range(2):
            t0 = time.monotonic()
            res = src.poll(inv)
            assert time.monotonic() - t0 < 2.0  # the source keeps its own deadline
            seen = {dict(r.labels).get("device") for r in res.readings if r.family == "fabricmon_ib_port_up"}
            assert seen == healthy  # every other device is served
            assert not res.up and res.stuck == [victim]
            assert any(victim in m and "blocked" in m for m in res.messages)
        assert calls["victim"] == 1  # not retried until its read returns
        release.set()
        assert wait_until(lambda: src.poll(inv).up, 5.0)
        res = src.poll(inv)
        up = {dict(r.labels).get("device") for r in res.readings if r.family == "fabricmon_ib_port_up"}
        assert up == set(devices)
    finally:
        release.set()
        src.close()


def test_readyz_names_the_stuck_source(tmp_path):
    from fabricmon.agent.runtime import build_agent
    from fabricmon.config import AgentConfig

    stuck = _Blocking()
    agent = build_agent(AgentConfig(node_name="node-000", sysfs_root=str(tmp_path)), sources=[stuck, _Fine()])
    try:
        agent.poller.poll_once()
        problems = agent.not_ready()
        assert any(p.startswith("stuckdrv: read blocked past its deadline") for p in problems), problems
        stuck.release.set()
        assert wait_until(lambda: (agent.poller.poll_once(), not any(
            p.startswith("stuckdrv") for p in agent.not_ready()))[1], 5.0), agent.not_ready()
    finally:
        stuck.release.set()
        agent.poller.close()


def test_one_stuck_netdev_costs_only_its_own_ethtool_series(tmp_path, monkeypatch):
    from fabricmon.sources.ethtool import EthtoolConfig, EthtoolSource

    # `ethtool -S` format as the fixture trees write it (real mlx5 names)
    for i in range(3):
        (tmp_path / f"eth{i}.txt").write_text("NIC statistics:\n     rx_prio3_pause: 5\n     tx_prio3_pause: 7\n")
    os.mkfifo(tmp_path / "eth3.txt")  # a FIFO in the fixture dir: refused, never blocks
    src = EthtoolSource(config=EthtoolConfig(interfaces=("eth0", "eth1", "eth2", "eth3"), timeout=1.0),
                        ethtool_dir=str(tmp_path))
    release = threading.Event()
    calls = {"eth1": 0}
    real = src._read

    def read(iface):
        if iface == "eth1":
            calls["eth1"] += 1
            release.wait(30)  # an ioctl asleep in the driver
        return real(iface)

    monkeypatch.setattr(src, "_read", read)
    inv = Inventory(sysfs_root="")
    try:
        for _ in range(2):
            finished, res = _in_thread(lambda: src.poll(inv), 3.0)
            assert finished
            up = {dict(r.labels)["interface"]: r.value for r in res.readings if r.family == "fabricmon_ethtool_up"}
            assert up == {"eth0": 1.0, "eth1": 0.0, "eth2": 1.0, "eth3": 0.0}, up
            assert res.stuck == ["eth1"] and not res.up
            assert any("eth3" in m and "FIFO" in m for m in res.messages), res.messages
        assert calls["eth1"] == 1
        release.set()
        assert wait_until(lambda: not src.poll(inv).stuck, 5.0)
    finally:
        release.set()
        src.close()


# ---------------------------------------------------------------- run_all: one at a time, all at once past a stall


def test_run_all_takes_the_keys_one_at_a_time_while_each_returns_promptly(monkeypatch):
    """Nine device threads parsing at once only fought over the GIL (issue 39): the calls run in turn."""
    monkeypatch.setattr(guarded_io, "STALL_S", 5.0)  # a busy machine's late wake-up is not a stall here
    workers = guarded_io.KeyedWorkers("t")
    lock = threading.Lock()
    running = [0]
    most = [0]

    def read(key):
        with lock:
            running[0] += 1
            most[0] = max(most[0], running[0])
        time.sleep(0.005)  # long enough that calls started together would overlap
        with lock:
            running[0] -= 1
        return key * 2

    try:
        done, failed = guarded_io.run_all(workers, {k: (read, (k,)) for k in range(6)}, 30.0)
        assert done == {k: k * 2 for k in range(6)} and failed == {}
        assert most[0] == 1
    finally:
        workers.close()


def test_run_all_runs_the_rest_at_once_when_one_key_stalls():
    """A stuck device still costs only itself: past the stall, the keys not yet run start together
    (a barrier only the four of them at once can pass) and are all served within the deadline."""
    workers = guarded_io.KeyedWorkers("t")
    release = threading.Event()
    together = threading.Barrier(4, timeout=3.0)

    def stuck():
        release.wait(30)  # a read asleep in the driver
        return "late"

    def healthy(key):
        together.wait()
        return key

    calls = {"a": (stuck, ()), **{k: (healthy, (k,)) for k in "bcde"}}
    try:
        finished, out = _in_thread(lambda: guarded_io.run_all(workers, calls, 2.0), 10.0)
        assert finished
        done, failed = out
        assert done == {k: k for k in "bcde"}
        assert failed == {"a": "read blocked past its 2.00s deadline"}
        # the next pass: the stuck key is not asked again, the others are served one at a time
        done, failed = guarded_io.run_all(workers, {"a": (stuck, ()), "b": (lambda: "b", ())}, 2.0)
        assert done == {"b": "b"} and failed == {"a": "previous read still blocked"}
    finally:
        release.set()
        workers.close()


def test_run_all_runs_the_rest_at_once_once_a_quarter_of_the_deadline_is_gone(monkeypatch):
    """On a busy machine every read is slow and none stuck: taken one at a time to the end, the last
    HCAs were reported blocked.  Past a quarter of the deadline the keys not yet run start together (a
    barrier only the seven of them at once can pass).  The deadline runs on a clock each read moves by
    a tenth of it, so the test waits on no real time."""
    clock = [1000.0]
    lock = threading.Lock()
    monkeypatch.setattr(guarded_io, "time", SimpleNamespace(monotonic=lambda: clock[0]))
    monkeypatch.setattr(guarded_io, "STALL_S", 60.0)  # no read here is a stall
    together = threading.Barrier(7, timeout=5.0)
    order: list[int] = []

    def slow(key):
        with lock:
            clock[0] += 10.0  # a tenth of the 100 s deadline
            order.append(key)
        if key >= 3:
            together.wait()
        return key

    workers = guarded_io.KeyedWorkers("t")
    try:
        finished, out = _in_thread(lambda: guarded_io.run_all(workers, {k: (slow, (k,)) for k in range(10)}, 100.0),
                                   20.0)
        assert finished
        done, failed = out
        assert done == {k: k for k in range(10)} and failed == {}
        assert order[:3] == [0, 1, 2]  # one at a time until 30 s of the deadline were gone
    finally:
        workers.close()
