"""``shoal loadtest``: a PerfTest-like AMQP 0-9-1 load generator (issue 6).

Works against any AMQP 0-9-1 broker. Modules: ``schema`` (the output format, the contract for
reports), ``frames`` (pre-encoded publish frames, struct parsers), ``client`` (minimal asyncio
AMQP client), ``workers`` (producer/consumer processes), ``writer`` (Parquet output), ``cli``.
"""
