"""What each ``shoal loadtest`` worker does (no I/O): its :class:`Config` from the flags,
the queues it uses (:func:`assigned`), the bindings of each queue (:func:`binding_keys`), the
routing keys a producer publishes on (:func:`routes`) and how many deliveries each message
should make (:func:`copies`).

Queue assignment (both roles): with Q queues and W workers, worker ``w`` uses the queues
``q`` with ``q % W == w`` when Q >= W, else the single queue ``w % Q``. A producer publishes
round-robin over its queues through the default exchange; ``seq`` counts over all of them.

With ``--exchange`` (``Config.exchange``) every worker declares the exchange and binds its
queues, and a producer publishes to the exchange round-robin over the routing keys that reach
its queues: ``direct`` and ``topic`` route each message to one queue (binding ``j`` of
``--bindings`` goes to queue ``j % Q``), ``fanout`` to every queue of the run.
"""
from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class Config:
    """Everything a worker needs (picklable; built by the CLI from the flags)."""

    url: str
    queues: list[str]
    size: int = 100
    rate: float = 0.0
    time_s: float = 10.0
    confirm: int = 0
    qos: int = 0
    multi_ack_every: int = 0
    persistent: bool = False
    durable: bool = False
    mandatory: bool = False
    queue_args: dict = field(default_factory=dict)
    sample_every: int = 100
    run_token: int = 0
    producers: int = 1
    consumers: int = 1
    exchange: str = ""          #: publish through this exchange ("" = the default exchange)
    exchange_type: str = "direct"   #: direct, topic or fanout (with ``exchange``)
    bindings: int = 0           #: direct/topic: binding keys over the queues (0 = one each)
    connections: int = 1        #: connections per consumer, its queues spread over them


def copies(cfg: Config) -> int:
    """How many deliveries each published message should make: the number of queues through
    a fanout exchange, else 1."""
    return len(cfg.queues) if cfg.exchange and cfg.exchange_type == "fanout" else 1


def _keys(cfg: Config) -> int:
    return cfg.bindings or len(cfg.queues)


def binding_keys(cfg: Config, q: int) -> list[str]:
    """The binding keys of queue ``q`` to ``cfg.exchange``: ``""`` for fanout; else binding
    ``j`` (0 <= j < ``bindings``) for each ``j % Q == q``, ``kJ`` for direct and ``kJ.*``
    for topic (a pattern: the topic exchange matches it word by word)."""
    if cfg.exchange_type == "fanout":
        return [""]
    suffix = ".*" if cfg.exchange_type == "topic" else ""
    return [f"k{j}{suffix}" for j in range(q, _keys(cfg), len(cfg.queues))]


def routes(cfg: Config, qidx: list[int]) -> list[tuple[str, int]]:
    """A producer's publishes, round-robin: ``(routing key, index in qidx of the queue it
    reaches)``. The default exchange: each queue's name. Fanout: one key reaching all (the
    message counts under the first of its queues). Direct and topic: every binding key of
    its queues (topic: ``kJ.x``, matched by the pattern ``kJ.*``)."""
    if not cfg.exchange:
        return [(cfg.queues[q], i) for i, q in enumerate(qidx)]
    if cfg.exchange_type == "fanout":
        return [("", 0)]
    suffix = ".x" if cfg.exchange_type == "topic" else ""
    nq = len(cfg.queues)
    local = {q: i for i, q in enumerate(qidx)}
    return [(f"k{j}{suffix}", local[j % nq]) for j in range(_keys(cfg)) if j % nq in local]


def assigned(queues: int, workers: int, w: int) -> list[int]:
    """Indices of the queues worker ``w`` of ``workers`` uses (see module docstring)."""
    if queues >= workers:
        return [q for q in range(queues) if q % workers == w]
    return [w % queues]
