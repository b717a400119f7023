"""The Shoal router: speaks AMQP 0-9-1 to clients and forwards work to nodes over ZeroMQ."""
