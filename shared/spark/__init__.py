"""Deprecated alias of :mod:`shoal.pipeline.spark` (moved by the layout of docs/architecture.md).

``from shoal.shared.spark import register`` and ``shoal.shared.spark.datasource`` keep working
for one release, with a DeprecationWarning; import :mod:`shoal.pipeline.spark` instead. This is
the only place where ``shoal.shared`` imports anything above it (an ``ignore_imports`` entry of
the import-linter contracts in pyproject.toml, to be removed with this alias).
"""
from __future__ import annotations

import warnings

from shoal.pipeline.spark import register

__all__ = ["register"]

warnings.warn("shoal.shared.spark is deprecated and will be removed in the next release; "
              "import shoal.pipeline.spark instead", DeprecationWarning, stacklevel=2)
