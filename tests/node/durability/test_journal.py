"""The node journal (issue 5, design.md section 5): recovery, torn tails, corruption, group
commit, disk full (compaction: test_journal_compaction.py). Crashes are simulated by copying
the journal directory (what a kill -9 or power cut leaves on disk) and cutting or damaging
the copy."""
from __future__ import annotations

import asyncio
import errno
import logging
import os
import shutil
import time
from pathlib import Path

import pytest

from pamqp.commands import Basic
from pamqp.header import ContentHeader

from shoal.node.durability.journal import Journal, JournalConfig, JournalCorrupt, JournalUnavailable
from shoal.node.durability.format import RecordType, scan
from shoal.node.queues.message import is_persistent
from shoal.shared.errors import ShoalError

from journal_helpers import Q, crash_copy, fill, ids, segs


# ---------------------------------------------------------------- basics
def test_missing_directory_is_created_and_empty_journal_recovers_nothing(jdir: Path) -> None:
    with Journal.open(jdir) as j:
        assert j.recovered.queues == {} and j.recovered.messages == {}
        assert j.commit() == 0                      # nothing to do
        assert j.stats().segments == 1
    with Journal.open(jdir) as j:
        assert j.recovered.messages == {} and j.recovered.cuts == []


def test_empty_segment_file_is_a_torn_creation_and_is_removed(jdir: Path) -> None:
    jdir.mkdir(parents=True)
    (jdir / "00000001.seg").write_bytes(b"")
    with Journal.open(jdir) as j:
        assert [c.reason for c in j.recovered.cuts] == ["torn segment header"]
        j.declare_queue(*Q)
        fill(j, 1)
        j.commit()
    with Journal.open(jdir) as j:
        assert ids(j) == [1]


def test_replay_order_with_interleaved_settlements_and_delivery_state(jdir: Path) -> None:
    with Journal.open(jdir) as j:
        j.declare_queue("/", "q", False, {"x-max-priority": 5})
        j.declare_queue("/", "other")
        fill(j, 3)                                  # 1 2 3
        j.settle([2])
        j.commit()
        j.enqueue("/", "other", 4, "", "other", b"h", b"b4", expiry_ms=123, not_before_ms=45)
        fill(j, 2, start=5)                         # 5 6
        j.delivery_state([(3, True, 2)])
        j.settle([1, 6, 999])                       # 999 was never journaled: ignored
        fill(j, 1, start=7)
        j.commit()
    with Journal.open(jdir) as j:
        r = j.recovered
        assert ids(j) == [3, 5, 7]
        assert [(m.redelivered, m.delivery_count) for m in r.messages[Q]] == [
            (True, 2), (False, 0), (False, 0)]
        (m4,) = r.messages[("/", "other")]
        assert (m4.body, m4.expiry_ms, m4.not_before_ms) == (b"b4", 123, 45)
        assert r.queues[Q].arguments == {"x-max-priority": 5}
        assert r.max_entry_id == 7
        kinds = [type(x).__name__ for x in j.replay()]
        assert kinds.count("Enqueue") == 7 and kinds.count("Settle") == 2


def test_uncommitted_records_are_not_durable(jdir: Path, tmp_path: Path) -> None:
    j = Journal.open(jdir)
    j.declare_queue(*Q)
    fill(j, 2)
    j.commit()
    fill(j, 2, start=3)                             # appended, never committed
    with Journal.open(crash_copy(jdir, tmp_path / "crash")) as c:
        assert ids(c) == [1, 2]
    j.close()


def test_topology_round_trip(jdir: Path) -> None:
    with Journal.open(jdir) as j:
        j.declare_exchange("/", "ex", "topic", auto_delete=False, internal=True,
                           arguments={"alternate-exchange": "ae"})
        j.declare_exchange("/", "gone", "fanout")
        j.declare_queue("/", "q", True, {"x-message-ttl": 1000})
        j.declare_queue("/", "dropped")
        j.bind("/", "ex", "q", "q", "a.#", {"x-match": "all"})
        j.bind("/", "ex", "q", "q", "b.*")
        j.bind("/", "gone", "q", "q", "")
        j.bind("v2", "amq.direct", "e", "ex", "k")
        j.unbind("/", "ex", "q", "q", "b.*")
        j.delete_exchange("/", "gone")              # takes its bindings with it
        j.declare_queue("/", "dropped")
        j.enqueue("/", "dropped", 1, "", "dropped", b"h", b"b")
        j.delete_queue("/", "dropped")              # and its messages
        j.commit()
    with Journal.open(jdir) as j:
        r = j.recovered
        assert set(r.exchanges) == {("/", "ex")}
        ex = r.exchanges[("/", "ex")]
        assert (ex.type, ex.internal, ex.arguments) == ("topic", True, {"alternate-exchange": "ae"})
        assert set(r.queues) == {("/", "q")}
        assert r.queues[("/", "q")].auto_delete and r.queues[("/", "q")].arguments == {
            "x-message-ttl": 1000}
        assert sorted((b.vhost, b.exchange, b.routing_key, str(b.arguments)) for b in r.bindings) \
            == [("/", "ex", "a.#", "{'x-match': 'all'}"), ("v2", "amq.direct", "k", "{}")]
        assert r.messages == {}


