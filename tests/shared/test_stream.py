"""The same-host link's framing (shared/stream.py): batches cut from a byte stream whatever
the socket reads return, in order, and large batches sent without joining their bytes."""
from __future__ import annotations

import asyncio
import struct

import pytest

from shoal.shared import stream, wire
from shoal.shared.wire import T


def _batches() -> list[list[list]]:
    return [[[T.HEARTBEAT]],
            [[T.PUBLISH, 7, "/", ["q"], "", "q", b"h", b"x" * 300, None]] * 3,
            [[T.SETTLE, wire.OUTCOME_ACK, list(range(50))]]]


def _stream_bytes(batches) -> bytes:
    return b"".join(b"".join(stream.encode_frames(b)) for b in batches)


@pytest.mark.parametrize("step", [1, 2, 3, 5, 7, 64, 1000, 100_000])
def test_frames_come_out_whole_and_in_order_whatever_the_reads(step):
    data = _stream_bytes(_batches())
    reader = stream.FrameReader()
    got = []
    for i in range(0, len(data), step):
        got.extend(wire.decode_batch(f) for f in reader.feed(data[i:i + step]))
    assert got == _batches()
    assert reader.pending == 0


def test_a_partial_frame_waits_for_its_rest():
    data = _stream_bytes([[[T.HEARTBEAT]]])
    reader = stream.FrameReader()
    assert reader.feed(data[:-1]) == []
    assert reader.pending == len(data) - 1
    assert [wire.decode_batch(f) for f in reader.feed(data[-1:])] == [[[T.HEARTBEAT]]]


def test_a_length_beyond_the_limit_is_refused(monkeypatch):
    monkeypatch.setattr(stream, "MAX_FRAME", 1000)
    with pytest.raises(ValueError, match="exceeds"):
        stream.FrameReader().feed(struct.pack(">I", 1001) + b"x")


def test_small_batches_are_one_buffer_large_ones_two():
    small = stream.encode_frames([[T.HEARTBEAT]])
    assert len(small) == 1
    big = stream.encode_frames([[T.PUBLISH, 0, "/", ["q"], "", "q", b"", b"x" * 200_000, None]])
    assert len(big) == 2 and big[0] == struct.pack(">I", len(big[1]))


def test_a_batch_too_large_for_one_frame_is_split_in_order(monkeypatch):
    monkeypatch.setattr(stream, "MAX_FRAME", 2000)
    msgs = [[T.PUBLISH, i, "/", ["q"], "", "q", b"", b"x" * 900, None] for i in range(5)]
    data = b"".join(stream.encode_frames(msgs))
    frames = stream.FrameReader().feed(data)
    assert len(frames) > 1
    assert [m for f in frames for m in wire.decode_batch(f)] == msgs


class _Transport:
    """What write_batch uses of an asyncio transport."""

    def __init__(self, closing: bool = False, waiting: int = 0) -> None:
        self.closing, self.waiting, self.written = closing, waiting, []

    def is_closing(self) -> bool:
        return self.closing

    def get_write_buffer_size(self) -> int:
        return self.waiting

    def write(self, data: bytes) -> None:
        self.written.append(data)

    def writelines(self, buffers: list[bytes]) -> None:
        self.written.extend(buffers)


def test_a_batch_is_written_as_its_frames_unless_closing_or_past_the_limit():
    batch = [[int(T.RAFT), b"x" * 10]]
    t = _Transport()
    assert stream.write_batch(t, batch) and b"".join(t.written) == b"".join(
        stream.encode_frames(batch))
    big = [[int(T.RAFT), b"y" * (stream.JOIN_BELOW + 1)]]
    t = _Transport(waiting=100)
    assert stream.write_batch(t, big, limit=100) and len(t.written) == 2
    for t, limit in ((_Transport(closing=True), -1), (_Transport(waiting=101), 100)):
        assert not stream.write_batch(t, batch, limit) and t.written == []


def test_dial_waits_for_a_socket_that_appears_and_gives_up_when_no_longer_wanted(
        tmp_path) -> None:
    """stream.dial: the router's node link and the nodes' peer links both dial so."""
    async def main() -> None:
        path = str(tmp_path / "later.sock")
        got = asyncio.ensure_future(stream.dial(path, asyncio.Protocol, lambda: True,
                                                0.01, 0.05, "test"))
        await asyncio.sleep(0.1)
        assert not got.done()                       # nothing listens yet: it keeps trying
        server = await asyncio.get_running_loop().create_unix_server(asyncio.Protocol, path)
        transport, _ = await asyncio.wait_for(got, 10)
        transport.close()
        server.close()
        wanted = [True]
        gone = asyncio.ensure_future(stream.dial(str(tmp_path / "never.sock"),
                                                 asyncio.Protocol, lambda: wanted[0],
                                                 0.01, 0.05, "test"))
        await asyncio.sleep(0.05)
        wanted[0] = False
        assert await asyncio.wait_for(gone, 10) is None
    asyncio.run(main())
