"""Streams (``x-queue-type: stream``): a replicated append-only log read from offsets
(docs/streams.md). ``chunk.py`` the unit written, replicated and read (Osiris's layout);
``segments.py`` the segment files and their indexes; ``offsets.py`` where a consumer
starts; ``stream.py`` one member's declare arguments, writer and readers."""
