"""The link's batches on a byte stream: the same-host ``unix://`` transport (issue 20).

ZeroMQ keeps message boundaries; a Unix stream socket does not. On a ``unix://`` link every
batch (:func:`shoal.shared.wire.encode_batch`'s bytes) is sent as one *frame*: a 4-byte
big-endian length, then the batch. Everything above the frame (HELLO, heartbeats, GOODBYE,
credit, replies) is the ZeroMQ link's protocol unchanged; only the transport differs
(docs/performance.md, "The same-host link").
"""
from __future__ import annotations

import asyncio
import logging
import struct
from typing import Any, Callable

from .wire import encode_batch

log = logging.getLogger("shoal.link")

_LEN = struct.Struct(">I")
#: Bytes of a frame's length prefix.
HEADER = _LEN.size
#: The largest frame (bytes): what the 4-byte prefix can say. A batch that would be larger
#: (several messages near ``max_message_size``'s 512 MiB limit) is sent as several frames.
MAX_FRAME = (1 << 32) - 1
#: Frames this small are sent as one ``write`` (prefix and batch joined); larger ones as two
#: buffers (``writelines``), so a large message's bytes are not copied to prepend 4 bytes.
JOIN_BELOW = 64 * 1024


async def dial(path: str, factory: Callable[[], asyncio.Protocol], wanted: Callable[[], bool],
               first_delay: float, max_delay: float, what: str) -> tuple[Any, Any] | None:
    """Connect to the Unix socket at ``path`` (``loop.create_unix_connection(factory,
    path)``), trying again after ``first_delay`` seconds, the wait doubling up to
    ``max_delay``, for as long as ``wanted()``. Returns ``(transport, protocol)``, or None
    once it is no longer wanted. A failed attempt (OSError: no socket yet, refused) is logged
    at debug level, naming ``what``. The router's link to a node and the nodes' peer links
    both dial this way (router/links/unix_link.py, node/replication/links.py)."""
    loop = asyncio.get_running_loop()
    delay = first_delay
    while wanted():
        try:
            return await loop.create_unix_connection(factory, path)
        except OSError as exc:
            log.debug("%s at %s: %s", what, path, exc)
        await asyncio.sleep(delay)
        delay = min(delay * 2, max_delay)
    return None


def scheme_path(endpoint: str) -> str | None:
    """The socket path of a ``unix://PATH`` endpoint, or None for any other endpoint."""
    return endpoint[len("unix://"):] if endpoint.startswith("unix://") else None


def encode_frames(messages: list[list[Any]]) -> list[bytes]:
    """The buffers to write for one batch of wire messages (``transport.writelines``, or one
    ``write`` when a single buffer): each frame's length prefix and its batch, joined when
    small. A batch whose encoding exceeds MAX_FRAME is split, in order, into several frames.
    Raises TypeError (shared.wire.encode_batch) for what the wire cannot carry."""
    data = encode_batch(messages)
    if len(data) > MAX_FRAME and len(messages) > 1:
        half = len(messages) // 2
        return encode_frames(messages[:half]) + encode_frames(messages[half:])
    head = _LEN.pack(len(data))
    if len(data) < JOIN_BELOW:
        return [head + data]
    return [head, data]


def write_batch(transport: Any, messages: list[list[Any]], limit: int = -1) -> bool:
    """Write one batch of wire messages to an asyncio ``transport`` as frames
    (:func:`encode_frames`). Returns False, writing nothing, when the transport is closing or
    more than ``limit`` bytes (``limit`` >= 0) already wait in it unsent: the reader is not
    keeping up, and the caller pauses or drops as its link does. Raises TypeError
    (shared.wire.encode_batch) for what the wire cannot carry."""
    if transport.is_closing() or 0 <= limit < transport.get_write_buffer_size():
        return False
    buffers = encode_frames(messages)
    if len(buffers) == 1:
        transport.write(buffers[0])
    else:
        transport.writelines(buffers)
    return True


class FrameReader:
    """Cuts a byte stream into frames: :meth:`feed` takes what a socket read returned and
    gives back the whole frames it completed, in order, keeping any partial frame."""

    __slots__ = ("_buf",)

    def __init__(self) -> None:
        self._buf = bytearray()

    @property
    def pending(self) -> int:
        """Bytes held of a frame not yet complete."""
        return len(self._buf)

    def feed(self, data: bytes) -> list[bytes]:
        """Frames completed by ``data`` (each the batch's bytes, without its prefix).

        Raises ValueError when a length prefix exceeds MAX_FRAME (the stream is not a link's:
        the caller closes the connection)."""
        buf = self._buf
        if buf:
            buf += data
            data = buf
        out: list[bytes] = []
        pos = 0
        end = len(data)
        unpack = _LEN.unpack_from
        while end - pos >= HEADER:
            (size,) = unpack(data, pos)
            if size > MAX_FRAME:
                raise ValueError(f"frame of {size} bytes exceeds the link's {MAX_FRAME}")
            stop = pos + HEADER + size
            if stop > end:
                break
            out.append(bytes(data[pos + HEADER:stop]))
            pos = stop
        if data is buf:
            del buf[:pos]
        elif pos < end:
            buf += data[pos:]
        return out
