"""The AMQP 1.0 codec decision, measured (issue 37): CPU per message of a broker's side of the
protocol, python-qpid-proton's engine against Shoal's pure-Python engine
(``shoal.router.amqp10``), in both directions.

    python tests/benchmarks/amqp10_codec.py [-n 50000] [--best-of 3] [--batch 256]

The method (the same for both engines):

- One process, no sockets. The peer is a python-qpid-proton CLIENT-mode ``Transport`` (no
  SASL layer for proton's server; Shoal's engine is given whatever it needs to reach the
  open state -- a SASL PLAIN exchange or an anonymous mode -- before the clock starts). Bytes
  move between the two as a socket would move them: everything the one side has to send is
  handed to the other at once (``transport.peek``/``pop`` on proton's side).
- The two sides run in lockstep, a batch of ``--batch`` (256) messages at a time; only the
  SERVER's work is timed: ``time.process_time_ns()`` is read around every server segment
  (hand it the bytes, handle its events, pull its output) and the segments are summed. The
  client's work is not counted. Set-up (open, begin, attach) is not counted either.
- Publish direction (client sender -> server receiver): the client sends N transfers,
  unsettled, of a message with a 100-byte body in one data section, properties message-id
  and content-type and one application property. The server, as a broker would: on the link's
  attach, attaches back and grants credit (``--credit``, 1,000, topped up when half is used);
  on each delivery reads its bytes, decodes the message and reads the body, message-id,
  content-type and application properties (what the conversion to 0-9-1 needs), answers
  ``accepted`` and settles.
  proton: ``link.recv(delivery.pending)``, ``link.advance()``, ``Message().decode()``,
  ``delivery.update(ACCEPTED)``, ``delivery.settle()``.
- Delivery direction (server sender -> client receiver): the client attaches a receiving link
  with credit (``--credit``, topped up), accepts and settles each message; the server encodes
  each message from its parts (a new ``proton.Message`` per message, ``encode()``), sends it
  unsettled (``sender.delivery(tag)``, ``send(bytes)``, ``advance()``), and handles the
  client's dispositions (reads the outcome, settles).
- proton is driven two ways, both printed: "events", the documented way (a ``Collector``,
  one ``Event`` per delivery, as above), and "polled", the cheapest found from Python (no
  collector: a publish walks ``link.current``; outcomes are read from the deliveries still
  unsettled, oldest first), since a broker built on proton would pay for the binding's event
  objects only if it chose to.
- Two more rows take the message codec out: "engine only" (the server does not decode the
  message; it sends pre-encoded ones), i.e. framing, performatives, sessions, links,
  settlement alone.
- Each figure is CPU microseconds per message, over N (50,000) messages, the best of
  ``--best-of`` (3) fresh connections. The ratio printed is Shoal / the cheaper proton
  figure (below 1: Shoal's engine costs less). The Shoal rows measure the tree they run
  from (its commit is printed, and whether router/amqp10 has uncommitted changes).

Shoal's engine is driven through its sans-IO surface (``receive_data(bytes) -> events``,
``data_to_send() -> bytes``); until it exists, its rows print "not available".
Not collected by pytest (no ``test_`` prefix): a benchmark asserts no speed.
"""
from __future__ import annotations

import argparse
import sys
import time

from proton import Collector, Connection, Delivery, Event, Message, Transport

BODY = b"x" * 100
CONTENT_TYPE = "application/octet-stream"


def make_message(i: int) -> Message:
    return Message(body=BODY, inferred=True, id=f"msg-{i}", content_type=CONTENT_TYPE,
                   properties={"n": i})


def move(src: Transport, dst: Transport) -> int:
    """Everything ``src`` has to send, into ``dst`` (as one socket read)."""
    n = src.pending()
    if n <= 0:
        return 0
    data = src.peek(n)
    src.pop(n)
    pos = 0
    while pos < n:          # as a socket reader does: no more than the transport can take
        cap = dst.capacity()
        if cap <= 0:
            raise RuntimeError(f"transport takes no input ({cap})")
        dst.push(data[pos:pos + cap])
        pos += cap
    return n


