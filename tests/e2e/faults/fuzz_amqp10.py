"""The AMQP 1.0 fuzz campaign (issue 37): mutated AMQP 1.0 byte streams against Shoal's sans-IO
engine (``shoal.router.amqp10.engine.Engine``), in process, a million inputs by hand::

    python -m tests.e2e.faults.fuzz_amqp10 --inputs 1000000 [--seed 1] [--jobs 2]

(tests/e2e/faults/test_fuzz_amqp10.py runs a CI-sized campaign.)

Inputs. A corpus of valid client streams, recorded from python-qpid-proton's client engine
(SASL PLAIN or no SASL, open, begin, sending and receiving links, whole and split transfers,
settled and unsettled, flows with drain and echo, every outcome, detach, end, close) as it talks
to the engine in lockstep, plus hand-built frames from an encoder in this module that is
independent of Shoal's codec (odd but legal encodings: list32/map32/str32, described
descriptors by symbol, every performative field as null, a transfer with a 64 KiB payload,
arrays, heartbeats, deep nesting). An input is one corpus stream (or the stream's prefix up to
the open, with 3 to 12 spliced hand-built frames) with 0 to 4 mutations: a bit flip, a byte
set to a type constructor (0x40, 0x45, 0xa1, 0xb0, 0xc0, 0xd0, 0xe0, 0xf0 ...), random bytes
inserted, a span deleted or duplicated, a frame spliced in from elsewhere, a frame's size or
doff rewritten (small, off by a few, huge), a compound/array/binary length rewritten to a huge
value, a descriptor changed (unknown ulong, symbol), then one time in ten a truncation. It is fed
to a fresh engine in random chunks (1 octet to all of it), and the engine is driven as the
router drives it (router/frontend/amqp10_client.py): open answered, links accepted with credit,
messages settled accepted, messages sent on links the client receives on while they have
credit, then EOF.

Checks, per input:
- no exception escapes ``receive_data``/``data_to_send``/``tick`` or the engine's own methods
  the driver calls (``open``, ``accept_link``, ``give_credit``, ``settle_received``,
  ``send_message``, ``drained``, ``detach``);
- the time per input stays under ``HANG_S`` and the engine's buffered input and output under
  ``MAX_BUFFER`` octets (bounded memory);
- the output is whole frames, each decodable by proton's own decoder (``proton.Data``), and
  nothing follows a ``close``;
- when the engine reports a protocol error (``ConnectionClosed`` with an error), its last frame
  is a ``close`` whose error condition is one of ``CONDITIONS``; after that it stays silent.

A failure is printed with its seed, index and the input's octets in hex (reproduce with
``--replay HEX``).
"""
from __future__ import annotations

import argparse
import os
import random
import struct
import sys
import time
import traceback
from collections import Counter
from dataclasses import dataclass, field

HANG_S = 2.0
TRACEBACKS = False          #: print each exception's traceback (--replay sets it)
MAX_BUFFER = 8 << 20
HEADER_AMQP = b"AMQP\x00\x01\x00\x00"
HEADER_SASL = b"AMQP\x03\x01\x00\x00"
#: error conditions a close/end/detach may carry after a bad frame
CONDITIONS = {"amqp:decode-error", "amqp:connection:framing-error", "amqp:invalid-field",
              "amqp:not-allowed", "amqp:session:unattached-handle",
              "amqp:session:window-violation", "amqp:session:handle-in-use",
              "amqp:session:errant-link", "amqp:link:transfer-limit-exceeded",
              "amqp:link:message-size-exceeded", "amqp:link:detach-forced",
              "amqp:resource-limit-exceeded", "amqp:frame-size-too-small",
              "amqp:not-implemented", "amqp:internal-error", "amqp:precondition-failed",
              "amqp:connection:forced"}


# -- an independent AMQP 1.0 encoder (part 1 types), for hand-built frames ------------------------
class Sym(str):
    pass


class Raw(bytes):
    """Already-encoded octets, put in as they are."""


class U(int):
    """A uint (0x70 / 0x52 / 0x43)."""


class UL(int):
    """A ulong."""


class UB(int):
    """A ubyte."""


