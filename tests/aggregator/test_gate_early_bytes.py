"""The connection gate relays what a client sends before the gate's own connection to gRPC is up.

The gate pauses reading a new client connection in ``connection_made`` until its connection to the gRPC
server's Unix socket is up.  Python 3.10 and Debian 12's 3.11.2 ignore a pause made there (CPython
gh-103607, https://github.com/python/cpython/issues/103607: ``_SelectorSocketTransport.__init__`` schedules
``_add_reader`` right after ``connection_made``, and their ``_SelectorTransport._add_reader`` checks only
``_closing``; Lib/asyncio/selector_events.py at v3.10.13 and v3.11.2, whose later releases check
``is_reading()`` instead).  There the agent's HTTP/2 preface was read before the relay had anywhere to send
it, and dropped; gRPC took the agent's next frame for the preface ("Connect string mismatch: expected 'P'
(80) got ' ' (0) at byte 0") and closed the connection.  The installed agent and aggregator (on Debian's
python3) failed every attempt with "Stream removed (Socket closed)" whenever the preface arrived before
the relay's backend connection, which CPU load made likely (tests/deploy/test_install.py).

Forced here on any Python: the transports add their reader as 3.11.2 does, and the relay's backend
connection is opened only once the gate has read the client's first bytes (bounded), so every connection
sends its preface "too early".  Real aggregator gRPC server and gate, real ``StreamClient``.
"""

from __future__ import annotations

import asyncio
import contextlib
from asyncio import selector_events
from typing import Any

import pytest

from fabricmon.agent.spool import MemorySpool
from fabricmon.agent.stream import StreamClient
from fabricmon.aggregator import conn_gate
from fabricmon.aggregator.engine import Engine
from fabricmon.aggregator.server import start_grpc_server
from fabricmon.batch import NodeHello
from fabricmon.topology import generate_topology
from support.waiting import wait_until

FIRST_READ_BOUND_S = 10.0  # a client that sends nothing still gets its backend connection after this


def _add_reader_as_in_3_11_2(self: Any, fd: int, callback: Any, *args: Any) -> None:
    """``_SelectorTransport._add_reader`` of CPython v3.11.2 (and v3.10.13): a pause is not consulted."""
    if self._closing:
        return
    self._loop._add_reader(fd, callback, *args)


@pytest.fixture
def early_reads(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """The forced condition; the sizes of the reads the gate made before its backend connection was up."""
    monkeypatch.setattr(selector_events._SelectorTransport, "_add_reader", _add_reader_as_in_3_11_2)
    early: list[int] = []
    first_read: dict[int, asyncio.Event] = {}
    buffer_updated, open_backend = conn_gate._Outer.buffer_updated, conn_gate._Outer._open_backend

    def counted_buffer_updated(self: Any, nbytes: int) -> None:
        if self.conn is not None and self.conn.inner is None:
            early.append(nbytes)
        buffer_updated(self, nbytes)
        first_read.setdefault(id(self), asyncio.Event()).set()

    async def open_backend_after_first_read(self: Any) -> Any:
        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait_for(first_read.setdefault(id(self), asyncio.Event()).wait(), FIRST_READ_BOUND_S)
        return await open_backend(self)

    monkeypatch.setattr(conn_gate._Outer, "buffer_updated", counted_buffer_updated)
    monkeypatch.setattr(conn_gate._Outer, "_open_backend", open_backend_after_first_read)
    return early


@pytest.mark.integration
def test_an_agents_first_bytes_read_before_the_relay_is_up_reach_grpc(early_reads: list[int]) -> None:
    engine = Engine(generate_topology(4, nodes_per_unit=4, layout="roce", cluster="test"))
    srv = start_grpc_server(engine, "127.0.0.1:0", token="tok")
    client = None
    try:
        client = StreamClient(srv.address, "node-001", lambda: NodeHello("node-001", "test", 1.0), MemorySpool(),
                              token="tok", backoff_min=0.05, backoff_max=0.5).start()
        # dropped, the preface failed every attempt: no stream within any bound
        assert wait_until(lambda: client.connected, 15), (client.last_error, client.stats()["connect_failures_total"])
        assert early_reads, "the gate read nothing before its backend connection: the condition was not forced"
        st = client.stats()
        assert st["connects_total"] == 1 and st["connect_failures_total"] == 0, (st, client.last_error)
        assert srv.stats()["connections_authenticated"] == 1
    finally:
        if client is not None:
            client.stop(2.0)
        srv.stop(0.5)
