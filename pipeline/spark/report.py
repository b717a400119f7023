"""``shoal report``: a PySpark job over ``shoal loadtest`` run folders (issue 8).

Reads the files of :mod:`shoal.pipeline.loadtest.schema` (the only definition of the columns) and
computes, per run and per queue and per node:

- throughput (msg/s): ``sent_per_s`` = messages sent / ``params.time``; ``received_per_s`` =
  messages received during the sending window (``second < params.time``) / ``params.time``;
  ``peak_received_per_s``: the busiest second;
- consumer latency percentiles p50/p95/p99/p99.9 in ms (Spark ``percentile``, exact with linear
  interpolation, or ``percentile_approx`` with ``approx=True``) over the LATENCY samples
  received during the sending window;
- ``redelivered`` (deliveries with the flag), ``lost`` (sent, never received) and
  ``duplicates`` from RECEIVED, in deliveries (``params.copies`` each: a fanout's queues).
  RECEIVED has no queue column, so per queue/node ``lost`` is known only when each producer
  of that queue published to that queue alone, and not through a fanout (else null);
- a timeline per run and second (sent, received, latency percentiles by receive second) and a
  latency histogram per run (10 log-spaced buckets per decade of µs).

Every table has a ``run`` column (the run's label, made unique), so runs compare side by side.
Errors (missing folder, not load-test output, unknown format version) raise
:class:`~shoal.pipeline.spark.options.ShoalSparkError` naming the folder.
"""
from __future__ import annotations

import json
import os
import posixpath
import sys
from collections.abc import Callable
from dataclasses import dataclass

from shoal.pipeline.loadtest import schema as S

from .options import ShoalSparkError

#: Percentiles reported everywhere (fractions) and their column suffixes.
PERCENTILES = (0.5, 0.95, 0.99, 0.999)
PCT_NAMES = ("p50", "p95", "p99", "p999")
#: Latency histogram resolution: buckets per decade of microseconds.
BUCKETS_PER_DECADE = 10


@dataclass(frozen=True)
class RunInput:
    """One run folder: ``path`` as given (local or any Spark-readable URI), ``run`` its unique
    label, ``meta`` the parsed run.json."""

    path: str
    run: str
    meta: dict

    @property
    def start_ns(self) -> int:
        return int(self.meta["start_ns"])

    @property
    def time_s(self) -> float:
        return float(self.meta.get("params", {}).get("time") or 0) or 1.0


def _is_local(path: str) -> bool:
    return "://" not in path or path.startswith("file://")


def _local(path: str) -> str:
    return path.removeprefix("file://")


def _join(path: str, name: str) -> str:
    return posixpath.join(path.rstrip("/"), name)


def _check_meta(path: str, text: str) -> dict:
    try:
        meta = json.loads(text)
    except ValueError:
        raise ShoalSparkError(f"{path}: not load-test output ({S.RUN_JSON} is not JSON)") from None
    if not isinstance(meta, dict) or "start_ns" not in meta or "format_version" not in meta:
        raise ShoalSparkError(f"{path}: not load-test output ({S.RUN_JSON} has no "
                              f"format_version/start_ns)")
    if meta["format_version"] != S.FORMAT_VERSION:
        raise ShoalSparkError(f"{path}: load-test format version {meta['format_version']} is "
                              f"not supported (this report reads version {S.FORMAT_VERSION})")
    return meta


def check_local_inputs(paths: list[str]) -> None:
    """Fail fast, before Spark starts, on local folders that are missing or incomplete."""
    for path in paths:
        if not _is_local(path):
            continue
        p = _local(path)
        if not os.path.isdir(p):
            raise ShoalSparkError(f"{path}: no such folder")
        missing = [n for n in (S.RUN_JSON, *S.FILES) if not os.path.exists(os.path.join(p, n))]
        if missing:
            raise ShoalSparkError(f"{path}: not load-test output (missing {', '.join(missing)})")


def read_inputs(spark, paths: list[str]) -> list[RunInput]:
    """Parse every run.json (through Spark, so remote paths work) and give runs unique names."""
    runs: list[RunInput] = []
    seen: dict[str, int] = {}
    for path in paths:
        if _is_local(path):
            p = _local(path)
            with open(os.path.join(p, S.RUN_JSON), encoding="utf-8") as f:
                meta = _check_meta(path, f.read())
        else:
            try:
                rows = spark.read.option("wholetext", True).text(_join(path, S.RUN_JSON)).collect()
            except Exception as exc:  # noqa: BLE001 - Spark's AnalysisException and friends
                raise ShoalSparkError(f"{path}: not load-test output (cannot read "
                                      f"{S.RUN_JSON}: {str(exc).splitlines()[0]})") from None
            meta = _check_meta(path, rows[0][0] if rows else "")
        name = str(meta.get("label") or posixpath.basename(path.rstrip("/")) or path)
        seen[name] = seen.get(name, 0) + 1
        if seen[name] > 1:
            name = f"{name} #{seen[name]}"
        runs.append(RunInput(path, name, meta))
    return runs


