"""The node journal's compaction (issue 5, design.md section 5): only live records survive, in
order, disk use stays bounded, topology snapshots replace deleted topology, and a model-based
crash test (the process dies mid-commit at a random byte) recovers exactly the committed
state."""
from __future__ import annotations

import os
from pathlib import Path

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from shoal.node.durability.journal import Journal, JournalConfig
from shoal.node.durability.format import RecordType

from journal_helpers import Q, crash_copy, fill, ids, segs


# ---------------------------------------------------------------- compaction
def test_compaction_keeps_exactly_the_live_records_in_order(jdir: Path, no_fsync: None) -> None:
    cfg = JournalConfig(segment_bytes=4096, copy_bytes_per_commit=1024)
    with Journal.open(jdir, cfg) as j:
        j.declare_exchange("/", "ex", "direct")
        j.declare_queue(*Q)
        j.bind("/", "ex", "q", "q", "rk")
        live = []
        for i in range(1, 2001):
            fill(j, 1, start=i)
            if i % 7 == 0:
                j.delivery_state([(i, True, 3)])
            if i % 50 == 1:
                live.append(i)                      # a few stay unacked for a long time
            if i > 3 and (i - 3) % 50 != 1:
                j.settle([i - 3])                   # the rest are acked 3 messages later
            j.commit()
        for i in range(1998, 2001):
            if i not in live:
                j.settle([i])
        j.commit()
        st = j.stats()
        assert st.live_records == len(live)
        assert st.segments <= 6, st
        assert segs(jdir)[0].name != "00000001.seg"            # old segments are gone
    with Journal.open(jdir, cfg) as j:
        r = j.recovered
        assert ids(j) == live
        assert all((m.redelivered, m.delivery_count) == ((True, 3) if m.entry_id % 7 == 0
                                                         else (False, 0))
                   for m in r.messages[Q])
        assert set(r.exchanges) == {("/", "ex")} and len(r.bindings) == 1


def test_disk_use_is_bounded_under_steady_publish_and_ack(jdir: Path, no_fsync: None) -> None:
    seg_bytes = 8192
    cfg = JournalConfig(segment_bytes=seg_bytes, copy_bytes_per_commit=4096)
    peak = 0
    with Journal.open(jdir, cfg) as j:
        j.declare_queue(*Q)
        j.declare_queue("/", "backlog")
        for i in range(1, 201):                     # a static backlog at the front
            j.enqueue("/", "backlog", i, "", "b", b"h", b"y" * 100)
        j.commit()
        backlog_live = j.stats().live_bytes
        for i in range(1000, 7000):                 # steady: publish, ack 20 later
            fill(j, 1, start=i)
            if i >= 1020:
                j.settle([i - 20])
            j.commit()
            st = j.stats()
            on_disk = st.bytes_on_disk
            if i % 100 == 0:
                assert on_disk == sum(p.stat().st_size for p in segs(jdir))
            peak = max(peak, on_disk)
            # the documented bound (docs/durability.md): garbage_factor * live + 2 segments
            # (the trigger) + the live bytes being copied forward + the head segment + one
            # commit's copy budget + one commit's write
            assert on_disk <= 3 * st.live_bytes + 3 * seg_bytes + 4096 + 1024, (i, st)
        written = j.stats().commits * 150
    assert peak * 5 < written                       # the log did not just grow
    assert backlog_live > 0
    with Journal.open(jdir, cfg) as j:
        assert ids(j, ("/", "backlog")) == list(range(1, 201))
        assert ids(j) == list(range(6980, 7000))


def test_compaction_snapshot_drops_deleted_topology(jdir: Path, no_fsync: None) -> None:
    cfg = JournalConfig(segment_bytes=2048)
    with Journal.open(jdir, cfg) as j:
        j.declare_queue(*Q)
        j.declare_queue("/", "tmp")
        j.declare_exchange("/", "x1", "fanout")
        j.commit()
        j.delete_queue("/", "tmp")
        j.delete_exchange("/", "x1")
        j.commit()
        for i in range(1, 200):
            fill(j, 1, start=i)
            j.settle([i])
            j.commit()
        assert "00000001.seg" not in [p.name for p in segs(jdir)]
        kinds = [r.TYPE for r in j.replay()]
        assert RecordType.TOPOLOGY_SNAPSHOT in kinds
    with Journal.open(jdir, cfg) as j:
        assert set(j.recovered.queues) == {Q} and j.recovered.exchanges == {}


# ---------------------------------------------------------------- model-based crash test
ops = st.lists(st.one_of(
    st.tuples(st.just("enq"), st.integers(0, 300)),
    st.tuples(st.just("settle"), st.integers(0, 10)),
    st.tuples(st.just("deliver"), st.integers(0, 10)),
    st.tuples(st.just("commit"), st.just(0)),
), max_size=60)


@settings(max_examples=100, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(ops=ops, crash_at=st.integers(1, 12), where=st.floats(0, 1),
       seg_bytes=st.sampled_from([600, 2000, 1 << 20]))
def test_recovered_state_equals_the_committed_model(tmp_path: Path, no_fsync: None, ops: list,
                                                    crash_at: int, where: float,
                                                    seg_bytes: int) -> None:
    """Random enqueue/settle/deliver/commit; the process dies during commit number
    ``crash_at`` (its write cut at a random byte): recovery gives exactly the state of the
    commit before, or of that commit if its write was whole. Small segments make the run
    roll and compact."""
    run = tmp_path / f"run{os.urandom(4).hex()}"
    cfg = JournalConfig(segment_bytes=seg_bytes, copy_bytes_per_commit=512)
    j = Journal.open(run / "j", cfg)
    j.declare_queue(*Q)
    j.commit()
    model: dict[int, tuple[bytes, bool, int]] = {}
    before = after = dict(model)
    next_id = 1
    commits = 0
    image = None
    for op, arg in ops + [("commit", 0)]:
        if op == "enq":
            model[next_id] = (b"m" * arg, False, 0)
            j.enqueue("/", "q", next_id, "", "q", b"h", b"m" * arg)
            next_id += 1
        elif op == "settle" and model:
            victim = sorted(model)[arg % len(model)]
            del model[victim]
            j.settle([victim])
        elif op == "deliver" and model:
            e = sorted(model)[arg % len(model)]
            body, _, count = model[e]
            model[e] = (body, True, count + 1)
            j.delivery_state([(e, True, count + 1)])
        elif op == "commit":
            commits += 1
            if commits == crash_at:                 # the disk as it was before this commit
                image = crash_copy(run / "j", run / "crash")
            head, pre = j.head.path, j.head.size
            j.commit()
            before, after = after, dict(model)
            if image is not None:
                # the process dies during this commit's write: part of it reached the disk,
                # and nothing after it (no segment was deleted yet)
                written = j.head.path.read_bytes()
                if j.head.path != head:
                    pre = 0                         # this commit started a new segment
                size = len(written)
                cut = pre + int(where * (size - pre))
                with open(image / j.head.path.name, "ab") as f:
                    f.write(written[pre:cut])
                break
    j.close()
    if image is None:                               # no crash: a clean restart
        image, before, cut, size = run / "j", after, 0, 0
    with Journal.open(image, cfg) as r:
        got = {m.entry_id: (m.body, m.redelivered, m.delivery_count)
               for m in r.recovered.messages.get(Q, [])}
        assert list(got) == sorted(got)
    if cut == size:
        assert got == after
    else:
        assert got in (before, after)
