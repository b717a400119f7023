"""The floor of a router<->node hop: what one round trip costs before any broker code runs.

    python tests/benchmarks/link_floor.py [--rate 5000] [--burst 5] [--time 5]
        [--transports zmq,zmq-tcp,zmq-pinned,unix]

A "router" process sends, every ``burst / rate`` seconds (1 ms by default, like the load
tool's pacing), one msgpack batch of ``--burst`` PUBLISH-shaped wire messages (100-byte body)
to a "node" process, which decodes it and answers with one batch of as many DELIVER-shaped
messages; the router decodes that. Nothing else happens: no AMQP, no queue model. Both run
uvloop and the link code's patterns (reader callbacks, one send per batch). Transports, each
measured in the same run, alternating:

- ``zmq``: ZeroMQ DEALER -> ROUTER over ``ipc://`` (design.md section 4), the FD read on
  ZMQ_EVENTS as router/links/node_link.py and node/server.py do;
- ``zmq-tcp``: the same over ``tcp://127.0.0.1`` (what a pod's link uses);
- ``zmq-pinned``: ``zmq`` with each process (its Python thread and the ZeroMQ I/O thread it
  starts) held to one CPU of its own (``sched_setaffinity``), so that the hand-off between a
  process's two threads never crosses CPUs;
- ``unix``: a plain Unix-domain stream socket, length-prefixed batches, read by the loop.

Prints CPU (utime + stime of both processes, every thread, from /proc) per message and the
round-trip latency p50/p99 per transport. The CPU per message of a whole broker on one such
hop cannot be lower than this figure; compare it with RabbitMQ's whole-broker figure from
compare_rabbitmq.py (load 3). Not collected by pytest: a benchmark asserts no speed.
"""
from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import struct
import sys
import tempfile
import time

import msgpack
import zmq

TCK = os.sysconf("SC_CLK_TCK")
_LEN = struct.Struct(">I")


def cpu_s(pid: int) -> float:
    """utime + stime (s) of every thread of ``pid``."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TCK


def _loop() -> asyncio.AbstractEventLoop:
    try:
        import uvloop
        return uvloop.new_event_loop()
    except ImportError:  # pragma: no cover
        return asyncio.new_event_loop()


def _answer(frame: bytes) -> bytes:
    """The node's work: decode a batch, answer with DELIVER-shaped messages."""
    batch = msgpack.unpackb(frame)
    return msgpack.packb([[20, 1, i, False, m[4], m[5], m[6], m[7]]
                          for i, m in enumerate(batch)])


# ---- node side ----------------------------------------------------------------------------
def _pin(cpu: int | None) -> None:
    """Hold this thread (and the threads it starts from now on) to ``cpu``."""
    if cpu is not None:
        os.sched_setaffinity(0, {cpu})


def node_zmq(endpoint: str, cpu: int | None = None) -> None:
    _pin(cpu)
    loop = _loop()
    ctx = zmq.Context()
    sock = ctx.socket(zmq.ROUTER)
    sock.bind(endpoint)

    def readable() -> None:
        while sock.get(zmq.EVENTS) & zmq.POLLIN:
            peer, frame = sock.recv_multipart(zmq.NOBLOCK)
            sock.send_multipart([peer, _answer(frame)], zmq.NOBLOCK)
    loop.add_reader(sock.getsockopt(zmq.FD), readable)
    readable()
    loop.run_forever()


class _Framed(asyncio.Protocol):
    """Length-prefixed frames over a stream; ``on_frame(bytes)`` per frame."""

    def __init__(self, on_frame) -> None:
        self.buf = bytearray()
        self.on_frame = on_frame
        self.transport = None

    def connection_made(self, transport) -> None:
        self.transport = transport

    def data_received(self, data: bytes) -> None:
        buf = self.buf
        buf += data
        while len(buf) >= 4:
            (n,) = _LEN.unpack_from(buf)
            if len(buf) < 4 + n:
                break
            frame = bytes(buf[4:4 + n])
            del buf[:4 + n]
            self.on_frame(frame)

    def send(self, frame: bytes) -> None:
        self.transport.write(_LEN.pack(len(frame)) + frame)


def node_unix(path: str) -> None:
    loop = _loop()

    def factory() -> _Framed:
        p = _Framed(lambda frame: p.send(_answer(frame)))
        return p
    loop.run_until_complete(loop.create_unix_server(factory, path))
    loop.run_forever()


# ---- router side --------------------------------------------------------------------------
def run_router(transport: str, address: str, rate: int, burst: int, seconds: float,
               node_pid: int) -> tuple[float, float, float]:
    """Drive the node; returns (CPU µs per message of both processes, p50 ms, p99 ms)."""
    everywhere = os.sched_getaffinity(0)
    try:
        if transport == "zmq-pinned":
            _pin(0)
        return _drive(transport, address, rate, burst, seconds, node_pid)
    finally:
        os.sched_setaffinity(0, everywhere)