# -- the proton client (not timed) ------------------------------------------------------------
class Client:
    def __init__(self) -> None:
        self.transport = Transport()          # client mode, no SASL
        self.conn = Connection()
        self.coll = Collector()
        self.conn.collect(self.coll)
        self.transport.bind(self.conn)
        self.conn.open()
        self.session = self.conn.session()
        self.session.open()
        self.settled = 0
        self.received = 0
        self.credit = 0

    def sender(self, address: str):
        self.link = self.session.sender("bench-sender")
        self.link.target.address = address
        self.link.open()
        return self.link

    def receiver(self, address: str, credit: int):
        self.credit = credit
        self.link = self.session.receiver("bench-receiver")
        self.link.source.address = address
        self.link.open()
        self.link.flow(credit)
        return self.link

    def send(self, messages: list[bytes], start: int) -> int:
        """Send as many of ``messages`` as credit allows; returns how many."""
        k = 0
        link = self.link
        while k < len(messages) and link.credit > 0:
            link.delivery(b"%d" % (start + k))
            link.send(messages[k])
            link.advance()
            k += 1
        return k

    def handle(self) -> None:
        coll = self.coll
        ev = coll.peek()
        while ev:
            if ev.type == Event.DELIVERY:
                d = ev.delivery
                if d.link.is_sender:
                    if d.updated and (d.settled or d.remote_state):
                        d.settle()
                        self.settled += 1
                elif d.readable and not d.partial:
                    link = d.link
                    link.recv(d.pending)
                    link.advance()
                    d.update(Delivery.ACCEPTED)
                    d.settle()
                    self.received += 1
                    if link.credit < self.credit // 2:
                        link.flow(self.credit - link.credit)
            coll.pop()
            ev = coll.peek()


# -- (a) proton's engine as the server ------------------------------------------------------
class ProtonServer:
    name = "python-qpid-proton 0.40 engine"

    def __init__(self, credit: int, with_codec: bool = True) -> None:
        self.with_codec = with_codec
        if not with_codec:
            self.payloads = [make_message(i).encode() for i in range(4096)]
        self.transport = Transport(Transport.SERVER)
        self.conn = Connection()
        self.coll = Collector()
        self.conn.collect(self.coll)
        self.transport.bind(self.conn)
        self.credit = credit
        self.received = 0
        self.outcomes = 0
        self.sender = None
        self.check = 0

    def handle(self) -> None:
        coll = self.coll
        ev = coll.peek()
        while ev:
            t = ev.type
            if t == Event.DELIVERY:
                d = ev.delivery
                link = d.link
                if link.is_receiver:
                    if d.readable and not d.partial:
                        data = link.recv(d.pending)
                        link.advance()
                        if self.with_codec:
                            m = Message()
                            m.decode(data)
                            body, mid, ct, props = m.body, m.id, m.content_type, m.properties
                            self.check += len(body) + len(props)
                        else:
                            self.check += len(BODY) + 1
                        d.update(Delivery.ACCEPTED)
                        d.settle()
                        self.received += 1
                        if link.credit < self.credit // 2:
                            link.flow(self.credit - link.credit)
                elif d.updated:
                    if d.remote_state == Delivery.ACCEPTED:
                        self.outcomes += 1
                    d.settle()
            elif t == Event.CONNECTION_REMOTE_OPEN:
                ev.connection.open()
            elif t == Event.SESSION_REMOTE_OPEN:
                ev.session.open()
            elif t == Event.LINK_REMOTE_OPEN:
                link = ev.link
                link.source.copy(link.remote_source)
                link.target.copy(link.remote_target)
                link.open()
                if link.is_receiver:
                    link.flow(self.credit)
                else:
                    self.sender = link
            coll.pop()
            ev = coll.peek()

    def receive(self, client_transport: Transport) -> None:
        move(client_transport, self.transport)
        self.handle()

    def output(self, client_transport: Transport) -> None:
        move(self.transport, client_transport)

    def send_messages(self, start: int, count: int) -> int:
        """Encode and send up to ``count`` messages as the link's credit allows."""
        link = self.sender
        k = 0
        while k < count and link.credit > 0:
            i = start + k
            data = make_message(i).encode() if self.with_codec else \
                self.payloads[i % len(self.payloads)]
            link.delivery(b"%d" % i)
            link.send(data)
            link.advance()
            k += 1
        return k


