"""The management HTTP API (issue 23), RabbitMQ's paths, JSON fields and status codes, served
by each router on ``management_port`` with aiohttp on the router's event loop: any router
answers for the whole cluster (queues are asked of every node, exchanges and bindings come
from the routing cache the nodes keep fresh)."""
