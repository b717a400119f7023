"""Fixtures for the Spark tests: one local SparkSession per session (bounded, no UI).

Every test here skips, saying why, when pyspark (the ``spark`` extra) is not installed.
"""
from __future__ import annotations

import shutil

import pytest


@pytest.fixture(scope="session")
def spark():
    """A ``local[2]`` session with the ``shoal`` format registered."""
    if shutil.which("java") is None:
        pytest.skip("no java on PATH: PySpark needs Java 17")
    from pyspark.sql import SparkSession
    from shoal.pipeline.spark import register, use_this_python
    use_this_python()       # workers run this interpreter, also from a venv not activated
    session = (SparkSession.builder.master("local[2]").appName("shoal-tests")
               .config("spark.ui.enabled", "false")
               .config("spark.ui.showConsoleProgress", "false")
               .config("spark.sql.shuffle.partitions", "2")
               .config("spark.default.parallelism", "2")
               .config("spark.sql.session.timeZone", "UTC")
               .config("spark.driver.memory", "1g")
               # the client JIT only, and the serial collector: the tests' JVM lives for
               # minutes, too short for the server JIT to pay back; a quarter less CPU
               .config("spark.driver.extraJavaOptions",
                       "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC")
               .getOrCreate())
    session.sparkContext.setLogLevel("ERROR")
    register(session)
    yield session
    session.stop()
