"""Deprecated alias of :mod:`shoal.pipeline.spark.datasource` (see :mod:`shoal.shared.spark`):
importing it gives that very module, so its classes and ``SOURCE_SCHEMA`` are the same objects."""
import sys

from shoal.pipeline.spark import datasource

sys.modules[__name__] = datasource
