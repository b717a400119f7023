"""How Shoal's processes are started: the local supervisor of ``shoal serve``
(:mod:`.launcher`), the docker cluster harness of ``shoal cluster`` (:mod:`.dockercluster`,
:mod:`.image`, :mod:`.pika_load`), and the image's health check (:mod:`.healthcheck`), beside
the Dockerfile.

It starts nodes and routers by module name (``python -m shoal.node``, ``python -m shoal.cli
router``), so it imports neither package (import-linter contracts in pyproject.toml;
docs/architecture.md).
"""
