"""The router's AMQP 0-9-1 front end around the sans-IO codec of :mod:`shoal.router.amqp`: the
client connection, its channels and their methods, and the amqps listener's TLS."""
