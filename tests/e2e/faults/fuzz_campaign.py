"""The fuzz campaign (issue 22, point 5): mutated AMQP sessions against the frame reader and the
connection/channel state machines, in process (:func:`in_process`, the sans-IO
``AMQPConnection``: a million inputs in minutes) and against a running cluster
(:func:`against_cluster`: the router's channel tasks and the nodes behind them).

An input is a valid client session (protocol header, handshake, then 3 to 12 pieces: channel
opens, publishes with properties and bodies, acks, nacks, declares with arguments, binds, qos,
consumes, gets, transactions, confirms, flow, closes, heartbeats) with 0 to 4 mutations (a
flipped byte, inserted or deleted bytes, a duplicated or foreign span, a truncation), fed in
random chunks. Failures: an exception out of ``receive_data`` (in process), an input that takes
over ``HANG_S`` (a hang), output that does not parse as frames; against a cluster, any
"Task exception was never retrieved", traceback or 541 internal error in the cluster's log, and
a normal client that cannot publish and get afterwards.

CI runs a short campaign (tests/e2e/faults/test_fuzz_campaign.py); by hand, with the figures for
docs/reliability.md::

    python -m tests.e2e.faults.fuzz_campaign --inputs 1000000 --cluster-inputs 5000
"""
from __future__ import annotations

import argparse
import random
import socket
import struct
import time
from dataclasses import dataclass, field

from pamqp import body, commands as C, frame, header, heartbeat

from shoal.router.amqp.connection import AMQPConnection

PROTOCOL_HEADER = b"AMQP\x00\x00\x09\x01"
HANG_S = 5.0
#: what a cluster's log must never say (an uncaught exception, a bug answered with 541)
BAD_LOG = ("Task exception was never retrieved", "Traceback (most recent call last)",
           "internal error")


def _m(method, channel: int = 0) -> bytes:
    return frame.marshal(method, channel)


def _content(channel: int, data: bytes, props: C.Basic.Properties | None = None,
             frame_max: int = 4096) -> bytes:
    out = [frame.marshal(header.ContentHeader(0, len(data), props or C.Basic.Properties()),
                         channel)]
    step = frame_max - 8
    for i in range(0, len(data), step):
        out.append(frame.marshal(body.ContentBody(data[i:i + step]), channel))
    return b"".join(out)


def handshake(user: str = "guest", password: str = "guest") -> bytes:
    return (PROTOCOL_HEADER
            + _m(C.Connection.StartOk({"product": "fuzz", "capabilities": {
                "publisher_confirms": True, "consumer_cancel_notify": True}},
                "PLAIN", f"\0{user}\0{password}"))
            + _m(C.Connection.TuneOk(2047, 131072, 0))
            + _m(C.Connection.Open("/")))


def pieces() -> list[bytes]:
    """Valid client frames and frame runs, on channels 1 and 2."""
    props = C.Basic.Properties(content_type="text/plain", delivery_mode=2, priority=3,
                               headers={"n": 1, "s": "x", "l": [1, "a"], "t": {"k": True}},
                               expiration="60000", message_id="m1")
    out = []
    for ch in (1, 2):
        q = f"fuzz-q{ch}"
        out += [
            _m(C.Channel.Open(), ch),
            _m(C.Queue.Declare(queue=q, arguments={"x-max-length": 10, "x-message-ttl": 500}),
               ch),
            _m(C.Queue.Declare(queue="", exclusive=True), ch),
            _m(C.Exchange.Declare(exchange="fuzz-x", exchange_type="topic"), ch),
            _m(C.Queue.Bind(queue=q, exchange="fuzz-x", routing_key="a.#"), ch),
            _m(C.Exchange.Bind(destination="fuzz-x", source="amq.fanout"), ch),
            _m(C.Basic.Publish(exchange="", routing_key=q), ch) + _content(ch, b"hello", props),
            _m(C.Basic.Publish(exchange="fuzz-x", routing_key="a.b", mandatory=True), ch)
            + _content(ch, b"y" * 9000),
            _m(C.Basic.Publish(exchange="amq.direct", routing_key="none"), ch) + _content(ch, b""),
            _m(C.Basic.Qos(0, 5, False), ch),
            _m(C.Basic.Consume(queue=q, consumer_tag=f"c{ch}"), ch),
            _m(C.Basic.Cancel(consumer_tag=f"c{ch}"), ch),
            _m(C.Basic.Get(queue=q), ch),
            _m(C.Basic.Ack(1, False), ch),
            _m(C.Basic.Nack(1, True, True), ch),
            _m(C.Basic.Reject(2, False), ch),
            _m(C.Basic.Recover(True), ch),
            _m(C.Confirm.Select(), ch),
            _m(C.Tx.Select(), ch),
            _m(C.Tx.Commit(), ch),
            _m(C.Tx.Rollback(), ch),
            _m(C.Channel.Flow(True), ch),
            _m(C.Queue.Purge(queue=q), ch),
            _m(C.Queue.Delete(queue=q), ch),
            _m(C.Channel.Close(200, "bye", 0, 0), ch),
            _m(C.Channel.CloseOk(), ch),
        ]
    out += [frame.marshal(heartbeat.Heartbeat(), 0),
            _m(C.Connection.UpdateSecret("guest", "refresh")),
            _m(C.Connection.Close(200, "bye", 0, 0))]
    return out


