"""The stream transport's own floor: CPU per message of a server that does nothing but read and ack.

Issue 39 asks the aggregator for at most 0.1 of Prometheus' CPU at a 1 s interval
(bench_freshness.py).  This measures the part no change to the aggregator's code can remove:
grpcio's server (the same ``context.read()``/``context.write()`` servicer shape as
``aggregator/server.py``) reading one message per stream per second and writing a small ack,
with nothing decoded, ingested or ticked, and no connection gate.  It skips every part of the
aggregator on purpose: it is the floor under it, not the aggregator.  For comparison, the same
messages to a bare asyncio TCP server (4-byte length, the message, a 2-byte ack; no HTTP/2, no
gRPC): the floor of any Python event-loop server here.

Two arrival patterns, each for 32 and 256 streams by default:

- ``spread``: each stream's message at its own offset in the second (agents polling on their own
  timers, as on a real cluster, and as Prometheus spreads its scrapes);
- ``together``: every stream's message at the same instant (bench_freshness' agents, which poll in
  one process on one clock).

Server CPU comes from ``/proc/<pid>/stat`` over ``--seconds`` after 3 s of warm-up, less the same
server's idle CPU measured first; client and server are separate processes on loopback.

    .venv/bin/python benchmarks/bench_grpc_floor.py [--streams 32 256] [--seconds 20] [--servers grpc asyncio]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import socket
import struct
import subprocess
import sys
import time

import grpc

ACK = b"\x08\x01"  # the size of an Ack carrying a small seq
METHOD = "/floor.Floor/Stream"
SERVERS = {"grpc": "grpc.aio", "asyncio": "asyncio TCP"}
MAX_SIZE = 4 * 1024 * 1024 - 1024


def _raw(b: bytes) -> bytes:
    return b


async def _serve(port: int) -> None:
    async def stream(_requests, context) -> None:
        while True:
            msg = await context.read()
            if msg is grpc.aio.EOF:  # type: ignore[comparison-overlap]
                return
            await context.write(ACK)

    handler = grpc.method_handlers_generic_handler("floor.Floor", {
        "Stream": grpc.stream_stream_rpc_method_handler(stream, request_deserializer=_raw, response_serializer=_raw)})
    server = grpc.aio.server()
    server.add_generic_rpc_handlers((handler,))
    server.add_insecure_port(f"127.0.0.1:{port}")
    await server.start()
    print("ready", flush=True)
    await server.wait_for_termination()


async def _serve_tcp(port: int) -> None:
    async def conn(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while True:
                (n,) = struct.unpack(">I", await reader.readexactly(4))
                await reader.readexactly(n)
                writer.write(ACK)
        except (asyncio.IncompleteReadError, ConnectionError):
            writer.close()

    server = await asyncio.start_server(conn, "127.0.0.1", port)
    print("ready", flush=True)
    await server.serve_forever()


async def _paced(streams: int, seconds: float, together: bool, send_one) -> int:
    """Each stream sends one message a second (at its own offset, or all at the same instant)."""
    sent = 0
    start = time.monotonic() + 0.5

    async def one(i: int) -> None:
        nonlocal sent
        send = await send_one()
        due = start + (0.0 if together else i / streams)
        while due < start + seconds:
            await asyncio.sleep(max(0.0, due - time.monotonic()))
            await send(True)
            sent += 1
            due += 1.0
        await send(False)

    await asyncio.gather(*(one(i) for i in range(streams)))
    return sent


async def _clients(server: str, port: int, streams: int, seconds: float, size: int, together: bool) -> int:
    payload = os.urandom(size)  # incompressible: gRPC does not compress here anyway
    if server == "asyncio":
        framed = struct.pack(">I", size) + payload

        async def tcp_stream():
            reader, writer = await asyncio.open_connection("127.0.0.1", port)

            async def send(more: bool) -> None:
                if not more:
                    writer.close()
                    return
                writer.write(framed)
                await reader.readexactly(len(ACK))
            return send

        return await _paced(streams, seconds, together, tcp_stream)
    async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
        call_of = channel.stream_stream(METHOD, request_serializer=_raw, response_deserializer=_raw)

        async def grpc_stream():
            call = call_of()

            async def send(more: bool) -> None:
                if not more:
                    await call.done_writing()
                    return
                await call.write(payload)
                await call.read()
            return send

        return await _paced(streams, seconds, together, grpc_stream)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _cpu_s(pid: int) -> float:
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def measure(kind: str, streams: int, seconds: float, size: int, together: bool) -> dict:
    port = _free_port()
    server = subprocess.Popen([sys.executable, __file__, "--serve", kind, str(port)], stdout=subprocess.PIPE, text=True)
    try:
        if server.stdout is None or server.stdout.readline().strip() != "ready":
            raise RuntimeError("the floor server did not start")
        time.sleep(1.0)
        c0 = _cpu_s(server.pid)
        time.sleep(5.0)
        idle = (_cpu_s(server.pid) - c0) / 5.0
        client = subprocess.Popen([sys.executable, __file__, "--client", kind, str(port), str(streams),
                                   str(seconds + 4), str(size), "together" if together else "spread"],
                                  stdout=subprocess.PIPE, text=True)
        time.sleep(3.5)  # connected and past the first messages
        c0, t0 = _cpu_s(server.pid), time.monotonic()
        time.sleep(seconds)
        c1, t1 = _cpu_s(server.pid), time.monotonic()
        out, _ = client.communicate(timeout=seconds + 60)
        if client.returncode != 0:
            raise RuntimeError(f"the clients failed ({client.returncode})")
        cores = (c1 - c0) / (t1 - t0)
        per_msg_us = max(0.0, cores - idle) / streams * 1e6  # one message per stream per second
        return {"server": kind, "streams": streams, "arrivals": "together" if together else "spread",
                "sent": int(out.split()[-1]), "cores": cores, "idle": idle, "per_msg_us": per_msg_us}
    finally:
        server.terminate()
        server.wait(10)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--streams", type=int, nargs="+", default=[32, 256])
    ap.add_argument("--seconds", type=float, default=20.0)
    ap.add_argument("--size", type=int, default=13000, help="message bytes (a steady agent batch is about 13 KB)")
    ap.add_argument("--servers", nargs="+", choices=SERVERS, default=list(SERVERS))
    ap.add_argument("--serve", nargs=2, help=argparse.SUPPRESS)
    ap.add_argument("--client", nargs=6, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.serve:
        kind, port = args.serve
        asyncio.run(_serve(int(port)) if kind == "grpc" else _serve_tcp(int(port)))
        return 0
    if args.client:
        kind, port, streams, seconds, size, pattern = args.client
        print("sent", asyncio.run(_clients(kind, int(port), int(streams), float(seconds), int(size),
                                           pattern == "together")))
        return 0
    if min(args.streams) < 1 or args.seconds <= 0 or args.size < 1:
        ap.error("--streams, --seconds and --size must be positive")
    if args.size > MAX_SIZE:
        ap.error(f"--size: at most {MAX_SIZE} bytes (gRPC's default receive limit, with room for framing)")
    print(f"Read-and-ack floor: one {args.size}-byte message per stream per second, "
          f"{args.seconds:.0f} s per row, {os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.2f}")
    print("(no decode, ingest, tick or connection gate: the floor under the aggregator, not the aggregator)")
    print()
    print("| server | streams | arrivals | server cores | idle cores | CPU per message |")
    print("|---|---:|---|---:|---:|---:|")
    for kind in args.servers:
        for streams in args.streams:
            for together in (False, True):
                r = measure(kind, streams, args.seconds, args.size, together)
                print(f"| {SERVERS[kind]} | {r['streams']} | {r['arrivals']} | {r['cores']:.4f} | {r['idle']:.4f} | "
                      f"{r['per_msg_us']:,.0f} us |", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
