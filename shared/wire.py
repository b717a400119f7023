"""The router <-> node wire protocol (design.md section 4).

Transport: each node binds one ZeroMQ ROUTER socket; each router connects one DEALER socket per
node. One ZeroMQ message (a single frame) carries a *batch*: a msgpack array of wire messages,
so each side sends at most one ZeroMQ message per peer per event-loop turn.

Every wire message is a msgpack array whose first element is a :class:`T` tag; its other fields
are listed, in order, in :data:`FIELDS`. Bodies and content-header payloads travel as msgpack
``bin`` (Python ``bytes``) exactly as the publisher sent them; they are never re-encoded.

Requests that expect an answer carry a ``req_id`` (int, unique per router) and are answered
with ``REPLY`` carrying the same ``req_id``. ``code`` 0 means success; any other value is an AMQP
reply code (shoal.shared.errors) and ``text`` explains it.

Identities
  * ``owner``: ``"<router_id>/<connection_id>"``, the connection that declares or uses an
    exclusive queue (spec 1.7.2.1 ``exclusive``).
  * ``consumer_id``: int, unique within one router. The node keys consumers by
    (router identity, consumer_id).
  * ``delivery_id``: int, unique within one node for its lifetime (the entry id). The router
    settles deliveries with these ids.

Version: :data:`WIRE_VERSION` is checked by HELLO; a node refuses a router with another version.
"""
from __future__ import annotations

import datetime
import decimal
import logging
import os
from enum import IntEnum
from typing import Any

import msgpack

#: Bumped whenever a message's fields change. Checked at connect time (HELLO).
WIRE_VERSION = 13