def test_caller_bugs_are_value_errors(jdir: Path) -> None:
    with Journal.open(jdir) as j:
        with pytest.raises(ValueError, match="not a durable queue"):
            fill(j, 1)
        j.declare_queue(*Q)
        fill(j, 1)
        with pytest.raises(ValueError, match="already journaled"):
            fill(j, 1)


def test_second_open_of_the_same_directory_is_refused(jdir: Path) -> None:
    with Journal.open(jdir):
        with pytest.raises(JournalUnavailable, match="locked"):
            Journal.open(jdir)


def test_journal_path_that_is_a_file_is_unavailable(tmp_path: Path) -> None:
    (tmp_path / "journal").write_bytes(b"not a directory")
    with pytest.raises(JournalUnavailable, match="cannot open journal directory") as info:
        Journal.open(tmp_path / "journal")
    assert info.value.os_error is not None


@pytest.mark.skipif(os.geteuid() == 0, reason="root ignores directory permissions")
def test_unwritable_directory_is_unavailable(tmp_path: Path) -> None:
    ro = tmp_path / "ro"
    ro.mkdir()
    ro.chmod(0o500)
    try:
        with pytest.raises(JournalUnavailable) as info:
            Journal.open(ro / "journal")
        assert isinstance(info.value, ShoalError) and info.value.os_error is not None
    finally:
        ro.chmod(0o700)


# ---------------------------------------------------------------- torn tails and corruption
def _journal_with_records(jdir: Path, n: int) -> tuple[Path, int, int]:
    """n committed records (the last in its own commit); returns (segment, start of the last
    commit's write, file size)."""
    with Journal.open(jdir) as j:
        j.declare_queue(*Q)
        fill(j, n - 1)
        j.commit()
        last_write = j.stats().bytes_on_disk
        fill(j, 1, start=n)
        j.commit()
    (seg,) = segs(jdir)
    return seg, last_write, seg.stat().st_size


def test_torn_write_at_every_byte_of_the_last_record(jdir: Path, tmp_path: Path,
                                                     caplog: pytest.LogCaptureFixture) -> None:
    seg, last_write, size = _journal_with_records(jdir, 4)
    image = seg.read_bytes()
    assert size - last_write > 100                  # BATCH marker + the record
    caplog.set_level(logging.WARNING, "shoal.node.durability.journal")
    for cut in range(last_write, size):
        d = tmp_path / f"cut{cut}"
        d.mkdir()
        (d / seg.name).write_bytes(image[:cut])
        with Journal.open(d) as j:
            assert ids(j) == [1, 2, 3], cut
            if cut > last_write:
                (c,) = j.recovered.cuts
                assert (c.offset, c.dropped) == (last_write, cut - last_write)
                assert any(str(d / seg.name) in m and f"at byte {last_write}" in m
                           for m in caplog.messages)
            fill(j, 1, start=10)                    # start-up goes on: new commits land
            j.commit()
        assert (d / seg.name).stat().st_size > last_write
        with Journal.open(d) as j:
            assert ids(j) == [1, 2, 3, 10]
        shutil.rmtree(d)


def test_bad_checksum_in_the_last_record_is_cut(jdir: Path) -> None:
    seg, last_write, size = _journal_with_records(jdir, 3)
    data = bytearray(seg.read_bytes())
    data[size - 5] ^= 0xFF                          # a body byte of the last record
    seg.write_bytes(data)
    with Journal.open(jdir) as j:
        assert ids(j) == [1, 2]
        assert j.recovered.cuts[0].reason == "bad record checksum"
    assert seg.stat().st_size < size


def test_zero_filled_tail_is_cut(jdir: Path) -> None:
    seg, _, size = _journal_with_records(jdir, 3)
    with open(seg, "ab") as f:
        f.write(b"\0" * 4096)                       # blocks allocated, data never written
    with Journal.open(jdir) as j:
        assert ids(j) == [1, 2, 3]
    assert seg.stat().st_size == size