class ProtonPolledServer(ProtonServer):
    """proton's engine without a collector: the cheapest way found to drive it from Python.
    Set-up polls the endpoints' states; then a publish walks ``link.current`` and a delivery's
    outcomes are read from the deliveries still unsettled, oldest first (the client settles in
    order), so no event object is made per message."""
    name = "python-qpid-proton 0.40 engine, polled"

    def __init__(self, credit: int, with_codec: bool = True) -> None:
        super().__init__(credit, with_codec)
        self.conn = Connection()                # no collector this time
        self.transport = Transport(Transport.SERVER)
        self.transport.bind(self.conn)
        self.receiver_link = None
        self.unsettled: list = []
        self.first = 0

    def handle(self) -> None:
        from proton import Endpoint
        if self.receiver_link is None and self.sender is None:
            new = Endpoint.LOCAL_UNINIT | Endpoint.REMOTE_ACTIVE
            if self.conn.state & Endpoint.LOCAL_UNINIT and \
                    self.conn.state & Endpoint.REMOTE_ACTIVE:
                self.conn.open()
            ssn = self.conn.session_head(new)
            while ssn:
                ssn.open()
                ssn = ssn.next(new)
            link = self.conn.link_head(new)
            while link:
                link.source.copy(link.remote_source)
                link.target.copy(link.remote_target)
                link.open()
                if link.is_receiver:
                    link.flow(self.credit)
                    self.receiver_link = link
                else:
                    self.sender = link
                link = link.next(new)
            return
        link = self.receiver_link
        if link is not None:
            d = link.current
            while d is not None and d.readable and not d.partial:
                data = link.recv(d.pending)
                link.advance()
                if self.with_codec:
                    m = Message()
                    m.decode(data)
                    body, mid, ct, props = m.body, m.id, m.content_type, m.properties
                    self.check += len(body) + len(props)
                else:
                    self.check += len(BODY) + 1
                d.update(Delivery.ACCEPTED)
                d.settle()
                self.received += 1
                d = link.current
            if link.credit < self.credit // 2:
                link.flow(self.credit - link.credit)
        if self.sender is not None:
            pending, i = self.unsettled, self.first
            while i < len(pending) and pending[i].remote_state:
                d = pending[i]
                if d.remote_state == Delivery.ACCEPTED:
                    self.outcomes += 1
                d.settle()
                i += 1
            if i > 4096:
                del pending[:i]
                i = 0
            self.first = i

    def send_messages(self, start: int, count: int) -> int:
        link = self.sender
        k = 0
        while k < count and link.credit > 0:
            i = start + k
            data = make_message(i).encode() if self.with_codec else \
                self.payloads[i % len(self.payloads)]
            self.unsettled.append(link.delivery(b"%d" % i))
            link.send(data)
            link.advance()
            k += 1
        return k


def run_proton_polled(direction: str, n: int, batch: int, credit: int,
                      with_codec: bool = True) -> float:
    return _lockstep(ProtonPolledServer(credit, with_codec), direction, n, batch, credit)


def run_proton(direction: str, n: int, batch: int, credit: int,
               with_codec: bool = True) -> float:
    """CPU microseconds per message of proton's server side, one fresh connection."""
    return _lockstep(ProtonServer(credit, with_codec), direction, n, batch, credit)


def _lockstep(server, direction: str, n: int, batch: int, credit: int) -> float:
    """Run ``n`` messages through ``server`` in ``direction`` with a proton client; the
    server's CPU microseconds per message."""
    client = Client()
    clock = time.process_time_ns
    if direction == "publish":
        client.sender("/queues/bench")
        messages = [make_message(i).encode() for i in range(n)]
    else:
        client.receiver("/queues/bench", credit)
    for _ in range(4):           # open, begin, attach and the first flow
        server.receive(client.transport)
        server.output(client.transport)
        client.handle()
    spent = 0
    sent = 0
    stalls = 0
    if direction == "publish":
        while server.received < n:
            k = client.send(messages[sent:sent + batch], sent)
            sent += k
            t = clock()
            server.receive(client.transport)
            server.output(client.transport)
            spent += clock() - t
            client.handle()
            stalls = stalls + 1 if k == 0 else 0
            if stalls > 50 and server.received < n:
                raise RuntimeError(f"publish stalled at {server.received} of {n}")
        assert server.check == n * (len(BODY) + 1), server.check
    else:
        assert server.sender is not None, "the server has no sending link"
        while server.outcomes < n:
            t = clock()
            k = server.send_messages(sent, min(batch, n - sent))
            server.output(client.transport)
            spent += clock() - t
            sent += k
            client.handle()
            t = clock()
            server.receive(client.transport)
            spent += clock() - t
            stalls = stalls + 1 if k == 0 else 0
            if stalls > 50 and server.outcomes < n:
                raise RuntimeError(f"delivery stalled at {server.outcomes} of {n}")
        assert client.received == n
    return spent / 1000 / n


