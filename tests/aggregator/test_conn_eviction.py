"""The connection gate's eviction order (aggregator/conn_eviction.py, conn_gate.py; issue 35 item 1).

Pure order first; then the gate itself on loopback in front of a small asyncio backend: which
connection a new one evicts at the limit, that an authenticated one never is, that the new one is
refused when every held one is authenticated, and that the relay maps the backend's peer back to
the client's address.
"""

from __future__ import annotations

import asyncio
import socket

import pytest

from fabricmon.aggregator.conn_eviction import EvictionOrder
from fabricmon.aggregator.conn_gate import (
    EVICTED_UNAUTHENTICATED,
    REFUSED_LIMIT,
    ConnectionGate,
    grpc_peer,
    private_socket_path,
    remove_private_socket,
)

# ------------------------------------------------------------------ the pure order


def test_oldest_of_the_host_holding_the_most_goes_first():
    o: EvictionOrder[str] = EvictionOrder()
    o.add("agent-a", "10.0.0.1")
    for i in range(3):
        o.add(f"flood-{i}", "10.9.9.9")
    o.add("agent-b", "10.0.0.2")
    assert o.victim() == "flood-0"  # the flooding host's oldest, not the older agent's connection
    o.remove("flood-0")
    assert o.victim() == "flood-1"
    o.remove("flood-1")
    o.remove("flood-2")
    # one each: the host that reached that count first, its oldest
    assert o.victim() == "agent-a"
    assert o.counts() == {"10.0.0.1": 1, "10.0.0.2": 1}


def test_same_host_oldest_first_and_authenticated_ones_are_not_candidates():
    o: EvictionOrder[int] = EvictionOrder()
    for k in range(5):
        o.add(k, "h")
    o.remove(0)  # its stream authenticated
    assert o.victim() == 1 and len(o) == 4 and 0 not in o
    for k in (1, 2, 3, 4):
        o.remove(k)
    assert o.victim() is None and len(o) == 0 and o.counts() == {}


def test_the_top_count_follows_removals_and_additions():
    o: EvictionOrder[str] = EvictionOrder()
    o.add("a1", "a")
    o.add("a2", "a")
    o.add("b1", "b")
    o.add("b2", "b")
    o.add("b3", "b")
    assert o.victim() == "b1"
    o.remove("b1")  # a and b hold 2 each: a reached 2 first
    assert o.victim() == "a1"
    o.remove("a1")
    o.remove("a2")
    assert o.victim() == "b2"
    o.add("c1", "c")
    o.remove("b2")
    o.remove("b3")
    assert o.victim() == "c1"
    o.add("c1", "c")  # adding twice counts once
    assert o.counts() == {"c": 1}


def test_peer_strings():
    assert grpc_peer(("10.1.2.3", 4000)) == ("10.1.2.3", "ipv4:10.1.2.3:4000")
    assert grpc_peer(("::ffff:10.1.2.3", 4000, 0, 0)) == ("10.1.2.3", "ipv4:10.1.2.3:4000")
    assert grpc_peer(("fd00::1", 4000, 0, 0)) == ("fd00::1", "ipv6:[fd00::1]:4000")


# ------------------------------------------------------------------ the gate on loopback


class _Backend(asyncio.Protocol):
    """Echoes on a Unix socket, and remembers each connection's peer as gRPC's context.peer() says it
    (``unix-abstract:NAME`` for a client bound to an abstract name)."""

    peers: list[str] = []

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport
        name = transport.get_extra_info("peername")
        assert isinstance(name, bytes) and name.startswith(b"\0")
        _Backend.peers.append("unix-abstract:" + name[1:].decode())

    def data_received(self, data: bytes) -> None:
        self.transport.write(data)  # type: ignore[attr-defined]


async def _client(port: int, source: str = "127.0.0.1") -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    r, w = await asyncio.open_connection("127.0.0.1", port, local_addr=(source, 0))
    w.write(b"ping")
    await w.drain()
    assert await asyncio.wait_for(r.readexactly(4), 5) == b"ping"  # relayed both ways
    return r, w


async def _closed(r: asyncio.StreamReader) -> bool:
    try:
        return await asyncio.wait_for(r.read(1), 5) == b""
    except ConnectionError:
        return True
    except asyncio.TimeoutError:
        return False