def enc(v, wide: bool = False) -> bytes:
    """``v`` encoded; ``wide`` picks the 32-bit forms of str, binary, symbol, list and map."""
    if v is None:
        return b"\x40"
    if isinstance(v, Raw):
        return bytes(v)
    if v is True:
        return b"\x41"
    if v is False:
        return b"\x42"
    if isinstance(v, UB):
        return b"\x50" + struct.pack(">B", v & 0xFF)
    if isinstance(v, U):
        if v == 0 and not wide:
            return b"\x43"
        if v < 256 and not wide:
            return b"\x52" + bytes([v])
        return b"\x70" + struct.pack(">I", v & 0xFFFFFFFF)
    if isinstance(v, UL):
        if v < 256 and not wide:
            return b"\x53" + bytes([v])
        return b"\x80" + struct.pack(">Q", v & 0xFFFFFFFFFFFFFFFF)
    if isinstance(v, bool):
        return b"\x41" if v else b"\x42"
    if isinstance(v, int):
        if -128 <= v < 128 and not wide:
            return b"\x55" + struct.pack(">b", v)
        return b"\x81" + struct.pack(">q", v)
    if isinstance(v, float):
        return b"\x82" + struct.pack(">d", v)
    if isinstance(v, Sym):
        raw = v.encode()
        return (b"\xa3" + bytes([len(raw)]) if len(raw) < 256 and not wide
                else b"\xb3" + struct.pack(">I", len(raw))) + raw
    if isinstance(v, str):
        raw = v.encode()
        return (b"\xa1" + bytes([len(raw)]) if len(raw) < 256 and not wide
                else b"\xb1" + struct.pack(">I", len(raw))) + raw
    if isinstance(v, (bytes, bytearray)):
        return (b"\xa0" + bytes([len(v)]) if len(v) < 256 and not wide
                else b"\xb0" + struct.pack(">I", len(v))) + bytes(v)
    if isinstance(v, list):
        if not v and not wide:
            return b"\x45"
        body = b"".join(enc(x, wide) for x in v)
        if len(body) + 1 < 256 and not wide:
            return b"\xc0" + bytes([len(body) + 1, len(v)]) + body
        return b"\xd0" + struct.pack(">II", len(body) + 4, len(v)) + body
    if isinstance(v, dict):
        body = b"".join(enc(k, wide) + enc(x, wide) for k, x in v.items())
        if len(body) + 1 < 256 and not wide:
            return b"\xc1" + bytes([len(body) + 1, 2 * len(v)]) + body
        return b"\xd1" + struct.pack(">II", len(body) + 4, 2 * len(v)) + body
    raise TypeError(type(v))


def described(code, fields, wide: bool = False) -> bytes:
    d = enc(Sym(code)) if isinstance(code, str) else enc(UL(code))
    return b"\x00" + d + enc(fields, wide)


def fr(body: bytes, channel: int = 0, kind: int = 0, payload: bytes = b"",
       ext: bytes = b"") -> bytes:
    """One frame: ``body`` (a performative), then ``payload``; ``ext`` an extended header."""
    doff = 2 + (len(ext) + 3) // 4
    ext = ext.ljust((doff - 2) * 4, b"\0")
    size = 8 + len(ext) + len(body) + len(payload)
    return struct.pack(">IBBH", size, doff, kind, channel) + ext + body + payload


def sasl_init(user: str = "guest", password: str = "guest", mech: str = "PLAIN") -> bytes:
    return fr(described(0x41, [Sym(mech), f"\0{user}\0{password}".encode(), "localhost"]),
              kind=1)


def open_(container: str = "fuzz", hostname="vhost:/", max_frame=U(65536), channel_max=255,
          idle=U(0), wide=False) -> bytes:
    return fr(described(0x10, [container, hostname, max_frame, channel_max, idle, None, None,
                               None, None, {Sym("product"): "fuzz"}], wide))


def begin(ch: int = 0, next_out=U(0), in_win=U(2048), out_win=U(2048), wide=False) -> bytes:
    return fr(described(0x11, [None, next_out, in_win, out_win, U(1023)], wide), ch)


def source(address) -> Raw:
    return Raw(described(0x28, [address, U(0), Sym("session-end"), U(0), False, None, None,
                                {Sym("jms-selector"): Raw(described(0x0000468C00000004,
                                                                   ["a = 1"]))}]))


def target(address) -> Raw:
    return Raw(described(0x29, [address]))


def attach(name: str, handle, role: bool, address="/queues/fuzz", ch: int = 0,
           snd_settle=UB(0), wide=False, props=None) -> bytes:
    src = source(address if role else None)
    tgt = target(None if role else address)
    return fr(described(0x12, [name, handle, role, snd_settle, UB(0), src, tgt, None, None,
                               None if role else U(0), None, None, None, props], wide), ch)


def flow(handle=None, credit=U(100), delivery_count=U(0), drain=False, echo=False,
         ch: int = 0, next_in=U(0), in_win=U(2048), next_out=U(0), out_win=U(2048)) -> bytes:
    return fr(described(0x13, [next_in, in_win, next_out, out_win, handle, delivery_count,
                               credit, None, drain, echo]), ch)


def message(body: bytes = b"hello", props: dict | None = None) -> bytes:
    return (described(0x70, [True, UB(4), U(60000)])
            + described(0x72, {Sym("x-opt-k"): "v"})
            + described(0x73, ["m1", None, "/queues/fuzz", "subj", "reply", "c1",
                               Sym("text/plain")])
            + described(0x74, props or {"n": 1, "s": "x", "f": 1.5, "b": True})
            + b"\x00\x53\x75" + enc(body))