def test_bad_checksum_in_the_middle_names_file_and_offset(jdir: Path) -> None:
    seg, _, size = _journal_with_records(jdir, 6)
    result = scan(seg.read_bytes(), str(seg), True)
    enq = [(off, sz) for off, sz, t, _ in result.records if t == RecordType.ENQUEUE]
    off, sz = enq[1]
    data = bytearray(seg.read_bytes())
    data[off + sz - 3] ^= 0x01
    seg.write_bytes(data)
    with pytest.raises(JournalCorrupt) as info:
        Journal.open(jdir)
    err = info.value
    assert isinstance(err, ShoalError)
    assert (err.path, err.offset) == (str(seg), off)
    assert str(seg) in str(err) and f"byte {off}" in str(err) and "valid records follow" in str(err)
    assert seg.stat().st_size == size               # nothing cut
    with pytest.raises(JournalCorrupt):             # and it stays refused
        Journal.open(jdir)


def test_garbled_length_in_the_middle_is_corruption_not_a_tail(jdir: Path) -> None:
    seg, _, _ = _journal_with_records(jdir, 6)
    result = scan(seg.read_bytes(), str(seg), True)
    off = [o for o, _, t, _ in result.records if t == RecordType.ENQUEUE][2]
    data = bytearray(seg.read_bytes())
    data[off:off + 4] = (10 ** 9).to_bytes(4, "little")   # claims to run past the end
    seg.write_bytes(data)
    with pytest.raises(JournalCorrupt, match=f"byte {off}"):
        Journal.open(jdir)


def test_corruption_in_a_non_last_segment_is_reported(jdir: Path) -> None:
    cfg = JournalConfig(segment_bytes=2048, mostly_dead=0.0)
    with Journal.open(jdir, cfg) as j:
        j.declare_queue(*Q)
        for i in range(1, 40):
            fill(j, 1, start=i)
            j.commit()
    first = segs(jdir)[0]
    assert len(segs(jdir)) > 2
    data = bytearray(first.read_bytes())
    data[-1] ^= 0xFF                                # its very last byte
    first.write_bytes(data)
    with pytest.raises(JournalCorrupt, match="not the last segment") as info:
        Journal.open(jdir, cfg)
    assert info.value.path == str(first)


def test_segment_with_a_foreign_header_is_corrupt(jdir: Path) -> None:
    jdir.mkdir(parents=True)
    (jdir / "00000001.seg").write_bytes(b"NOTSHOAL" + b"\0" * 64)
    with pytest.raises(JournalCorrupt, match="bad magic"):
        Journal.open(jdir)


