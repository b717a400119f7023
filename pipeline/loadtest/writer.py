"""Writes a run folder in the format of ``schema`` (the only writer; readers use ``read_run``).

``per_second.parquet`` and ``latency.parquet`` are written incrementally (one row group per
``flush()``, called every few seconds by the runner), so a long run does not keep every row in
memory; ``producers.parquet``, ``received.parquet`` and the final ``run.json`` are written by
``close()``.
"""
from __future__ import annotations

import json
import os
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from . import schema as S


def _write_json(path: Path, obj: dict) -> None:
    tmp = path.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(obj, indent=2, sort_keys=True) + "\n")
    os.replace(tmp, path)


def received_runs(producer: int, counts: bytes, sent: int) -> list[tuple[int, int, int, int]]:
    """Run-length encode one producer's receive counts (one byte per seq) over ``[0, sent)``:
    rows ``(producer, seq_start, seq_end, count)`` as in ``schema.RECEIVED``. ``counts`` may be
    shorter than ``sent`` (missing seqs count 0) or longer (ignored)."""
    if sent <= 0:
        return []
    counts = counts[:sent]
    if len(counts) < sent:
        counts = counts + bytes(sent - len(counts))
    arr = pa.Array.from_buffers(pa.uint8(), sent, [None, pa.py_buffer(counts)])
    ree = pc.run_end_encode(arr, run_end_type=pa.int64())
    ends = ree.run_ends.to_pylist()
    values = ree.values.to_pylist()
    rows, start = [], 0
    for end, value in zip(ends, values):
        rows.append((producer, start, end, value))
        start = end
    return rows


def merge_counts(parts: list[bytes]) -> bytes:
    """Add per-consumer receive counts element-wise, saturating at 255."""
    parts = [p for p in parts if p]
    if not parts:
        return b""
    if len(parts) == 1:
        return parts[0]
    n = max(len(p) for p in parts)
    total = None
    for p in parts:
        a = pa.Array.from_buffers(pa.uint8(), len(p), [None, pa.py_buffer(p)])
        a = pc.cast(a, pa.uint16())
        if len(a) < n:
            a = pa.concat_arrays([a, pa.nulls(n - len(a), pa.uint16()).fill_null(0)])
        total = a if total is None else pc.add(total, a)
    total = pc.cast(pc.min_element_wise(total, pa.scalar(255, pa.uint16())), pa.uint8())
    return total.buffers()[1].to_pybytes()[:n]


def loss_and_duplicates(received: pa.Table, copies: int = 1) -> tuple[int, int]:
    """``(lost, duplicates)`` from a RECEIVED table (see the schema docstring), in deliveries:
    each seq should have been received ``copies`` times (``params.copies``: a fanout's
    queues)."""
    lost = dup = 0
    for start, end, count in zip(received["seq_start"].to_pylist(),
                                 received["seq_end"].to_pylist(),
                                 received["count"].to_pylist()):
        if count < copies:
            lost += (copies - count) * (end - start)
        elif count > copies:
            dup += (count - copies) * (end - start)
    return lost, dup


def warm_up() -> None:
    """Make pyarrow's one-time set-up happen now: its first conversion of Python values
    imports pandas, about 0.2 s of CPU. The runner calls this before the workers start, so
    that the cost does not fall inside the measured window (it did, at the first ``flush()``
    five seconds in, and showed in both brokers' latency as a spike of 1-3 ms that second)."""
    pa.array([0], pa.int64())


class RunWriter:
    """The files of one run folder. ``rows`` arguments are lists of dicts keyed by column."""

    def __init__(self, out_dir: str | Path, run_json: dict) -> None:
        self.dir = Path(out_dir)
        self.dir.mkdir(parents=True, exist_ok=True)
        self.run_json = run_json
        _write_json(self.dir / S.RUN_JSON, run_json)
        self.per_second = pq.ParquetWriter(self.dir / S.PER_SECOND_FILE, S.PER_SECOND)
        self.latency = pq.ParquetWriter(self.dir / S.LATENCY_FILE, S.LATENCY)
        self._ps: list[dict] = []
        self._lat: list[tuple] = []

    def add_per_second(self, rows: list[dict]) -> None:
        self._ps.extend(rows)

    def add_samples(self, samples: list[tuple]) -> None:
        """``samples``: tuples in LATENCY column order."""
        self._lat.extend(samples)

    def flush(self) -> None:
        if self._ps:
            self.per_second.write_table(pa.Table.from_pylist(self._ps, schema=S.PER_SECOND))
            self._ps = []
        if self._lat:
            cols = list(zip(*self._lat))
            self.latency.write_table(pa.Table.from_arrays(
                [pa.array(c, type=f.type) for c, f in zip(cols, S.LATENCY)],
                schema=S.LATENCY))
            self._lat = []

    def abort(self) -> None:
        """Close the streaming files after a failed or interrupted run (so that what was
        flushed stays readable); ``run.json`` gets ``summary = {"aborted": true}``."""
        self.flush()
        self.per_second.close()
        self.latency.close()
        self.run_json["summary"] = {"aborted": True}
        _write_json(self.dir / S.RUN_JSON, self.run_json)

    def close(self, producers: list[dict], received: list[tuple], summary: dict) -> None:
        self.flush()
        self.per_second.close()
        self.latency.close()
        pq.write_table(pa.Table.from_pylist(producers, schema=S.PRODUCERS),
                       self.dir / S.PRODUCERS_FILE)
        cols = list(zip(*received)) if received else [[], [], [], []]
        pq.write_table(pa.Table.from_arrays(
            [pa.array(c, type=f.type) for c, f in zip(cols, S.RECEIVED)], schema=S.RECEIVED),
            self.dir / S.RECEIVED_FILE)
        self.run_json["summary"] = summary
        _write_json(self.dir / S.RUN_JSON, self.run_json)


def read_run(run_dir: str | Path) -> dict:
    """Read a run folder: ``{"run": dict, "per_second": Table, "latency": Table,
    "producers": Table, "received": Table}``. Raises ``FileNotFoundError``."""
    d = Path(run_dir)
    out = {"run": json.loads((d / S.RUN_JSON).read_text())}
    for name, schema in S.FILES.items():
        out[name.removesuffix(".parquet")] = pq.read_table(d / name, schema=schema)
    return out