def transfer(handle, delivery_id, payload: bytes, settled=False, more=False, tag=b"t",
             ch: int = 0, wide=False) -> bytes:
    return fr(described(0x14, [handle, delivery_id, tag, U(0), settled, more], wide), ch,
              payload=payload)


def disposition(first, last=None, role=True, settled=True, state=None, ch: int = 0) -> bytes:
    return fr(described(0x15, [role, first, last, settled, state]), ch)


ACCEPTED = Raw(described(0x24, []))
RELEASED = Raw(described(0x26, []))
REJECTED = Raw(described(0x25, [Raw(described(0x1d, [Sym("amqp:internal-error"), "x"]))]))
MODIFIED = Raw(described(0x27, [True, False, {Sym("x-k"): 1}]))


def detach(handle, closed=True, ch: int = 0, err=None) -> bytes:
    return fr(described(0x16, [handle, closed, err]), ch)


def end(ch: int = 0) -> bytes:
    return fr(described(0x17, []), ch)


def close(err=None) -> bytes:
    return fr(described(0x18, [err]))


NAMES = {0x10: "open", 0x11: "begin", 0x12: "attach", 0x13: "flow", 0x14: "transfer",
         0x15: "disposition", 0x16: "detach", 0x17: "end", 0x18: "close", None: "empty"}
HEARTBEAT = b"\x00\x00\x00\x08\x02\x00\x00\x00"


def hand_pieces() -> list[bytes]:
    """Frames, most legal, some odd, for splicing after the open."""
    big = message(b"B" * 65536)
    deep: object = "leaf"
    for _ in range(200):
        deep = [deep]
    out = [
        begin(0), begin(1, wide=True), begin(2),
        attach("s0", U(0), False), attach("r1", U(1), True), attach("s2", U(2), False,
                                                                    "/exchanges/amq.topic/a.b"),
        attach("r3", U(3), True, "/amq/queue/fuzz", snd_settle=UB(1)),
        attach("d4", U(4), True, None, wide=True),
        attach("x5", U(5), False, None, props={Sym("x-multiqueue"): [Sym("a"), Sym("b")]}),
        attach("w6", U(6), True, "/queues/fuzz", ch=1),
        flow(U(1), U(50)), flow(U(3), U(5), drain=True), flow(None, None, echo=True),
        flow(U(1), U(0), echo=True), flow(U(0), U(10)), flow(U(1), U(0xFFFFFFFF)),
        transfer(U(0), U(0), message()), transfer(U(0), U(1), message(b""), settled=True),
        transfer(U(0), U(2), message()[:20], more=True) + transfer(U(0), None,
                                                                   message()[20:]),
        transfer(U(0), U(3), big[:30000], more=True) + transfer(U(0), None, big[30000:60000],
                                                                more=True)
        + transfer(U(0), None, big[60000:]),
        transfer(U(0), U(4), b"", more=True, settled=True),
        transfer(U(0), U(5), b"\x00\x53\x77\xa1\x03abc", wide=True),
        transfer(U(2), U(6), b"\x00\x53\x75\xa0\x00"),
        fr(described(0x14, [U(0), U(7), b"t", U(0), False, False, None, None, None, True]),
           payload=b"aborted"),
        disposition(U(0)), disposition(U(0), U(10), state=ACCEPTED),
        disposition(U(1), state=RELEASED, settled=False), disposition(U(2), state=REJECTED),
        disposition(U(3), U(3), state=MODIFIED), disposition(U(0), U(0xFFFFFFFF)),
        disposition(U(0), role=False, state=ACCEPTED),
        detach(U(0)), detach(U(1), closed=False), detach(U(9)),
        end(0), end(1), HEARTBEAT, HEARTBEAT * 3,
        fr(described(0x13, []), 0, ext=b"\x01\x02\x03\x04"),
        fr(described("amqp:flow:list", [U(0), U(2048), U(0), U(2048)])),
        fr(described(0x14, [U(0), U(8), deep])),
        fr(described(0x12, [enc("x" * 10), U(0)]), 0),
        fr(enc([1, 2, 3])),                             # not described
        fr(described(0x99, [])),                        # unknown performative
        fr(described(0x10, []), 0),                     # a second open
        fr(b"\x00\x53\x13\xe0\x06\x02\xa1" + b"\x02ab" + b"\x01"),  # array of strings
        fr(b"\x00\x53\x13" + b"\xf0" + struct.pack(">II", 0x7FFFFFFF, 0x7FFFFFFF) + b"\x43"),
        fr(b"\x00\x53\x15" + b"\xd0" + struct.pack(">II", 0x7FFFFFF0, 0x7FFFFFF0)),
        fr(b"\x00\x53\x14" + b"\xc0\x04\x02\x43\x43", payload=b"\xb0\xff\xff\xff\xff"),
        close(), close(Raw(described(0x1d, [Sym("amqp:internal-error"), "bye"]))),
    ]
    # attaches whose source or target fields have the wrong types (the broker echoes them)
    odd = ("x", [1], {Sym("k"): 1}, -1, 1.5, b"\xff", True)
    for i, v in enumerate(odd):
        for role in (False, True):
            fields = [Sym("/queues/fuzz")] + [None] * 10
            fields[1 + i % 10] = v
            src = Raw(described(0x28, fields))
            tgt = Raw(described(0x29, fields[:7]))
            out.append(fr(described(0x12, [f"odd{i}{role:d}", U(10 + i), role, UB(0), UB(0),
                                           src, tgt, None, None, None if role else U(0)])))
    return out