class T(IntEnum):
    """Wire message tags. R->N: router to node. N->R: node to router."""

    # --- session (both ways) ---
    HELLO = 1             # R->N [T, wire_version, router_id, expected_node_id]
    HELLO_OK = 2          # N->R [T, wire_version, node_id, incarnation]
                          #   incarnation: random str per node process start; a router that
                          #   sees a new one knows the node restarted.
    HEARTBEAT = 3         # both [T]  (sent every link_heartbeat_ms; see settings)
    GOODBYE = 4           # both [T]  R->N: router stops cleanly, forget it now (as if it timed
                          #   out). N->R: the node is stopping, or it does not know this router
                          #   (message before HELLO, e.g. after a node restart): the router
                          #   treats the node as down and says HELLO again.
    REPLY = 5             # N->R [T, req_id, code, text, payload]

    # --- topology (R->N requests, answered by REPLY) ---
    QUEUE_DECLARE = 10    # [T, req_id, vhost, name, passive, durable, exclusive, auto_delete,
                          #     arguments, owner]  -> payload [name, message_count, consumer_count]
    QUEUE_DELETE = 11     # [T, req_id, vhost, name, if_unused, if_empty, owner] -> [message_count]
    QUEUE_PURGE = 12      # [T, req_id, vhost, name, owner] -> [message_count]
    EXCHANGE_DECLARE = 13  # [T, req_id, vhost, name, type, passive, durable, auto_delete,
                           #     internal, arguments] -> None
    EXCHANGE_DELETE = 14  # [T, req_id, vhost, name, if_unused] -> None
    BIND = 15             # [T, req_id, vhost, exchange, dest_kind, destination, routing_key,
                          #     arguments] -> None   (sent to the exchange's owner node)
    UNBIND = 16           # same fields as BIND -> None
    UNBIND_DESTINATION = 17  # [T, vhost, dest_kind, destination]  no reply: drop every binding
                             # to a deleted queue ("q") or exchange ("e")
    TOPOLOGY_SNAPSHOT = 18   # [T, req_id] -> payload [exchanges, bindings, queues, catalogue]:
                             #   exchanges and bindings as TOPOLOGY_EVENT data; queues: the
                             #   node's classic queues, [[vhost, name, durable], ...]; catalogue:
                             #   what it knows of the other nodes (node/replication/catalogue.py),
                             #   [[node_id, exchanges, bindings, queues], ...]
    CONNECTION_CLOSED = 19   # [T, owner]  no reply: delete the owner's exclusive queues

    # --- topology change feed (N->R, to every router that said HELLO) ---
    TOPOLOGY_EVENT = 20   # [T, event, data]; event in EV_*; data as below
    # EV_EXCHANGE_ADDED   data = [vhost, name, type, durable, auto_delete, internal, arguments]
    # EV_EXCHANGE_REMOVED data = [vhost, name]
    # EV_BINDING_ADDED    data = [vhost, exchange, dest_kind, destination, routing_key, arguments]
    # EV_BINDING_REMOVED  data = same as EV_BINDING_ADDED
    # EV_QUEUE_REMOVED    data = [vhost, name]   (deleted, auto-deleted, exclusive owner gone)
    # EV_QUEUE_ADDED      data = [vhost, name, durable]  a classic queue was made (durable: 1 for
    #                     a durable, non-exclusive, non-auto-delete one)
    # EV_ACCESS           data = [version, definitions]   (node/access_store.py)
    TOPOLOGY_SYNC = 21    # N->R [T, sync_id]: a topology request of another router changed
                          #   the topology (the TOPOLOGY_EVENTs before this); answer
                          #   TOPOLOGY_SYNCED once they are applied. The node holds that
                          #   request's REPLY until every other router answered (or is gone),
                          #   so a client's declare-ok / bind-ok through one router means
                          #   every router routes by it (read-your-writes across routers).
    TOPOLOGY_SYNCED = 22  # R->N [T, sync_id]

    # --- messages ---
    PUBLISH = 30          # R->N [T, seq, vhost, queues, exchange, routing_key, header, body,
                          #       publisher(, first)]
                          #   seq: 0 = no answer wanted; else answered by PUBLISH_RESULT;
                          #   < 0: sent again to a quorum queue's or stream's new leader,
                          #   with ``first``, the publish's first seq (a quorum queue may
                          #   hold it already: it is enqueued redelivered; a stream that
                          #   holds it, named in a chunk's trailer by the router's id and
                          #   ``first``, does not store it twice).
                          #   publisher: the publishing connection's owner string, or None
                          #   (a republished dead letter); consumers with no_local skip it.
                          #   queues: list of queue names on this node.
                          #   header: content-header frame payload (class, weight, body size,
                          #   property flags and list) as the client sent it.
    PUBLISH_RESULT = 31   # N->R [T, seq, code, routed(, n)]; routed = queues that accepted it;
                          #   code != 0: a queue refused it (x-overflow reject-publish):
                          #   the router answers basic.nack. With ``n`` (>= 2): the same
                          #   answer for seq, seq + 1, ..., seq + n - 1 (coalesce_results).
    PUBLISH_MOVED = 32    # N->R [T, seq, code, routed, moved]: as PUBLISH_RESULT for the
                          #   queues it names, but ``moved`` (queue names) are quorum queues
                          #   this node does not lead (any more): the router sends the publish
                          #   again to their leader, once it knows it (EV_QUEUE_LEADER).

    # --- consumers ---
    CONSUME = 40          # R->N [T, req_id, consumer_id, vhost, queue, tag, no_ack, exclusive,
                          #       arguments, owner(, qos)] -> available: int (the queue's
                          #   AVAILABLE entries now; a multi-queue consumer pulls at once from
                          #   queues that have some. Older nodes answer None: wait for WORK).
                          #   qos: [consumer prefetch, global prefetch] of a 0-9-1 channel
                          #   (a stream checks them, RabbitMQ's rules); absent for AMQP 1.0.
                          #   A stream answers [available, "stream"]
    CANCEL = 41           # R->N [T, req_id, consumer_id] -> None.  Unsettled deliveries stay
                          #   acquired until SETTLE (spec: basic.cancel keeps unacked messages).
    CREDIT = 42           # R->N [T, consumer_id, credit, drain]
                          #   adds ``credit`` deliveries to the consumer's allowance.  drain=True:
                          #   use what can be used now, return the rest with CREDIT_DRAINED.
    DELIVER = 43          # N->R [T, consumer_id, delivery_id, redelivered, exchange,
                          #       routing_key, header, body]
    WORK = 44             # N->R [T, consumer_id]: the queue has a message for a consumer with
                          #   no credit (seed 002 notifyWork across the process boundary); sent
                          #   once until the next CREDIT.
    CREDIT_DRAINED = 45   # N->R [T, consumer_id, unused]
    CONSUMER_CANCELLED = 46  # N->R [T, consumer_id, reason]: the node ended the consumer
                             #   (queue deleted); the router sends basic.cancel.
    SETTLE = 47           # R->N [T, outcome, delivery_ids(, annotations)]; outcome in
                          #   OUTCOME_*; ``annotations`` (bytes): an AMQP 0-9-1 field
                          #   table (a modified outcome's message annotations, RabbitMQ
                          #   4) merged into each message's headers as it is returned
                          #   or dead-lettered
    GET = 48              # R->N [T, req_id, vhost, queue, no_ack, owner]
                          #   -> payload None (empty) or [delivery_id, redelivered, exchange,
                          #      routing_key, header, body, message_count]
    REPUBLISH = 49        # N->R [T, vhost, exchange, routing_key, header, body(, confirm)]:
                          #   route and publish like a basic.publish without confirm
                          #   (dead-lettering: the node has no exchange cache). Sent to any
                          #   one router. ``confirm`` (an id, not 0): publish with confirms
                          #   and answer REPUBLISH_RESULT (at-least-once dead-lettering)

    # --- flow control (N->R) ---
    NODE_BLOCKED = 50     # N->R [T, blocked, reason]: the node's journal cannot write (disk
                          #   full, I/O error): persistent publishes to its durable queues are
                          #   not confirmed until it can; the router sends connection.blocked
                          #   (reason) to clients that support it, connection.unblocked when
                          #   blocked=False. Sent again to a router that says HELLO meanwhile.

    # --- listing (R->N request, answered by REPLY) ---
    QUEUE_LIST = 51       # R->N [T, req_id, vhost or None] -> payload [[vhost, name, durable,
                          #   exclusive, auto_delete, arguments, messages_ready, consumers,
                          #   messages_unacknowledged, [published, delivered_or_fetched,
                          #   acknowledged], quorum], ...]: quorum = None for a classic
                          #   queue, else EV_QUEUE_LEADER's data (a quorum queue is listed by
                          #   its leader only); the node's queues (of one vhost), for
                          #   max-queues and the management API (counters since node start)
    NODE_STATS = 52       # R->N [T, req_id] -> payload {rss_bytes, queues, messages_ready,
                          #   loop_lag_seconds, loop_lag_max_seconds, routers, blocked, and
                          #   with paging paged_bytes, paged_messages, page_outs; with a
                          #   journal fsync_seconds and commit_records ([bucket bounds,
                          #   per-bucket counts with +Inf last, sum, count]), journal_bytes}
                          #   (node/stats.py; the routers' Prometheus metrics)
    ROUTER_REPORT = 53    # R->N [T, router_id, report]  no reply, every second: the router's
                          #   live objects for the management API, report = {"connections":
                          #   [...], "channels": [...], "consumers": [...]} as RabbitMQ's JSON
                          #   rows (router/live.py); the node keeps the latest per router
    ROUTER_REPORTS = 54   # R->N [T, req_id] -> payload [[router_id, report, age_ms], ...]: the
                          #   latest report of every router the node knows (any router
                          #   answers for all)
    FORCE_CLOSE = 55      # R->N [T, router_id, connection_name, reason]  no reply: the node
                          #   passes it on, unchanged, to that router (N->R), which closes the
                          #   connection with 320 CONNECTION_FORCED (management API DELETE)
    ACCESS_GET = 56       # R->N [T, req_id] -> payload [version, definitions or None]: the
                          #   users, vhosts and permissions the first node keeps
                          #   (node/access_store.py; version 0: nothing stored yet)
    ACCESS_SET = 57       # R->N [T, req_id, expected_version, definitions] -> [version];
                          #   406 if the version moved on. Every router gets EV_ACCESS before
                          #   the reply (TOPOLOGY_SYNC, as for declares)
    QUORUM_OP = 58        # R->N [T, req_id, op, vhost, name, node] -> payload: an operator's
                          #   quorum queue command (rabbitmq-queues'; node/replication/
                          #   manager.py ``quorum_op``): "status", "add_member",
                          #   "delete_member", "transfer" (vhost and name: to its leader,
                          #   MOVED from a follower); "grow" (node, name = "all" or "even")
                          #   and "shrink" (node): to every node, for the queues it leads

    # --- delivery leases (docs/consumers.md, "Delivery leases") ---
    LEASE_GRANT = 60      # N->R [T, consumer_ids, offer_id]: an offer: the queue is empty and
                          #   these (a list) are all its consumers, on this router. The node
                          #   goes on delivering; the router answers LEASE_TAKE, or declines
                          #   (LEASE_END). Every message of this offer, and of the lease it
                          #   becomes, names offer_id (unique on the node).
    LEASE_REVOKE = 61     # N->R [T, consumer_id, offer_id]: something else made the queue
                          #   non-empty or shared; answer LEASE_END (behind any LEASED).
                          #   consumer_id: the lease's first consumer.
    LEASED = 62           # R->N [T, consumer_id, delivery_id, exchange, routing_key, header,
                          #       body, publisher(, publish_id)]: the router delivered this
                          #   message itself under delivery_id (negative, chosen by the
                          #   router); the node enqueues it acquired by the consumer. Sent
                          #   ahead of SETTLEs. publish_id (a publish with a confirm): the
                          #   node answers PUBLISH_RESULT for it, as for a PUBLISH.
    LEASE_END = 63        # R->N [T, consumer_id, offer_id(, soon)]: the router holds the
                          #   lease no longer (returned, declined or revoked); sent behind its
                          #   LEASEDs. ``soon`` true: returned only because its consumers had
                          #   no credit or room; the node may lend it again once it is empty.
    REPUBLISH_RESULT = 64  # R->N [T, confirm, ok]: a REPUBLISH with ``confirm`` reached every
                          #   queue it was routed to, on disk where durable (ok true), or did
                          #   not (unroutable, a missing exchange, a nack: ok false)
    LEASE_TAKE = 65       # R->N [T, consumer_ids, offer_id]: the router takes that offer
                          #   (LEASE_GRANT's consumers and id), behind every PUBLISH it sent
                          #   (never ahead of them: not urgent); it holds its publishes to the
                          #   queue until the answer.
    LEASE_TAKEN = 66      # N->R [T, consumer_id, offer_id]: the lease has started: the router
                          #   may deliver publishes to the consumers itself. Every TAKE is
                          #   answered, with this or LEASE_REVOKE (that offer is not standing
                          #   any more, or the rule no longer holds); consumer_id: the first.
    LEASE_ACKED = 67      # R->N [T, consumer_id, count]: ``count`` deliveries to that consumer
                          #   made under its lease that the client acknowledged before their
                          #   LEASEDs left the router, which sends this instead of them and of
                          #   their SETTLE (and confirms their publish_ids itself): the node
                          #   counts them published, delivered and acknowledged, takes them
                          #   from the consumer's credit, and stores nothing (RabbitMQ
                          #   writes no message acknowledged before it was written). Sent
                          #   among the lease's records, before its LEASE_END
                          #   (router/links/records.py).

    # --- replication (N->N, over each node's links to the other nodes: design.md section 8) ---
    PEER_HELLO = 70       # N->N [T, wire_version, node_id, member_id, catalogue_seq], every
                          #   5 peer ticks (the node<->node heartbeat): who this node is now
                          #   (member_id changes when its disk was wiped); catalogue_seq:
                          #   [incarnation, count] of its PEER_EVENTs
    RAFT = 71             # N->N [T, vhost, name, uid, message]: one Raft message of the group
                          #   of quorum queue ``name`` (node/replication/raft.py Message.to_wire)
    GROUP_CREATE = 72     # N->N [T, vhost, name, uid, snapshot]: be a first member of a new
                          #   quorum queue, from its bootstrap snapshot (Snapshot.to_wire)
    PEER_CATALOGUE = 73   # N->N [T, node_id, catalogue_seq, exchanges, bindings, queues]: the
                          #   sender's whole topology (as TOPOLOGY_SNAPSHOT's first three)
    PEER_EVENT = 74       # N->N [T, node_id, catalogue_seq, event, data]: one TOPOLOGY_EVENT
                          #   of the sender
    PEER_WANT = 75        # N->N [T, node_id]: send me your PEER_CATALOGUE
    GROUP_ASK = 76        # N->N [T, vhost, name, uid, member_id]: a member that has had no
                          #   leader for a while asks whether the group still has it
                          #   (node/replication/reconcile.py)
    GROUP_ANSWER = 77     # N->N [T, vhost, name, uid, member_id, status]: "member", "removed"
                          #   (the group is here and the asker is not in it) or "none"
    STREAM_RAFT = 78      # N->N [T, vhost, name, uid, message]: one Raft message between the
                          #   members of a replicated stream (node/streams/members.py)
    STREAM_CREATE = 79    # N->N [T, vhost, name, uid, arguments, voters]: be a first member of
                          #   a new replicated stream (voters: member ids)
    STREAM_DELETE = 80    # N->N [T, vhost, name, uid(, member_id)]: the stream was deleted, or
                          #   (with member_id) that member was removed: drop it
    STREAM_READERS = 81   # N->N [T, vhost, name, uid, node_id, readers]: a member that does
                          #   not lead tells the leader who reads from it ([tag, offset] each:
                          #   node/streams/readers.py), for management and metrics


