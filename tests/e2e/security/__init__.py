"""TLS, client certificates and CURVE on the router-node link, end to end."""
