"""The AMQP 1.0 fuzz campaign's engine side (tests/e2e/faults/fuzz_amqp10.py): Shoal's sans-IO
engine built, driven as the router drives it, and checked.

- ``new_engine`` and ``Driver``: a fresh ``shoal.router.amqp10.engine.Engine``, and the router's
  side of it (router/frontend/amqp10_client.py: open answered, links accepted with credit,
  messages settled, messages sent while there is credit).
- ``record_sessions``: the corpus, proton's client engine against a driven engine, in lockstep.
- ``run_one``: one input fed to a fresh driven engine, then the checks (no exception, no hang,
  bounded buffers, whole frames proton decodes, nothing after a close, a close with one of
  ``CONDITIONS`` after a protocol error); ``Result`` tallies them, ``kind``/``distinct`` group
  the failures.
"""
from __future__ import annotations

import os
import random
import struct
import time
import traceback
from collections import Counter
from dataclasses import dataclass, field

from .fuzz_amqp10_inputs import chunks

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
NAMES = {0x10: "open", 0x11: "begin", 0x12: "attach", 0x13: "flow", 0x14: "transfer",
         0x15: "disposition", 0x16: "detach", 0x17: "end", 0x18: "close", None: "empty"}


# -- the engine, driven as the router drives it ----------------------------------------------------
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


# -- the corpus, recorded from proton's client against the engine ---------------------------------
def record_sessions() -> list[bytes]:
    """Valid client streams: proton's client engine against Shoal's engine, in lockstep."""
    from proton import (Collector, Connection, Delivery, Event, Message, Transport)

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