# ---------------------------------------------------------------- group commit
def test_group_commit_is_one_write_and_one_fsync(jdir: Path,
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    with Journal.open(jdir) as j:
        j.declare_queue(*Q)
        j.commit()
        calls = {"fdatasync": 0, "pwrite": 0}
        real_sync, real_pwrite = os.fdatasync, os.pwrite

        def counting_sync(fd: int) -> None:
            calls["fdatasync"] += 1
            real_sync(fd)

        def counting_pwrite(fd: int, data, offset: int) -> int:
            calls["pwrite"] += 1
            return real_pwrite(fd, data, offset)

        monkeypatch.setattr(os, "fdatasync", counting_sync)
        monkeypatch.setattr(os, "pwrite", counting_pwrite)
        lsns = [j.enqueue("/", "q", i, "", "q", b"h", b"b" * 100) for i in range(1, 501)]
        assert lsns == sorted(lsns) and j.durable_lsn < lsns[0]
        assert calls == {"fdatasync": 0, "pwrite": 0}       # append only buffers
        assert j.commit() == lsns[-1]
        assert calls == {"fdatasync": 1, "pwrite": 1}
        assert j.commit() == lsns[-1]                        # nothing new: no I/O
        assert calls == {"fdatasync": 1, "pwrite": 1}


def test_commit_async_groups_appends_made_while_the_disk_works(jdir: Path) -> None:
    async def main() -> None:
        with Journal.open(jdir) as j:
            j.declare_queue(*Q)
            futs = []
            for i in range(1, 201):
                fill(j, 1, start=i)
                futs.append(j.commit_async())
            results = await asyncio.gather(*futs)
            assert results == sorted(results) and results[-1] == j.durable_lsn
            assert j.fsyncs < 200                   # later commits grouped behind earlier ones
            assert await j.commit_async() == j.durable_lsn
    asyncio.run(main())
    with Journal.open(jdir) as j:
        assert ids(j) == list(range(1, 201))


# ---------------------------------------------------------------- disk full
class _Disk:
    """Fails os.pwrite / os.fdatasync with ENOSPC while ``full``."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch, partial: bool) -> None:
        self.full = False
        self.partial = partial
        real_pwrite, real_sync = os.pwrite, os.fdatasync

        def pwrite(fd: int, data, offset: int) -> int:
            if self.full:
                if self.partial and len(data) > 10:     # some bytes land, then ENOSPC
                    real_pwrite(fd, bytes(data[:len(data) // 2]), offset)
                raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
            return real_pwrite(fd, data, offset)

        def fdatasync(fd: int) -> None:
            if self.full:
                raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
            real_sync(fd)

        monkeypatch.setattr(os, "pwrite", pwrite)
        monkeypatch.setattr(os, "fdatasync", fdatasync)


@pytest.mark.parametrize("partial", [False, True], ids=["nothing-written", "half-written"])
def test_disk_full_withholds_commit_keeps_data_and_resumes(
        jdir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, partial: bool) -> None:
    disk = _Disk(monkeypatch, partial)
    j = Journal.open(jdir)
    j.declare_queue(*Q)
    fill(j, 3)
    durable = j.commit()
    disk.full = True
    fill(j, 2, start=4)
    j.settle([1])
    with pytest.raises(JournalUnavailable) as info:
        j.commit()
    assert info.value.os_error.errno == errno.ENOSPC and isinstance(info.value, ShoalError)
    assert j.durable_lsn == durable and not j.available
    with Journal.open(crash_copy(jdir, tmp_path / "during")) as c:   # a crash now loses nothing
        assert ids(c) == [1, 2, 3]
    fill(j, 1, start=6)                             # still buffering
    with pytest.raises(JournalUnavailable):
        j.commit()
    disk.full = False
    assert j.commit() > durable and j.available
    j.close()
    with Journal.open(jdir) as j2:
        assert ids(j2) == [2, 3, 4, 5, 6]


def test_disk_full_on_segment_roll(jdir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    disk = _Disk(monkeypatch, partial=False)
    cfg = JournalConfig(segment_bytes=1024)
    j = Journal.open(jdir, cfg)
    j.declare_queue(*Q)
    fill(j, 5)
    j.commit()
    disk.full = True
    fill(j, 20, start=6)                            # does not fit: rolls
    with pytest.raises(JournalUnavailable):
        j.commit()
    assert len(segs(jdir)) == 1                     # no half-made segment left behind
    disk.full = False
    j.commit()
    j.close()
    with Journal.open(jdir, cfg) as j2:
        assert ids(j2) == list(range(1, 26))


def test_enqueues_are_refused_when_the_failing_buffer_is_full(
        jdir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    disk = _Disk(monkeypatch, partial=False)
    j = Journal.open(jdir, JournalConfig(max_buffered_bytes=2000))
    j.declare_queue(*Q)
    j.commit()
    disk.full = True
    fill(j, 1)
    with pytest.raises(JournalUnavailable):
        j.commit()
    with pytest.raises(JournalUnavailable, match="already buffered"):
        fill(j, 30, start=2)
    j.settle([1])                                   # settlements are still accepted
    disk.full = False
    j.close()


@pytest.mark.parametrize("props, persistent", [
    (Basic.Properties(delivery_mode=2), True),
    (Basic.Properties(delivery_mode=1), False),
    (Basic.Properties(), False),
    (Basic.Properties(content_type="text/plain", content_encoding="gzip",
                      headers={"a": 1, "b": "xyz"}, delivery_mode=2, priority=3), True),
    (Basic.Properties(content_type="text/plain", headers={"a": 1}, delivery_mode=1), False),
])
def test_is_persistent_reads_delivery_mode_from_the_raw_header(props, persistent) -> None:
    header = ContentHeader(0, 5, props).marshal()
    assert is_persistent(header) is persistent
    assert is_persistent(header[:14]) is False       # truncated: treated as transient


def test_commit_async_on_a_full_disk_fails_then_resumes(jdir: Path,
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    disk = _Disk(monkeypatch, partial=True)

    async def main() -> None:
        with Journal.open(jdir) as j:
            j.declare_queue(*Q)
            fill(j, 2)
            first = await j.commit_async()
            disk.full = True
            fill(j, 2, start=3)
            with pytest.raises(JournalUnavailable):
                await j.commit_async()
            assert j.durable_lsn == first and not j.available
            disk.full = False
            fill(j, 1, start=5)
            assert await j.commit_async() > first
    asyncio.run(main())
    with Journal.open(jdir) as j:
        assert ids(j) == [1, 2, 3, 4, 5]


# ---------------------------------------------------------------- commit on the loop's thread
def test_commit_now_syncs_on_the_calling_thread_and_a_crash_then_keeps_it(
        jdir: Path, tmp_path: Path) -> None:
    """While the disk's fdatasyncs are short a commit runs on the event loop's thread: no
    worker thread is made, and what it returned for is on disk (a crash copy holds it)."""
    with Journal.open(jdir) as j:
        j.declare_queue(*Q)
        fill(j, 3)
        assert j.can_commit_now()
        assert j.commit_now() is True
        assert j.stats().buffered_records == 0
        assert j.writer._executor is None                   # no thread was needed
        assert j.commit_now() is True                       # nothing buffered: nothing to do
        with Journal.open(crash_copy(jdir, tmp_path / "crash")) as c:
            assert ids(c) == [1, 2, 3]


def test_a_slow_disk_moves_commits_to_the_worker_thread_and_a_probe_brings_them_back(
        jdir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """fdatasyncs slower than INLINE_FSYNC_MAX_S (here 10 ms each, the median) move the commits
    to the worker thread, where the loop keeps serving while the disk works; one commit a
    PROBE_EVERY_S is still made on the loop's thread, and once the disk is fast again the
    commits come back to it."""
    from shoal.node.durability import writer as w
    real_sync = os.fdatasync
    slow = [True]

    def fdatasync(fd: int) -> None:
        if slow[0]:
            time.sleep(0.01)
        real_sync(fd)
    monkeypatch.setattr(os, "fdatasync", fdatasync)

    async def main() -> None:
        with Journal.open(jdir) as j:
            j.declare_queue(*Q)
            n = 0
            while j.can_commit_now():                       # slow fsyncs, measured inline
                n += 1
                fill(j, 1, start=n)
                assert j.commit_now()
            assert n >= 1 and j.writer.fsync_recent_s > w.INLINE_FSYNC_MAX_S
            n += 1
            fill(j, 1, start=n)
            assert await j.commit_async() == j.durable_lsn  # the worker thread's turn
            assert j.writer._executor is not None
            slow[0] = False
            j.writer._probed -= w.PROBE_EVERY_S             # a probe is due
            probes = 0
            while True:
                assert j.can_commit_now()
                n += 1
                fill(j, 1, start=n)
                assert j.commit_now()
                probes += 1
                if j.writer.fsync_recent_s <= w.INLINE_FSYNC_MAX_S:
                    break
                j.writer._probed -= w.PROBE_EVERY_S
            assert j.can_commit_now()                       # fast again: no probe needed
            return n
    n = asyncio.run(main())
    with Journal.open(jdir) as j:
        assert ids(j) == list(range(1, n + 1))


def test_a_commit_larger_than_the_inline_bound_goes_to_the_worker_thread(
        jdir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from shoal.node.durability import writer as w
    monkeypatch.setattr(w, "INLINE_MAX_BYTES", 100)

    async def main() -> None:
        with Journal.open(jdir) as j:
            j.declare_queue(*Q)
            fill(j, 3)
            assert j.commit_now() is False                  # handed to the thread
            assert j.writer.inflight is not None and not j.can_commit_now()
            assert await j.commit_async() == j.durable_lsn
            assert j.stats().buffered_records == 0
    asyncio.run(main())
    with Journal.open(jdir) as j:
        assert ids(j) == [1, 2, 3]


def test_commit_now_on_a_full_disk_keeps_the_records_and_the_thread_retries(
        jdir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    disk = _Disk(monkeypatch, partial=True)

    async def main() -> None:
        with Journal.open(jdir) as j:
            j.declare_queue(*Q)
            fill(j, 2)
            assert j.commit_now()
            first = j.durable_lsn
            disk.full = True
            fill(j, 2, start=3)
            with pytest.raises(JournalUnavailable) as info:
                j.commit_now()
            assert info.value.os_error.errno == errno.ENOSPC
            assert j.durable_lsn == first and not j.available
            assert not j.can_commit_now()                   # a failing disk: the thread retries
            disk.full = False
            assert await j.commit_async() > first and j.available
            assert j.can_commit_now()
    asyncio.run(main())
    with Journal.open(jdir) as j:
        assert ids(j) == [1, 2, 3, 4]
