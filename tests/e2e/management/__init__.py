"""The management HTTP API, the web console and the Prometheus metrics, end to end."""
