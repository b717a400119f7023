"""What a node keeps on disk (docs/design.md section 5): the append-only journal, its record
format, replay at start and compaction, and the shard's side of it."""
