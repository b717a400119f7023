"""A python-qpid-proton client engine wired in memory to Shoal's AMQP 1.0 engine (no sockets):
the sans-IO tests of router/amqp10/engine.py drive both with :meth:`Peer.pump`."""
from __future__ import annotations

import pytest

proton = pytest.importorskip("proton", reason="python-qpid-proton is a test dependency "
                                              "(pip install -e '.[test]')")

from shoal.router.amqp10.engine import (ConnectionOpened, Engine,  # noqa: E402
                                        LinkAttached)


class Peer:
    """A proton client ``conn`` (Connection + Transport, SASL PLAIN as guest/guest unless
    ``sasl=False``) and ``engine``, Shoal's server side. ``events`` collects the engine's."""

    def __init__(self, engine: Engine | None = None, sasl: bool = True, user: str = "guest",
                 password: str = "guest", max_frame_size: int | None = None,
                 hostname: str | None = None, auto: bool = True) -> None:
        self.engine = engine or Engine(
            lambda mech, resp, host: "guest" if resp == b"\x00guest\x00guest" else None,
            ["PLAIN"])
        self.conn = proton.Connection()
        self.conn.container = "test-client"
        if hostname:
            self.conn.hostname = hostname
        self.transport = proton.Transport()
        if max_frame_size:
            self.transport.max_frame_size = max_frame_size
        if sasl:
            self.conn.user, self.conn.password = user, password
            s = proton.SASL(self.transport)
            s.allowed_mechs("PLAIN")
            s.allow_insecure_mechs = True
        self.transport.bind(self.conn)
        self.events: list = []
        self.auto = auto          #: accept opens and links as they come
        self.links: list = []     #: the engine's Link objects, in attach order

    def pump(self, rounds: int = 20) -> list:
        """Move bytes both ways until quiet; returns the engine events of this pump."""
        got = []
        for _ in range(rounds):
            n = self.transport.pending()
            out = b""
            if n > 0:
                out = bytes(self.transport.peek(n))
                self.transport.pop(n)
            evs = self.engine.receive_data(out) if out else []
            for ev in evs:
                if self.auto and type(ev) is ConnectionOpened:
                    self.engine.open("shoal-test")
                    evs += self.engine.resume()     # handled by this same loop
                if type(ev) is LinkAttached:
                    self.links.append(ev.link)
                    if self.auto:
                        ev.link.session.accept_link(ev.link, credit=10)
            got += evs
            back = self.engine.data_to_send()
            if back:
                self.transport.push(back)
            if not out and not back:
                break
        self.events += got
        return got
