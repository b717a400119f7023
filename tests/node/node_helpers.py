"""Helpers for node tests: a fake network of routers talking to one sans-IO Shard."""
from __future__ import annotations

from shoal.node.shard import Shard
from shoal.shared.settings import Settings
from shoal.shared.wire import WIRE_VERSION, T


class Net:
    """A Shard plus per-router inboxes (what the shard sent, in order)."""

    def __init__(self, node_id: str = "node-0", leases: bool = False) -> None:
        """``leases``: the node lends queues (node/lease.py); off, the fake routers need not
        answer LEASE_GRANT and the other tests see the node's own deliveries."""
        self.settings = Settings(node_id=node_id, link_heartbeat_ms=100, link_heartbeat_timeout=0.3,
                                 delivery_leases=leases)
        self.shard = Shard(node_id, "inc-1", self.settings)
        self.inbox: dict[bytes, list[list]] = {}
        self.auto_sync: set[bytes] = set()     #: routers that answer TOPOLOGY_SYNC at once
        self.now = 0.0

    def pump(self) -> None:
        """Move what the shard sent to the routers' inboxes. A router that syncs by itself
        answers TOPOLOGY_SYNC at once, as a real one does after applying the events before
        it (the sync itself does not reach its inbox)."""
        while True:
            syncs = []
            for peer, msgs in self.shard.take_outbox().items():
                if peer in self.auto_sync:
                    syncs += [(peer, m[1]) for m in msgs if m[0] == T.TOPOLOGY_SYNC]
                    msgs = [m for m in msgs if m[0] != T.TOPOLOGY_SYNC]
                self.inbox.setdefault(peer, []).extend(msgs)
            if not syncs:
                return
            for peer, sync_id in syncs:
                self.shard.handle(peer, [T.TOPOLOGY_SYNCED, sync_id], self.now)

    def router(self, name: str = "r1", hello: bool = True,
               auto_sync: bool = True) -> "FakeRouter":
        r = FakeRouter(self, name)
        if auto_sync:
            self.auto_sync.add(r.identity)
        if hello:
            r.send(T.HELLO, WIRE_VERSION, name, self.shard.node_id)
            assert r.take() == [[T.HELLO_OK, WIRE_VERSION, self.shard.node_id, "inc-1"]]
        return r


class FakeRouter:
    def __init__(self, net: Net, name: str) -> None:
        self.net = net
        self.name = name
        self.identity = name.encode()
        self.req_id = 0
        self.next_consumer = 0

    def send(self, *msg) -> None:
        self.net.shard.handle(self.identity, list(msg), self.net.now)
        self.net.pump()

    def take(self) -> list[list]:
        msgs = self.net.inbox.pop(self.identity, [])
        return msgs

    def take_kind(self, tag: T) -> list[list]:
        return [m for m in self.take() if m[0] == tag]

    def request(self, tag: T, *fields) -> list:
        """Send a request; return the REPLY [T, req_id, code, text, payload]. Other messages
        stay queued (available through ``self.pending``)."""
        self.req_id += 1
        self.send(tag, self.req_id, *fields)
        msgs = self.take()
        replies = [m for m in msgs if m[0] == T.REPLY and m[1] == self.req_id]
        assert len(replies) == 1, msgs
        self.pending = [m for m in msgs if m is not replies[0]]
        self.before_reply = msgs[:msgs.index(replies[0])]
        return replies[0]

    def ok(self, tag: T, *fields):
        reply = self.request(tag, *fields)
        assert reply[2] == 0, reply
        return reply[4]

    # conveniences
    def declare(self, name: str, durable=False, exclusive=False, auto_delete=False,
                args=None, passive=False, owner=None, vhost="/"):
        return self.request(T.QUEUE_DECLARE, vhost, name, passive, durable, exclusive,
                            auto_delete, args or {}, owner or f"{self.name}/c1")

    def publish(self, queue, body: bytes, seq=0, queues=None, rk="rk") -> None:
        self.send(T.PUBLISH, seq, "/", queues or [queue], "ex", rk, b"hdr", body, None)

    def consume(self, queue, no_ack=False, exclusive=False, args=None, owner=None) -> int:
        self.next_consumer += 1
        reply = self.request(T.CONSUME, self.next_consumer, "/", queue,
                             f"ctag{self.next_consumer}", no_ack, exclusive, args or {},
                             owner or f"{self.name}/c1")
        assert reply[2] == 0, reply
        return self.next_consumer

    def credit(self, cid: int, credit: int, drain: bool = False) -> list[list]:
        self.send(T.CREDIT, cid, credit, drain)
        return self.take()


def bodies(msgs: list[list]) -> list[bytes]:
    return [m[7] for m in msgs if m[0] == T.DELIVER]