PIECES = pieces()
#: the handshake, then channels 1 and 2 open (most pieces need an open channel)
HANDSHAKE = handshake() + _m(C.Channel.Open(), 1) + _m(C.Channel.Open(), 2)


def generate(rnd: random.Random) -> bytes:
    """One input: a session with 0 to 4 mutations (the handshake itself in one input of ten)."""
    session = b"".join(rnd.choice(PIECES) for _ in range(rnd.randint(3, 12)))
    data = bytearray(HANDSHAKE + session)
    lo = 0 if rnd.random() < 0.1 else len(HANDSHAKE)
    for _ in range(rnd.choice((0, 1, 1, 2, 2, 3, 4))):
        if len(data) <= lo + 1:
            break
        at = rnd.randrange(lo, len(data))
        kind = rnd.randrange(6)
        if kind == 0:
            data[at] ^= 1 << rnd.randrange(8)
        elif kind == 1:
            data[at:at] = rnd.randbytes(rnd.randint(1, 16))
        elif kind == 2:
            del data[at:at + rnd.randint(1, 32)]
        elif kind == 3:
            end = min(len(data), at + rnd.randint(1, 64))
            data[at:at] = data[at:end]
        elif kind == 4:
            p = rnd.choice(PIECES)
            s = rnd.randrange(len(p))
            data[at:at] = p[s:s + rnd.randint(1, 64)]
        else:
            data[at:at + 1] = struct.pack(">B", rnd.choice((0, 0xFF, 0xCE, 1, 3, 8)))
    if rnd.random() < 0.1 and len(data) > lo:
        del data[rnd.randrange(lo, len(data)):]
    return bytes(data)


def chunks(rnd: random.Random, data: bytes) -> list[bytes]:
    if rnd.random() < 0.5:
        return [data]
    out, pos = [], 0
    while pos < len(data):
        n = rnd.randint(1, 2048)
        out.append(data[pos:pos + n])
        pos += n
    return out


def frames_parse(data: bytes) -> bool:
    """Whether the server's output is a run of whole, decodable frames."""
    pos = 0
    while pos < len(data):
        if data[pos:pos + 8] == PROTOCOL_HEADER:    # answer to a bad protocol header
            pos += 8
            continue
        try:
            used, _, _ = frame.unmarshal(data[pos:])
        except Exception:  # noqa: BLE001 - any decoding failure is a finding
            return False
        if not used:
            return False
        pos += used
    return True


@dataclass
class Result:
    inputs: int = 0
    exceptions: list[str] = field(default_factory=list)
    hangs: int = 0
    bad_output: int = 0
    seconds: float = 0.0

    def line(self, what: str) -> str:
        rate = self.inputs / self.seconds if self.seconds else 0
        return (f"{what}: {self.inputs} inputs in {self.seconds:.1f} s ({rate:,.0f}/s): "
                f"{len(self.exceptions)} uncaught exceptions, {self.hangs} hangs, "
                f"{self.bad_output} malformed outputs")


