"""A stream's log on disk (node/streams/): chunks in Osiris's layout, segment files with
their indexes, seeking by offset and by time, retention, torn writes, and readers with
offset specs and filters."""
from __future__ import annotations

import os
import struct
import sys
from random import Random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from shoal.node.streams import chunk as chunks
from shoal.node.streams.offsets import (FIRST, LAST, NEXT, OFFSET, TIMESTAMP, Timestamp,
                                        parse_max_age, parse_offset_spec, start_offset)
from shoal.node.streams.segment import INDEX_HEADER, INDEX_SIZE
from shoal.node.streams.segments import SegmentLog
from shoal.node.streams.stream import (StreamConfig, StreamError, StreamReader, StreamWriter,
                                       parse_stream_arguments)

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from disk_model import DiskModel  # noqa: E402  (this folder, as test_stream_sim.py)


def _write(w: StreamWriter, n: int, ts: int, prefix: str = "m", filt: bytes | None = None,
           size: int = 0) -> None:
    for i in range(n):
        w.add("", "s", b"H", f"{prefix}{i}".encode() + b"x" * size, filt)
    w.flush(ts)


def _bodies(msgs) -> list[bytes]:
    return [bytes(m.body) for m in msgs]


# -- chunks -----------------------------------------------------------------------------

def test_a_chunk_has_osiris_header_layout() -> None:
    recs = [chunks.encode_record("ex", "rk", b"hdr", b"body-%d" % i) for i in range(3)]
    c = chunks.build(recs, chunk_id=40, epoch=7, timestamp=1_700_000_000_000)
    magic, ctype, n_entries, n_records, ts, epoch, cid, crc, dlen, tlen, bsize = \
        struct.unpack(">BBHIqQQIIIB3x", c[:48])
    assert (magic, ctype, n_entries, n_records) == (0x50, 0, 3, 3)
    assert (ts, epoch, cid, tlen, bsize) == (1_700_000_000_000, 7, 40, 0, 0)
    assert len(c) == 48 + dlen
    got = [(off, chunks.decode_record(r)) for off, r in chunks.records(c)]
    assert [off for off, _ in got] == [40, 41, 42]
    ex, rk, fv, header, body = got[2][1]
    assert (ex, rk, fv, bytes(header), bytes(body)) == ("ex", "rk", None, b"hdr", b"body-2")
    assert chunks.check(c).chunk_id == 40


@settings(max_examples=100, deadline=None)
@given(st.dictionaries(st.text(st.characters(min_codepoint=33, max_codepoint=126), min_size=1,
                               max_size=40),
                       st.tuples(st.lists(st.integers(0, 2**64 - 1)),
                                 st.lists(st.integers(0, 2**64 - 1))), max_size=5))
def test_a_chunks_trailer_names_its_publishes(sent) -> None:
    """The trailer (chunk.py: each writer's publishes, first sent and sent again) reads back
    as written, after the records, outside the CRC, and the records are unchanged."""
    trailer = chunks.encode_trailer(sent)
    c = chunks.build([chunks.encode_record("", "s", b"h", b"body")], 7, 1, 5, trailer=trailer)
    h = chunks.check(c)
    assert h.size == len(c) and h.trailer_length == len(trailer)
    assert chunks.decode_trailer(chunks.trailer_of(c)) == \
        {w: lists for w, lists in sent.items() if lists[0] or lists[1]}
    assert [bytes(r) for _, r in chunks.records(c)] == \
        [chunks.encode_record("", "s", b"h", b"body")]
    if trailer:
        with pytest.raises(chunks.ChunkError):
            chunks.decode_trailer(trailer[:-1])


def test_a_corrupt_chunk_fails_its_crc() -> None:
    c = bytearray(chunks.build([b"abc"], 0, 1, 0))
    c[-1] ^= 1
    with pytest.raises(chunks.ChunkError, match="CRC"):
        chunks.check(bytes(c))
    with pytest.raises(chunks.ChunkError, match="torn"):
        chunks.check(bytes(c[:-1]))


@settings(max_examples=200, deadline=None)
@given(st.lists(st.one_of(st.none(), st.binary(min_size=1, max_size=12)), min_size=1,
                max_size=20),
       st.binary(min_size=1, max_size=12), st.integers(16, 255))
