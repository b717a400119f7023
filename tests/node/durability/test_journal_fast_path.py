"""The per-message conveniences of the journal (``enqueue``, ``delivery_state``, ``settle``)
encode their records and change the index directly (node/durability/journal.py). They must
leave the same bytes on disk and the same live index as :meth:`Journal.append` with the
record objects, and recover the same messages."""
from __future__ import annotations

from pathlib import Path

from shoal.node.durability.format import DeliveryState, Enqueue, Settle, scan
from shoal.node.durability.journal import Journal

from journal_helpers import Q


def _history(j: Journal, fast: bool) -> None:
    j.declare_queue(*Q)
    for i in range(1, 11):
        fields = (*Q, i, "amq.direct", f"key-{i}", b"\x00\x3c" + bytes(i), b"body" * i)
        times = dict(redelivered=i % 3 == 0, delivery_count=i % 4, enqueue_ms=1_700_000_000_000 + i,
                     expiry_ms=(1_800_000_000_000 if i % 2 else 0),
                     not_before_ms=(1_750_000_000_000 if i == 5 else 0))
        if fast:
            j.enqueue(*fields, **times)
        else:
            j.append(Enqueue(*fields, **times))
    j.commit()
    updates = [(2, True, 1), (3, True, 2), (99, True, 1)]        # 99: not journaled
    if fast:
        j.delivery_state(updates)
        j.settle([1, 4, 98])
    else:
        j.append(DeliveryState([list(u) for u in updates]))
        j.append(Settle([1, 4, 98]))
    j.commit()


def _records(d: Path) -> list[tuple[int, bytes]]:
    """(type, payload) of every record on disk (the framing is salted per segment)."""
    out = []
    for p in sorted(d.glob("*.seg")):
        out += [(r[2], bytes(r[3])) for r in scan(p.read_bytes(), str(p), True).records]
    return out


def test_fast_paths_write_what_append_writes_and_recover_the_same(tmp_path: Path) -> None:
    images, recovered, records = [], [], []
    for fast in (True, False):
        d = tmp_path / ("fast" if fast else "append")
        with Journal.open(d) as j:
            _history(j, fast)
            live = {i: (e.qkey, e.redelivered, e.delivery_count)
                    for i, e in j.state.entries.items()}
            assert j.appended_lsn == j.durable_lsn == 13
        images.append(live)
        records.append(_records(d))
        with Journal.open(d) as j:
            recovered.append([(m.entry_id, m.routing_key, m.header, m.body, m.redelivered,
                               m.delivery_count, m.enqueue_ms, m.expiry_ms, m.not_before_ms)
                              for m in j.recovered.messages[Q]])
    assert records[0] == records[1] and len(records[0]) == 2 + 1 + 10 + 1 + 1   # BATCHes, declare, ENQUEUEs, DS, SETTLE
    assert images[0] == images[1]
    assert images[0][2] == (Q, True, 1) and 1 not in images[0] and 4 not in images[0]
    assert recovered[0] == recovered[1]
    assert [m[0] for m in recovered[0]] == [2, 3, 5, 6, 7, 8, 9, 10]


def test_settle_and_delivery_state_of_unknown_ids_write_nothing(tmp_path: Path) -> None:
    with Journal.open(tmp_path / "j") as j:
        j.declare_queue(*Q)
        lsn = j.commit()
        assert j.settle([7, 8]) == lsn and j.delivery_state([(7, True, 1)]) == lsn
        assert j.appended_lsn == lsn