# -- the corpus, recorded from proton's client against the engine ---------------------------------
def engine_module():
    """``shoal.router.amqp10.engine``, or None while it does not exist."""
    try:
        from shoal.router.amqp10 import engine
    except ImportError:
        return None
    return engine


def new_engine(max_message_size: int = 0, anonymous: bool = False):
    from shoal.router.amqp10.engine import Engine
    mechs = ["PLAIN", "ANONYMOUS"] if anonymous else ["PLAIN"]
    return Engine(lambda mech, resp, host: "guest"
                  if mech == "ANONYMOUS" or resp == b"\0guest\0guest" else None,
                  mechs, idle_timeout_ms=60000, max_message_size=max_message_size,
                  anonymous_user="guest" if anonymous else None)


def link_call(eng, link, name: str, *args, **kw):
    """``name`` (accept_link, refuse_link, give_credit, settle_received, send_message,
    drained) for ``link``: the engine's method in the first cut, the link's session's since
    9724a7d."""
    m = getattr(eng, name, None)
    if m is None:
        m = getattr(link.session, name)
    return m(link, *args, **kw)


class Driver:
    """Drives an engine as router/frontend/amqp10_client.py does (no broker behind it)."""

    def __init__(self, eng, rnd: random.Random | None = None) -> None:
        from shoal.router.amqp10 import engine as E
        from shoal.router.amqp10 import frames as F
        self.E, self.F = E, F
        self.eng = eng
        self.rnd = rnd or random.Random(0)
        self.senders: list = []         #: our sending links (the client receives)
        self.closed_error = None
        self.closed = False
        self.stats: Counter = Counter()
        self.n = 0

    def handle(self, events: list) -> None:
        E, F, eng = self.E, self.F, self.eng
        settle: dict = {}
        events = list(events)
        for ev in events:
            t = type(ev)
            self.stats[t.__name__] += 1
            if t is E.ConnectionOpened:
                eng.open("shoal-fuzz")
                if hasattr(eng, "resume"):   # frames behind the open wait for our answer
                    events += eng.resume()
            elif t is E.LinkAttached:
                link = ev.link
                r = self.rnd.random()
                if r < 0.1:
                    link_call(eng, link, "refuse_link", "amqp:not-found", "no such queue")
                elif link.role == F.ROLE_SENDER:
                    link_call(eng, link, "accept_link")
                    self.senders.append(link)
                else:
                    link_call(eng, link, "accept_link", credit=256)
            elif t is E.MessageReceived:
                settle.setdefault(ev.link, []).append(ev.delivery_id)
            elif t is E.CreditChanged:
                link = ev.link
                if link.drain and link.credit > 0 and self.rnd.random() < 0.5:
                    link_call(eng, link, "drained")
            elif t is E.LinkDetached:
                if ev.link in self.senders:
                    self.senders.remove(ev.link)
            elif t is E.ConnectionClosed:
                self.closed = True
                self.closed_error = ev.error
        for link, ids in settle.items():
            if link.detached:
                continue
            state = self.rnd.choice((F.Accepted(), F.Accepted(), F.Released(),
                                     F.Rejected(F.error("amqp:internal-error", "no"))))
            link_call(eng, link, "settle_received", ids, state)
            if link.credit < 128 and not link.detached:
                link_call(eng, link, "give_credit", 256)
        if not self.closed:
            for link in list(self.senders):
                k = 0
                while link.credit > 0 and not link.detached and k < 4:
                    self.n += 1
                    link_call(eng, link, "send_message", b"\x00\x53\x75\xa0\x05hello", self.n)
                    k += 1


