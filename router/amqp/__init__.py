"""Sans-IO AMQP 0-9-1 protocol core (design.md section 7): bytes in, events and bytes out."""
