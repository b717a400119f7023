"""The data pipeline around Shoal, a client of any AMQP 0-9-1 broker: the load generator and its
Parquet output (:mod:`.loadtest`, ``shoal loadtest``), and Apache Spark's side (:mod:`.spark`:
the ``shoal`` PySpark source and sink, the ``shoal report`` job).

It imports only ``shoal.shared`` and public client libraries, never router or node internals
(import-linter contracts in pyproject.toml; docs/architecture.md).
"""