def _read_table(spark, runs: list[RunInput], file: str):
    """One schema file of every run, with a ``run`` column; checks the schema's columns."""
    from pyspark.sql import functions as F
    want = S.FILES[file].names
    out = None
    for r in runs:
        path = _join(r.path, file)
        try:
            df = spark.read.parquet(path)
        except Exception as exc:  # noqa: BLE001 - Spark's AnalysisException and friends
            raise ShoalSparkError(f"{r.path}: not load-test output (cannot read {file}: "
                                  f"{str(exc).splitlines()[0]})") from None
        missing = [c for c in want if c not in df.columns]
        if missing:
            raise ShoalSparkError(f"{r.path}: not load-test output ({file} lacks columns "
                                  f"{', '.join(missing)})")
        df = df.select(F.lit(r.run).alias("run"), *want)
        out = df if out is None else out.unionByName(df)
    return out


def _pct_cols(col: str, approx: bool, prefix: str = "latency_") -> list:
    """p50/p95/p99/p99.9 of ``col`` (µs) as ms columns."""
    from pyspark.sql import functions as F
    fn = F.percentile_approx(col, list(PERCENTILES), 10000) if approx \
        else F.percentile(col, list(PERCENTILES))
    return [fn.alias("_pcts")], [(F.col("_pcts")[i] / 1000.0).alias(f"{prefix}{n}_ms")
                                 for i, n in enumerate(PCT_NAMES)]


