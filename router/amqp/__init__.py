"""Sans-IO AMQP 0-9-1 protocol core (design.md section 7): bytes in, events and bytes out.

Modules: ``connection`` (AMQPConnection, the public object: framing, the hot path, the
dispatch of every other frame, errors, close and output), ``login`` (start-ok, tune-ok, open,
update-secret: what each answers), ``liveness`` (heartbeats and timeouts), ``events`` (what it
emits), ``states`` (connection/channel state enums and the one transition table), ``channel``
(channel state, content assembly, and the channel table with channel open/close/flow),
``handshake`` (server properties, SASL, tune),
``framing`` (frame constants, pamqp decode guard), ``methods`` (method ids, close frames),
``fastpath`` (hand-written publish/ack/deliver/confirm codec).
"""
