"""The Qpid queue model of a node (seeds 000-004, docs/design.md section 2): a queue, its strict
entry list, its consumers and the features its declare arguments turn on."""