def _local(w: asyncio.StreamWriter) -> str:
    return grpc_peer(w.get_extra_info("sockname"))[1]


@pytest.fixture
def gate_run():
    def run(body):
        async def main():
            _Backend.peers = []
            path = private_socket_path()
            backend = await asyncio.get_running_loop().create_unix_server(_Backend, path)
            gate = ConnectionGate(path, limit=3)
            await gate.start("127.0.0.1", 0)
            try:
                await body(gate)
            finally:
                gate.abort_all()
                backend.close()
                remove_private_socket(path)

        asyncio.run(asyncio.wait_for(main(), 30))

    return run


def _relayed_peer_of(gate: ConnectionGate, client_peer: str) -> str:
    """The backend's peer string of the relay connection that carries ``client_peer``."""
    return next(p for p in _Backend.peers if gate.real_peer(p) == client_peer)


def test_at_the_limit_the_flooding_host_is_evicted_and_the_agent_kept(gate_run):
    async def body(gate: ConnectionGate) -> None:
        agent = await _client(gate.port, "127.0.0.1")
        flood = [await _client(gate.port, "127.0.0.2") for _ in range(2)]
        assert gate.stats()["connections_unauthenticated"] == 3
        newcomer = await _client(gate.port, "127.0.0.2")  # at the limit: the flood's oldest goes
        assert await _closed(flood[0][0])
        assert gate.evicted[EVICTED_UNAUTHENTICATED] == 1
        another = await _client(gate.port, "127.0.0.3")  # a third host: still the flood's (it holds 2)
        assert await _closed(flood[1][0])
        for r, w in (agent, newcomer, another):
            w.write(b"more")
            await w.drain()
            assert await asyncio.wait_for(r.readexactly(4), 5) == b"more"  # still relayed
        assert gate.stats()["connections_unauthenticated"] == 3

    gate_run(body)


def test_an_authenticated_connection_is_never_evicted_and_a_full_gate_refuses(gate_run):
    async def body(gate: ConnectionGate) -> None:
        conns = [await _client(gate.port) for _ in range(3)]
        first = _relayed_peer_of(gate, _local(conns[0][1]))
        gate.authenticated(first)  # the servicer's word: its stream's credential validated
        assert gate.real_peer(first) == _local(conns[0][1])
        conns.append(await _client(gate.port))  # evicts the oldest unauthenticated: the second, not the first
        assert await _closed(conns[1][0])
        for c in conns[2:]:
            gate.authenticated(_relayed_peer_of(gate, _local(c[1])))
        assert gate.stats()["connections_authenticated"] == 3
        r, w = await asyncio.open_connection("127.0.0.1", gate.port)
        assert await _closed(r)  # every connection authenticated: the new one is refused
        assert gate.refused[REFUSED_LIMIT] == 1
        w.close()
        conns[0][1].write(b"still")
        await conns[0][1].drain()
        assert await asyncio.wait_for(conns[0][0].readexactly(5), 5) == b"still"
        gate.unauthenticated(first)  # a revoked token: a candidate again
        conns.append(await _client(gate.port))
        assert await _closed(conns[0][0])
        assert gate.evicted[EVICTED_UNAUTHENTICATED] == 2

    gate_run(body)


def test_a_closed_client_frees_its_slot_and_its_peer_mapping(gate_run):
    async def body(gate: ConnectionGate) -> None:
        r, w = await _client(gate.port)
        relayed = _Backend.peers[-1]
        assert gate.real_peer(relayed) == _local(w)
        w.close()
        for _ in range(100):  # bounded: the gate sees the close within a few loop turns
            if not gate.conns:
                break
            await asyncio.sleep(0.02)
        assert not gate.conns and gate.real_peer(relayed) is None
        assert gate.real_peer("unix:") is None  # not through the gate

    gate_run(body)


def test_the_gate_listens_dual_stack_for_the_any_address():
    async def main() -> None:
        gate = ConnectionGate("/nonexistent/grpc.sock", limit=1)
        port = await gate.start("::", 0)
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=5):
                pass
        finally:
            gate.abort_all()

    if not socket.has_dualstack_ipv6():
        pytest.skip("no dual-stack IPv6 here")
    asyncio.run(asyncio.wait_for(main(), 30))