def test_the_bloom_never_rules_out_a_value_it_holds(values, other, size) -> None:
    b = chunks.bloom(values, size)
    held = [v for v in values if v is not None]
    for v in held:
        assert chunks.may_match(b, [v], False)
        assert chunks.may_match(b, [other, v], False)
    assert chunks.may_match(b, [other], True) == (None in values or chunks.may_match(
        b, [other], False))


def test_a_chunk_without_filter_values_matches_only_unfiltered_readers() -> None:
    assert chunks.bloom([None, None]) == b""
    assert not chunks.may_match(b"", [b"red"], False)
    assert chunks.may_match(b"", [b"red"], True)


# -- the segment log --------------------------------------------------------------------

def test_offsets_seek_and_segments_roll(tmp_path) -> None:
    log = SegmentLog(tmp_path, max_segment_bytes=4096)
    w = StreamWriter(log, StreamConfig())
    for turn in range(40):
        _write(w, 5, ts=1000 + turn * 10, prefix=f"t{turn}-", size=100)
    w.sync()
    assert log.next_offset == 200 and log.first_offset == 0
    assert len(log.segments) > 5
    for s in log.segments:
        assert s.path.name == f"{s.first:020d}.segment"
    for off in (0, 1, 4, 5, 99, 123, 199):
        msgs = StreamReader(log, off).read(1, log.next_offset)
        assert msgs[0].offset == off
        assert bytes(msgs[0].body).startswith(f"t{off // 5}-{off % 5}".encode())
    assert log.locate(200) is None
    # by time: the first chunk written at that time or later
    assert log.seek_time(0) == 0
    assert log.seek_time(1000) == 0
    assert log.seek_time(1001) == 5
    assert log.seek_time(1250) == 125
    assert log.seek_time(10_000) == 200
    assert log.last_chunk_id == 195


def test_a_reopened_log_has_the_same_chunks(tmp_path) -> None:
    log = SegmentLog(tmp_path, max_segment_bytes=2048)
    w = StreamWriter(log, StreamConfig())
    for turn in range(20):
        _write(w, 3, ts=turn, prefix=f"{turn}-", size=50)
    w.sync()
    before = [(m.offset, bytes(m.body)) for m in StreamReader(log, 0)]
    log.close()
    again = SegmentLog(tmp_path, max_segment_bytes=2048)
    assert again.next_offset == 60
    assert [(m.offset, bytes(m.body)) for m in StreamReader(again, 0)] == before
    _write(StreamWriter(again, StreamConfig()), 1, ts=99)
    assert again.next_offset == 61


def test_a_torn_write_is_cut_off_at_open(tmp_path) -> None:
    log = SegmentLog(tmp_path)
    w = StreamWriter(log, StreamConfig())
    for turn in range(3):
        _write(w, 2, ts=turn)
    w.sync()
    seg = log.segments[-1].path
    log.close()
    size = seg.stat().st_size
    with open(seg, "r+b") as f:        # the last chunk half written
        f.truncate(size - 5)
    again = SegmentLog(tmp_path)
    assert again.next_offset == 4
    assert [m.offset for m in StreamReader(again, 0)] == [0, 1, 2, 3]
    # the index record of the torn chunk is gone too: the next chunk takes its place
    _write(StreamWriter(again, StreamConfig()), 2, ts=9, prefix="new")
    assert _bodies(StreamReader(again, 4)) == [b"new0", b"new1"]
    again.close()
    assert SegmentLog(tmp_path).next_offset == 6


def test_an_index_behind_its_segment_is_rebuilt_from_the_chunks(tmp_path) -> None:
    """Only a segment's first sync writes its index (segments.py): records that did not
    reach the disk come back from the chunks, each with the next log index."""
    log = SegmentLog(tmp_path)
    for k, ts in enumerate((1, 2, 3)):
        c = chunks.build([chunks.encode_record("", "s", b"H", f"m{k}".encode())],
                         log.next_offset, 1, ts)
        log.append(c, log_index=7 + k)
        log.sync()
    before = bytes(log.segments[-1].index)
    idx = log.segments[-1].path.with_suffix(".index")
    log.close()
    with open(idx, "r+b") as f:        # only the first record reached the disk
        f.truncate(len(INDEX_HEADER) + INDEX_SIZE)
    again = SegmentLog(tmp_path)
    assert again.next_offset == 3
    assert bytes(again.segments[-1].index) == before
    assert [again.segments[-1].log_index(i) for i in range(3)] == [7, 8, 9]
    assert _bodies(StreamReader(again, 0)) == [b"m0", b"m1", b"m2"]
    again.close()
    assert idx.read_bytes() == INDEX_HEADER + before     # written back at open


