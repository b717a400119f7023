"""What the router and the nodes must agree on: wire messages, placement, settings, errors.

This package imports neither ``shoal.router`` nor ``shoal.node`` (design.md section 1).
"""