#: The tags that code handling every message compares or sends, as plain ints, once for the
#: router and the node: an IntEnum member costs a class attribute lookup at each use (about
#: 5x a plain int comparison).
TAG_HELLO, TAG_HELLO_OK, TAG_HEARTBEAT, TAG_GOODBYE, TAG_REPLY = (
    int(T.HELLO), int(T.HELLO_OK), int(T.HEARTBEAT), int(T.GOODBYE), int(T.REPLY))
TAG_PUBLISH_MOVED = int(T.PUBLISH_MOVED)
TAG_TOPOLOGY_EVENT, TAG_PUBLISH, TAG_PUBLISH_RESULT, TAG_REPUBLISH, TAG_NODE_BLOCKED = (
    int(T.TOPOLOGY_EVENT), int(T.PUBLISH), int(T.PUBLISH_RESULT), int(T.REPUBLISH),
    int(T.NODE_BLOCKED))
TAG_CREDIT, TAG_DELIVER, TAG_WORK, TAG_SETTLE = (
    int(T.CREDIT), int(T.DELIVER), int(T.WORK), int(T.SETTLE))
TAG_LEASE_GRANT, TAG_LEASE_REVOKE, TAG_LEASED, TAG_LEASE_END = (
    int(T.LEASE_GRANT), int(T.LEASE_REVOKE), int(T.LEASED), int(T.LEASE_END))