def _drive(transport: str, address: str, rate: int, burst: int, seconds: float,
           node_pid: int) -> tuple[float, float, float]:
    loop = _loop()
    asyncio.set_event_loop(loop)
    sent_at: list[float] = []
    rtts: list[float] = []
    body = b"x" * 100
    header = b"h" * 20
    ctx = None
    if transport.startswith("zmq"):
        ctx = zmq.Context()
        sock = ctx.socket(zmq.DEALER)
        sock.connect(address)

        def on_frame(frame: bytes) -> None:
            msgpack.unpackb(frame)
            rtts.append(time.perf_counter() - sent_at.pop(0))

        def readable() -> None:
            while sock.get(zmq.EVENTS) & zmq.POLLIN:
                on_frame(sock.recv(zmq.NOBLOCK))
        loop.add_reader(sock.getsockopt(zmq.FD), readable)
        readable()

        def send(frame: bytes) -> None:
            sock.send(frame, zmq.NOBLOCK)
            if sock.get(zmq.EVENTS) & zmq.POLLIN:   # the send may eat the FD's edge
                loop.call_soon(readable)
    else:
        def on_frame(frame: bytes) -> None:
            msgpack.unpackb(frame)
            rtts.append(time.perf_counter() - sent_at.pop(0))
        for _ in range(100):
            try:
                _, proto = loop.run_until_complete(
                    loop.create_unix_connection(lambda: _Framed(on_frame), address))
                break
            except (FileNotFoundError, ConnectionRefusedError):
                time.sleep(0.05)
        send = proto.send

    interval = burst / rate
    warm = 1.0
    state = {"start": 0.0, "cpu0": 0.0, "n": 0}
    done = loop.create_future()
    me = os.getpid()

    def tick(at: float) -> None:
        now = loop.time()
        if now - state["start"] >= warm + seconds:
            done.set_result(None)
            return
        if state["cpu0"] == 0.0 and now - state["start"] >= warm:
            state["cpu0"] = cpu_s(me) + cpu_s(node_pid)
            rtts.clear()
            state["n"] = 0
        batch = [[21, 0, "/", ["q"], "", "q", header, body, "owner"] for _ in range(burst)]
        sent_at.append(time.perf_counter())
        send(msgpack.packb(batch))
        state["n"] += burst
        loop.call_at(at + interval, tick, at + interval)

    time.sleep(0.3)
    state["start"] = loop.time()
    loop.call_soon(tick, state["start"])
    loop.run_until_complete(done)
    cpu = cpu_s(me) + cpu_s(node_pid) - state["cpu0"]
    if ctx is not None:
        ctx.destroy(linger=0)
    loop.close()
    q = statistics.quantiles(rtts, n=100)
    return cpu / state["n"] * 1e6, q[49] * 1e3, q[98] * 1e3


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--rate", type=int, default=5000, help="messages per second")
    p.add_argument("--burst", type=int, default=5, help="messages per batch")
    p.add_argument("--time", type=float, default=5.0, help="measured seconds per run")
    p.add_argument("--runs", type=int, default=3, help="runs per transport")
    p.add_argument("--transports", default="zmq,unix",
                   help="comma-separated: zmq, zmq-tcp, zmq-pinned, unix")
    p.add_argument("--cpu", type=int, help=argparse.SUPPRESS)
    p.add_argument("--role", help=argparse.SUPPRESS)
    p.add_argument("--address", help=argparse.SUPPRESS)
    a = p.parse_args()
    if a.role == "node-zmq":
        node_zmq(a.address, a.cpu)
        return
    if a.role == "node-unix":
        node_unix(a.address)
        return
    import socket
    import subprocess
    transports = a.transports.split(",")
    bad = set(transports) - {"zmq", "zmq-tcp", "zmq-pinned", "unix"}
    if bad:
        p.error(f"unknown transport {sorted(bad)[0]!r}")
    results: dict[str, list[tuple[float, float, float]]] = {t: [] for t in transports}
    for i in range(a.runs):
        for transport in transports if i % 2 == 0 else transports[::-1]:
            d = tempfile.mkdtemp(prefix="shoal-floor-")
            address = f"ipc://{d}/n.sock" if transport in ("zmq", "zmq-pinned") \
                else f"{d}/n.sock"
            if transport == "zmq-tcp":
                with socket.socket() as s:
                    s.bind(("127.0.0.1", 0))
                    address = f"tcp://127.0.0.1:{s.getsockname()[1]}"
            role = "node-unix" if transport == "unix" else "node-zmq"
            pin = ["--cpu", "1"] if transport == "zmq-pinned" else []
            node = subprocess.Popen([sys.executable, __file__, "--role", role,
                                     "--address", address, *pin])
            try:
                r = run_router(transport, address, a.rate, a.burst, a.time, node.pid)
            finally:
                node.kill()
                node.wait()
            results[transport].append(r)
            print(f"{transport:10} {r[0]:6.1f} µs CPU/msg  round trip p50 {r[1]:.3f} ms  "
                  f"p99 {r[2]:.3f} ms", flush=True)
    for transport, rs in results.items():
        print(f"{transport:10} median {statistics.median(r[0] for r in rs):6.1f} µs CPU/msg, "
              f"p50 {statistics.median(r[1] for r in rs):.3f} ms, "
              f"p99 {statistics.median(r[2] for r in rs):.3f} ms "
              f"({a.rate} msg/s in batches of {a.burst})")


if __name__ == "__main__":
    main()