def record_sessions() -> list[bytes]:
    """Valid client streams: proton's client engine against Shoal's engine, in lockstep."""
    from proton import (Collector, Connection, Delivery, Event, Message, SASL, Transport)

    def session(use_sasl: bool, max_frame: int, plan: str) -> bytes:
        eng = new_engine(anonymous=not use_sasl)
        drv = Driver(eng, random.Random(1))
        drv.rnd = _NoRefuse()
        ct = Transport()
        ct.max_frame_size = max_frame
        conn = Connection()
        coll = Collector()
        conn.collect(coll)
        if use_sasl:
            s = ct.sasl()
            s.allowed_mechs("PLAIN")
            s.allow_insecure_mechs = True
            conn.user, conn.password = "guest", "guest"
        conn.hostname = "vhost:/"
        ct.bind(conn)
        conn.open()
        ssn = conn.session()
        ssn.open()
        out = bytearray()
        snd = ssn.sender("fuzz-sender")
        snd.target.address = "/queues/fuzz"
        if plan == "presettled":
            snd.snd_settle_mode = 1
        snd.open()
        rcv = ssn.receiver("fuzz-receiver")
        rcv.source.address = "/queues/fuzz"
        rcv.open()
        rcv.flow(20)
        sent = 0
        outcomes = [Delivery.ACCEPTED, Delivery.RELEASED, Delivery.REJECTED, Delivery.MODIFIED]
        got = 0

        def pump() -> None:
            n = ct.pending()
            if n > 0:
                data = ct.peek(n)
                ct.pop(n)
                out.extend(data)
                drv.handle(eng.receive_data(bytes(data)))
            data = eng.data_to_send()
            if data:
                ct.push(data)

        for step in range(60):
            pump()
            ev = coll.peek()
            while ev:
                if ev.type == Event.DELIVERY:
                    d = ev.delivery
                    if d.link.is_receiver and d.readable and not d.partial:
                        d.link.recv(d.pending)
                        d.link.advance()
                        d.update(outcomes[got % 4])
                        d.settle()
                        got += 1
                    elif d.link.is_sender and d.updated:
                        d.settle()
                coll.pop()
                ev = coll.peek()
            if snd.credit > 0 and sent < 12:
                body = b"m" * (3000 if sent % 4 == 3 else 20)
                m = Message(body=body, id=f"id-{sent}", content_type="text/plain",
                            properties={"k": sent}, subject="s", durable=bool(sent % 2))
                d = snd.delivery(b"%d" % sent)
                snd.send(m.encode())
                snd.advance()
                if plan == "presettled":
                    d.settle()
                sent += 1
            if step == 20:
                rcv.drain(5)
            if step == 40:
                snd.close()
                rcv.close()
            if step == 50:
                ssn.close()
                conn.close()
        pump()
        return bytes(out)

    return [session(True, 65536, "unsettled"), session(True, 512, "unsettled"),
            session(False, 65536, "presettled"), session(True, 1024, "presettled")]


class _NoRefuse(random.Random):
    def random(self) -> float:
        return 0.5


def open_prefix(stream: bytes) -> bytes:
    """The stream up to and including the client's open frame (headers, SASL, open)."""
    pos = 0
    while pos + 8 <= len(stream):
        if stream[pos:pos + 4] == b"AMQP":
            pos += 8
            continue
        size = struct.unpack_from(">I", stream, pos)[0]
        if size < 8:
            break
        body_at = pos + stream[pos + 4] * 4
        is_open = stream[body_at:body_at + 3] == b"\x00\x53\x10"
        pos += size
        if is_open:
            return stream[:pos]
    return stream


def frame_spans(data: bytes) -> list[tuple[int, int]]:
    """(start, end) of each frame of a well-formed stream (headers skipped)."""
    spans, pos = [], 0
    while pos + 8 <= len(data):
        if data[pos:pos + 4] == b"AMQP":
            pos += 8
            continue
        size = struct.unpack_from(">I", data, pos)[0]
        if size < 8 or pos + size > len(data):
            break
        spans.append((pos, pos + size))
        pos += size
    return spans


# -- the generator ----------------------------------------------------------------------------
SPECIAL = (0x00, 0xFF, 0x40, 0x41, 0x43, 0x45, 0x50, 0x52, 0x53, 0x70, 0x80, 0xa0, 0xa1,
           0xa3, 0xb0, 0xb1, 0xb3, 0xc0, 0xc1, 0xd0, 0xd1, 0xe0, 0xf0, 0x7F, 0x01, 0x02)
LENGTH_CODES = {0xb0: 4, 0xb1: 4, 0xb3: 4, 0xd0: 8, 0xd1: 8, 0xf0: 8, 0xa0: 1, 0xa1: 1,
                0xa3: 1, 0xc0: 2, 0xc1: 2, 0xe0: 2}