def test_a_segment_without_any_index_record_was_never_synced_and_goes(tmp_path) -> None:
    """A segment's first sync writes its index: with no record on disk, none of its chunks
    was ever synced (nor confirmed)."""
    log = SegmentLog(tmp_path)
    w = StreamWriter(log, StreamConfig())
    _write(w, 2, ts=1)
    _write(w, 2, ts=2)
    w.sync()
    idx = log.segments[-1].path.with_suffix(".index")
    log.close()
    with open(idx, "r+b") as f:
        f.truncate(len(INDEX_HEADER))
    assert SegmentLog(tmp_path).next_offset == 0


@settings(max_examples=40, deadline=None)
@given(st.integers(0, 2**32), st.lists(st.integers(1, 4), min_size=1, max_size=12),
       st.integers(300, 3000))
def test_a_crash_keeps_every_synced_chunk(tmp_path_factory, seed, turns, seg) -> None:
    """Whatever a crash leaves of what was not synced (tests/node/streams/disk_model.py:
    the files as last synced, or with a prefix of what was appended since), every chunk
    synced reads back after it, with the log indexes it was written with."""
    d = tmp_path_factory.mktemp("c")
    disk = DiskModel(Random(seed))
    disk.install()
    try:
        log = SegmentLog(d, max_segment_bytes=seg)
        sent: list[bytes] = []
        synced = 0
        for t, n in enumerate(turns):
            bodies = [f"{t}-{i}".encode() * 20 for i in range(n)]
            c = chunks.build([chunks.encode_record("", "s", b"H", b) for b in bodies],
                             log.next_offset, 1, t)
            log.append(c, log_index=t + 1)
            sent += bodies
            if t % 3 != 2:              # every third turn is lost unless torn through
                log.sync()
                synced = len(sent)
        log.close()
        disk.crash(d)
        again = SegmentLog(d, max_segment_bytes=seg)
        got = _bodies(StreamReader(again, 0))
        assert got[:synced] == sent[:synced] and got == sent[:len(got)]
        indexes = [s.log_index(i) for s in again.segments for i in range(s.chunks)]
        assert indexes == list(range(1, len(indexes) + 1))
        again.close()
    finally:
        disk.uninstall()


def test_a_flipped_byte_in_the_last_segment_cuts_the_log_there(tmp_path) -> None:
    log = SegmentLog(tmp_path)
    w = StreamWriter(log, StreamConfig())
    for turn in range(4):
        _write(w, 1, ts=turn, size=20)
    w.sync()
    seg = log.segments[-1]
    pos = seg.record(1)[3]
    log.close()
    with open(seg.path, "r+b") as f:
        f.seek(pos + 60)
        b = f.read(1)
        f.seek(pos + 60)
        f.write(bytes([b[0] ^ 0xFF]))
    assert SegmentLog(tmp_path).next_offset == 1


def test_retention_removes_whole_segments_from_the_front(tmp_path) -> None:
    log = SegmentLog(tmp_path, max_segment_bytes=1000)
    w = StreamWriter(log, StreamConfig())
    for turn in range(30):
        _write(w, 1, ts=turn * 1000, size=300)
    w.sync()
    n = len(log.segments)
    assert log.retain(max_bytes=None, max_age_ms=None, now_ms=10**9) == 0
    removed = log.retain(max_bytes=3000, max_age_ms=None, now_ms=0)
    assert removed > 0 and len(log.segments) == n - removed
    assert log.bytes <= 3000 + 1000
    first = log.first_offset
    assert first > 0
    assert all(not p.name.startswith(f"{0:020d}") for p in tmp_path.iterdir())
    # by age: everything older than 5 s before t=29 s, but never the segment being written
    log.retain(max_bytes=None, max_age_ms=5000, now_ms=29_000)
    assert log.first_offset >= 24 - 3
    log.retain(max_bytes=None, max_age_ms=1, now_ms=10**9)
    assert len(log.segments) == 1 and log.next_offset == 30
    # a reader behind the first offset goes on from it
    r = StreamReader(log, 0)
    assert r.read(100, log.next_offset)[0].offset == log.first_offset


