"""Side-by-side scenarios: the same client script against Shoal and RabbitMQ 3.10."""