# -- (b) Shoal's engine ---------------------------------------------------------------------
def shoal_engine():
    """Shoal's sans-IO engine module, or None while it does not exist."""
    try:
        from shoal.router.amqp10 import engine  # noqa: F401
    except ImportError:
        return None
    return engine


def link_call(eng, link, name: str, *args, **kw):
    """``name`` (accept_link, give_credit, settle_received, send_message ...) for ``link``:
    the engine's method in the first cut, the link's session's since 9724a7d."""
    m = getattr(eng, name, None)
    if m is None:
        m = getattr(link.session, name)
    return m(link, *args, **kw)


class ShoalServer:
    """Shoal's engine (``shoal.router.amqp10.engine.Engine``) as a broker drives it
    (router/frontend/amqp10_client.py): anonymous login (the proton client has no SASL layer),
    links accepted with credit; a publish converted with ``convert.to_091`` (the decode the
    router does), a delivery built with ``convert.to_amqp10`` from the 0-9-1 header and body
    a node holds; received transfers settled accepted a batch at a time."""

    def __init__(self, credit: int, with_codec: bool = True) -> None:
        from shoal.router.amqp10 import convert, engine, frames
        self.E, self.F, self.convert = engine, frames, convert
        self.eng = engine.Engine(lambda mech, resp, host: "guest", ["ANONYMOUS"],
                                 idle_timeout_ms=0, anonymous_user="guest")
        self.credit = credit
        self.with_codec = with_codec
        self.received = self.outcomes = self.check = 0
        self.sender = None
        self.accepted = frames.Accepted()
        self.name = "Shoal engine" + ("" if with_codec else " (no message codec)")

    def handle(self, events) -> None:
        E = self.E
        settle: dict = {}
        events = list(events)
        for ev in events:
            t = type(ev)
            if t is E.MessageReceived:
                if self.with_codec:
                    inc = self.convert.to_091(ev.payload)
                    self.check += len(inc.body) + (1 if inc.header else 0)
                else:
                    self.check += len(BODY) + 1
                self.received += 1
                settle.setdefault(ev.link, []).append(ev.delivery_id)
            elif t is E.DeliveriesSettled:
                self.outcomes += len(ev.deliveries)
            elif t is E.ConnectionOpened:
                self.eng.open("shoal-bench")
                if hasattr(self.eng, "resume"):     # frames behind the open wait for it
                    events += self.eng.resume()
            elif t is E.LinkAttached:
                link = ev.link
                if link.role == self.F.ROLE_SENDER:
                    link_call(self.eng, link, "accept_link")
                    self.sender = link
                else:
                    link_call(self.eng, link, "accept_link", credit=self.credit)
            elif t is E.ConnectionClosed:
                raise RuntimeError(f"Shoal's engine closed the connection: {ev.error!r}")
        for link, ids in settle.items():
            link_call(self.eng, link, "settle_received", ids, self.accepted)
            if link.credit < self.credit // 2:
                link_call(self.eng, link, "give_credit", self.credit)

    def receive(self, client_transport: Transport) -> None:
        n = client_transport.pending()
        if n > 0:
            data = client_transport.peek(n)
            client_transport.pop(n)
            self.handle(self.eng.receive_data(data))

    def output(self, client_transport: Transport) -> None:
        data = self.eng.data_to_send()
        pos = 0
        while pos < len(data):
            cap = client_transport.capacity()
            if cap <= 0:
                raise RuntimeError(f"client transport takes no input ({cap})")
            client_transport.push(data[pos:pos + cap])
            pos += cap

    def send_messages(self, start: int, count: int) -> int:
        link = self.sender
        k = 0
        while k < count and link.credit > 0:
            i = start + k
            if self.with_codec:
                payload = self.convert.to_amqp10(self.headers[i % len(self.headers)], BODY,
                                                 "", "bench", False)
            else:
                payload = self.payloads[i % len(self.payloads)]
            link_call(self.eng, link, "send_message", payload, i)
            k += 1
        return k


