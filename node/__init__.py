"""The Shoal node: owns a shard of queues and the exchanges placed on it (design.md section 1).

``shoal.node.shard.Shard`` is the sans-IO core (wire messages in, wire messages out);
``shoal.node.process.run_node`` runs it behind a ZeroMQ ROUTER socket; ``shoal.node.cli.main``
is the command line entry point.
"""
