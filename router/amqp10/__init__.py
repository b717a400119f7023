"""AMQP 1.0 for the router: the type codec, frames, the sans-IO connection engine, SASL,
addresses and message conversion (docs/amqp10.md)."""
