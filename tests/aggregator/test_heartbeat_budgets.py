"""The hang tracker against other nodes' users (issue 35 items 2, 4; docs/security.md): a (job, rank) alive
on its node is not taken over from another node, its RAS address counts only from its own history, and one
node cannot fill the cluster-wide table (budgets per node and per job, drops counted by reason)."""

from __future__ import annotations

from fabricmon.aggregator import hangs
from fabricmon.aggregator.hangs import HeartbeatTracker
from fabricmon.aggregator.ras_queries import RasQueries
from fabricmon.rank_timing import Heartbeat


def _job(t: HeartbeatTracker, ts: float, *, ranks: int = 16, node_of=lambda r: f"n{r // 8}") -> None:
    for r in range(ranks):
        t.add(Heartbeat("j", r, 7, 14 if r == 9 else 15, r != 9, ts, node_of(r), "", "localhost:28028"), "")


def test_a_rank_alive_on_its_node_is_not_taken_over_and_its_ras_address_not_redirected():
    t = HeartbeatTracker(stall_s=30)
    for k in range(0, 60, 5):
        _job(t, 1000.0 + k)
        # a user on node "evil" posts rank 3 with its own RAS server, and a rank the job never had
        t.add(Heartbeat("j", 3, 7, 15, True, 1000.0 + k, "evil", "", "127.0.0.1:4444"), "")
    t.add(Heartbeat("j", 99, 7, 15, True, 1056.0, "evil", "", "127.0.0.1:4444"), "")
    rb = t.jobs[("j", "")].ranks[3]
    assert (rb.node, rb.nccl_ras) == ("n0", "localhost:28028")
    assert t.dropped["conflict"] == 12
    # the RAS query goes to the job's own ranks, never to the address one fresh line announced
    ranks = t.jobs[("j", "")].ranks
    assert RasQueries._pick(ranks, {"n1"}, 1056.0, t, lambda n: True) == ("n0", "localhost:28028")
    assert RasQueries._pick({99: ranks[99]}, set(), 1056.0, t, lambda n: True) is None
    assert [(h.ranks, h.nodes) for h in t.hangs(1056.0)] == [((9,), ("n1",))]


def test_one_node_cannot_fill_the_table_and_drops_are_counted_by_reason(monkeypatch):
    table, posted = 8192, 16384  # 2^20 and a node posting more, in small for a test
    monkeypatch.setattr(hangs, "MAX_RANKS", table)
    t = HeartbeatTracker(stall_s=30)
    for i in range(posted):  # one node posts made-up jobs and ranks
        t.add(Heartbeat(f"fake-{i % 512}", i, 1, 1, True, 1000.0, "evil"), "")
    # a hung job elsewhere is still tracked and named
    for k in range(0, 60, 5):
        _job(t, 1000.0 + k)
    assert [(h.job, h.ranks) for h in t.hangs(1056.0)] == [("j", (9,))]
    held = sum(1 for jb in t.jobs.values() for b in jb.ranks.values() if b.node == "evil")
    assert held == hangs.MAX_RANKS_PER_NODE < table
    assert t.dropped["node_jobs"] > 0 and t.dropped["node_budget"] + t.dropped["node_jobs"] == posted - held