def test_truncate_and_reset(tmp_path) -> None:
    log = SegmentLog(tmp_path, max_segment_bytes=600)
    w = StreamWriter(log, StreamConfig())
    for turn in range(10):
        _write(w, 2, ts=turn, size=100)
    w.sync()
    log.truncate_from(9)          # the chunk holding 9 (8-9) and all after
    assert log.next_offset == 8
    assert [m.offset for m in StreamReader(log, 0)] == list(range(8))
    log.close()
    assert SegmentLog(tmp_path, max_segment_bytes=600).next_offset == 8
    log = SegmentLog(tmp_path)
    log.reset(1000)
    assert (log.first_offset, log.next_offset, log.last_chunk_id) == (1000, 1000, None)
    log.close()
    again = SegmentLog(tmp_path)
    assert again.next_offset == 1000
    _write(StreamWriter(again, StreamConfig()), 1, ts=1)
    assert [m.offset for m in StreamReader(again, 0)] == [1000]


def test_a_chunk_must_start_at_the_next_offset(tmp_path) -> None:
    log = SegmentLog(tmp_path)
    with pytest.raises(ValueError, match="next offset 0"):
        log.append(chunks.build([b"x"], 5, 1, 0))
    bad = bytearray(chunks.build([b"x"], 0, 1, 0))
    bad[-1] ^= 1
    with pytest.raises(chunks.ChunkError):
        log.append(bytes(bad), verify=True)
    assert log.next_offset == 0


def test_timestamps_never_go_back(tmp_path) -> None:
    log = SegmentLog(tmp_path)
    w = StreamWriter(log, StreamConfig())
    _write(w, 1, ts=5000)
    _write(w, 1, ts=4000)       # the clock stepped back
    assert [m.timestamp for m in StreamReader(log, 0)] == [5000, 5000]


# -- readers ----------------------------------------------------------------------------

def test_readers_stop_at_the_committed_offset(tmp_path) -> None:
    log = SegmentLog(tmp_path)
    w = StreamWriter(log, StreamConfig())
    _write(w, 3, ts=1)
    assert w.committed == 0
    r = StreamReader(log, 0)
    assert r.read(10, w.committed) == []
    w.sync()
    assert [m.offset for m in r.read(2, w.committed)] == [0, 1]
    assert [m.offset for m in r.read(10, w.committed)] == [2]
    assert r.read(10, w.committed) == []


def test_filtered_readers(tmp_path) -> None:
    log = SegmentLog(tmp_path)
    w = StreamWriter(log, StreamConfig())
    _write(w, 3, ts=1, prefix="red", filt=b"red")
    _write(w, 3, ts=2, prefix="blue", filt=b"blue")
    _write(w, 2, ts=3, prefix="plain")
    w.add("", "s", b"H", b"mixed-red", b"red")
    w.add("", "s", b"H", b"mixed-plain", None)
    w.flush(4)
    w.sync()
    red = StreamReader(log, 0, [b"red"])
    assert _bodies(red.read(100, w.committed)) == [b"red0", b"red1", b"red2", b"mixed-red"]
    assert red.skipped_chunks >= 1        # the plain chunk, at least, by its bloom
    both = StreamReader(log, 0, [b"blue"], unfiltered=True)
    assert _bodies(both.read(100, w.committed)) == [
        b"blue0", b"blue1", b"blue2", b"plain0", b"plain1", b"mixed-plain"]


# -- offset specs and declare arguments ---------------------------------------------------

def test_offset_specs_as_rabbitmq_parses_them() -> None:
    now = 10_000_000
    assert parse_offset_spec(None, now) == (NEXT, 0)
    assert parse_offset_spec("first", now) == (FIRST, 0)
    assert parse_offset_spec(b"last", now) == (LAST, 0)
    assert parse_offset_spec(42, now) == (OFFSET, 42)
    assert parse_offset_spec(Timestamp(1700), now) == (TIMESTAMP, 1_700_000)
    assert parse_offset_spec("1h", now) == (TIMESTAMP, now - 3_600_000)
    assert parse_offset_spec("30m", now) == (TIMESTAMP, now - 1_800_000)
    for bad in ("1x", "0s", "h", "-1h", ""):
        with pytest.raises(ValueError, match="invalid_max_age"):
            parse_offset_spec(bad, now)
    with pytest.raises(ValueError, match="invalid_offset_arg"):
        parse_offset_spec(-1, now)
    assert parse_max_age("7D") == 7 * 86_400_000
    assert parse_max_age("1Y") == 365 * 86_400_000