TAG_LEASE_TAKE, TAG_LEASE_TAKEN, TAG_LEASE_ACKED = (
    int(T.LEASE_TAKE), int(T.LEASE_TAKEN), int(T.LEASE_ACKED))


def scheduled(header: bytes) -> bool:
    """Whether a content header (bytes as the client sent them) may hold a scheduled-delivery
    header (``x-delay``, ``x-qpid-not-valid-before``); a cheap byte search that never misses
    one (false positives are parsed by the node)."""
    return b"x-delay" in header or b"x-qpid-not-valid-before" in header


def leasable(header: bytes) -> bool:
    """Whether a router holding a delivery lease may deliver a message with this content
    header itself: not when it carries an ``expiration`` (property flag 0x0100) or may carry
    a scheduled-delivery header (``x-delay``, ``x-qpid-not-valid-before``): those need the
    queue's timers. A cheap byte test; a false "no" only costs the hop."""
    flags = header[12] if len(header) > 13 else 0   # high byte of the property flags
    if flags & 0x01:
        return False
    return not (flags & 0x20 and scheduled(header))


#: REPLY code (never an AMQP reply code) of a request about a quorum queue sent to a node that
#: does not lead it: payload = the leader's node id, or None while there is none; the router
#: asks again where the leader is (EV_QUEUE_LEADER).
MOVED = 1

