"""``shoal.shared.spark`` (the path docs/spark.md gave before the layout of docs/architecture.md)
keeps working for one release: the same objects as ``shoal.pipeline.spark``, with a
DeprecationWarning that names the new path."""
from __future__ import annotations

import subprocess
import sys

import pytest

pytest.importorskip("pyspark", reason="the Spark tests need the spark extra (pyspark)")

SCRIPT = """
import warnings
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    from shoal.shared.spark import register
    import shoal.shared.spark.datasource as old
import shoal.pipeline.spark as new
import shoal.pipeline.spark.datasource as new_ds
assert register is new.register
assert old is new_ds and old.SOURCE_SCHEMA is new_ds.SOURCE_SCHEMA
assert old.ShoalDataSource is new_ds.ShoalDataSource
print([(w.category.__name__, str(w.message)) for w in caught])
"""


def test_old_import_path_works_and_warns():
    r = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True,
                       timeout=120)
    assert r.returncode == 0, r.stderr
    assert "DeprecationWarning" in r.stdout
    assert "import shoal.pipeline.spark instead" in r.stdout
