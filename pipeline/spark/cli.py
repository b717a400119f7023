"""``shoal report RUN_DIR... [--master URL] [--out DIR] [--approx]`` (dispatched lazily by
``shoal.cli``, so only this command imports pyspark).

Exit status: 0 on success; 2 with one line on stderr for bad input (a missing folder, a folder
that is not load-test output, pyspark not installed); 1 with one line if the Spark job fails.
"""
from __future__ import annotations

import argparse
import os
import sys

from .options import ShoalSparkError


class _Parser(argparse.ArgumentParser):
    def error(self, message: str):  # one line, exit 2
        print(f"shoal report: {message}", file=sys.stderr)
        raise SystemExit(2)


def _parser() -> argparse.ArgumentParser:
    p = _Parser(prog="shoal report", description="Analyse `shoal loadtest` runs with Spark: "
                "throughput, latency percentiles, redeliveries and loss, side by side.")
    p.add_argument("runs", nargs="+", metavar="RUN_DIR",
                   help="run folders written by `shoal loadtest --out` (any Spark path)")
    p.add_argument("--master", default="local[*]", help="Spark master URL (default local[*])")
    p.add_argument("--out", default="shoal-report",
                   help="output folder: report.html, *.parquet, *.csv (default ./shoal-report)")
    p.add_argument("--approx", action="store_true",
                   help="percentile_approx instead of exact percentiles (for huge inputs)")
    return p


def run(runs: list[str], master: str, out: str, approx: bool = False) -> str:
    """The job; returns the path of report.html. Raises ShoalSparkError on bad input."""
    from . import report
    report.check_local_inputs(runs)
    try:
        from pyspark.sql import SparkSession
    except ImportError:
        raise ShoalSparkError("pyspark is not installed: pip install 'shoal[spark]'") from None
    from . import html as page
    from . import use_this_python
    use_this_python()           # Spark's Python workers: this interpreter, not PATH's python3
    progress = report.stderr_progress(13)
    progress(f"starting Spark ({master})")
    spark = (SparkSession.builder.master(master).appName("shoal report")
             .config("spark.sql.session.timeZone", "UTC")
             .config("spark.ui.showConsoleProgress", "true")    # Spark's stage progress bar
             .getOrCreate())
    spark.sparkContext.setLogLevel("ERROR")
    inputs = report.read_inputs(spark, runs)
    tables = report.collect(report.aggregate(spark, inputs, approx, progress), progress)
    progress(f"writing {out}")
    report.write_tables(tables, out)
    path = os.path.join(out, "report.html")
    with open(path, "w", encoding="utf-8") as f:
        f.write(page.render({k: v.to_pylist() for k, v in tables.items()}))
    return path


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(sys.argv[1:] if argv is None else argv)
    try:
        path = run(args.runs, args.master, args.out, args.approx)
    except ShoalSparkError as exc:
        print(f"shoal report: {exc}", file=sys.stderr)
        return 2
    except ImportError as exc:
        print(f"shoal report: {exc.name or exc} is not installed: pip install 'shoal[spark]'",
              file=sys.stderr)
        return 2
    except Exception as exc:  # noqa: BLE001 - the CLI boundary: one line, non-zero exit
        first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
        print(f"shoal report: Spark job failed: {first}", file=sys.stderr)
        return 1
    print(f"shoal report: wrote {path}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