class Generator:
    def __init__(self, sessions: list[bytes]) -> None:
        self.sessions = sessions
        self.prefixes = [open_prefix(s) for s in sessions]
        self.pieces = hand_pieces()
        self.frames = [s[a:b] for s in sessions for a, b in frame_spans(s)] + self.pieces

    def generate(self, rnd: random.Random) -> bytes:
        r = rnd.random()
        if r < 0.45:
            data = bytearray(rnd.choice(self.sessions))
        else:
            prefix = rnd.choice(self.prefixes)
            data = bytearray(prefix)
            for _ in range(rnd.randint(3, 12)):
                data += rnd.choice(self.pieces)
        # mutate after the headers most of the time, the headers and SASL one time in ten
        lo = 0 if rnd.random() < 0.1 else min(len(data) - 1, 16)
        for _ in range(rnd.choice((0, 1, 1, 1, 2, 2, 3, 4))):
            self.mutate(rnd, data, lo)
        if rnd.random() < 0.1 and len(data) > lo + 1:
            del data[rnd.randrange(lo, len(data)):]
        return bytes(data)

    def mutate(self, rnd: random.Random, data: bytearray, lo: int) -> None:
        if len(data) <= lo + 1:
            return
        at = rnd.randrange(lo, len(data))
        kind = rnd.randrange(10)
        if kind == 0:
            data[at] ^= 1 << rnd.randrange(8)
        elif kind == 1:
            data[at] = rnd.choice(SPECIAL)
        elif kind == 2:
            data[at:at] = rnd.randbytes(rnd.randint(1, 16))
        elif kind == 3:
            del data[at:at + rnd.randint(1, 32)]
        elif kind == 4:
            end_ = min(len(data), at + rnd.randint(1, 64))
            data[at:at] = data[at:end_]
        elif kind == 5:
            f = rnd.choice(self.frames)
            if rnd.random() < 0.5:
                data[at:at] = f
            else:
                s = rnd.randrange(len(f))
                data[at:at] = f[s:s + rnd.randint(1, 64)]
        elif kind in (6, 7):     # a frame's size or doff
            spans = [s for s in frame_spans(bytes(data)) if s[0] >= lo]
            if not spans:
                return
            a, b = rnd.choice(spans)
            if kind == 6:
                size = rnd.choice((0, 1, 7, 8, 9, b - a - 1, b - a + 1, b - a + rnd.randint(2, 99),
                                   511, 512, 65536, 131072, 131073, 0x7FFFFFFF, 0xFFFFFFFF))
                struct.pack_into(">I", data, a, size & 0xFFFFFFFF)
            else:
                data[a + 4] = rnd.choice((0, 1, 2, 3, 0x40, 0xFF))
        elif kind == 8:          # a length field of a variable-width value
            cands = [i for i in range(lo, len(data) - 1) if data[i] in LENGTH_CODES]
            if not cands:
                return
            i = rnd.choice(cands)
            width = LENGTH_CODES[data[i]]
            if width == 8:
                pos = i + 1 + (4 if rnd.random() < 0.5 else 0)
                val = rnd.choice((0, 1, 0x7FFFFFFF, 0xFFFFFFFF, 0xFFFFFFF0))
                if pos + 4 <= len(data):
                    struct.pack_into(">I", data, pos, val)
            elif width == 4:
                if i + 5 <= len(data):
                    struct.pack_into(">I", data, i + 1,
                                     rnd.choice((0, 0x7FFFFFFF, 0xFFFFFFFF, 0x10000)))
            elif width == 2:
                if i + 3 <= len(data):
                    data[i + 1 + rnd.randrange(2)] = rnd.choice((0, 1, 0xFF))
            else:
                if i + 2 <= len(data):
                    data[i + 1] = rnd.choice((0, 0xFF, 0x80))
        else:                    # a descriptor
            cands = [i for i in range(lo, len(data) - 2)
                     if data[i] == 0x00 and data[i + 1] == 0x53]
            if not cands:
                return
            i = rnd.choice(cands)
            if rnd.random() < 0.7:
                data[i + 2] = rnd.choice((0x00, 0x1d, 0x19, 0x23, 0x28, 0x29, 0x30, 0x45,
                                          0x70, 0x75, 0x78, 0x7F, 0x99, 0xFF))
            else:
                data[i + 1:i + 3] = enc(Sym(rnd.choice(("amqp:open:list", "amqp:transfer:list",
                                                        "amqp:nope:list", ""))))


def chunks(rnd: random.Random, data: bytes) -> list[bytes]:
    r = rnd.random()
    if r < 0.4:
        return [data]
    out, pos = [], 0
    top = 1 if r < 0.45 else rnd.choice((7, 64, 512, 4096))
    while pos < len(data):
        n = rnd.randint(1, top)
        out.append(data[pos:pos + n])
        pos += n
    return out


