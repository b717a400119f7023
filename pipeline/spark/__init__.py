"""Shoal on Apache Spark (optional extra ``pip install 'shoal[spark]'``).

- :mod:`.datasource`: the ``shoal`` PySpark data source (AMQP 0-9-1 streaming source, streaming
  and batch sink); :func:`register` makes ``format("shoal")`` available on a session.
- :mod:`.report`: the ``shoal report`` job over ``shoal loadtest`` output.

Nothing outside this package imports pyspark; importing this package does not either.
"""
from __future__ import annotations

import os
import sys
from typing import Any


def use_this_python() -> None:
    """Make Spark's Python workers run this interpreter: ``PYSPARK_PYTHON`` and
    ``PYSPARK_DRIVER_PYTHON`` are set to ``sys.executable`` unless already set. Without them
    Spark starts ``python3`` from PATH, which in a virtual environment that is not activated is
    another Python, without Shoal (``shoal report`` and the ``shoal`` format then fail). Call
    it before the SparkSession is made: Spark reads them when its context starts."""
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)


def register(spark: Any) -> None:
    """Register the ``shoal`` format on ``spark`` (a ``pyspark.sql.SparkSession``). Its readers
    and writers run in this interpreter (:func:`use_this_python`), also when the session was
    made before ``PYSPARK_PYTHON`` was set (Spark's default then is PATH's ``python3``)."""
    from .datasource import ShoalDataSource
    use_this_python()
    context = spark.sparkContext
    if context.pythonExec == "python3":     # Spark's default: PATH's, maybe not this one
        context.pythonExec = os.environ["PYSPARK_PYTHON"]
    spark.dataSource.register(ShoalDataSource)