def aggregate(spark, runs: list[RunInput], approx: bool = False,
              progress: Callable[[str], None] = lambda s: None) -> dict:
    """The report's tables as Spark DataFrames: ``runs``, ``queues``, ``nodes``, ``timeline``,
    ``latency_hist`` (columns documented in docs/spark.md)."""
    from pyspark.sql import functions as F
    progress(f"reading {len(runs)} run(s)")
    per_second = _read_table(spark, runs, S.PER_SECOND_FILE).cache()
    latency = _read_table(spark, runs, S.LATENCY_FILE)
    producers = _read_table(spark, runs, S.PRODUCERS_FILE).cache()
    received = _read_table(spark, runs, S.RECEIVED_FILE)
    meta = spark.createDataFrame(
        [(r.run, r.path, str(r.meta.get("broker", "")), r.start_ns, r.time_s,
          int(r.meta.get("params", {}).get("producers") or 0),
          int(r.meta.get("params", {}).get("consumers") or 0),
          int(r.meta.get("params", {}).get("size") or 0),
          int(r.meta.get("params", {}).get("copies") or 1)) for r in runs],
        "run string, path string, broker string, start_ns long, time_s double, "
        "producers int, consumers int, size int, copies int")
    meta = F.broadcast(meta)
    lat = (latency.join(meta.select("run", "start_ns", "time_s"), "run")
           .withColumn("rsecond", F.floor((F.col("received_ns") - F.col("start_ns")) / 1e9))
           .cache())
    in_window = F.col("rsecond") < F.col("time_s")
    queue_node = producers.select("run", "queue", "node").distinct()
    lat_w = lat.where(in_window).join(queue_node, ["run", "queue"], "left")

    progress("loss and duplicates per producer")
    span, c = F.col("seq_end") - F.col("seq_start"), F.col("copies")
    loss = (received.join(meta.select("run", "copies"), "run").groupBy("run", "producer").agg(
        F.sum(F.when(F.col("count") < c, (c - F.col("count")) * span)
              .otherwise(0)).alias("lost"),
        F.sum(F.when(F.col("count") > c, (F.col("count") - c) * span)
              .otherwise(0)).alias("duplicates")))
    nq = producers.groupBy("run", "producer").agg(F.countDistinct("queue").alias("_nq"))
    loss_q = (producers.select("run", "producer", "queue").distinct()
              .join(nq, ["run", "producer"]).join(loss, ["run", "producer"], "left")
              .join(meta.select("run", "copies"), "run")
              .groupBy("run", "queue").agg(
                  F.when((F.max("_nq") > 1) | (F.max("copies") > 1), F.lit(None))
                  .otherwise(F.sum(F.coalesce("lost", F.lit(0)))).alias("lost")))

    def counts(keys: list[str]):
        cons = per_second.where(F.col("role") == S.ROLE_CONSUMER).join(
            meta.select("run", "time_s"), "run")
        got = cons.groupBy(*keys).agg(
            F.sum("received").alias("received"), F.sum("redelivered").alias("redelivered"),
            F.sum("foreign").alias("foreign"),
            F.sum(F.when(F.col("second") < F.col("time_s"), F.col("received")).otherwise(0))
            .alias("received_in_window"))
        peak = (cons.groupBy(*keys, "second").agg(F.sum("received").alias("r"))
                .groupBy(*keys).agg(F.max("r").alias("peak_received_per_s")))
        sent = producers.groupBy(*keys).agg(*[F.sum(c).alias(c) for c in
                                              ("sent", "confirmed", "nacked", "returned")])
        pcts, pct_out = _pct_cols("latency_us", approx)
        lats = lat_w.groupBy(*keys).agg(*pcts, F.count("*").alias("latency_samples")) \
            .select(*keys, *pct_out, "latency_samples")
        df = (sent.join(got, keys, "full").join(peak, keys, "left").join(lats, keys, "left")
              .join(meta.select("run", "time_s"), "run", "left"))
        for c in ("sent", "confirmed", "nacked", "returned", "received", "redelivered",
                  "foreign", "received_in_window", "peak_received_per_s"):
            df = df.withColumn(c, F.coalesce(F.col(c), F.lit(0)).cast("long"))
        return (df.withColumn("sent_per_s", F.col("sent") / F.col("time_s"))
                .withColumn("received_per_s", F.col("received_in_window") / F.col("time_s")))

    progress("per-run totals and latency percentiles")
    run_tbl = (counts(["run"]).drop("time_s")
               .join(loss.groupBy("run").agg(F.sum("lost").cast("long").alias("lost"),
                                             F.sum("duplicates").cast("long")
                                             .alias("duplicates")), "run", "left")
               .join(meta, "run").orderBy("run"))
    run_tbl = run_tbl.select("run", "path", "broker", "producers", "consumers", "size",
                             "time_s", *[c for c in run_tbl.columns if c not in (
                                 "run", "path", "broker", "producers", "consumers", "size",
                                 "time_s", "start_ns")], "start_ns")
    progress("per-queue and per-node aggregates")
    queue_tbl = (counts(["run", "queue", "node"]).drop("time_s")
                 .join(loss_q, ["run", "queue"], "left").orderBy("run", "queue"))
    node_tbl = (counts(["run", "node"]).drop("time_s")
                .join(queue_tbl.groupBy("run", "node").agg(
                    F.when(F.count(F.when(F.col("lost").isNull(), 1)) > 0, F.lit(None))
                    .otherwise(F.sum("lost")).cast("long").alias("lost")),
                    ["run", "node"], "left").orderBy("run", "node"))

    progress("timeline per second")
    ps = per_second.groupBy("run", "second").agg(
        F.sum(F.when(F.col("role") == S.ROLE_PRODUCER, F.col("sent")).otherwise(0))
        .cast("long").alias("sent"),
        F.sum(F.when(F.col("role") == S.ROLE_CONSUMER, F.col("received")).otherwise(0))
        .cast("long").alias("received"))
    pcts, pct_out = _pct_cols("latency_us", approx)
    lt = lat.groupBy("run", F.col("rsecond").cast("int").alias("second")).agg(*pcts).select(
        "run", "second", *pct_out)
    timeline = ps.join(lt, ["run", "second"], "full").orderBy("run", "second")

    progress("latency distribution")
    bucket = F.floor(F.log10(F.greatest(F.col("latency_us"), F.lit(1))) * BUCKETS_PER_DECADE)
    hist = (lat.groupBy("run", bucket.cast("int").alias("bucket")).agg(F.count("*").alias("count"))
            .withColumn("latency_from_ms", F.pow(10.0, F.col("bucket") / BUCKETS_PER_DECADE) / 1000)
            .withColumn("latency_to_ms",
                        F.pow(10.0, (F.col("bucket") + 1) / BUCKETS_PER_DECADE) / 1000)
            .orderBy("run", "bucket"))
    return {"runs": run_tbl, "queues": queue_tbl, "nodes": node_tbl, "timeline": timeline,
            "latency_hist": hist}


def collect(tables: dict, progress: Callable[[str], None] = lambda s: None) -> dict:
    """Run the jobs: every table as a pyarrow Table (the aggregates are small)."""
    import pyarrow as pa
    out = {}
    for name, df in tables.items():
        progress(f"computing {name}")
        rows = [r.asDict() for r in df.collect()]
        out[name] = pa.Table.from_pylist(rows) if rows else pa.table(
            {f.name: pa.array([], type=pa.null()) for f in df.schema.fields})
    return out


def write_tables(tables: dict, out_dir: str) -> list[str]:
    """``OUT/NAME.parquet`` and ``OUT/NAME.csv`` for each table; returns the file paths."""
    import pyarrow.csv as pcsv
    import pyarrow.parquet as pq
    os.makedirs(out_dir, exist_ok=True)
    written = []
    for name, table in tables.items():
        for path, write in ((os.path.join(out_dir, f"{name}.parquet"), pq.write_table),
                            (os.path.join(out_dir, f"{name}.csv"), pcsv.write_csv)):
            write(table, path)
            written.append(path)
    return written


def stderr_progress(total: int) -> Callable[[str], None]:
    """A progress callback printing ``shoal report [i/total] what`` lines on stderr."""
    state = {"i": 0}

    def progress(what: str) -> None:
        state["i"] += 1
        print(f"shoal report [{min(state['i'], total)}/{total}] {what}", file=sys.stderr,
              flush=True)
    return progress