#: N->N tags: the shard hands them to node/replication, not to a router's state.
PEER_TAGS = frozenset({70, 71, 72, 73, 74, 75, 76, 77, 78, 79, 80, 81})

# Topology events.
EV_EXCHANGE_ADDED = 1
EV_EXCHANGE_REMOVED = 2
EV_BINDING_ADDED = 3
EV_BINDING_REMOVED = 4
EV_QUEUE_REMOVED = 5
EV_ACCESS = 6           # data = [version, definitions]: users, vhosts and permissions changed
EV_QUEUE_LEADER = 7     # data = [vhost, name, leader node id, term, members (node ids),
                        #   online (node ids)(, "stream")]: a quorum queue's or replicated
                        #   stream's leader (sent by the leader when elected, when a stream's
                        #   members change, and to a router that says HELLO; by a member that
                        #   is asked for it and is not its leader). A stream's consumers may
                        #   read from any member (router/quorum.py ``read_node``)
EV_QUEUE_ADDED = 8      # data = [vhost, name, durable]: a classic queue was made

# Settlement outcomes (SETTLE).
OUTCOME_ACK = 1       # basic.ack: dequeue
OUTCOME_REQUEUE = 2   # nack/reject requeue=true, channel closed: release to original position,
                      # redelivered=true
