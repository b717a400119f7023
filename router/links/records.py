"""A delivery lease's records waiting for the next batch to a node (router/lease.py makes
them, router/links/node_link.py sends them ahead of everything else; shared/wire.py LEASED,
LEASE_ACKED and LEASE_END).

While a router holds a lease it delivers publishes itself and tells the node a few
milliseconds later (``LEASE_FLUSH_S``), one LEASED record per delivery. At a moderate rate
most of those deliveries are acknowledged by their client before their record leaves. Such a
record needs no message at the node: the node would store it, acquire it and, one batch
later, drop it on the SETTLE. The router sends one LEASE_ACKED count per consumer instead of
those records and their SETTLEs, as RabbitMQ writes no message acknowledged before it was
written. A record with a publish id (a confirm the node would answer, once on disk where
durable) is counted so too, and the router confirms that publish itself: its one queue's
consumer has acknowledged it. RabbitMQ's message store does the same: the write of a message
removed before it was written is skipped and the message confirmed (rabbit_msg_store's
``ignore`` case, ``blind_confirm(..., ignored, ...)``).

Order: the count takes the place of the first of that consumer's records to be
acknowledged; the others' effects move there with it. All of one consumer's records in a
batch belong to one lease and come before that lease's LEASE_END (the router delivers
nothing under a lease it has ended, and a new lease needs the node to have read that
LEASE_END, which leaves with this batch), so the move only reorders the consumer's credit
being taken at the node, while the node delivers nothing to it.
"""
from __future__ import annotations

import time

from shoal.shared.wire import TAG_CREDIT, TAG_LEASE_ACKED, TAG_LEASED

#: How long (s) a batch of nothing but LEASE_ACKED counts, the lent consumers' credit and
#: LEASEDs younger than the flush interval may be held back (LeaseRecords.hold_for): the
#: lag of the node's message counts (the management API's) under a steady lease.
ACKED_HOLD_S = 0.05
#: A shorter wait than this (s) is not worth a timer: the batch goes now.
MIN_WAIT_S = 0.0005


class LeaseRecords:
    """The records (wire messages, lists) to send ahead of the next batch, in order."""

    __slots__ = ("_records", "_unsent", "_acked", "_dropped", "_since")

    def __init__(self) -> None:
        self._records: list[list] = []
        #: delivery id -> (LEASED, when queued: time.monotonic())
        self._unsent: dict[int, tuple[list, float]] = {}
        self._acked: dict[int, list] = {}      # consumer id -> this batch's LEASE_ACKED
        self._dropped = 0                      # emptied lists in _records
        self._since = 0.0                      # when this batch's first LEASE_ACKED was made

    def __len__(self) -> int:
        return len(self._records)

    def add(self, msg: list) -> None:
        """Queue LEASED or LEASE_END ``msg`` behind those already queued."""
        self._records.append(msg)
        if msg[0] == TAG_LEASED:
            self._unsent[msg[2]] = (msg, time.monotonic())

    def acked(self, delivery_id: int) -> int | None:
        """The client acknowledged leased delivery ``delivery_id``. None: its LEASED has left
        (or was never here), so the caller settles it. Else it is now counted in its
        consumer's LEASE_ACKED, no SETTLE must follow, and the result is its publish id: 0
        for none, else the caller confirms that publish (the node will not answer it)."""
        got = self._unsent.pop(delivery_id, None)
        if got is None:
            return None
        rec = got[0]
        pid = rec[8] if len(rec) > 8 else 0
        cid = rec[1]
        count = self._acked.get(cid)
        if count is None:
            if not self._acked:
                self._since = got[1]
            rec[:] = [TAG_LEASE_ACKED, cid, 1]
            self._acked[cid] = rec
        else:
            count[2] += 1
            rec.clear()
            self._dropped += 1
        return pid

    def hold_for(self, urgent: list[list], now: float, flush_s: float) -> float:
        """Seconds the next batch may still wait, 0 to send it now. It waits only while it
        would carry nothing the node acts on: every record a LEASE_ACKED count or a LEASED
        queued less than ``flush_s`` ago (so a record, and the confirm the node gives for
        it, still leaves within ``flush_s``, as before), and ``urgent`` (the link's
        settlements and credit) only credit, without drain, for consumers named by those
        records (lent: the node delivers nothing to them). A batch of counts waits at most
        ``ACKED_HOLD_S`` from its first. So under a steady lease, where clients ack within a
        millisecond, the node wakes about every ``ACKED_HOLD_S``, not every ``flush_s``
        (docs/performance-log.md)."""
        acked, unsent = self._acked, self._unsent
        # Each record is a count (one per consumer in acked), an emptied one merged into a
        # count, or an unacked LEASED (in unsent); anything else (LEASE_END) leaves now.
        if not acked and not unsent or len(acked) + len(unsent) + self._dropped \
                != len(self._records):
            return 0.0
        lent = set(acked)
        wait = ACKED_HOLD_S - (now - self._since) if acked else flush_s
        for rec, at in unsent.values():
            wait = min(wait, flush_s - (now - at))
            lent.add(rec[1])
        if wait < MIN_WAIT_S:
            return 0.0
        for m in urgent:
            if m[0] != TAG_CREDIT or m[3] or m[1] not in lent:
                return 0.0
        return wait

    def take(self) -> list[list]:
        """The records to send now, in order; none are left here."""
        records = self._records
        if self._dropped:
            records = [r for r in records if r]
            self._dropped = 0
        self._records = []
        self._unsent.clear()
        self._acked.clear()
        return records

    def clear(self) -> None:
        """Drop every record (the node is down: it forgets the leases)."""
        self._records = []
        self._unsent.clear()
        self._acked.clear()
        self._dropped = 0
