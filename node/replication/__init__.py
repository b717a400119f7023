"""Replication: quorum queues on Raft (design.md section 8, docs/replication.md).

``raft.py``, ``log.py`` and ``quorum.py`` are the sans-IO Raft core (modelled on etcd's raft
library: messages in; messages to send, entries to persist and entries to apply out). The
rest wires it into a node: the quorum queue's state machine, its disk and the node-to-node link.
"""
