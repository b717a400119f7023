"""The AMQP 1.0 fuzz campaign's inputs (tests/e2e/faults/fuzz_amqp10.py): what is fed to the
engine, independent of the engine.

- An AMQP 1.0 encoder (part 1 types) independent of Shoal's codec, and ``hand_pieces()``: frames
  built with it, most legal, some odd (list32/map32/str32, descriptors by symbol, null fields,
  a 64 KiB transfer, arrays, heartbeats, deep nesting), for splicing after the open.
- ``Generator``: an input from a corpus stream (recorded from proton's client by
  ``fuzz_amqp10_checks.record_sessions``) or its prefix up to the open with spliced hand-built
  frames, then 0 to 4 mutations and sometimes a truncation; ``open_prefix`` and
  ``frame_spans`` cut streams into frames for it.
- ``chunks``: an input split into the random pieces it is fed in.
"""
from __future__ import annotations

import random
import struct


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


# -- corpus streams cut at their frames ------------------------------------------------------
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