def test_start_offsets(tmp_path) -> None:
    log = SegmentLog(tmp_path)
    w = StreamWriter(log, StreamConfig())
    _write(w, 4, ts=100)
    _write(w, 4, ts=200)
    w.sync()

    def start(spec):
        return start_offset(spec, log.first_offset, log.next_offset, log.last_chunk_id,
                            log.seek_time)
    assert start((FIRST, 0)) == 0
    assert start((LAST, 0)) == 4
    assert start((NEXT, 0)) == 8
    assert start((OFFSET, 6)) == 6
    assert start((OFFSET, 600)) == 8
    assert start((TIMESTAMP, 150)) == 4
    assert start((TIMESTAMP, 99)) == 0


def test_stream_declare_arguments_as_rabbitmq() -> None:
    cfg = parse_stream_arguments("/", "s", {"x-queue-type": "stream", "x-max-age": "1D",
                                            "x-max-length-bytes": 10_000,
                                            "x-stream-max-segment-size-bytes": 1000,
                                            "x-initial-cluster-size": 3,
                                            "x-stream-filter-size-bytes": 32},
                                 durable=True, exclusive=False, auto_delete=False)
    assert (cfg.max_age, cfg.max_bytes, cfg.max_segment_bytes, cfg.initial_cluster_size,
            cfg.filter_size) == (86_400_000, 10_000, 1000, 3, 32)
    cases = [
        ({}, dict(durable=False), "invalid property 'non-durable' for queue 's' in vhost '/'"),
        ({}, dict(exclusive=True),
         "invalid property 'exclusive-owner' for queue 's' in vhost '/'"),
        ({}, dict(auto_delete=True),
         "invalid property 'auto-delete' for queue 's' in vhost '/'"),
        ({"x-max-length": 5}, {},
         "invalid arg 'x-max-length' for queue 's' in vhost '/' of queue type "
         "rabbit_stream_queue"),
        ({"x-max-age": "3 days"}, {}, "invalid arg 'x-max-age' for queue 's' in vhost '/': "
                                      "{error,invalid_max_age}"),
        ({"x-stream-max-segment-size-bytes": 3_000_000_001}, {},
         "Exceeded max value for x-stream-max-segment-size-bytes"),
        ({"x-stream-filter-size-bytes": 8}, {},
         "Invalid value for x-stream-filter-size-bytes"),
        ({"x-stream-filter-size-bytes": "16"}, {},
         "Invalid type for x-stream-filter-size-bytes"),
    ]
    for args, props, text in cases:
        kw = dict(durable=True, exclusive=False, auto_delete=False)
        kw.update(props)
        with pytest.raises(StreamError) as err:
            parse_stream_arguments("/", "s", args, **kw)
        assert str(err.value) == text


@settings(max_examples=60, deadline=None)
@given(st.lists(st.lists(st.binary(max_size=300), min_size=1, max_size=8), min_size=1,
                max_size=30),
       st.integers(300, 3000))
def test_any_history_reads_back_and_survives_a_reopen(tmp_path_factory, turns, seg) -> None:
    d = tmp_path_factory.mktemp("s")
    log = SegmentLog(d, max_segment_bytes=seg)
    w = StreamWriter(log, StreamConfig())
    sent = []
    for t, bodies in enumerate(turns):
        for b in bodies:
            w.add("x", "k", b"h", b)
            sent.append(b)
        w.flush(t)
    w.sync()
    assert _bodies(StreamReader(log, 0)) == sent
    log.close()
    again = SegmentLog(d, max_segment_bytes=seg)
    assert _bodies(StreamReader(again, 0)) == sent
    k = len(sent) // 2
    assert _bodies(StreamReader(again, k)) == sent[k:]
    again.close()
    assert os.path.isdir(d)


def test_a_new_log_has_its_first_segment(tmp_path) -> None:
    """As Osiris's: stream_status shows one segment for a new stream."""
    log = SegmentLog(tmp_path)
    assert [s.path.name for s in log.segments] == [f"{0:020d}.segment"]
    assert (log.first_offset, log.next_offset, log.last_chunk_id) == (0, 0, None)
    log.close()
    assert len(SegmentLog(tmp_path).segments) == 1
