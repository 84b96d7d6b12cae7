"""benchmarks/bench_freshness.py's transport floor (``--floor``): a real agent stream client against the
floor server in its own process gets the aggregator's subscription, then an ack for every batch, and the
server counts what it acked.  If the floor stopped answering as the aggregator does, the benchmark's
floor would measure a stream that never got going.  The same through ``--together``'s relay, which holds
what the nodes send and writes it at once."""

from __future__ import annotations

import json
import signal
import subprocess
import sys

import pytest

from fabricmon.aggregator.engine import Engine
from fabricmon.proto.subscription import Subscription
from support.net import free_port
from support.paths import REPO
from support.streamrig import client, snap
from support.waiting import wait_until

sys.path.insert(0, str(REPO / "benchmarks"))

from bench_freshness import _Together  # noqa: E402


@pytest.mark.parametrize("relayed", [False, True], ids=["direct", "together-relay"])
def test_the_floor_acks_every_batch_after_the_aggregators_subscription(relayed):
    port = free_port()
    proc = subprocess.Popen([sys.executable, str(REPO / "benchmarks" / "bench_freshness.py"), "--role", "floor",
                             "--listen", f"127.0.0.1:{port}"], stdout=subprocess.PIPE, text=True)
    target = f"127.0.0.1:{port}"
    relay = _Together() if relayed else None
    c = client(relay.relay(target) if relay is not None else target)
    try:
        c.start()
        for i in range(1, 4):
            c.offer(snap(i))
        wait_until(lambda: c.stats().get("batches_acked_total", 0) >= 3, 30.0, "three acks from the floor")
        assert c.state.batches.subscription == Subscription(frozenset(Engine.read_delta_families),
                                                            frozenset(Engine.read_gauge_families))
    finally:
        c.stop(timeout=2.0)
        proc.send_signal(signal.SIGTERM)
        out, _ = proc.communicate(timeout=30)
        if relay is not None:
            relay.close()
    assert proc.returncode == 0
    assert json.loads(out.strip().splitlines()[-1])["floor_batches_acked"] == c.stats()["batches_acked_total"]