def in_process(n: int, seed: int = 0, check_every: int = 20) -> Result:
    """``n`` inputs into fresh sans-IO connections (output checked on every
    ``check_every``-th)."""
    rnd = random.Random(seed)
    res = Result()
    began = time.monotonic()
    for i in range(n):
        data = generate(rnd)
        conn = AMQPConnection(lambda user, password: True, vhosts=("/",), heartbeat=0)
        t0 = time.monotonic()
        out = []
        try:
            for part in chunks(rnd, data):
                conn.receive_data(part)
                out.append(conn.data_to_send())
            conn.tick(t0 + 30.0)
            out.append(conn.data_to_send())
        except Exception as e:  # noqa: BLE001 - every exception is a finding
            res.exceptions.append(f"{e!r} on input {i} (seed {seed}): {data[:200]!r}")
        if time.monotonic() - t0 > HANG_S:
            res.hangs += 1
        if i % check_every == 0 and not frames_parse(b"".join(out)):
            res.bad_output += 1
        res.inputs += 1
    res.seconds = time.monotonic() - began
    return res


def against_cluster(host: str, port: int, n: int, seed: int = 0) -> Result:
    """``n`` inputs, each on its own TCP connection to a running broker: sent, then read
    until the broker closes or is quiet for 0.1 s."""
    rnd = random.Random(seed)
    res = Result()
    began = time.monotonic()
    for _ in range(n):
        data = generate(rnd)
        t0 = time.monotonic()
        try:
            with socket.create_connection((host, port), timeout=HANG_S) as s:
                s.settimeout(0.1)
                try:
                    for part in chunks(rnd, data):
                        s.sendall(part)
                    while s.recv(65536):
                        if time.monotonic() - t0 > HANG_S:
                            res.hangs += 1
                            break
                except (socket.timeout, ConnectionError):
                    pass
        except OSError as e:
            res.exceptions.append(f"cannot connect: {e!r}")
        res.inputs += 1
    res.seconds = time.monotonic() - began
    return res


def bad_log_lines(text: str) -> list[str]:
    return [line for line in text.splitlines() if any(b in line for b in BAD_LOG)]


def main(argv: list[str] | None = None) -> int:
    import tempfile
    from pathlib import Path

    import pika

    from tests.conftest import start_cluster, stop_cluster
    p = argparse.ArgumentParser(prog="python -m tests.e2e.faults.fuzz_campaign")
    p.add_argument("--inputs", type=int, default=1_000_000, help="in-process inputs")
    p.add_argument("--cluster-inputs", type=int, default=5000)
    p.add_argument("--seed", type=int, default=1)
    a = p.parse_args(argv)
    res = in_process(a.inputs, a.seed)
    print(res.line("in process"), flush=True)
    for e in res.exceptions[:10]:
        print("  ", e)
    with tempfile.TemporaryDirectory(prefix="shoal-fuzz-") as d:
        cl = start_cluster(Path(d) / "cluster", 2)
        try:
            net = against_cluster(cl.host, cl.port, a.cluster_inputs, a.seed)
            conn = pika.BlockingConnection(pika.URLParameters(cl.url))
            ch = conn.channel()
            ch.queue_declare("fuzz-after", auto_delete=True)
            ch.basic_publish("", "fuzz-after", b"still serving")
            served = ch.basic_get("fuzz-after", auto_ack=True)[2] == b"still serving"
            conn.close()
            bad = bad_log_lines(cl.log_path.read_text(errors="replace"))
        finally:
            stop_cluster(cl, require_clean_exit=False)
    print(net.line("against a cluster") + f"; {len(bad)} bad log lines; a normal client "
          f"{'is served' if served else 'is NOT served'}")
    for line in bad[:10]:
        print("  ", line)
    ok = not (res.exceptions or res.hangs or res.bad_output or net.exceptions or net.hangs
              or bad or not served)
    print("PASS" if ok else "FAIL")
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