OUTCOME_REJECT = 3    # nack/reject requeue=false: dead-letter if configured, else drop
OUTCOME_RELEASE = 4   # AMQP 1.0 released: as REQUEUE, but not counted as a delivery attempt
                      # toward a delivery limit (OASIS AMQP 1.0 part 3.4.4)

# Binding destination kinds.
DEST_QUEUE = "q"
DEST_EXCHANGE = "e"

OK = 0


def _default(obj: Any) -> Any:
    """msgpack fallback for AMQP table values msgpack has no type for."""
    if isinstance(obj, decimal.Decimal):
        return str(obj)
    if isinstance(obj, datetime.datetime):
        return int(obj.timestamp())
    if isinstance(obj, (set, frozenset, tuple)):
        return list(obj)
    raise TypeError(f"cannot encode {type(obj).__name__} on the wire")


log = logging.getLogger("shoal.wire")

#: A frame at least this large (bytes) is a large message's: the sender hands it to ZeroMQ
#: without a copy (``copy=False``), and :class:`Packer` drops the msgpack packer that made it.
LARGE_FRAME = 1 << 20


class Packer:
    """A reusable msgpack packer (``use_bin_type``) that does not keep a large message.

    msgpack never shrinks a packer's internal buffer: after one 100 MiB message, a reused
    packer would keep 100 MiB resident for the life of the process. ``pack(obj) -> bytes``
    starts a new packer after any output of :data:`LARGE_FRAME` bytes or more
    (docs/performance.md "Large messages"). Raises TypeError for what msgpack cannot carry.
    """

    __slots__ = ("_packer", "_default")

    def __init__(self, default: Any = None) -> None:
        self._default = default
        self._packer = msgpack.Packer(use_bin_type=True, default=default)

    def pack(self, obj: Any) -> bytes:
        data = self._packer.pack(obj)
        if len(data) >= LARGE_FRAME:
            self._packer = msgpack.Packer(use_bin_type=True, default=self._default)
        return data


_packer = Packer(_default)


def encode_batch(messages: list[list[Any]]) -> bytes:
    """Encode a batch (list of wire messages) to one ZeroMQ frame. Raises TypeError."""
    return _packer.pack(messages)


def decode_batch(frame: bytes) -> list[list[Any]]:
    """Decode one ZeroMQ frame into its wire messages.

    Raises ``ValueError`` when the frame is not a msgpack array of arrays (a peer bug or
    garbage); callers log and drop such frames, they never crash.
    """
    try:
        batch = msgpack.unpackb(frame, raw=False, strict_map_key=False, use_list=True)
    except Exception as exc:  # msgpack raises several unrelated types
        raise ValueError(f"undecodable wire frame: {exc}") from None
    if not isinstance(batch, list) or not all(isinstance(m, list) and m for m in batch):
        raise ValueError("wire frame is not a batch of messages")
    return batch


def coalesce_results(msgs: list[list[Any]]) -> list[list[Any]]:
    """A batch with each run of PUBLISH_RESULTs for consecutive publish ids and the same
    ``code`` and ``routed`` sent as one ``[T, seq, code, routed, n]``; every other message,
    and the order, as they were. The router numbers the publishes needing an answer one
    after another, so a node that answers a turn's publishes answers runs: a stream's
    chunk, a group commit, a router's leased records (docs/performance.md, "Issues 46 and
    47: answers in runs, ..."). ``msgs`` is left as it was; a message of it may be the
    returned batch's."""
    if len(msgs) < 2:
        return msgs
    out: list[list[Any]] = []
    last: list[Any] | None = None       # the PUBLISH_RESULT ending ``out``, if one does
    tag = TAG_PUBLISH_RESULT
    for m in msgs:
        if m[0] == tag and len(m) == 4:
            if last is not None and last[2] == m[2] and last[3] == m[3]:
                if len(last) == 4:
                    if last[1] + 1 == m[1]:
                        last = out[-1] = [tag, last[1], m[2], m[3], 2]
                        continue
                elif last[1] + last[4] == m[1]:
                    last[4] += 1
                    continue
            last = m
        else:
            last = None
        out.append(m)
    return out