# -- the checks ---------------------------------------------------------------------------------
def parse_output(data: bytes) -> tuple[list, str | None]:
    """The output's frames as (kind, channel, performative descriptor, described value), or a
    reason why it is not whole decodable frames."""
    from proton import Data
    frames_, pos = [], 0
    while pos < len(data):
        if data[pos:pos + 4] == b"AMQP":
            if data[pos:pos + 8] not in (HEADER_AMQP, HEADER_SASL):
                return frames_, f"bad protocol header {data[pos:pos + 8]!r}"
            pos += 8
            continue
        if len(data) - pos < 8:
            return frames_, "a partial frame header at the end"
        size, doff, kind, ch = struct.unpack_from(">IBBH", data, pos)
        if size < 8 or doff < 2 or doff * 4 > size or pos + size > len(data):
            return frames_, f"bad frame header size {size} doff {doff}"
        body = data[pos + doff * 4:pos + size]
        pos += size
        if not body:
            frames_.append((kind, ch, None, None))
            continue
        d = Data()
        try:
            d.decode(body)
            d.rewind()
            d.next()
            obj = d.get_object()
        except Exception as e:  # noqa: BLE001 - proton could not decode our output
            return frames_, f"undecodable frame body {body[:64].hex()}: {e!r}"
        desc = getattr(obj, "descriptor", None)
        frames_.append((kind, ch, int(desc) if desc is not None else None, obj))
    return frames_, None


def close_condition(obj) -> str | None:
    """The error condition of a decoded close/end/detach, or None."""
    value = getattr(obj, "value", None)
    if not isinstance(value, list):
        return None
    for v in value:
        if getattr(v, "descriptor", None) == 0x1d and isinstance(v.value, list) and v.value:
            return str(v.value[0])
    return None


@dataclass
class Result:
    inputs: int = 0
    failures: list[str] = field(default_factory=list)
    hangs: int = 0
    bad_output: int = 0
    seconds: float = 0.0
    conditions: Counter = field(default_factory=Counter)
    outcomes: Counter = field(default_factory=Counter)
    slowest_s: float = 0.0

    kinds: Counter = field(default_factory=Counter)     #: failure kind -> count
    KEEP = 3                                            #: failures kept per kind, in full

    def fail(self, text: str) -> None:
        k = kind(text)
        self.kinds[k] += 1
        if self.kinds[k] <= self.KEEP:
            self.failures.append(text)

    @property
    def failed(self) -> int:
        return sum(self.kinds.values())

    def line(self, what: str = "in process") -> str:
        rate = self.inputs / self.seconds if self.seconds else 0
        return (f"{what}: {self.inputs} inputs in {self.seconds:.1f} s ({rate:,.0f}/s): "
                f"{self.failed} failures, {self.hangs} hangs, {self.bad_output} "
                f"malformed outputs; slowest input {self.slowest_s * 1000:.1f} ms")

    def merge(self, other: "Result") -> None:
        self.inputs += other.inputs
        self.failures += other.failures
        self.kinds.update(other.kinds)
        self.hangs += other.hangs
        self.bad_output += other.bad_output
        self.conditions.update(other.conditions)
        self.outcomes.update(other.outcomes)
        self.slowest_s = max(self.slowest_s, other.slowest_s)


def run_one(data: bytes, rnd: random.Random, res: Result, label: str,
            check_output: bool = True) -> None:
    """Feed ``data`` to a fresh engine, driven; record what goes wrong in ``res``."""
    eng = new_engine(max_message_size=rnd.choice((0, 0, 1 << 20, 1000)),
                     anonymous=rnd.random() < 0.3)
    drv = Driver(eng, rnd)
    out = bytearray()
    t0 = time.monotonic()
    stage = "receive_data"
    try:
        for part in chunks(rnd, data):
            stage = "receive_data"
            events = eng.receive_data(part)
            stage = "driver (engine API)"
            drv.handle(events)
            stage = "data_to_send"
            out += eng.data_to_send()
            if len(out) > MAX_BUFFER or len(getattr(eng, "_in", b"")) > MAX_BUFFER:
                raise MemoryError(f"buffers over {MAX_BUFFER} octets (out {len(out)}, "
                                  f"in {len(getattr(eng, '_in', b''))})")
            if time.monotonic() - t0 > HANG_S:
                break
        stage = "tick"
        drv.handle(eng.tick(time.monotonic() + 1000))
        out += eng.data_to_send()
        stage = "receive_data(EOF)"
        drv.handle(eng.receive_data(b""))
        out += eng.data_to_send()
    except Exception as e:  # noqa: BLE001 - every exception out of the engine is a finding
        tb = traceback.extract_tb(e.__traceback__)
        where = next((f"{os.path.basename(f.filename)}:{f.lineno} {f.name}" for f in
                      reversed(tb) if "amqp10" in f.filename and "fuzz" not in f.filename),
                     "?")
        res.fail(f"{label}: {type(e).__name__}: {e} [in {stage}, at {where}]\n"
                            f"    input ({len(data)} octets): {data.hex()}")
        if TRACEBACKS:
            traceback.print_exc()
    spent = time.monotonic() - t0
    res.slowest_s = max(res.slowest_s, spent)
    if spent > HANG_S:
        res.hangs += 1
        res.fail(f"{label}: took {spent:.1f} s\n    input: {data.hex()}")
    res.inputs += 1
    if drv.closed_error is not None:
        res.outcomes["closed with an error"] += 1
    elif drv.closed:
        res.outcomes["closed"] += 1
    else:
        res.outcomes["open at EOF?"] += 1
    if not check_output:
        return
    frames_, why = parse_output(bytes(out))
    problem = why
    closes = [i for i, f in enumerate(frames_) if f[0] == 0 and f[2] == 0x18]
    if not problem and closes and closes[0] != len(frames_) - 1:
        after = sorted({NAMES.get(f[2], str(f[2])) for f in frames_[closes[0] + 1:]})
        problem = f"frames after our close ({', '.join(after)})"
    for kind, ch, desc, obj in frames_:
        if desc in (0x16, 0x17, 0x18):
            c = close_condition(obj)
            if c:
                res.conditions[f"{ {0x16: 'detach', 0x17: 'end', 0x18: 'close'}[desc]} {c}"] += 1
                if c not in CONDITIONS and desc == 0x18:
                    problem = problem or f"close with an unexpected condition {c}"
    if drv.closed_error is not None and not problem and not closes:
        # ConnectionClosed with an error: ours (a protocol error) or the client's close; either
        # way a close frame of ours must follow (our close's condition is checked above)
        cond = str(getattr(drv.closed_error, "condition", "") or "")
        problem = f"a connection closed with an error ({cond}) without a close frame"
    if problem:
        res.bad_output += 1
        res.fail(f"{label}: output: {problem}\n    input: {data.hex()}")


