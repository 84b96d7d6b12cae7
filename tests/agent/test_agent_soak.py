"""Bounded soak (about 40 s; select with ``-m soak``, deselect with ``-m "not soak"``): the live
agent under a hostile intake client and an aggregator stopped and started several times keeps
/metrics answering with a parseable exposition and loses no batch that reached its spool.
"""

from __future__ import annotations

import threading
import time

import pytest

from support.agentrig import (
    Aggregator,
    LiveAgent,
    SimNode,
    SlowClients,
    hostile_lines,
    http_get,
    parse_metrics,
    wait_until,
)

pytestmark = [pytest.mark.integration, pytest.mark.soak]

FLAPS = 6
PER_PHASE = 8  # batches spooled while down, and received while up, in each flap (2 s at 0.25 s polls)


@pytest.fixture
def node(tmp_path):
    n = SimNode(tmp_path / "tree")
    yield n
    n.stop()


class HostileClient:
    """Posts hostile rank bodies in a loop (bounded in count and time) until stopped."""

    def __init__(self, agent: LiveAgent, max_posts: int = 5000, every: float = 0.02) -> None:
        self.agent = agent
        self.posts = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, args=(max_posts, every), daemon=True)
        self._thread.start()

    def _run(self, max_posts: int, every: float) -> None:
        while self.posts < max_posts and not self._stop.wait(every):
            self.agent.post_ranks(hostile_lines(self.posts), timeout=2.0)
            self.posts += 1

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(10)


class Scraper:
    """Scrapes /metrics in a loop; records failures and the slowest answer."""

    def __init__(self, agent: LiveAgent, every: float = 0.1) -> None:
        self.agent = agent
        self.ok = 0
        self.failures: list[str] = []
        self.slowest = 0.0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, args=(every,), daemon=True)
        self._thread.start()

    def _run(self, every: float) -> None:
        while not self._stop.wait(every) and self.ok + len(self.failures) < 10_000:
            t0 = time.monotonic()
            code, body = http_get(self.agent.url("/metrics"), timeout=5.0)
            self.slowest = max(self.slowest, time.monotonic() - t0)
            if code != 200:
                self.failures.append(f"HTTP {code}")
                continue
            try:
                parse_metrics(body)
                self.ok += 1
            except Exception as exc:
                self.failures.append(f"unparseable: {exc}")

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(10)


def test_soak_hostile_intake_and_flapping_aggregator(tmp_path, node):
    agg = Aggregator(node.topology)
    agent = LiveAgent(node, tmp_path, agg.target, interval=0.25)
    hostile = scraper = slow = None
    try:
        assert wait_until(lambda: http_get(agent.url("/readyz"))[0] == 200, 20)
        hostile = HostileClient(agent)
        scraper = Scraper(agent)
        slow = SlowClients(agent.intake_port, 16)
        for flap in range(FLAPS):
            n = len(agent.spooled)
            assert wait_until(lambda n=n: len(agent.spooled) >= n + PER_PHASE, 20), agent.stream.stats()
            agg.start()
            assert wait_until(lambda: agg.agents_connected() == 1.0, 20), (flap, agent.stream.stats())
            n_seen = len(agg.recorder.seqs())
            assert wait_until(lambda n_seen=n_seen: len(agg.recorder.seqs()) >= n_seen + PER_PHASE, 20)
            agg.stop()
        agg.start()  # and up for good: everything spooled must arrive
        assert wait_until(lambda: agg.agents_connected() == 1.0 and len(agent.stream.spool) == 0, 30), \
            agent.stream.stats()
        assert wait_until(lambda: set(agent.spooled) <= set(agg.recorder.seqs()), 30), \
            (sorted(set(agent.spooled) - set(agg.recorder.seqs()))[:5], agent.stream.stats())
        st = agent.stream.stats()
    finally:
        for x in (hostile, scraper):
            if x is not None:
                x.stop()
        if slow is not None:
            slow.close()
        agent.stop()
        agg.stop()
    assert scraper.failures == [] and scraper.ok >= 20, (scraper.ok, scraper.failures[:3])
    assert hostile.posts >= 50
    assert len(agent.spooled) >= FLAPS * PER_PHASE
    for life in agg.recorder.lives:
        assert life == sorted(life) and len(set(life)) == len(life), "seqs not increasing within one aggregator"
    assert st["batches_dropped"]["spool_write_failed"] == 0 and st["batches_dropped"]["spool_full"] == 0
    assert st["connects_total"] >= FLAPS + 1
    print(f"soak: scrapes={scraper.ok} slowest={scraper.slowest:.3f}s posts={hostile.posts} "
          f"spooled={len(agent.spooled)} delivered={len(set(agg.recorder.seqs()))} connects={st['connects_total']}")
