"""Sans-IO AMQP 0-9-1 protocol core (design.md section 7): bytes in, events and bytes out.

Modules: ``connection`` (AMQPConnection, the public object), ``control`` (the frames its hot
path does not take: connection and channel class methods), ``events`` (what it emits),
``states`` (connection/channel state enums and the one transition table), ``channel``
(channel state and content assembly), ``handshake`` (server properties, SASL, tune),
``framing`` (frame constants, pamqp decode guard), ``methods`` (method ids, close frames),
``fastpath`` (hand-written publish/ack/deliver/confirm codec).
"""