def shoal_headers(n: int) -> list[bytes]:
    """The 0-9-1 content headers a node would hold for the messages of :func:`make_message`
    (each its own message-id: no cache hit in ``to_amqp10``)."""
    from pamqp import commands as C
    from pamqp.header import ContentHeader
    return [ContentHeader(0, len(BODY), C.Basic.Properties(
        message_id=f"msg-{i}", content_type=CONTENT_TYPE, headers={"n": i})).marshal()
        for i in range(n)]


def run_shoal(direction: str, n: int, batch: int, credit: int,
              with_codec: bool = True) -> float:
    """Shoal's engine through the same steps as :func:`run_proton` (see the docstring)."""
    server = ShoalServer(credit, with_codec)
    if direction == "deliver":
        if with_codec:
            server.headers = shoal_headers(n)
        else:
            server.payloads = [make_message(i).encode() for i in range(min(n, 4096))]
    return _lockstep(server, direction, n, batch, credit)


def best(fn, direction: str, args, with_codec: bool = True) -> float:
    return min(fn(direction, args.n, args.batch, args.credit, with_codec)
               for _ in range(args.best_of))


def tree_state() -> str:
    """The commit of the Shoal tree measured, and whether router/amqp10 has changes."""
    import subprocess
    from pathlib import Path
    root = Path(__file__).resolve().parents[2]
    try:
        head = subprocess.run(["git", "-C", str(root), "rev-parse", "--short", "HEAD"],
                              capture_output=True, text=True, check=True).stdout.strip()
        dirty = subprocess.run(["git", "-C", str(root), "status", "--porcelain", "--",
                                "router/amqp10"], capture_output=True, text=True).stdout
    except (OSError, subprocess.CalledProcessError):
        return "?"
    return head + (" (router/amqp10 modified)" if dirty.strip() else "")


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("-n", type=int, default=50_000, help="messages per direction and try")
    p.add_argument("--best-of", type=int, default=3)
    p.add_argument("--batch", type=int, default=256, help="messages per lockstep round")
    p.add_argument("--credit", type=int, default=1000, help="link credit window")
    args = p.parse_args(argv)
    engine = shoal_engine()
    rows = []
    for with_codec in (True, False):
        for direction in ("publish", "deliver"):
            a = best(run_proton, direction, args, with_codec)
            a2 = best(run_proton_polled, direction, args, with_codec)
            b = None
            if engine is not None:
                try:
                    b = best(run_shoal, direction, args, with_codec)
                except Exception as e:  # noqa: BLE001 - printed; proton's figure stands
                    print(f"Shoal engine, {direction}: {e!r}", file=sys.stderr)
            rows.append((direction, with_codec, a, a2, b))
    print(f"AMQP 1.0 server-side CPU per message (us), N={args.n}, best of {args.best_of}, "
          f"batch {args.batch}, credit {args.credit}, Python {sys.version.split()[0]}")
    print(f"Shoal tree: {tree_state()}")
    print(f"{'':<48} {'proton':>8} {'proton':>8} {'Shoal':>14} {'Shoal/proton':>13}")
    print(f"{'':<48} {'events':>8} {'polled':>8} {'':>14} {'(polled)':>13}")
    what = {("publish", True): "publish: transfers in + message decode, accept",
            ("deliver", True): "deliver: message encode + transfers out, outcomes",
            ("publish", False): "publish: engine only (no message decode)",
            ("deliver", False): "deliver: engine only (message pre-encoded)"}
    for direction, with_codec, a, a2, b in rows:
        print(f"{what[(direction, with_codec)]:<48} {a:>8.2f} {a2:>8.2f} "
              f"{(f'{b:.2f}' if b is not None else 'not available'):>14} "
              f"{(f'{b / min(a, a2):.2f}' if b is not None else '-'):>13}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