def in_process(n: int, seed: int = 0, check_every: int = 1) -> Result:
    """``n`` inputs from ``seed``, each into a fresh engine."""
    rnd = random.Random(seed)
    gen = Generator(record_sessions())
    res = Result()
    began = time.monotonic()
    for i in range(n):
        data = gen.generate(rnd)
        run_one(data, random.Random(rnd.random()), res, f"seed {seed} input {i}",
                check_output=i % check_every == 0)
    res.seconds = time.monotonic() - began
    return res


def kind(failure: str) -> str:
    """A failure's kind: its first line without the label, numbers and parenthesised detail."""
    import re
    key = re.sub(r"\d+", "N", failure.split("\n")[0].split(": ", 1)[1])
    return re.sub(r" \(.*\)$", "", key)


def distinct(failures: list[str], counts: Counter | None = None
             ) -> dict[str, tuple[int, str]]:
    """Failures grouped by kind: kind -> (how many, the first one)."""
    out: dict[str, tuple[int, str]] = {}
    for f in failures:
        k = kind(f)
        n, first = out.get(k, (0, f))
        out[k] = (n + 1, first)
    if counts:
        out = {k: (counts.get(k, n), first) for k, (n, first) in out.items()}
    return out


def _job(args: tuple[int, int, int]) -> Result:
    n, seed, check_every = args
    return in_process(n, seed, check_every)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m tests.e2e.faults.fuzz_amqp10")
    p.add_argument("--inputs", type=int, default=1_000_000)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--jobs", type=int, default=1, help="processes (each its own seed)")
    p.add_argument("--check-every", type=int, default=1,
                   help="decode the output of every Nth input (1 = all)")
    p.add_argument("--replay", default="", help="one input, in hex, to run and report")
    p.add_argument("--out", default="", help="write every distinct failure, in full, here")
    a = p.parse_args(argv)
    if engine_module() is None:
        print("fuzz_amqp10: shoal.router.amqp10.engine is not there yet; nothing to fuzz")
        return 2
    if a.replay:
        global TRACEBACKS
        TRACEBACKS = True
        res = Result()
        run_one(bytes.fromhex(a.replay), random.Random(0), res, "replay")
        print(res.line("replay"))
        for f in res.failures:
            print(f)
        return 1 if res.failed else 0
    if a.jobs > 1:
        import multiprocessing as mp
        per = a.inputs // a.jobs
        with mp.get_context("spawn").Pool(a.jobs) as pool:
            parts = pool.map(_job, [(per, a.seed * 1000 + j, a.check_every)
                                    for j in range(a.jobs)])
        res = Result()
        t0 = max(p_.seconds for p_ in parts)
        for part in parts:
            res.merge(part)
        res.seconds = t0
    else:
        res = in_process(a.inputs, a.seed, a.check_every)
    print(res.line(), flush=True)
    print("outcomes:", dict(res.outcomes.most_common()))
    print("error conditions sent:", dict(res.conditions.most_common()))
    # one line per distinct failure (type and place), with its first input
    seen = distinct(res.failures, res.kinds)
    for key, (count, f) in list(seen.items())[:30]:
        print(f"[{count}x] {f}")
    if a.out:
        with open(a.out, "w") as f:
            for key, (count, first) in seen.items():
                f.write(f"[{count}x] {first}\n\n")
    print("PASS" if not res.failed else f"FAIL ({len(seen)} distinct)")
    return 0 if not res.failed else 1


if __name__ == "__main__":
    sys.exit(main())
