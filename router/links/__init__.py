"""A router's links to the nodes (docs/design.md section 4): ZeroMQ, in memory to a node hosted
in the router's process, and the same-host Unix stream socket."""