# ---- handing batches over within one process ------------------------------------------------
#: The hot path's messages. Their fields are only ints, bools, str, bytes, None and lists of
#: ints or strs, each message is a list built for one send, and neither side keeps or changes it
#: after handing it over: a peer in the same process (``shoal serve --embed-node``) receives them
#: as they are, which saves the msgpack round trip (about 1 µs per message at 5,000 msg/s,
#: docs/performance-log.md, session 6).
HOT_TAGS = frozenset({TAG_PUBLISH, TAG_PUBLISH_RESULT, TAG_CREDIT, TAG_DELIVER, TAG_WORK,
                      TAG_SETTLE, TAG_LEASED, TAG_LEASE_ACKED})
#: ``SHOAL_WIRE_CHECK=1`` (the e2e suite sets it): every hot message handed over is checked to
#: be exactly what a msgpack round trip gives back (plain ``int`` tags, no tuples, no
#: memoryviews), and to be unchanged when the receiver starts and ends handling it.
CHECK = os.environ.get("SHOAL_WIRE_CHECK", "").strip() == "1"


class WireCheckError(AssertionError):
    """A hot message handed over in memory differs from what the ZeroMQ link would carry
    (SHOAL_WIRE_CHECK=1 only): a bug in the sender or the receiver."""


class _Checked(list):
    """A batch handed over under CHECK, with the encoding of its hot messages at handover."""

    snapshot: bytes = b""


def _copy(msg: list) -> list:
    """``msg`` as a ZeroMQ peer would decode it (the options of :func:`decode_batch`)."""
    return msgpack.unpackb(_packer.pack(msg), raw=False, strict_map_key=False)


def _hot(batch: list) -> bytes:
    return _packer.pack([m for m in batch if m[0] in HOT_TAGS])


def _same(a: Any, b: Any) -> bool:
    """``a`` and ``b`` are equal with the very same types all the way down."""
    if type(a) is not type(b):
        return False
    if type(a) is list:
        return len(a) == len(b) and all(map(_same, a, b))
    if type(a) is dict:
        return a.keys() == b.keys() and all(_same(v, b[k]) for k, v in a.items())
    return a == b


def _fail(what: str) -> None:
    log.error("wire check failed: %s", what)
    raise WireCheckError(f"wire check failed: {what}")


def handover(batch: list[list[Any]]) -> list[list[Any]]:
    """What a peer in the same process receives for ``batch`` instead of its frame: hot
    messages (:data:`HOT_TAGS`) as they are; every other message as a decoded copy of its
    msgpack encoding, so that topology, arguments and replies reach the receiver exactly as
    over ZeroMQ and share no mutable object with the sender.

    Raises TypeError (a value msgpack cannot carry, as :func:`encode_batch`), and
    WireCheckError under :data:`CHECK` when a hot message is not in msgpack's form.
    """
    out = batch
    for i, msg in enumerate(batch):
        if msg[0] in HOT_TAGS:
            if CHECK:
                copy = _copy(msg)
                if not _same(msg, copy):
                    _fail(f"hot message {msg!r} would arrive as {copy!r}")
            continue
        if out is batch:
            out = list(batch)
        out[i] = _copy(msg)
    if CHECK:
        out = _Checked(out)
        out.snapshot = _hot(out)
    return out


def received(batch: list[list[Any]]) -> None:
    """Called by the receiver of a :func:`handover` batch before and after handling it. Under
    :data:`CHECK`, raises WireCheckError when a hot message changed since the handover (the
    sender kept and changed it, or the receiver changed it); otherwise does nothing."""
    if CHECK and isinstance(batch, _Checked) and _hot(batch) != batch.snapshot:
        _fail(f"a hot message changed after it was handed over: {batch!r}")
