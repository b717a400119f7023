"""Shoal on Apache Spark (optional extra ``pip install 'shoal[spark]'``).

- :mod:`.datasource`: the ``shoal`` PySpark data source (AMQP 0-9-1 streaming source, streaming
  and batch sink); :func:`register` makes ``format("shoal")`` available on a session.
- :mod:`.report`: the ``shoal report`` job over ``shoal loadtest`` output.

Nothing outside this package imports pyspark; importing this package does not either.
"""
from __future__ import annotations

from typing import Any


def register(spark: Any) -> None:
    """Register the ``shoal`` format on ``spark`` (a ``pyspark.sql.SparkSession``)."""
    from .datasource import ShoalDataSource
    spark.dataSource.register(ShoalDataSource)
